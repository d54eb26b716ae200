"""What differs between the Pythons the package supports (3.11 and newer).

The suite runs on one interpreter at a time (``nox -s tests`` on the one running nox), so
a difference that breaks another version must be pinned down by a check that means the
same thing on every version. trio-asyncio replaces ``asyncio.current_task`` (on 3.12+ it
is C code that cannot see trio-asyncio's loop); grpclib keeps the reference it took when
it was imported. If grpclib was imported first -- ``reactantserver.client`` imports it --
every server call failed on 3.12+ with "no running event loop", while the suite passed
on 3.11.
"""

from __future__ import annotations

import subprocess
import sys


def test_grpclib_uses_the_current_task_trio_asyncio_installed_whatever_the_import_order() -> None:
    code = (
        "import reactantserver.client, grpclib.utils\n"  # grpclib first, as a client does
        "import asyncio\n"
        "from reactantserver.transport import grpc\n"
        "print(grpclib.utils._current_task is asyncio.current_task)\n"
        "import trio_asyncio._loop as patched\n"
        "print(asyncio.current_task is getattr(patched, '_new_current_task', asyncio.current_task))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]

"""What differs between the Pythons the package supports (3.11 and newer).

The suite runs on one interpreter at a time (``nox -s tests`` on the one running nox), so
a difference that breaks another version must be pinned down by a check that means the
same thing on every version. The worker hosts grpclib on a standard asyncio loop with
Trio as its guest; a client imported first (``reactantserver.client`` imports grpclib)
must not change which loop or which ``current_task`` grpclib sees -- under trio-asyncio,
which the worker used before, that import order broke every server call on 3.12+ while
the suite passed on 3.11.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_a_guest_mode_server_answers_whatever_the_import_order() -> None:
    code = (
        "import reactantserver.client, grpclib.utils\n"  # grpclib first, as a client does
        "import sys, trio\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from fake_host import FakeHost\n"
        "from reactantserver.config.schema import EndpointsConfig\n"
        "from reactantserver.service import Service\n"
        "from reactantserver.transport import guest\n"
        "from reactantserver.worker.grpc import serve_grpc\n"
        "import numpy as np\n"
        "async def main():\n"
        "    async with trio.open_nursery() as n:\n"
        "        port = await n.start(serve_grpc, Service(FakeHost()), EndpointsConfig(port=0))\n"
        "        def call():\n"
        "            with reactantserver.client.Client(f'127.0.0.1:{port}') as c:\n"
        "                return c.infer('double', {'x': np.ones((1, 16), np.float32)})['y']\n"
        "        y = await trio.to_thread.run_sync(call)\n"
        "        n.cancel_scope.cancel()\n"
        "    return float(y.sum())\n"
        "print(guest.run(main))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["32.0"]

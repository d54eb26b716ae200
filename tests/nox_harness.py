"""Running ``nox -s serve`` as a user does, from tests: real nox, real processes.

``nox_path`` links nox and the packages it imports (all pure Python) from the test
environment into one directory, so that *any* supported interpreter can run this nox
with ``PYTHONPATH`` pointing there -- a test can run nox on Python 3.12 without
installing anything. ``environment`` is the environment such a run gets: the test
environment's scripts first on PATH, so that ``nox -s serve --no-venv --no-install``
runs the session's own code (steps, messages, ``exec``) on the package under test.
``Running`` is one such run in a process group of its own.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from clocks import wait_until

ROOT = Path(__file__).resolve().parent.parent


def nox_path(tmp: Path) -> Path:
    """A directory holding nox and everything it imports, linked from this environment."""
    from packaging.requirements import Requirement

    out = tmp / "nox-site"
    out.mkdir()
    todo, seen = ["nox"], set()
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        dist = importlib.metadata.distribution(name)
        for file in dist.files or ():
            top = file.parts[0]
            # Metadata too (.dist-info): some of nox's dependencies read their own.
            if top.endswith(".pth") or top in ("..", "__pycache__"):
                continue
            source = Path(str(dist.locate_file(top)))
            if not (out / top).exists() and source.exists():
                (out / top).symlink_to(source)
        for requirement in dist.requires or ():
            req = Requirement(requirement)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return out


def environment(nox_site: Path, **extra: str) -> dict[str, str]:
    """The environment of a nox run: none of our variables, nox on PYTHONPATH, this
    environment's scripts (reactantserver, python, grpcurl) first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INFERENCE_SERVER_", "REACTANT_", "NOX_", "PYTHONPATH"))
    }
    env["PYTHONPATH"] = str(nox_site)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def nox_argv(python: str, *args: str) -> list[str]:
    """``python -m nox`` on the checkout's noxfile."""
    return [python, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args]


class Running:
    """A command (``nox -s serve ...``) in a process group of its own, output to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text()

    def wait_ready(self, port: int) -> None:
        """Until the server is ready and has printed its "Try:" block (or fail)."""
        from reactantserver.client import Client

        with Client(f"127.0.0.1:{port}", timeout=5) as client:

            def ready() -> bool:
                assert self.proc.poll() is None, self.text()
                try:
                    return bool(client.is_server_ready()) and "Try:" in self.text()
                except Exception:  # not listening yet
                    return False

            wait_until(ready, 180, self.text)

    def close(self) -> None:
        """Kill what is left of the group (a test that failed midway)."""
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()

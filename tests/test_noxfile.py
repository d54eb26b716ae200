"""``noxfile.py``: sessions on any Python 3.11+, and ``nox -s serve`` run as a user runs it.

The interpreter choice is a function (``session_python``) posed every kind of machine.
The serve session is then run through nox itself, in real processes: nox on the test
interpreter and on another Python (3.12 or 3.13, when this machine has one), stopped
every way a user or a supervisor stops it -- SIGTERM to nox's pid, Ctrl-C (SIGINT to
the process group), SIGTERM to the group, SIGKILL -- each time checking the exit status
nox returns and that nothing of the process group survives. ``--no-venv --no-install``
runs the session's own code on the test environment, so no test installs anything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nox_harness import Running, environment, nox_argv, nox_path
from worker_harness import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

THIS = (sys.version_info.major, sys.version_info.minor)


# ------------------------------------------------------------------ choosing the Python


def test_nox_on_a_supported_python_uses_it() -> None:
    for running in ((3, 11), (3, 12), (3, 13), (3, 14)):
        assert noxfile.session_python(running, "/opt/py/bin/python", lambda _: None) == (
            "/opt/py/bin/python"
        )


def test_nox_on_an_older_python_takes_the_newest_supported_one_that_runs() -> None:
    found = {
        "python3.13": "/shims/python3.13",  # a pyenv shim for a version not selected
        "python3.12": "/usr/bin/python3.12",
        "python3.11": "/usr/bin/python3.11",
    }
    reports = {
        "/shims/python3.13": None,
        "/usr/bin/python3.12": (3, 12),
        "/usr/bin/python3.11": (3, 11),
    }
    chosen = noxfile.session_python((3, 10), "/usr/bin/python3.10", found.get, reports.get)
    assert chosen == "/usr/bin/python3.12"
    # A binary named python3.12 that is something else is not taken at its word.
    reports["/usr/bin/python3.12"] = (3, 9)
    assert noxfile.session_python((3, 10), "/x", found.get, reports.get) == "/usr/bin/python3.11"


def test_with_no_supported_python_there_is_none_and_the_reason_says_what_to_do() -> None:
    assert noxfile.session_python((3, 9), "/x", lambda _: None) is None
    assert noxfile.NO_PYTHON.startswith("reactantserver needs Python 3.11 or newer: nox runs on")
    assert "python3.13, python3.12, python3.11" in noxfile.NO_PYTHON


def test_with_no_supported_python_every_session_fails_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not skipped with exit status 0 (what nox does for a missing interpreter unless
    told otherwise): the session runs without a virtualenv and fails with the reason."""
    monkeypatch.setattr(noxfile, "PYTHON", None)

    def example_session(session: object) -> None:
        raise AssertionError("must not run")

    wrapped = noxfile.session(example_session)
    errors: list[str] = []

    class FakeSession:
        def error(self, message: str) -> None:
            errors.append(message)

    wrapped(FakeSession())  # type: ignore[arg-type]
    assert errors == [noxfile.NO_PYTHON]
    assert wrapped.python is False  # type: ignore[attr-defined]
    assert noxfile.nox.options.error_on_missing_interpreters is True


def test_this_interpreter_is_the_one_chosen_here() -> None:
    assert THIS >= noxfile.OLDEST
    assert sys.executable == noxfile.PYTHON


# ------------------------------------------------------------------ nox itself


def _other_python() -> str | None:
    """A supported interpreter of another version than this one, if the machine has one."""
    candidates = [f"python{a}.{b}" for a, b in noxfile.SUPPORTED if (a, b) != THIS]
    pyenv = Path.home() / ".pyenv" / "versions"
    for name in candidates:
        version = tuple(int(p) for p in name[len("python") :].split("."))
        paths = (
            sorted(pyenv.glob(f"{version[0]}.{version[1]}.*/bin/{name}")) if pyenv.is_dir() else []
        )
        for path in paths:
            if noxfile._version_of(str(path)) == version:
                return str(path)
    return None


@pytest.fixture(scope="module")
def nox_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nox_path(tmp_path_factory.mktemp("nox"))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["this", "other"])
def test_nox_runs_its_sessions_on_the_python_that_runs_it(nox_site: Path, which: str) -> None:
    """nox on 3.11, or on 3.12/3.13 with no 3.11 anywhere on PATH: the sessions are
    listed on that interpreter (nothing is skipped for want of 3.11)."""
    python = sys.executable if which == "this" else _other_python()
    if python is None:
        pytest.skip("this machine has no supported Python besides the running one")
    out = subprocess.run(
        nox_argv(python, "-l", "--json"),
        capture_output=True,
        text=True,
        env=environment(nox_site),
        timeout=120,
        check=True,
    )
    sessions = {s["session"]: s for s in json.loads(out.stdout)}
    assert sessions["tests"]["python"] == python


def _node_file(tmp: Path, repo: Path, port: int, metrics: int) -> Path:
    node = tmp / "node.yaml"
    node.write_text(
        f"model_repo: {repo}\n"
        f"base_port: {port}\n"
        f"metrics_base_port: {metrics}\n"
        "gpus: 0\n"
        "global:\n"
        "  model_control_mode: static\n"
        f"  cache_dir: {tmp / 'cache'}\n"
        "  models_include: [double]\n"
    )
    return node


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Running]]:
    runs: list[Running] = []
    yield runs
    for run in runs:
        run.close()


def _group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


STOPS = {
    "sigterm-to-nox": (lambda pid: os.kill(pid, signal.SIGTERM), 0),
    "ctrl-c": (lambda pid: os.killpg(pid, signal.SIGINT), 0),
    "sigterm-to-group": (lambda pid: os.killpg(pid, signal.SIGTERM), 0),
    "sigkill-to-nox": (lambda pid: os.kill(pid, signal.SIGKILL), -signal.SIGKILL),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("python", "stop"),
    [
        ("this", "sigterm-to-nox"),
        ("this", "ctrl-c"),
        ("this", "sigterm-to-group"),
        ("this", "sigkill-to-nox"),
        ("other", "sigterm-to-nox"),
    ],
)
def test_nox_serve_stops_gracefully_and_leaves_nothing_behind(
    zoo_repo: Path, tmp_path: Path, nox_site: Path, started: list[Running], python: str, stop: str
) -> None:
    """nox's pid *is* the server once it serves: every stop reaches the server, the exit
    status nox returns is the server's (0 after a graceful drain), and the process group
    is empty afterwards."""
    interpreter = sys.executable if python == "this" else _other_python()
    if interpreter is None:
        pytest.skip("this machine has no supported Python besides the running one")
    port, metrics = free_port(), free_port()
    node = _node_file(tmp_path, zoo_repo, port, metrics)
    argv = nox_argv(interpreter, "-s", "serve", "--no-venv", "--no-install", "--", str(node))
    run = Running(argv, environment(nox_site), tmp_path / "nox.log")
    started.append(run)
    run.wait_ready(port)

    import psutil

    assert "reactantserver" in " ".join(psutil.Process(run.proc.pid).cmdline())
    from reactantserver.client import Client

    with Client(f"127.0.0.1:{port}", timeout=30) as client:
        assert client.infer("double", {"x": [[1.0] * 16]})["y"].tolist() == [[2.0] * 16]
    send, status = STOPS[stop]
    send(run.proc.pid)
    assert run.proc.wait(timeout=60) == status, run.text()
    deadline = time.monotonic() + 10
    while not _group_is_gone(run.proc.pid):
        assert time.monotonic() < deadline, "a process of nox's group outlived it"
        time.sleep(0.05)
    text = run.text()
    assert "[3/3] reactantserver serve" in text
    assert f"gRPC (KServe V2 / Triton):  127.0.0.1:{port}" in text
    if status == 0:
        assert "draining" in text and "worker worker0 stopped" in text


@pytest.mark.slow
def test_nox_serve_fails_with_the_servers_status_when_serving_fails(
    tmp_path: Path, nox_site: Path, zoo_repo: Path
) -> None:
    """A node file with problems: every one is reported and nox exits 2, the server's
    status. A port already taken: one line, and status 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_repo: nowhere\nglobal:\n  scheduler:\n    discipline: fiar\n")
    argv = nox_argv(sys.executable, "-s", "serve", "--no-venv", "--no-install", "--", str(bad))
    done = subprocess.run(
        argv, capture_output=True, text=True, env=environment(nox_site), timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"{bad}:1: model_repo: expected a readable directory of model bundles; got 'nowhere' "
        f"({tmp_path / 'nowhere'}), which does not exist\n"
        f"{bad}:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'\n"
    ) in done.stderr
    assert "Traceback" not in done.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = _node_file(tmp_path, zoo_repo, port, 0)
        argv = nox_argv(sys.executable, "-s", "serve", "--no-venv", "--no-install", "--", str(node))
        done = subprocess.run(
            argv, capture_output=True, text=True, env=environment(nox_site), timeout=120
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"reactantserver serve: cannot listen for gRPC on 127.0.0.1:{port}: address already in use"
    ) in done.stderr
    assert "Traceback" not in done.stderr

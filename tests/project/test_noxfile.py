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

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from clocks import wait_until
from nox_harness import Running, environment, nox_argv, nox_path
from worker_harness import free_port

ROOT = Path(__file__).resolve().parents[2]
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


# ------------------------------------------------------------------ the pinned tools


class RecordingSession:
    """What a session function asks of nox, recorded (no virtualenv, nothing run)."""

    def __init__(self) -> None:
        self.installs: list[tuple[str, ...]] = []
        self.runs: list[tuple[str, ...]] = []
        self.env: dict[str, str] = {}
        self.posargs: list[str] = []

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def run(self, *args: str, **kwargs: object) -> None:
        self.runs.append(args)

    def create_tmp(self) -> str:
        return tempfile.mkdtemp(prefix="rs_nox_session_")

    def chdir(self, path: object) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}; every line is ``name==version``."""
    found = {}
    for line in (ROOT / noxfile.CONSTRAINTS).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version and "," not in version, f"not pinned with ==: {line!r}"
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


@pytest.mark.parametrize("name", ["lint", "tests", "fuzz", "bench"])
def test_the_sessions_ci_runs_install_with_the_constraints_file(name: str) -> None:
    """lint and tests (and the sessions that install the test extra) pass the one
    constraints file to pip with every install of the package."""
    session = RecordingSession()
    getattr(noxfile, name)(session)
    assert session.installs, name
    for args in session.installs:
        assert args[:2] == ("-c", "constraints.txt"), (name, args)
    assert (ROOT / noxfile.CONSTRAINTS).is_file()


def test_the_tools_ci_depends_on_are_pinned_exactly() -> None:
    pinned = pins()
    for tool in ("mypy", "ruff", "numpy", "pytest", "pytest-trio", "hypothesis", "pluggy"):
        assert tool in pinned, f"{tool} is not pinned in constraints.txt"


def test_every_pytest_plugin_of_the_test_environment_is_pinned() -> None:
    """A plugin is code that runs inside every test run: a new release of any of them
    changes the verdict as surely as a new pytest (entry point group pytest11)."""
    import importlib.metadata

    plugins = {
        ep.dist.name.lower().replace("_", "-")
        for ep in importlib.metadata.entry_points(group="pytest11")
        if ep.dist is not None
    }
    assert plugins, "no pytest plugin found: is this the test environment?"
    assert plugins <= set(pins()), f"not pinned: {sorted(plugins - set(pins()))}"


def test_the_gpu_jax_session_finds_a_python_3_12_behind_pyenv_shims(tmp_path: Path) -> None:
    """``tests_gpu_jax`` needs Python 3.12+ (jax 0.11): the running one if it is, else a
    ``python3.12`` on PATH that really runs, else pyenv's (a shim for a version not
    selected fails), 3.12 -- the GPU image's -- before 3.13; None when there is none."""
    pyenv = tmp_path / "pyenv"
    installed = {}
    for version in ("3.12.1", "3.13.0"):
        name = f"python{version.rsplit('.', 1)[0]}"
        exe = pyenv / "versions" / version / "bin" / name
        exe.parent.mkdir(parents=True)
        exe.write_text("")
        installed[str(exe)] = tuple(int(p) for p in version.split(".")[:2])
    shims = {"python3.12": "/shims/python3.12", "python3.13": "/shims/python3.13"}

    def found(running: tuple[int, int], root: Path = pyenv) -> str | None:
        return noxfile.python_at_least(
            (3, 12),
            running=running,
            executable="/usr/bin/python3",
            which=shims.get,
            version_of=installed.get,  # the shims do not run: not in the table
            pyenv=root,
        )

    assert found((3, 13)) == "/usr/bin/python3"  # the running one is new enough
    assert found((3, 11)) == str(pyenv / "versions" / "3.12.1" / "bin" / "python3.12")
    assert found((3, 11), root=tmp_path / "no-pyenv") is None
    assert noxfile.GPU_IMAGE_PYTHON == (3, 12) and noxfile.GPU_IMAGE_JAX.startswith("0.11.")


def test_readme_says_how_to_bump_the_pins() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Tool versions", 1)[1].split("\n#", 1)[0]
    assert "constraints.txt" in section and "nox -s lint tests" in section


# ------------------------------------------------------------------ quiet, healthy starts


def test_the_uv_probe_line_is_dropped_and_nothing_else() -> None:
    """nox logs ``uv binary not found.`` on every session where uv is not installed,
    whichever backend the session uses; the noxfile's filter on nox's logger drops that
    line and lets every other one through."""
    import logging

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("nox", logging.INFO, __file__, 1, message, None, None)

    logger = logging.getLogger("nox")
    assert not logger.filter(record("uv binary not found."))
    assert logger.filter(record("Running session serve"))
    assert logger.filter(record("uv binary not found. (something else)"))


def test_nox_prints_no_uv_line(tmp_path: Path, nox_site: Path) -> None:
    """Real nox on this noxfile, uv nowhere on PATH: no ``uv binary not found.``."""
    done = subprocess.run(
        nox_argv(sys.executable, "-s", "node", "--no-venv", "--no-install"),
        capture_output=True,
        text=True,
        env=environment(nox_site),
        timeout=120,
    )
    assert "Running session node" in done.stderr, done.stderr
    assert "Session node aborted: usage: nox -s node" in done.stderr
    assert noxfile.UV_NOT_FOUND not in done.stdout + done.stderr


# ------------------------------------------------------------------ serve's check step


class ServeSession(RecordingSession):
    """A serve session with a virtualenv of its own (a directory), its step lines kept."""

    def __init__(self, venv: Path) -> None:
        super().__init__()
        self.virtualenv = type("Venv", (), {"location": str(venv)})()
        self.bin_paths: list[str] = []
        self.lines: list[str] = []

    def log(self, text: str) -> None:
        self.lines.append(text)


def test_a_second_serve_installs_nothing_when_nothing_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: a second ``nox -s serve`` took 22-46 s, pip resolving again what was
    installed; and its line promised "the first time takes a minute". The install runs
    once per pyproject.toml (the package is editable: its sources need none); the line
    says which case it is."""
    monkeypatch.setattr(noxfile, "become", lambda session, argv: None)  # no exec here
    venv = tmp_path / "venv"
    venv.mkdir()
    shown = noxfile._shown(str(venv))
    first = ServeSession(venv)
    noxfile.serve(first)
    assert first.installs == [noxfile.SERVE_REQUIREMENTS]
    assert first.lines[0] == f"[1/3] {noxfile.installing(shown)}"
    again = ServeSession(venv)
    noxfile.serve(again)
    assert again.installs == []
    assert again.lines[0] == f"[1/3] {noxfile.reusing(shown)}"
    assert "first time" not in again.lines[0]


def test_the_install_runs_again_when_pyproject_changes(tmp_path: Path) -> None:
    root, venv = tmp_path / "checkout", tmp_path / "venv"
    root.mkdir()
    venv.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    session = ServeSession(venv)
    done = [noxfile.install_once(session, ("-e", ".[jax]"), root=root) for _ in range(2)]
    assert done == ["installed", "reused"]
    # Another list of requirements (the cuda extra) is its own entry.
    assert noxfile.install_once(session, ("-e", ".[cuda]"), root=root) == "installed"
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = ['numpy']\n")
    assert noxfile.install_once(session, ("-e", ".[jax]"), step=1, root=root) == "updated"
    assert session.lines[-1] == f"[1/3] {noxfile.updating(noxfile._shown(str(venv)))}"
    assert session.installs == [("-e", ".[jax]"), ("-e", ".[cuda]"), ("-e", ".[jax]")]
    # A stamp that cannot be read is no stamp.
    (venv / noxfile.INSTALL_STAMP).write_text("{not json")
    assert noxfile.install_once(session, ("-e", ".[jax]"), root=root) == "installed"


def test_the_check_step_knows_every_backend() -> None:
    import typing

    from reactantserver.config.schema import Backend

    assert typing.get_args(Backend) == noxfile.BACKENDS


def test_the_check_prints_the_backend_or_every_problem_and_status_2(
    tmp_path: Path, zoo_repo: Path
) -> None:
    good = _node_file(tmp_path, zoo_repo, free_port(), 0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_repo: nowhere\nglobal:\n  scheduler:\n    discipline: fiar\n")
    ok = subprocess.run(
        [sys.executable, "-c", noxfile.CHECK, str(good), ""], capture_output=True, text=True
    )
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "cpu\n", "")
    refused = subprocess.run(
        [sys.executable, "-c", noxfile.CHECK, str(bad), ""], capture_output=True, text=True
    )
    assert (refused.returncode, refused.stdout) == (noxfile.CHECK_FAILED, "")
    assert refused.stderr.splitlines() == [
        f"{bad}:1: model_repo: expected a readable directory of model bundles; got 'nowhere' "
        f"({tmp_path / 'nowhere'}), which does not exist",
        f"{bad}:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    ]


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
def started(tmp_path: Path) -> Iterator[list[Running | socket.socket]]:
    runs: list[Running | socket.socket] = []
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
    zoo_repo: Path,
    tmp_path: Path,
    nox_site: Path,
    started: list[Running | socket.socket],
    python: str,
    stop: str,
) -> None:
    """nox's pid *is* the server once it serves: every stop reaches the server, the exit
    status nox returns is the server's (0 after a graceful drain), and the process group
    is empty afterwards."""
    interpreter = sys.executable if python == "this" else _other_python()
    if interpreter is None:
        pytest.skip("this machine has no supported Python besides the running one")
    port, metrics = free_port(), free_port()
    moved: dict[str, str] = {}
    if stop == "ctrl-c":
        # README's way past a taken port: the node file's ports are held by another
        # process, and the variables the port-in-use line names move both.
        held = [socket.socket(), socket.socket()]
        for sock in held:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            started.append(sock)  # held until the runs close
        node = _node_file(tmp_path, zoo_repo, *(s.getsockname()[1] for s in held))
        moved = {
            "INFERENCE_SERVER_ENDPOINTS_PORT": str(port),
            "INFERENCE_SERVER_ENDPOINTS_METRICS_PORT": str(metrics),
        }
    else:
        node = _node_file(tmp_path, zoo_repo, port, metrics)
    argv = nox_argv(interpreter, "-s", "serve", "--no-venv", "--no-install", "--", str(node))
    run = Running(argv, environment(nox_site, **moved), tmp_path / "nox.log")
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
    wait_until(lambda: _group_is_gone(run.proc.pid), what="nox's whole process group gone")
    text = run.text()
    assert "[3/3] reactantserver serve" in text
    assert f"gRPC (KServe V2 / Triton):  127.0.0.1:{port}" in text
    assert f"http://127.0.0.1:{metrics}/metrics" in text
    if status == 0:
        assert "draining" in text and "worker worker0 stopped" in text


@pytest.mark.slow
def test_nox_serve_fails_with_the_servers_status_when_serving_fails(
    tmp_path: Path, nox_site: Path, zoo_repo: Path
) -> None:
    """A node file with problems: every one is reported at the check step and nox exits
    2, the server's status for it. A port already taken: one line naming the variable
    that moves it, and the server's status 78."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_repo: nowhere\nglobal:\n  scheduler:\n    discipline: fiar\n")
    argv = nox_argv(sys.executable, "-s", "serve", "--no-venv", "--no-install", "--", str(bad))
    done = subprocess.run(
        argv, capture_output=True, text=True, env=environment(nox_site), timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    # Refused at the check step: its line, then the problems, and nothing after them.
    assert done.stderr.endswith(
        f"nox > [2/3] checking {bad}\n"
        f"{bad}:1: model_repo: expected a readable directory of model bundles; got 'nowhere' "
        f"({tmp_path / 'nowhere'}), which does not exist\n"
        f"{bad}:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'\n"
    ), done.stderr
    assert "[3/3]" not in done.stdout + done.stderr
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
    assert done.returncode == 78, done.stdout + done.stderr  # EX_CONFIG (startup.py)
    assert (
        f"reactantserver serve: cannot listen for gRPC on 127.0.0.1:{port}: address already in "
        "use; another process is listening there (stop it, or choose another port: "
        "INFERENCE_SERVER_ENDPOINTS_PORT=PORT in the environment for one run"
    ) in done.stderr
    assert "Traceback" not in done.stderr

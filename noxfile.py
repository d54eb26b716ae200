"""Developer sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s proto``, ``nox -s bench``,
``nox -s bench_peer``, ``nox -s fuzz``, ``nox -s serve`` and ``nox -s node``.

Every session installs what it needs into its own virtualenv, so a clean clone on a
machine with only Python (plus ``pip install nox``) runs all of them.
"""

from __future__ import annotations

from pathlib import Path
from shutil import which

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite, CPU only."""
    session.install("-e", ".[jax,test]")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """A long run of the wire fuzz suite: ``nox -s fuzz [-- --fuzz-examples N]``."""
    session.install("-e", ".[jax,test]")
    args = session.posargs or ["--fuzz-examples", "400"]
    session.run("pytest", "tests/test_wire_fuzz.py", "-p", "no:cacheprovider", *args)


@nox.session(python=PYTHON)
def serve(session: nox.Session) -> None:
    """Serve a node file: ``nox -s serve -- node.yaml [--worker NAME]``.

    With no arguments, build the example zoo into examples/repo on first run and serve
    examples/node.yaml on the CPU (gRPC on 127.0.0.1:8001, /metrics on :8002).
    """
    session.install("-e", ".[jax]")
    args = list(session.posargs)
    if not args:
        if not any(Path("examples/repo").glob("*/manifest.yaml")):
            session.log("building the example zoo into examples/repo (first run only)")
            session.run("python", "examples/build_repo.py", "--out", "examples/repo")
        args = ["examples/node.yaml"]
        session.env["JAX_PLATFORMS"] = "cpu"
    else:
        backend = session.run(
            "python",
            "-c",
            "import sys; from reactantserver.config import load_server_config as l; "
            "print(l(sys.argv[1], worker=sys.argv[2] or None).runtime.backend)",
            args[0],
            args[args.index("--worker") + 1] if "--worker" in args else "",
            silent=True,
        )
        if backend and backend.strip() == "cuda":
            session.install("-e", ".[cuda]")
    session.run("reactantserver", "serve", *args)


@nox.session(python=PYTHON)
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
    session.run("reactantserver", "node", *session.posargs)


@nox.session(python=PYTHON)
def image(session: nox.Session) -> None:
    """Build the CPU image from the Dockerfile with no registry and run it (slow).

    Needs root, podman, debootstrap, unshare and chroot (``apt-get install podman
    debootstrap``); see deploy/docker/local_image.py and docs/deployment.md.
    """
    missing = [tool for tool in ("podman", "debootstrap", "unshare", "chroot") if not which(tool)]
    if missing:
        session.skip(f"needs {', '.join(missing)} (apt-get install podman debootstrap)")
    session.install("-e", ".[jax,test]")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("python", "deploy/docker/local_image.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over src/."""
    session.install("-e", ".[jax,lint]")
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


@nox.session(python=PYTHON)
def proto(session: nox.Session) -> None:
    """Regenerate the betterproto modules and the descriptor set from proto/."""
    session.install("-e", ".[proto]")
    session.run("python", "proto/generate.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Print every benchmark table (``nox -s bench -- scheduler`` picks by name)."""
    session.install("-e", ".[jax,test]")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_peer(session: nox.Session) -> None:
    """Compare with MLServer on loopback: ``nox -s bench_peer [-- --runs 3]``.

    Its own virtualenv: MLServer 1.7 with uvloop pinned to 0.21.0 (newer uvloop kills
    MLServer's parallel workers at start), installed together with this package so that
    pip resolves one consistent set.
    """
    session.install("-e", ".[jax,test]", "mlserver==1.7.*", "uvloop==0.21.0")
    session.env["JAX_PLATFORMS"] = "cpu"
    session.run("python", "benchmarks/peer/bench_peer.py", *session.posargs)

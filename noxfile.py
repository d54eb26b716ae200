"""Developer sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s proto``, ``nox -s bench``.

Every session installs what it needs into its own virtualenv, so a clean clone on a
machine with only Python (plus ``pip install nox``) runs all of them.
"""

from __future__ import annotations

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
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over src/."""
    session.install("-e", ".[jax,lint]")
    session.run("ruff", "check", "src", "tests", "examples", "benchmarks", "noxfile.py", "proto")
    session.run(
        "ruff", "format", "--check", "src", "tests", "examples", "benchmarks", "noxfile.py", "proto"
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

"""XLA/JAX settings from ``runtime:``: applied before JAX starts, reported when too late."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from reactantserver.config import RuntimeConfig
from reactantserver.runtime import apply_environment, desired_environment


def test_desired_environment_for_cpu_and_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    assert desired_environment(
        RuntimeConfig(backend="cpu", mem_fraction=0.5, preallocate=False)
    ) == {
        "JAX_PLATFORMS": "cpu",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    assert desired_environment(RuntimeConfig(backend="cuda"))["JAX_PLATFORMS"] == "cuda,cpu"


def test_the_newer_fraction_variable_is_used_when_already_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # XLA refuses XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION together.
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.7")
    env = desired_environment(RuntimeConfig(mem_fraction=0.25))
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.25"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env


def test_settings_reach_a_fresh_process_before_jax_starts() -> None:
    code = (
        "import json, os, sys\n"
        "from reactantserver.config import RuntimeConfig\n"
        "from reactantserver.runtime import Runtime\n"
        "assert 'jax' not in sys.modules\n"
        "rt = Runtime.start(RuntimeConfig(backend='cpu', mem_fraction=0.42, preallocate=False))\n"
        "import jax\n"
        "print(json.dumps({'backend': rt.backend, 'platforms': jax.config.jax_platforms,\n"
        "  'fraction': os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'],\n"
        "  'prealloc': os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'],\n"
        "  'applied': sorted(rt.environment.applied)}))\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_", "XLA_"))  # a clean slate: only our settings count
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "backend": "cpu",
        "platforms": "cpu",
        "fraction": "0.42",
        "prealloc": "false",
        "applied": [
            "JAX_PLATFORMS",
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_PREALLOCATE",
        ],
    }


def test_too_late_settings_are_reported_not_silently_dropped(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax

    jax.devices()  # JAX is initialised in this process from here on
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    with caplog.at_level(logging.WARNING, logger="reactantserver.runtime"):
        report = apply_environment(RuntimeConfig(backend="cpu", mem_fraction=0.3))
    assert report.jax_was_initialised
    assert report.applied == {}
    assert report.ignored == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"}
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"  # untouched
    assert caplog.messages == [
        "JAX was already initialised in this process, so these settings cannot take effect: "
        "XLA_PYTHON_CLIENT_MEM_FRACTION=0.3; continuing with JAX's current platforms and "
        "allocator"
    ]


def test_the_private_jax_probe_is_where_the_installed_jax_keeps_it() -> None:
    """JAX has no public "are the backends initialised?" (jax-ml/jax#23320), so
    runtime/environment.py reads jax's private PRIVATE_PROBE. This pins it against the
    installed jax (CI: constraints.txt's), in a fresh process: importing jax leaves it
    False, a device brings it to True. When a JAX release moves it, this fails naming what
    to change."""
    from reactantserver.runtime import environment

    module, name = environment.PRIVATE_PROBE
    code = (
        "import json, sys\n"
        "import jax\n"
        "from reactantserver.runtime.environment import _backends_probe, jax_initialised\n"
        "probe = _backends_probe()\n"
        "if probe is None:\n"
        "    print(json.dumps({'version': jax.__version__, 'found': False})); sys.exit()\n"
        "before = jax_initialised()\n"
        "jax.devices()\n"
        "print(json.dumps({'version': jax.__version__, 'found': True, 'before': before,\n"
        "                  'after': jax_initialised()}))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["found"], (
        f"jax {seen['version']} has no {module}.{name}: find where it now answers 'are the "
        "backends initialised?' without initialising them (a public API, if one exists by "
        "now) and change reactantserver.runtime.environment.PRIVATE_PROBE"
    )
    assert (seen["before"], seen["after"]) == (False, True), (
        f"jax {seen['version']}: {module}.{name}() no longer tells an imported jax from one "
        f"with backends ({seen}); change reactantserver.runtime.environment.PRIVATE_PROBE"
    )


def test_a_moved_probe_warns_and_applies_the_settings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Should the private name move, the server still starts: a warning names it, and the
    settings are applied as in a fresh process."""
    import jax  # noqa: F401  (in sys.modules: the probe is asked)

    from reactantserver.runtime import environment

    monkeypatch.setattr(environment, "PRIVATE_PROBE", ("jax._src.xla_bridge", "no_such_name"))
    with caplog.at_level(logging.WARNING, logger="reactantserver.runtime"):
        assert environment.jax_initialised() is False
    assert "xla_bridge.no_such_name moved" in caplog.text

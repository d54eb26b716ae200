"""Process-wide JAX/XLA settings, applied before JAX initialises a backend.

Theory of operation
-------------------
XLA reads its allocator settings from the environment when it creates a device
client, and JAX picks its platforms when it first initialises its backends. Both
happen once per process, so ``apply_environment`` must run before anything touches
a device. It sets:

* ``JAX_PLATFORMS``: ``cpu`` for ``runtime.backend: cpu``; ``cuda,cpu`` for ``cuda``
  (with both listed, a machine without a visible GPU still starts, and the runtime
  decides between falling back and refusing);
* ``XLA_PYTHON_CLIENT_MEM_FRACTION`` from ``runtime.mem_fraction`` (or the newer
  ``XLA_CLIENT_MEM_FRACTION`` when the operator already uses that name: XLA refuses
  both at once);
* ``XLA_PYTHON_CLIENT_PREALLOCATE`` from ``runtime.preallocate``.

If JAX has already initialised its backends (a test process, or an embedding
application), nothing can change any more: we log a warning naming each setting
that would have differed and carry on with what JAX has.

This module imports no JAX: it only looks at ``sys.modules`` to see whether JAX is
already there, and if so asks JAX's own (private: :data:`PRIVATE_PROBE` says why) flag
whether its backends are up.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable

import attrs

from ..config import RuntimeConfig

log = logging.getLogger("reactantserver.runtime")


@attrs.frozen
class EnvironmentReport:
    """What ``apply_environment`` did."""

    #: Variables set (name -> value).
    applied: dict[str, str]
    #: Variables that could not take effect because JAX was already initialised.
    ignored: dict[str, str]
    jax_was_initialised: bool


def desired_environment(cfg: RuntimeConfig) -> dict[str, str]:
    """The environment variables that express ``cfg`` to JAX/XLA."""
    fraction_var = (
        "XLA_CLIENT_MEM_FRACTION"
        if os.environ.get("XLA_CLIENT_MEM_FRACTION")
        else "XLA_PYTHON_CLIENT_MEM_FRACTION"
    )
    return {
        "JAX_PLATFORMS": "cpu" if cfg.backend == "cpu" else "cuda,cpu",
        fraction_var: f"{cfg.mem_fraction:g}",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true" if cfg.preallocate else "false",
    }


#: Where JAX answers "are the backends up?" without bringing them up. No public API does
#: (jax-ml/jax#23320 asks for one and is open; ``jax.extend.backend.backends()`` and
#: ``jax.devices()`` initialise the backends they report), so this reads a private name
#: (jax 0.4 has it; CI's constraints.txt pins 0.10.2): ``tests/runtime/test_runtime_environment.py``
#: calls it on the installed jax and fails, naming this constant, the day it moves.
PRIVATE_PROBE = ("jax._src.xla_bridge", "backends_are_initialized")


def _backends_probe() -> Callable[[], object] | None:
    """JAX's own "are the backends initialised?" (:data:`PRIVATE_PROBE`); None if moved."""
    module, name = PRIVATE_PROBE
    try:
        probe = getattr(importlib.import_module(module), name)  # imported with jax: free
    except (ImportError, AttributeError):
        return None
    return probe if callable(probe) else None


def jax_initialised() -> bool:
    """True once JAX has created its device clients in this process (never creates them).

    Reads JAX's private :data:`PRIVATE_PROBE`. Should a JAX release move it, this warns and
    answers False: the settings are then applied as in a fresh process (harmless when JAX has
    not started; when it has, they do not take effect and the warning says why).
    """
    if "jax" not in sys.modules:
        return False
    probe = _backends_probe()
    if probe is None:
        log.warning(
            "cannot tell whether JAX %s already initialised its backends (%s.%s moved); "
            "applying the runtime settings as if it had not",
            getattr(sys.modules["jax"], "__version__", "?"),
            *PRIVATE_PROBE,
        )
        return False
    return bool(probe())


def apply_environment(cfg: RuntimeConfig) -> EnvironmentReport:
    """Set the JAX/XLA environment for ``cfg`` (see the module docstring)."""
    want = desired_environment(cfg)
    if jax_initialised():
        ignored = {k: v for k, v in want.items() if os.environ.get(k) != v}
        if ignored:
            settings = ", ".join(f"{k}={v}" for k, v in ignored.items())
            log.warning(
                "JAX was already initialised in this process, so these settings cannot take "
                "effect: %s; continuing with JAX's current platforms and allocator",
                settings,
            )
        return EnvironmentReport(applied={}, ignored=ignored, jax_was_initialised=True)
    for key, value in want.items():
        old = os.environ.get(key)
        if old is not None and old != value:
            log.info("runtime config overrides %s=%s with %s", key, old, value)
        os.environ[key] = value
    if "jax" in sys.modules:
        # Imported but not initialised: the platform list was read at import time,
        # so update the live config too (the XLA_* variables are read later anyway).
        import jax

        jax.config.update("jax_platforms", want["JAX_PLATFORMS"])
    return EnvironmentReport(applied=want, ignored={}, jax_was_initialised=False)

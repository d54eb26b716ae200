"""reactantserver: serve many compiled JAX/StableHLO models from one GPU.

The package imports no JAX: only ``reactantserver.runtime`` and
``reactantserver.export`` do. Public names are resolved lazily so that
``import reactantserver`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it
_LAZY = {
    "Scheduler": "reactantserver.scheduling",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reactantserver' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

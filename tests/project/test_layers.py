"""No import from a lower layer to a higher one: the layering, checked in fresh interpreters.

The server is built in layers (docs/architecture.md has the map): the records and the
sans-IO policies at the bottom, the JAX runtime above them, the RPC service above that,
the gRPC transport on top, and the worker wiring them all. A lower module importing a
higher one drags the higher layer -- and its dependencies -- into every process that
uses the lower one (a simulation, the gateway, a client), and makes the layers cycle.

Each check imports one module in a fresh interpreter and looks at ``sys.modules``
afterwards: the leaf modules (records, interfaces, policies, the models' and meta
models' records) must not have pulled in the transport, the runtime, betterproto or
JAX; the RPC service must not have pulled in the transport or the runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules below the runtime and the RPC layer.
LEAF = [
    "reactantserver.records",
    "reactantserver.host",
    "reactantserver.status",
    "reactantserver.grpcwire",
    "reactantserver.statistics",
    "reactantserver.changes",
    "reactantserver.threads",
    "reactantserver.lifecycle",
    "reactantserver.scheduling",
    "reactantserver.weights",
    "reactantserver.models",
    "reactantserver.meta",
    "reactantserver.hooks",
    "reactantserver.metrics",
]

#: What a leaf must not import, by module-name prefix.
ABOVE_LEAF = (
    "reactantserver.transport",
    "reactantserver.runtime",
    "reactantserver.service",
    "reactantserver.worker",
    "reactantserver.protocol",
    "betterproto",
    "grpclib",
    "jax",
    "jaxlib",
)


def _imported_after(module: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def _offending(loaded: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("module", LEAF)
def test_a_leaf_module_imports_nothing_above_it(module: str) -> None:
    leaked = _offending(_imported_after(module), ABOVE_LEAF)
    assert leaked == [], f"importing {module} imported {leaked}"


def test_the_service_knows_no_transport_and_no_runtime() -> None:
    """The RPC layer sits under the transport and beside the runtime."""
    loaded = _imported_after("reactantserver.service")
    leaked = _offending(
        loaded,
        ("reactantserver.transport", "reactantserver.runtime", "reactantserver.worker", "jax"),
    )
    assert leaked == []
    assert "betterproto" in loaded  # it speaks protocol messages: the layer is right


def test_the_runtime_knows_no_service_and_no_transport() -> None:
    """The runtime's executor and weight drivers speak records, not protocol messages."""
    loaded = _imported_after("reactantserver.runtime.weight_provider")
    leaked = _offending(
        loaded,
        (
            "reactantserver.transport",
            "reactantserver.service",
            "reactantserver.worker",
            "reactantserver.protocol",
            "betterproto",
        ),
    )
    assert leaked == []

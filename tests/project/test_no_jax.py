"""Modules that must import without JAX.

The client, config, bundle parsing, the scheduler and the generated protocol modules
are used by processes that never touch a device (the gateway, simulations, clients),
so importing them must not pull in JAX. Each check runs in a fresh interpreter and
looks at ``sys.modules`` afterwards.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

JAX_FREE = [
    "reactantserver",
    "reactantserver.errors",
    "reactantserver.tensors",
    "reactantserver.config",
    "reactantserver.cli",
    "reactantserver.protocol.inference",
    "reactantserver.protocol.reactant_control",
    "reactantserver.protocol.grpc.health.v1",
    "reactantserver.scheduling",
    "reactantserver.bundle",
    "reactantserver.weights",
    "reactantserver.service",
    "reactantserver.inferio",
    "reactantserver.transport.core.limits",
    "reactantserver.transport.core.framing",
    "reactantserver.transport.core.faultlog",
    "reactantserver.transport.h2guard",
    "reactantserver.transport.h2conn",
    "reactantserver.transport.server",
    "reactantserver.status",
    "reactantserver.models",
    "reactantserver.shm",
    "reactantserver.admin",
    "reactantserver.hooks",
    "reactantserver.client",
    "reactantserver.lifecycle",
    "reactantserver.meta",
    "reactantserver.gateway",
    "reactantserver.gateway.core.control",
    "reactantserver.gateway.lpt",
    "reactantserver.gateway.app",
    "reactantserver.fleet",
    "reactantserver.fleet.host",
    "reactantserver.planning",
    "reactantserver.planning.plan",
    "reactantserver.planning.command",
    "reactantserver.planning.calibrate",
    "reactantserver.node",
    "reactantserver.client.coerce",
    "reactantserver.startup",
    "reactantserver.announce",
    "reactantserver.config.paths",
    "reactantserver.records",
    "reactantserver.host",
    "reactantserver.messages",
    "reactantserver.statistics",
    "reactantserver.metrics",
    "reactantserver.protocol.codec",
    "reactantserver.changes",
    "reactantserver.threads",
]


@pytest.mark.parametrize("module", JAX_FREE)
def test_module_imports_without_jax(module: str) -> None:
    assert importlib.util.find_spec(module) is not None, f"{module} does not exist"
    code = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        "leaked = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib')))\n"
        "print(','.join(leaked))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} imported {out.stdout.strip()}"


#: The sans-IO halves of the transport: no grpclib, h2 or asyncio either, so a gateway,
#: the metrics collector and the tests read limits and rules without the wire stack.
WIRE_STACK_FREE = [
    "reactantserver.transport.core.limits",
    "reactantserver.transport.core.framing",
    "reactantserver.transport.core.faultlog",
    "reactantserver.transport.core.reclaim",
]


@pytest.mark.parametrize("module", WIRE_STACK_FREE)
def test_module_imports_without_the_wire_stack(module: str) -> None:
    code = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpclib', 'h2', 'hpack', 'asyncio'))\n"
        "print(','.join(leaked))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} imported {out.stdout.strip()}"


def test_public_scheduler_name_without_jax() -> None:
    code = (
        "import sys, reactantserver\n"
        "reactantserver.Scheduler\n"
        "print(any(m == 'jax' or m.startswith('jax.') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gateway_core_is_sans_io() -> None:
    """The gateway's core decides without I/O: importing it -- and the wire peek, the HTTP/2
    client state machine, the request counters, the request path's rules (admission,
    failover, stream slots) and a forwarded call's states -- pulls in no event loop, gRPC
    library, protobuf runtime or JAX (the gateway's I/O converts to and from messages)."""
    code = (
        "import sys, reactantserver.gateway, reactantserver.gateway.core.wire\n"
        "import reactantserver.h2.client, reactantserver.gateway.core.stats\n"
        "import reactantserver.gateway.core.inflight, reactantserver.gateway.core.routing\n"
        "import reactantserver.gateway.core.callstate\n"
        "roots = ('trio', 'asyncio', 'grpclib', 'betterproto', 'google', 'jax', 'jaxlib')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_gateway_process_has_no_trio_asyncio() -> None:
    """The gateway runs Trio as asyncio's guest: nothing it imports brings trio-asyncio (whose
    import patches asyncio's loop lookup process-wide)."""
    code = (
        "import sys, reactantserver.gateway.app, reactantserver.cli\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('trio_asyncio'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

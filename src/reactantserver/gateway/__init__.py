"""The gateway: one endpoint in front of many workers, a sans-IO core and the I/O that drives it.

One gateway process fronts many workers (one per GPU). Its core (``core``, the
sub-package ``gateway/core/``) decides and does no I/O: no sockets, no clock, no asyncio,
no trio, no grpclib, no JAX (``tests/project/test_import_graph.py`` holds it to that,
through everything it imports). The gateway's I/O, the modules of this folder, converts
what it hears into the core's records, calls the core, and carries out what it returns;
the fleet simulator (``reactantserver.fleet``) drives the very same core objects in
virtual time. The core's modules are listed in ``gateway/core/__init__.py``.

The I/O (asyncio, trio, sockets or grpclib):

``app``        the process: Trio supervising the proxy, the prober and the admin port
``proxy``      every RPC of the Triton surface, on asyncio
``forward``    one forwarded ModelInfer, from the client's call to a worker's answer
``calls``      what the handlers share: the raw codec, the call record (grpclib's errors)
``pool``       one worker as the gateway talks to it: connection, stream slots, counters
``channel``    the connections to the workers: unary gRPC over the transport's client role
``fanout``     the RPCs answered by asking every worker, then merged
``prober``     discovery: a probe round every ``health_interval_seconds``
``lpt``        lpt_packing in the process: the repack driver and the control plane
``scrape``     the workers' metrics, fetched at scrape time
``metrics``    the gateway's Prometheus collector over the parts above

The package re-exports the core only: ``import reactantserver.gateway`` imports none of
the I/O. See docs/gateway.md.
"""

from __future__ import annotations

from .core.control import (
    Compaction,
    LptController,
    RepackOutcome,
    ResidencyChange,
    SchedulingStatus,
)
from .core.estimates import Estimate, LoadEstimator, RepackCadence, ewma
from .core.packing import ModelDemand, PackPolicy, PackResult, Placement, WorkerCapacity, pack
from .core.policy import check_repack_wait, not_lpt, policy_value
from .core.routing import (
    FillRouter,
    LeastOutstandingRouter,
    RoundRobinRouter,
    Router,
    RouterStatistics,
    Ticket,
    make_router,
    quantum,
)
from .core.table import ModelSnapshot, Replica, RouteTable, WorkerSnapshot, build_table, items_of

__all__ = [
    "Compaction",
    "Estimate",
    "FillRouter",
    "LeastOutstandingRouter",
    "LoadEstimator",
    "LptController",
    "ModelDemand",
    "ModelSnapshot",
    "PackPolicy",
    "PackResult",
    "Placement",
    "RepackCadence",
    "RepackOutcome",
    "Replica",
    "ResidencyChange",
    "RoundRobinRouter",
    "RouteTable",
    "Router",
    "RouterStatistics",
    "SchedulingStatus",
    "Ticket",
    "WorkerCapacity",
    "WorkerSnapshot",
    "build_table",
    "check_repack_wait",
    "ewma",
    "items_of",
    "make_router",
    "not_lpt",
    "pack",
    "policy_value",
    "quantum",
]

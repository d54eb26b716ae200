"""The gateway's sans-IO core: route table, routers, the lpt_packing packer and estimates.

One gateway process fronts many workers (one per GPU). Everything here decides and nothing
here does I/O: no sockets, no clock, no trio, no grpclib, no protobuf, no JAX. The gateway's
I/O (the gRPC proxy, the prober, the admin port) converts what it hears into the records
below, calls these objects, and carries out what they return; the fleet simulator
(``reactantserver.fleet``) drives the very same objects in virtual time.

Modules, one concern each:

``table``      the immutable route table built from the workers' probe answers
               (replicas per model, batch axis, learned cost per item, fleet totals)
``routing``    the Router seam: round_robin, least_outstanding and lpt_packing fill routing;
               choose / failover / release and in-flight accounting
``packing``    the LPT packer: a pure function from demand, weight bytes and budgets to a
               placement, with hysteresis and the oversubscription warning
``estimates``  rate and cost EWMAs on the fleet-compute clock; the repack cadence
``control``    the lpt_packing controller: repack, control-RPC semantics, status records
``policy``     GatewayControlService values: checked against gateway.yml's rules

See docs/gateway.md.
"""

from __future__ import annotations

from .control import (
    Compaction,
    LptController,
    RepackOutcome,
    ResidencyChange,
    SchedulingStatus,
)
from .estimates import Estimate, LoadEstimator, RepackCadence, ewma
from .packing import ModelDemand, PackPolicy, PackResult, Placement, WorkerCapacity, pack
from .policy import check_repack_wait, not_lpt, policy_value
from .routing import (
    FillRouter,
    LeastOutstandingRouter,
    RoundRobinRouter,
    Router,
    RouterStatistics,
    Ticket,
    make_router,
    quantum,
)
from .table import ModelSnapshot, Replica, RouteTable, WorkerSnapshot, build_table, items_of

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

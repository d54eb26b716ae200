"""The fleet simulator: N simulated workers behind the real gateway router, in virtual time.

:mod:`.simulator` runs the worker's real scheduling and weight-cache policies
(:mod:`reactantserver.scheduling`, :mod:`reactantserver.weights`) behind the gateway's real
router and LPT controller (:mod:`reactantserver.gateway`); :mod:`.report` holds what a run
reports, :mod:`.host` the host's cores as a resource (what makes a batch slower under load). It lives above both packages because it imports both: the worker's scheduling
package stays free of the gateway (``docs/fleet.md`` is the user's guide).
"""

from __future__ import annotations

from .report import (
    FleetModelReport,
    FleetReport,
    FleetWorkerReport,
    LoadEvent,
    RepackEvent,
    moved_models,
    percentile,
)
from .simulator import (
    ClosedLoop,
    FleetModel,
    FleetSimulation,
    FleetWorker,
    offered_fleet_load,
    simulate_fleet,
    zipf_fleet_catalog,
)

__all__ = [
    "ClosedLoop",
    "FleetModel",
    "FleetModelReport",
    "FleetReport",
    "FleetSimulation",
    "FleetWorker",
    "FleetWorkerReport",
    "LoadEvent",
    "RepackEvent",
    "moved_models",
    "offered_fleet_load",
    "percentile",
    "simulate_fleet",
    "zipf_fleet_catalog",
]

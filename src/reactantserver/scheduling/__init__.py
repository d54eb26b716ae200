"""Scheduling: which model's requests run next on the one device, and in what batch.

The package is split the sans-IO way (see ``docs/scheduling.md``):

* ``policy.SchedulingPolicy`` -- the synchronous core (queues, disciplines,
  coalescing, shedding, learned costs); given ``now``, returns decisions.
  ``batching`` (row planning), ``cost`` (EMAs), ``queues`` and ``candidates``
  are its parts, ``records`` the values it hands out (requests, batches, decisions,
  statistics).
* ``dispatch.Scheduler`` -- the thin Trio driver: one device execution at a time,
  dispatch timeout, cancellation, shutdown. ``reactantserver.Scheduler`` is this class.
* ``simulate`` -- a cost-model executor and workload generator to run the real
  ``Scheduler`` under virtual time.

Nothing here imports JAX. Assembling a batch's data (gather, pad, scatter) is the
executor's job: ``reactantserver.runtime.assemble``.
"""

from .batching import Plan, plan_batch
from .dispatch import Executor, Health, Prefetcher, Scheduler, SchedulerStatistics
from .policy import SchedulingPolicy, check_weight
from .records import (
    Batch,
    Decision,
    ModelStatistics,
    PolicyStatistics,
    Request,
    RequestState,
)

__all__ = [
    "Batch",
    "Decision",
    "Executor",
    "Health",
    "ModelStatistics",
    "Plan",
    "PolicyStatistics",
    "Prefetcher",
    "Request",
    "RequestState",
    "Scheduler",
    "SchedulerStatistics",
    "SchedulingPolicy",
    "check_weight",
    "plan_batch",
]

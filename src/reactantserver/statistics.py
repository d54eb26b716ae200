"""What a worker reports about itself: one frozen :class:`WorkerStatistics` record.

Trio's habit: a primitive's ``statistics()`` returns a frozen snapshot that a reader may
keep while the primitive moves on. ``Worker.statistics()`` builds this record once per
``/metrics`` scrape, from the statistics of its parts (the scheduler, the service, the
weight provider, the meta runner, the model versions), and the Prometheus collector
(``reactantserver.metrics``) reads nothing else -- no worker internals, no second
snapshot of the scheduler. This module sits below both, so neither imports the other.

Leaf in the layering sense: no transport, runtime, protocol or JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from .energy import EnergyStatistics
from .histogram import HistogramSnapshot
from .lifecycle import ModelRecord
from .meta import MetaStatistics
from .records import ControlStatus, RequestStatistics, ServiceStatistics
from .scheduling import SchedulerStatistics
from .weights import MemoryStats, WeightCacheStatistics

if TYPE_CHECKING:  # a plain record of the wire layer; typed only, so this stays a leaf
    from .transport.core.limits import WireStatistics

__all__ = ["ServedModelStatistics", "WorkerStatistics"]


@attrs.frozen(kw_only=True)
class ServedModelStatistics:
    """One compiled model serving now, as the metrics see it."""

    name: str
    #: Rows one dispatch may carry (largest compiled size, capped).
    max_batch_size: int
    weight_nbytes: int
    #: Whether its weights are on the device now.
    resident: bool
    #: Rows per execution, before padding.
    batch_rows: HistogramSnapshot
    #: The service's request side (outcomes by status, latency).
    requests: RequestStatistics


@attrs.frozen(kw_only=True)
class WorkerStatistics:
    """A snapshot of one worker (see the module docstring)."""

    #: The worker's name and its device: the labels of every series. ``gpu`` is the
    #: device this process was given in ``CUDA_VISIBLE_DEVICES`` (an index or a UUID, as
    #: the node supervisor passes it) when that names one device, else the configured
    #: ordinal, so workers of one machine never share a label.
    name: str
    gpu: str
    backend: str
    control_mode: str
    discipline: str
    #: ServerReady / ``/readyz``.
    ready: bool
    scheduler: SchedulerStatistics
    service: ServiceStatistics
    #: What ModelControlStatus answers (residency mode, per-model residency).
    control: ControlStatus
    #: Compiled models serving now, by name.
    models: tuple[ServedModelStatistics, ...]
    #: Every known model name's lifecycle state, and failed loads per name.
    lifecycle: Mapping[str, ModelRecord]
    load_failures: Mapping[str, int]
    #: Repository polls of dynamic mode's watcher (both 0 in the other modes).
    repository_polls: int
    repository_poll_failures: int
    #: Bytes of model weights on the device.
    resident_weight_bytes: int
    #: The on-demand weight cache; ``None`` when it is off.
    weight_cache: WeightCacheStatistics | None
    meta: MetaStatistics
    #: Device allocator statistics; ``None`` where the backend reports none (the CPU).
    memory: MemoryStats | None
    #: The gRPC wire layer's counts: connections, streams, client mistakes by kind.
    wire: WireStatistics
    #: Energy attributed to models and idle; ``None`` where the device's energy is not
    #: measured (no NVML counter, no readable RAPL): then no energy series is exported.
    energy: EnergyStatistics | None = None
    #: ``cost.device_hour``, the price of one hour of this device; ``None`` when unset.
    cost_device_hour: float | None = None

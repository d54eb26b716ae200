"""What a fleet simulation reports: frozen records, and their text tables.

``FleetReport`` is the whole run (throughput, latency percentiles, weight loads, idle time,
repacks, the packer's warnings), with one ``FleetWorkerReport`` per worker and one
``FleetModelReport`` per model. Statistics cover the window ``[warmup, duration)``: device
time is clipped to it; latencies and loads count events that happened in it. Two logs say
what happened when: ``repack_log`` every lpt_packing repack of the whole run (warm-up
included: when, why, which models moved, the placement after it) and ``load_log`` every
weight load finished in the window (when, on which worker, which model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from reactantserver.histogram import percentile

__all__ = [
    "FleetModelReport",
    "FleetReport",
    "FleetWorkerReport",
    "LoadEvent",
    "RepackEvent",
    "moved_models",
    "percentile",
]


@attrs.frozen(kw_only=True)
class RepackEvent:
    """One repack of the simulated lpt_packing controller."""

    #: Virtual time, seconds from the start of the run.
    at: float
    #: ``startup``, ``compute``, ``operator`` or ``fleet``.
    trigger: str
    #: The fleet compute seconds on the controller's clock when it ran.
    fleet_compute: float
    #: Models whose worker set this repack changed, sorted.
    moved: tuple[str, ...]
    #: Model -> workers after it.
    placement: Mapping[str, tuple[str, ...]]


@attrs.frozen(kw_only=True)
class LoadEvent:
    """One weight load finished in the window."""

    at: float
    worker: str
    model: str


def moved_models(
    before: Mapping[str, tuple[str, ...]], after: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """Models whose worker set differs between two placements, sorted."""
    names = set(before) | set(after)
    return tuple(sorted(n for n in names if set(before.get(n, ())) != set(after.get(n, ()))))


@attrs.frozen(kw_only=True)
class FleetModelReport:
    name: str
    completed: int
    rejected: int
    p50: float
    p99: float
    mean: float
    mean_batch_rows: float
    #: Workers that served it in the window.
    workers: tuple[str, ...]


@attrs.frozen(kw_only=True)
class FleetWorkerReport:
    name: str
    #: Fractions of the window spent executing, waiting for a batch's weights to load (a
    #: transfer overlapped with execution costs nothing), and idle.
    compute: float
    loading: float
    idle: float
    weight_loads: int
    dispatches: int
    mean_batch_rows: float
    #: Models placed on it at the end (lpt_packing), or that it served.
    models: tuple[str, ...]
    #: Copy-engine seconds of the weight loads it finished in the window.
    load_seconds: float = 0.0
    #: Fraction of the window spent on per-request worker CPU (``FleetWorker.request_seconds``)
    #: between executions; ``compute + request_cpu + loading + idle = 1``.
    request_cpu: float = 0.0


@attrs.frozen(kw_only=True)
class FleetReport:
    mode: str
    workers: tuple[FleetWorkerReport, ...]
    models: tuple[FleetModelReport, ...]
    window: float
    completed: int
    rejected: int
    weight_loads: int
    repacks: Mapping[str, int]
    warnings: tuple[str, ...]
    #: Latency percentiles over every request of the window, seconds.
    p50: float = math.nan
    p99: float = math.nan
    #: Every repack of the run, in order (lpt_packing; empty in the other modes).
    repack_log: tuple[RepackEvent, ...] = ()
    #: Every weight load finished in the window, in order.
    load_log: tuple[LoadEvent, ...] = ()
    #: Host name -> the share of its free cores busy in the window (``hosts=``; empty
    #: without the host model).
    host_busy: Mapping[str, float] = attrs.field(factory=dict)

    def placement_at(self, t: float) -> Mapping[str, tuple[str, ...]]:
        """The lpt_packing placement in force at virtual time ``t`` (after every repack at
        or before ``t``; empty before the first)."""
        placement: Mapping[str, tuple[str, ...]] = {}
        for event in self.repack_log:
            if event.at > t:
                break
            placement = event.placement
        return placement

    def moved_between(self, start: float, end: float) -> tuple[str, ...]:
        """Models whose worker set differs between the placements at ``start`` and ``end``
        (a model moved away and back counts as not moved, as two snapshots of a live
        gateway's placement see it)."""
        return moved_models(self.placement_at(start), self.placement_at(end))

    @property
    def throughput(self) -> float:
        """Requests answered per second over the window."""
        return self.completed / self.window if self.window > 0 else 0.0

    @property
    def loads_per_second(self) -> float:
        return self.weight_loads / self.window if self.window > 0 else 0.0

    @property
    def mean_load_seconds(self) -> float:
        """Mean duration of one weight load in the window (NaN with none): what to compare
        with a live worker's ``worker_weight_load_seconds_total`` per load."""
        loads = sum(w.weight_loads for w in self.workers)
        return math.fsum(w.load_seconds for w in self.workers) / loads if loads else math.nan

    @property
    def loads_per_1000(self) -> float:
        return 1000.0 * self.weight_loads / self.completed if self.completed else math.nan

    @property
    def idle(self) -> float:
        """Mean device idle fraction over the workers."""
        return math.fsum(w.idle for w in self.workers) / len(self.workers) if self.workers else 0.0

    @property
    def mean_batch_rows(self) -> float:
        rows = math.fsum(w.mean_batch_rows * w.dispatches for w in self.workers)
        dispatches = sum(w.dispatches for w in self.workers)
        return rows / dispatches if dispatches else 0.0

    def format(self, *, rows: int | None = None) -> str:
        out = [
            f"mode={self.mode}  throughput={self.throughput:.1f} req/s  p50={self.p50 * 1e3:.1f} ms  "
            f"p99={self.p99 * 1e3:.1f} ms  weight loads/s="
            f"{self.loads_per_second:.2f} ({self.loads_per_1000:.1f} per 1000 requests)  "
            f"idle={self.idle:.1%}  mean batch rows={self.mean_batch_rows:.2f}  "
            f"rejected={self.rejected}  repacks={dict(self.repacks)}",
            "",
            f"{'worker':>8} {'compute':>8} {'loading':>8} {'idle':>6} {'loads':>6} "
            f"{'batches':>8} {'rows/b':>6}  models",
        ]
        for w in self.workers:
            shown = " ".join(w.models[:8]) + (" ..." if len(w.models) > 8 else "")
            out.append(
                f"{w.name:>8} {w.compute:>8.1%} {w.loading:>8.1%} {w.idle:>6.1%} "
                f"{w.weight_loads:>6} {w.dispatches:>8} {w.mean_batch_rows:>6.2f}  {shown}"
            )
        out += ["", f"{'model':>6} {'done':>7} {'p50 ms':>8} {'p99 ms':>8} {'rows/b':>6}  workers"]
        shown_models = self.models if rows is None else self.models[:rows]
        for m in shown_models:
            out.append(
                f"{m.name:>6} {m.completed:>7} {m.p50 * 1e3:>8.1f} {m.p99 * 1e3:>8.1f} "
                f"{m.mean_batch_rows:>6.2f}  {' '.join(m.workers)}"
            )
        if rows is not None and rows < len(self.models):
            out.append(f"{'...':>6} ({len(self.models) - rows} more)")
        return "\n".join(out)

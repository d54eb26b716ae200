"""Prometheus metrics of a worker, read from statistics records at scrape time.

Nothing on the request path touches prometheus-client: the scheduler, the service
and the models keep plain counters, and ``WorkerCollector.collect`` turns one frozen
:class:`~reactantserver.statistics.WorkerStatistics` snapshot into metric families
when ``/metrics`` is scraped. The collector is given the function that takes the
snapshot (``Worker.statistics``) and reads nothing else, so it knows no worker
internals and imports nothing above ``reactantserver.statistics``. It is registered on
a registry the worker creates (never the process-global one), so several workers in
one process (tests) do not mix.

Every series carries ``worker`` (the worker's name) and ``gpu`` (the device ordinal)
labels so a gateway or a Prometheus server can merge several workers. Names follow
Prometheus conventions: base units (seconds, bytes), ``_total`` on counters. The
full list, with meanings, is in ``docs/monitoring.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .lifecycle import ModelState
from .statistics import WorkerStatistics

if TYPE_CHECKING:  # a plain record of the wire layer, read as data: metrics stays a leaf
    from .transport.core.limits import WireStatistics


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, doc: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


#: Per-model series read from the scheduler's ModelStatistics: attribute, kind, name, help.
_SCHEDULER_SERIES: tuple[tuple[str, type, str, str], ...] = (
    ("dispatches", CounterMetricFamily, "worker_dispatch", "Device executions (batches)."),
    ("compute_seconds", CounterMetricFamily, "worker_compute_seconds", "Device execution time."),
    ("requests", CounterMetricFamily, "worker_requests_served", "Requests answered by the device."),
    ("rows", CounterMetricFamily, "worker_rows_served", "Batch rows answered by the device."),
    (
        "shed",
        CounterMetricFamily,
        "worker_requests_deadline_shed",
        "Requests dropped at dispatch because their deadline could not be met.",
    ),
    (
        "rejected",
        CounterMetricFamily,
        "worker_requests_queue_full",
        "Requests refused because the model's queue was full.",
    ),
    ("queue_depth", GaugeMetricFamily, "worker_queue_depth", "Requests waiting in the queue."),
)


def wire_metrics(base: dict[str, str], wire: WireStatistics) -> Iterator[Metric]:
    """The gRPC wire layer's series: connections, streams, client errors by kind."""
    yield _gauge(
        "worker_grpc_connections_open", "Open gRPC connections.", base, wire.connections_open
    )
    for key, value, doc in (
        ("accepted", wire.connections_accepted, "gRPC connections accepted."),
        (
            "refused",
            wire.connections_refused,
            "Connections refused with GOAWAY at endpoints.max_connections.",
        ),
        (
            "evicted",
            wire.connections_evicted,
            "Connections closed in their handshake to make room (endpoints.max_connections).",
        ),
        (
            "idle_closed",
            wire.connections_idle_closed,
            "Connections closed after endpoints.idle_timeout_seconds without a call.",
        ),
    ):
        yield _counter(f"worker_grpc_connections_{key}", doc, base, value)
    yield _gauge(
        "worker_grpc_streams_open", "gRPC calls (HTTP/2 streams) open now.", base, wire.streams_open
    )
    errors = CounterMetricFamily(
        "worker_grpc_client_errors",
        "Client mistakes caught by the wire layer, by kind (docs/grpc.md).",
        labels=[*base, "kind"],
    )
    for kind, n in sorted(wire.faults.items()):
        errors.add_metric([*base.values(), kind], n)
    yield errors


class WorkerCollector(Collector):
    """Collects a worker's metrics from one statistics snapshot per scrape."""

    def __init__(self, statistics: Callable[[], WorkerStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        w = self._statistics()
        base = {"worker": w.name, "gpu": w.gpu}
        sched, service = w.scheduler, w.service

        info = {
            **base,
            "backend": w.backend,
            "control_mode": w.control_mode,
            "discipline": w.discipline,
            "residency_mode": w.control.residency_mode,
        }
        yield _gauge("worker_info", "Static facts about this worker (always 1).", info, 1)
        yield _gauge("worker_ready", "1 when the worker is ready to serve.", base, int(w.ready))
        yield _gauge(
            "worker_inflight_requests",
            "ModelInfer calls being served now.",
            base,
            service.in_flight,
        )
        yield _gauge(
            "worker_max_concurrent_requests",
            "endpoints.max_concurrent_requests (0 = uncapped).",
            base,
            service.max_concurrent_requests,
        )
        yield _counter(
            "worker_requests_shed",
            "ModelInfer calls refused because max_concurrent_requests were in flight.",
            base,
            service.shed_total,
        )
        yield _counter(
            "worker_dispatch_overruns",
            "Executions that exceeded scheduler.dispatch_timeout_seconds.",
            base,
            sched.overruns,
        )
        yield _counter(
            "worker_dispatch_failures",
            "Executions that failed or overran.",
            base,
            sched.failed_dispatches,
        )
        where = CounterMetricFamily(
            "worker_dispatches_by_place",
            "Executions run inline on the dispatch loop (tiny programs, CPU) or on the "
            "device thread.",
            labels=[*base, "place"],
        )
        where.add_metric([*base.values(), "inline"], sched.inline_dispatches)
        where.add_metric([*base.values(), "device_thread"], sched.threaded_dispatches)
        yield where
        yield _gauge("worker_models_loaded", "Models being served.", base, len(w.models))
        yield _gauge(
            "worker_resident_weight_bytes",
            "Bytes of model weights on the device.",
            base,
            w.resident_weight_bytes,
        )

        rpcs = CounterMetricFamily(
            "worker_grpc_calls",
            "Finished gRPC calls by method and status code.",
            labels=[*base, "rpc", "status"],
        )
        for (rpc, code), n in sorted(service.rpcs.items()):
            rpcs.add_metric([*base.values(), rpc, code], n)
        yield rpcs

        yield from wire_metrics(base, w.wire)
        yield from _energy(base, w)
        yield from _per_model(base, w)
        yield from _lifecycle(base, w)
        yield from _weight_cache(base, w)

        meta = w.meta
        yield _gauge(
            "worker_meta_running", "Meta-model requests running their glue now.", base, meta.running
        )
        yield _gauge(
            "worker_meta_waiting",
            "Meta-model requests waiting for a slot (scheduler.meta_concurrency).",
            base,
            meta.waiting,
        )
        yield _counter(
            "worker_meta_run_errors",
            "Meta-model requests whose run() raised (sub-call errors not counted).",
            base,
            meta.run_errors,
        )

        mem = w.memory
        if mem is not None:
            for key, value, doc in (
                ("in_use", mem.in_use, "Device memory in use."),
                ("limit", mem.limit, "Device memory the allocator may use."),
                ("peak_in_use", mem.peak, "Peak device memory in use."),
            ):
                yield _gauge(f"worker_device_memory_{key}_bytes", doc, base, value)


def _energy(base: dict[str, str], w: WorkerStatistics) -> Iterator[Metric]:
    """Energy per model and idle (docs/monitoring.md#energy-and-cost-per-model), and the
    device's price. Where energy is not measured only ``worker_energy_measured`` (0) is
    exported: an absent series, never a made-up 0 joules."""
    energy = w.energy
    source = energy.source if energy is not None else "none"
    yield _gauge(
        "worker_energy_measured",
        "1 when the device's energy counter is read (label source: nvml, rapl); 0 with "
        "source none where it cannot be.",
        {**base, "source": source},
        int(energy is not None),
    )
    if w.cost_device_hour is not None:
        yield _gauge(
            "worker_cost_device_hour",
            "cost.device_hour: the price of one hour of this device.",
            base,
            w.cost_device_hour,
        )
    if energy is None:
        return
    per_model = CounterMetricFamily(
        "worker_energy_joules",
        "Device energy attributed to the model by its share of device time.",
        labels=[*base, "model"],
    )
    for model, joules in sorted(energy.model_joules.items()):
        per_model.add_metric([*base.values(), model], joules)
    yield per_model
    yield _counter(
        "worker_idle_energy_joules",
        "Device energy while no model executed (the part of each interval not attributed).",
        base,
        energy.idle_joules,
    )
    if energy.watts is not None:
        yield _gauge(
            "worker_device_power_watts",
            "The device's power at the last reading (NVML), or the last interval's mean (RAPL).",
            base,
            energy.watts,
        )
    yield _counter(
        "worker_energy_counter_resets",
        "Intervals dropped because the energy counter went backwards (driver reload).",
        base,
        energy.resets,
    )


def _weight_cache(base: dict[str, str], w: WorkerStatistics) -> Iterator[Metric]:
    """The on-demand weight cache (docs/on_demand_weights.md); its series exist only
    while the cache is on, except ``worker_models_resident``."""
    yield _gauge(
        "worker_models_resident",
        "Models whose weights are on the device now.",
        base,
        sum(m.resident for m in w.models),
    )
    stats = w.weight_cache
    if stats is None:
        return
    cache, budget = stats.policy, stats.budget
    for name, value, doc in (
        ("cache_resident", cache.resident_bytes, "On-demand weights loading or resident."),
        ("cache_max", budget.on_demand, "The on-demand budget (the LRU's cap)."),
        ("cache_pinned", cache.pinned_bytes, "Weights of residency: device models."),
        ("cache_max_scratch", budget.max_scratch, "Execution scratch held back (probe)."),
        ("pool", budget.weight_pool, "Bytes for all weights, pinned plus on demand."),
        ("cache_arena", budget.arena, "The device memory arena the budget is cut from."),
        ("host", cache.host_bytes, "Weights with a host copy now (system copies, maps)."),
    ):
        yield _gauge(f"worker_weight_{name}_bytes", doc, base, value)
    counters: tuple[tuple[str, float, str], ...] = (
        ("loads", cache.loads, "Completed on-demand weight loads (prefetches included)."),
        ("evicts", cache.evictions, "On-demand weights evicted to make room."),
        ("load_seconds", cache.load_seconds, "Time spent in on-demand weight loads."),
        ("load_failures", cache.load_failures, "Weight loads that failed."),
        ("cache_hits", cache.hits, "Acquires that found the weights on the device."),
        ("cache_misses", cache.misses, "Acquires that had to load the weights."),
        ("prefetches", cache.prefetches, "Loads started ahead of dispatch."),
        ("prefetch_hits", cache.prefetch_hits, "Prefetched weights then used."),
        ("prefetch_wasted", cache.prefetch_wasted, "Prefetched weights evicted unused."),
        ("oversize_loads", cache.oversize_loads, "Loads of a model larger than the budget."),
        ("compactions", cache.compactions, "Compactions (interval or CompactMemory)."),
    )
    for name, total, doc in counters:
        yield _counter(f"worker_weight_{name}", doc, base, total)
    pinned = GaugeMetricFamily(
        "worker_model_pinned",
        "1 when the model's residency is device (never evicted).",
        labels=[*base, "model"],
    )
    for info in w.control.models:
        pinned.add_metric([*base.values(), info.name], int(info.residency == "device"))
    yield pinned


def _lifecycle(base: dict[str, str], w: WorkerStatistics) -> Iterator[Metric]:
    """Every known model's lifecycle state (one series per state, 1 = current) and
    its failed loads, including models that are not serving (failed, unloaded)."""
    labels = [*base, "model"]
    states = GaugeMetricFamily(
        "worker_model_state",
        "1 for the lifecycle state each known model is in, 0 for the others "
        "(unloaded, loading, ready, reloading, draining, failed).",
        labels=[*labels, "state"],
    )
    for name, record in sorted(w.lifecycle.items()):
        for state in ModelState:
            states.add_metric([*base.values(), name, state.value], int(state is record.state))
    failures = CounterMetricFamily(
        "worker_model_load_failures",
        "Model versions that failed to load (bundle, compile or warm-up errors).",
        labels=labels,
    )
    for name, n in sorted(w.load_failures.items()):
        failures.add_metric([*base.values(), name], n)
    yield from (states, failures)
    yield _counter(
        "worker_repository_polls",
        "Repository polls the watcher completed (dynamic mode).",
        base,
        w.repository_polls,
    )
    yield _counter(
        "worker_repository_poll_failures",
        "Repository polls that could not list the repository.",
        base,
        w.repository_poll_failures,
    )


def _per_model(base: dict[str, str], w: WorkerStatistics) -> Iterator[Metric]:
    labels = [*base, "model"]
    from_scheduler = [
        (attr, kind(name, doc, labels=labels)) for attr, kind, name, doc in _SCHEDULER_SERIES
    ]
    max_batch = GaugeMetricFamily(
        "worker_model_max_batch_size",
        "Rows one dispatch may carry (largest compiled size, capped).",
        labels=labels,
    )
    weight_bytes = GaugeMetricFamily(
        "worker_model_weight_bytes", "Bytes of the model's weights.", labels=labels
    )
    batch_cost = GaugeMetricFamily(
        "worker_model_batch_cost_seconds",
        "Learned device seconds of one execution at each compiled batch size.",
        labels=[*labels, "batch_size"],
    )
    batch_fastest = GaugeMetricFamily(
        "worker_model_batch_fastest_seconds",
        "The fastest execution seen at each compiled batch size.",
        labels=[*labels, "batch_size"],
    )
    resident = GaugeMetricFamily(
        "worker_model_resident", "1 when the model's weights are on the device.", labels=labels
    )
    batch_rows = HistogramMetricFamily(
        "worker_batch_rows", "Rows per device execution, before padding.", labels=labels
    )
    latency = HistogramMetricFamily(
        "worker_request_latency_seconds",
        "ModelInfer latency from receipt to answer.",
        labels=labels,
    )
    outcomes = CounterMetricFamily(
        "worker_requests",
        "Finished ModelInfer calls by gRPC status code (OK, INVALID_ARGUMENT, ...).",
        labels=[*labels, "status"],
    )
    stats = w.scheduler.policy.models
    for model in w.models:
        lv = [*base.values(), model.name]
        s = stats.get(model.name)
        if s is not None:
            for attr, family in from_scheduler:
                family.add_metric(lv, getattr(s, attr))
            for size, seconds in s.costs:
                batch_cost.add_metric([*lv, str(size)], seconds)
            for size, seconds in s.fastest:
                batch_fastest.add_metric([*lv, str(size)], seconds)
        max_batch.add_metric(lv, model.max_batch_size)
        weight_bytes.add_metric(lv, model.weight_nbytes)
        resident.add_metric(lv, int(model.resident))
        rows = model.batch_rows
        batch_rows.add_metric(lv, list(rows.buckets), rows.total)
        req = model.requests
        for code, n in sorted(req.by_status.items()):
            outcomes.add_metric([*lv, code], n)
        if req.latency is not None:
            latency.add_metric(lv, list(req.latency.buckets), req.latency.total)
    for _, family in from_scheduler:
        yield family
    yield from (max_batch, weight_bytes, batch_cost, batch_fastest, resident, batch_rows)
    yield from (latency, outcomes)

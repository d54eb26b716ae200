"""The gateway's Prometheus metrics, read from frozen statistics records at scrape time.

Nothing on the request path touches prometheus-client: the proxy, the router, the worker
clients and the prober keep plain counters, and :class:`GatewayCollector` turns snapshots
of them into metric families when ``/metrics`` is scraped, followed by the workers' own
families (:mod:`.scrape`), each sample labelled with its ``worker``. The registry is the
gateway's own (never the process-global one). ``docs/monitoring.md`` lists every series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..histogram import HistogramSnapshot
from ..transport.core.limits import Fault, WireCounters
from .core.control import LptController, SchedulingStatus
from .core.energy import energy_series
from .core.routing import Router, RouterStatistics
from .core.stats import GatewayStats
from .pool import WorkerClient
from .prober import Prober
from .scrape import WorkerMetrics


def _one(family: GaugeMetricFamily | CounterMetricFamily, value: float) -> Metric:
    family.add_metric([], value)
    return family


def _histograms(
    family: HistogramMetricFamily, snapshots: Mapping[tuple[str, str], HistogramSnapshot]
) -> Metric:
    """``family`` with one series per label pair of ``snapshots``, in sorted order."""
    for labels, snap in sorted(snapshots.items()):
        family.add_metric(list(labels), list(snap.buckets), snap.total)
    return family


class GatewayCollector(Collector):
    """Collects the gateway's series (see the module docstring)."""

    def __init__(
        self,
        *,
        stats: GatewayStats,
        router: Router,
        prober: Prober,
        clients: Sequence[WorkerClient],
        wire: WireCounters,
        workers: WorkerMetrics,
        mode: str,
        draining: Callable[[], bool],
        lpt: LptController | None = None,
        device_hour: float | None = None,
    ) -> None:
        self._stats = stats
        #: gateway.yml's cost.device_hour (None: unset).
        self._device_hour = device_hour
        self._router = router
        self._prober = prober
        self._clients = tuple(clients)
        self._wire = wire
        self._workers = workers
        self._mode = mode
        self._draining = draining
        self._lpt = lpt

    def collect(self) -> Iterator[Metric]:
        stats = self._stats.statistics()
        routing = self._router.statistics()
        table = self._router.table
        names = {c.address: c.name for c in self._clients}

        info = GaugeMetricFamily(
            "gateway_info", "Static facts about this gateway (always 1).",
            labels=["mode", "work_basis"],
        )  # fmt: skip
        info.add_metric([self._mode, routing.work_basis], 1)
        yield info
        ready, _ = self._prober.ready()
        yield _one(
            GaugeMetricFamily("gateway_ready", "1 when /readyz answers 200 (a worker is ready)."),
            int(ready and not self._draining()),
        )

        requests = CounterMetricFamily(
            "gateway_requests", "Calls answered by the gateway, by RPC, model and status.",
            labels=["rpc", "model", "status"],
        )  # fmt: skip
        for (rpc, model, status), n in sorted(stats.requests.items()):
            requests.add_metric([rpc, model, status], n)
        yield requests
        yield _histograms(
            HistogramMetricFamily(
                "gateway_request_latency_seconds",
                "Gateway-side latency of each call, arrival to answer.",
                labels=["rpc", "model"],
            ),
            stats.latency,
        )
        yield _histograms(
            HistogramMetricFamily(
                "gateway_worker_latency_seconds",
                "Latency of the calls forwarded to each worker (sent to answered).",
                labels=["rpc", "worker"],
            ),
            stats.worker_latency,
        )
        yield _one(
            GaugeMetricFamily(
                "gateway_inflight_requests",
                "ModelInfer calls in flight (the admission cap's count).",
            ),
            stats.infer_in_flight,
        )
        yield _one(
            GaugeMetricFamily("gateway_inflight_calls", "Calls of any RPC being served now."),
            stats.in_flight,
        )
        yield _one(
            CounterMetricFamily(
                "gateway_requests_shed",
                "ModelInfer calls refused with RESOURCE_EXHAUSTED by the admission cap.",
            ),
            stats.shed,
        )
        yield _one(
            GaugeMetricFamily(
                "gateway_max_concurrent_requests",
                "The admission cap: grpc.max_concurrent_requests_per_worker x workers "
                "(0 = uncapped).",
            ),
            stats.max_concurrent,
        )

        yield _one(
            GaugeMetricFamily(
                "gateway_routing_table_size", "Models with at least one ready replica."
            ),
            len(table.models),
        )
        yield _one(
            CounterMetricFamily(
                "gateway_routing_table_generation", "Route tables built (probe rounds)."
            ),
            table.generation,
        )
        yield _one(
            CounterMetricFamily(
                "gateway_refreshes_requested",
                "Route-table refreshes asked for by the request path (unknown model, "
                "NOT_FOUND, connection failure).",
            ),
            stats.refreshes_requested,
        )
        yield _one(
            CounterMetricFamily(
                "gateway_refreshes",
                "Probe rounds run on demand (single flight, at most one a second).",
            ),
            stats.refreshes_run,
        )

        ready_g = GaugeMetricFamily(
            "gateway_worker_ready", "1 when the worker answers probes and is ready.",
            labels=["worker"],
        )  # fmt: skip
        for address, probe in sorted(self._prober.probes.items()):
            ready_g.add_metric([names.get(address, address)], int(probe.ready))
        yield ready_g

        yield from self._routing(routing, names)
        if self._lpt is not None:
            yield from self._placement(self._lpt.status(), names)
        yield from self._clients_series()
        yield from self._wire_series()
        up = GaugeMetricFamily(
            "gateway_worker_metrics_up",
            "1 when the worker's /metrics answered the last scrape (metrics_endpoints).",
            labels=["worker"],
        )
        for label, ok in sorted(self._workers.up.items()):
            up.add_metric([label], int(ok))
        yield up
        yield from energy_series(self._workers.collect(), self._device_hour)
        yield from self._workers.collect()

    def _routing(self, routing: RouterStatistics, names: dict[str, str]) -> Iterator[Metric]:
        outstanding = GaugeMetricFamily(
            "gateway_replica_outstanding",
            "Items (batch rows) in flight per model and worker.",
            labels=["model", "worker"],
        )
        outstanding_requests = GaugeMetricFamily(
            "gateway_replica_outstanding_requests",
            "Requests in flight per model and worker.",
            labels=["model", "worker"],
        )
        routed = CounterMetricFamily(
            "gateway_replica_routed", "Requests routed per model and worker (failovers count "
            "on each worker tried).", labels=["model", "worker"],
        )  # fmt: skip
        routed_items = CounterMetricFamily(
            "gateway_replica_routed_items", "Items routed per model and worker.",
            labels=["model", "worker"],
        )  # fmt: skip
        for r in routing.replicas:
            labels = [r.model, names.get(r.worker, r.worker)]
            outstanding.add_metric(labels, r.outstanding_items)
            outstanding_requests.add_metric(labels, r.outstanding_requests)
            routed.add_metric(labels, r.routed_requests)
            routed_items.add_metric(labels, r.routed_items)
        yield outstanding
        yield outstanding_requests
        yield routed
        yield routed_items
        work = GaugeMetricFamily(
            "gateway_worker_inflight_work",
            "In-flight work per worker in the router's work_basis (compute: estimated "
            "seconds; items; requests).",
            labels=["worker", "basis"],
        )
        for worker, load in routing.workers.items():
            work.add_metric([names.get(worker, worker), routing.work_basis], load.work)
        yield work
        yield _one(
            CounterMetricFamily(
                "gateway_failovers", "Requests moved to another replica (NOT_FOUND, "
                "UNAVAILABLE, or not sent)."
            ),
            routing.failovers,
        )  # fmt: skip
        yield _one(
            CounterMetricFamily(
                "gateway_failovers_exhausted", "Requests whose failover found no replica left."
            ),
            routing.exhausted,
        )
        released = CounterMetricFamily(
            "gateway_routed_requests", "Routed requests by how they ended.", labels=["outcome"]
        )
        for outcome, n in sorted(routing.released.items()):
            released.add_metric([outcome], n)
        yield released

    def _placement(self, status: SchedulingStatus, names: dict[str, str]) -> Iterator[Metric]:
        """lpt_packing's placement and repacks (the controller's status record)."""
        weight = GaugeMetricFamily(
            "gateway_placement_weight",
            "Share of the model's traffic the worker is placed to take (1/k; absent where "
            "it is not placed).",
            labels=["model", "worker"],
        )
        replicas = GaugeMetricFamily(
            "gateway_model_replicas", "Workers the model is placed on (k).", labels=["model"]
        )
        utilization = GaugeMetricFamily(
            "gateway_model_utilization",
            "The model's smoothed load: arrival rate x compute seconds per request (the "
            "fraction of one worker it keeps busy).",
            labels=["model"],
        )
        quantum = GaugeMetricFamily(
            "gateway_model_fill_quantum",
            "Fill quantum Q in items per placed replica (routing_fill_factor x max batch).",
            labels=["model", "worker"],
        )
        for m in status.models:
            replicas.add_metric([m.name], len(m.replicas))
            utilization.add_metric([m.name], m.load)
            for address in m.replicas:
                label = names.get(address, address)
                weight.add_metric([m.name, label], 1.0 / len(m.replicas))
            for address, q in sorted(m.fill_quantum.items()):
                quantum.add_metric([m.name, names.get(address, address)], q)
        yield weight
        yield replicas
        yield utilization
        yield quantum
        repacks = CounterMetricFamily(
            "gateway_repacks", "Repacks by trigger (startup, compute, operator, fleet).",
            labels=["trigger"],
        )  # fmt: skip
        for trigger, n in sorted(status.repacks.items()):
            repacks.add_metric([trigger], n)
        yield repacks
        assigned = GaugeMetricFamily(
            "gateway_worker_assigned_weight_bytes",
            "Weight bytes of the models placed on the worker.",
            labels=["worker"],
        )
        over = GaugeMetricFamily(
            "gateway_worker_oversubscribed",
            "1 when the weights placed on the worker exceed its weight budget (it will "
            "load and evict on nearly every request).",
            labels=["worker"],
        )
        for w in status.workers:
            label = names.get(w.address, w.address)
            assigned.add_metric([label], w.assigned_bytes)
            over.add_metric([label], int(w.oversubscribed))
        yield assigned
        yield over
        yield _one(
            GaugeMetricFamily(
                "gateway_workers_oversubscribed",
                "Workers whose placed weights exceed their budget at the last repack.",
            ),
            sum(w.oversubscribed for w in status.workers),
        )
        yield _one(
            CounterMetricFamily(
                "gateway_placement_generation",
                "Changes of the routing state: repacks and accepted control calls.",
            ),
            status.generation,
        )

    def _wire_series(self) -> Iterator[Metric]:
        """The hardened wire's counts, as a worker's ``worker_grpc_*`` series."""
        wire = self._wire.statistics()
        yield _one(
            GaugeMetricFamily("gateway_grpc_connections_open", "Open client connections."),
            wire.connections_open,
        )
        for what, value, doc in (
            ("accepted", wire.connections_accepted, "Client connections accepted."),
            ("refused", wire.connections_refused, "Connections refused at grpc.max_connections."),
            ("evicted", wire.connections_evicted, "Connections closed in their handshake to make room."),
            ("idle_closed", wire.connections_idle_closed, "Connections closed by the idle timeout."),
        ):  # fmt: skip
            yield _one(CounterMetricFamily(f"gateway_grpc_connections_{what}", doc), value)
        yield _one(
            GaugeMetricFamily("gateway_grpc_streams_open", "Calls (HTTP/2 streams) open now."),
            wire.streams_open,
        )
        errors = CounterMetricFamily(
            "gateway_grpc_client_errors",
            "Client mistakes caught by the wire layer, by kind (docs/grpc.md).",
            labels=["kind"],
        )
        for fault in Fault:
            errors.add_metric([fault.value], wire.faults.get(fault.value, 0))
        yield errors

    def _clients_series(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "gateway_worker_streams", "Calls in flight on the worker's connection.",
            labels=["worker"],
        )  # fmt: skip
        waiting = GaugeMetricFamily(
            "gateway_worker_stream_waiters",
            "Calls waiting for one of the worker's streams (worker_client.max_concurrent_streams).",
            labels=["worker"],
        )
        connects = CounterMetricFamily(
            "gateway_worker_connects", "Connections opened to the worker.", labels=["worker"]
        )
        failures = CounterMetricFamily(
            "gateway_worker_connect_failures", "Failed connection attempts.", labels=["worker"]
        )
        for client in self._clients:
            s = client.statistics()
            streams.add_metric([s.name], s.active_streams)
            waiting.add_metric([s.name], s.waiting)
            connects.add_metric([s.name], s.connects)
            failures.add_metric([s.name], s.connect_failures)
        yield streams
        yield waiting
        yield connects
        yield failures

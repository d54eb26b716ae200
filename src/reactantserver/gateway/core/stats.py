"""The gateway's own counters: plain numbers on the request path, frozen records for metrics.

The proxy calls :meth:`GatewayStats.finish` once per gRPC call it answers (every RPC, every
outcome) and :meth:`GatewayStats.worker_call` once per call it forwards to a worker; both
are a dictionary lookup (by ``(rpc, model)`` or ``(rpc, worker)``) and a histogram bisect;
the status names are given when the counts are read. :meth:`GatewayStats.statistics` copies them
into a frozen :class:`GatewayStatistics` when ``/metrics`` is scraped. No clock is read
here: callers pass the seconds they measured.

Labels are bounded: ``rpc`` by the protocol, ``status`` by gRPC's codes, ``worker`` by the
configured endpoints, ``model`` by the models the workers serve -- a request for a model no
worker serves is counted under ``model=""`` (its status says NOT_FOUND), so a client
sending random names cannot grow the label set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from reactantserver.grpcwire import status_name
from reactantserver.histogram import LATENCY_BUCKETS, Histogram, HistogramSnapshot

from .inflight import Admission


@attrs.frozen(kw_only=True)
class GatewayStatistics:
    """A snapshot of the gateway's request counters."""

    #: (rpc, model, status name) -> calls answered.
    requests: Mapping[tuple[str, str, str], int]
    #: (rpc, model) -> gateway-side latency, arrival to answer.
    latency: Mapping[tuple[str, str], HistogramSnapshot]
    #: (rpc, worker name) -> latency of the calls forwarded to that worker.
    worker_latency: Mapping[tuple[str, str], HistogramSnapshot]
    #: Calls being served now (every RPC).
    in_flight: int
    #: ModelInfer calls in flight (what the admission cap counts).
    infer_in_flight: int
    #: ModelInfer calls refused by the admission cap.
    shed: int
    #: The admission cap (0 = uncapped).
    max_concurrent: int
    #: Route table refreshes asked for by the request path (unknown model, NOT_FOUND,
    #: connection failures), and how many of them ran a probe round.
    refreshes_requested: int
    refreshes_run: int


class _Answered:
    """The calls of one ``(rpc, model)`` answered so far: their count by status code and
    their latency."""

    __slots__ = ("codes", "latency")

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}
        self.latency = Histogram(LATENCY_BUCKETS)


class GatewayStats:
    """Mutable counters (event-loop thread only); see the module docstring. The calls in
    flight are the :class:`~.inflight.Admission`'s counts, read here, not kept twice."""

    def __init__(self, max_concurrent: int = 0, admission: Admission | None = None) -> None:
        self.admission = admission if admission is not None else Admission(max_concurrent)
        self.refreshes_requested = 0
        self.refreshes_run = 0
        self._answered: dict[tuple[str, str], _Answered] = {}
        self._worker_latency: dict[tuple[str, str], Histogram] = {}

    def finish(self, rpc: str, model: str, code: int, seconds: float) -> None:
        """One call answered with status ``code`` after ``seconds``."""
        key = (rpc, model)
        answered = self._answered.get(key)
        if answered is None:
            answered = self._answered[key] = _Answered()
        codes = answered.codes
        codes[code] = codes.get(code, 0) + 1
        answered.latency.observe(seconds)

    def worker_call(self, rpc: str, worker: str, seconds: float) -> None:
        """One forwarded call answered by ``worker`` (any status) after ``seconds``."""
        key = (rpc, worker)
        histogram = self._worker_latency.get(key)
        if histogram is None:
            histogram = self._worker_latency[key] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def statistics(self) -> GatewayStatistics:
        requests: Counter[tuple[str, str, str]] = Counter()
        for (rpc, model), answered in self._answered.items():
            for code, n in answered.codes.items():
                requests[(rpc, model, status_name(code))] += n
        return GatewayStatistics(
            requests=MappingProxyType(dict(requests)),
            latency=MappingProxyType(
                {k: answered.latency.snapshot() for k, answered in self._answered.items()}
            ),
            worker_latency=MappingProxyType(
                {k: h.snapshot() for k, h in self._worker_latency.items()}
            ),
            in_flight=self.admission.calls,
            infer_in_flight=self.admission.infer,
            shed=self.admission.shed,
            max_concurrent=self.admission.cap,
            refreshes_requested=self.refreshes_requested,
            refreshes_run=self.refreshes_run,
        )

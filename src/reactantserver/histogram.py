"""A fixed-bucket histogram kept as plain counters, snapshotted for Prometheus.

Request paths call ``observe`` (a bisect and two additions); the metrics collector
calls ``snapshot`` at scrape time and gets a frozen record in the shape
``HistogramMetricFamily`` takes: cumulative ``(upper bound, count)`` pairs ending
with ``+Inf``, and the sum of observed values. The simulators keep every latency
instead and report its nearest-rank :func:`percentile`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

import attrs

#: Request latency buckets: 1 ms doubling up to ~8 s (the original's 0.001 * 2**k).
LATENCY_BUCKETS: tuple[float, ...] = tuple(0.001 * 2**k for k in range(14))
#: Rows per execution: powers of two up to 1024.
ROW_BUCKETS: tuple[float, ...] = tuple(float(2**k) for k in range(11))


@attrs.frozen
class HistogramSnapshot:
    buckets: tuple[tuple[str, int], ...]
    total: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


class Histogram:
    """Counts of observations at or below each bound (plus one overflow bucket)."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        cumulative = 0
        pairs: list[tuple[str, int]] = []
        for bound, n in zip((*map(repr, self._bounds), "+Inf"), self._counts, strict=True):
            cumulative += n
            pairs.append((bound, cumulative))
        return HistogramSnapshot(tuple(pairs), self._sum)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

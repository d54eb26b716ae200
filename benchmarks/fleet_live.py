"""Pure parts of the fleet benchmark (``bench_fleet.py``): workload, windows, tables.

Nothing here starts a process or opens a socket, so ``tests/benchmarks/test_bench_fleet.py`` can check
the arithmetic: the Zipf draw, the counter deltas that make a measured window (weight loads
per 1,000 requests, mean batch rows, per-model cost), the least-squares fit of load time
against bytes, what the lpt_packing controller did (repacks by trigger, models moved), the
rule that compares a predicted event count with a measured one, and the side-by-side tables.

**Comparing counts.** A weight-load rate is a count of events over the window. Its relative
error is meaningless when the live count is 0 (any prediction but 0 is "inf") and noisy when
it is a handful (one event more is +100% of one). So a count is *within* when the predicted
events over the same window are within the tolerance of the live count **or within one
event** of it: ``|predicted - live| <= max(tolerance x live, 1)``. The one-event floor only
matters below ``1 / tolerance`` live events (4 at 25%); above that the relative rule alone
decides, so a rate of hundreds per second is held to 25% as before. The table prints both
counts beside the rates, so a reader can apply a stricter rule.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

# ------------------------------------------------------------------------------ workload


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under Zipf(s), normalised to sum to 1."""
    raw = [rank**-s for rank in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def popularity(names: Sequence[str], s: float, seed: int) -> dict[str, float]:
    """Each model's share of the requests: Zipf(s) over ``names`` in a seeded shuffled
    order, so that popularity is independent of size (the catalog alternates widths)."""
    order = list(names)
    random.Random(seed).shuffle(order)
    return dict(zip(order, zipf_weights(len(order), s), strict=True))


class ModelDraw:
    """Draws model names by popularity from its own seeded generator (one per client)."""

    def __init__(self, shares: Mapping[str, float], seed: int) -> None:
        self.names = sorted(shares)
        self.cumulative: list[float] = []
        total = 0.0
        for name in self.names:
            total += shares[name]
            self.cumulative.append(total)
        self.rng = random.Random(seed)

    def __call__(self) -> str:
        x = self.rng.random() * self.cumulative[-1]
        lo, hi = 0, len(self.cumulative) - 1
        while lo < hi:  # first cumulative share above x
            mid = (lo + hi) // 2
            if self.cumulative[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        return self.names[lo]


# ------------------------------------------------------------------------------ counters


@attrs.frozen
class ModelCounters:
    """One model's cumulative counters on one worker (ModelControlStatus)."""

    compute_seconds: float = 0.0
    requests: int = 0
    dispatches: int = 0
    rows: int = 0


@attrs.frozen
class WorkerCounters:
    """One worker's cumulative counters: weight loads (``/metrics``) and per model."""

    loads: float = 0.0
    load_seconds: float = 0.0
    models: Mapping[str, ModelCounters] = attrs.field(factory=dict)


@attrs.frozen
class Control:
    """What the lpt_packing controller did over one run (live: GetSchedulingStatus and the
    Repack reply; simulated: the simulator's repack log), in the same terms on both sides."""

    #: Repacks by trigger over the whole run (startup, compute, operator, fleet).
    repacks: Mapping[str, int]
    #: Models whose worker set the operator Repack changed.
    moved_by_operator: tuple[str, ...] = ()
    #: Models whose worker set differs between the start of the warm-up (after the startup
    #: repack) and the start of the window, and between the start and the end of the window.
    moved_in_warmup: tuple[str, ...] = ()
    moved_in_window: tuple[str, ...] = ()

    def describe(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.repacks.items()) if v)
        return (
            f"repacks {counts or 'none'}; moved by the operator Repack: "
            f"{' '.join(self.moved_by_operator) or 'none'}; moved in the warm-up: "
            f"{' '.join(self.moved_in_warmup) or 'none'}; in the window: "
            f"{' '.join(self.moved_in_window) or 'none'}"
        )


@attrs.frozen
class Window:
    """One measured window of one mode: client-side latencies and worker counter deltas."""

    mode: str
    seconds: float
    #: Latencies of the requests started and answered inside the window, sorted, seconds.
    latencies: tuple[float, ...]
    loads: float
    #: Seconds the workers spent in those loads (``worker_weight_load_seconds_total``).
    load_seconds: float
    dispatches: int
    rows: int
    #: Per model, summed over the workers: (compute seconds, dispatches, rows).
    per_model: Mapping[str, tuple[float, int, int]]
    #: Per model, the workers that executed it in the window.
    model_workers: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: Per worker, its execution seconds in the window.
    worker_compute: Mapping[str, float] = attrs.field(factory=dict)
    #: What the lpt_packing controller did (None in the other modes).
    control: Control | None = None

    @property
    def compute_seconds(self) -> float:
        return sum(c for c, _, _ in self.per_model.values())

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)

    @property
    def loads_per_1000(self) -> float:
        return 1000.0 * self.loads / self.requests if self.requests else math.nan

    @property
    def loads_per_second(self) -> float:
        return self.loads / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_batch_rows(self) -> float:
        return self.rows / self.dispatches if self.dispatches else 0.0


def window(
    mode: str,
    seconds: float,
    latencies: Sequence[float],
    before: Mapping[str, WorkerCounters],
    after: Mapping[str, WorkerCounters],
) -> Window:
    """The window between two counter snapshots of the same workers (keyed by name)."""
    loads = load_seconds = 0.0
    per_model: dict[str, tuple[float, int, int]] = {}
    where: dict[str, list[str]] = {}
    busy: dict[str, float] = {}
    for worker, end in after.items():
        start = before[worker]
        loads += end.loads - start.loads
        load_seconds += end.load_seconds - start.load_seconds
        for name, m in end.models.items():
            s = start.models.get(name, ModelCounters())
            d_compute = m.compute_seconds - s.compute_seconds
            d_dispatches = m.dispatches - s.dispatches
            d_rows = m.rows - s.rows
            c, n, r = per_model.get(name, (0.0, 0, 0))
            per_model[name] = (c + d_compute, n + d_dispatches, r + d_rows)
            busy[worker] = busy.get(worker, 0.0) + d_compute
            if d_dispatches:
                where.setdefault(name, []).append(worker)
    return Window(
        mode=mode,
        seconds=seconds,
        latencies=tuple(sorted(latencies)),
        loads=loads,
        load_seconds=load_seconds,
        dispatches=sum(n for _, n, _ in per_model.values()),
        rows=sum(r for _, _, r in per_model.values()),
        per_model=per_model,
        model_workers={name: tuple(sorted(ws)) for name, ws in where.items()},
        worker_compute=busy,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank q-quantile of sorted ``values`` (as the simulator's report); NaN if empty."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope x``; with one distinct x, a line through the
    origin and the mean point (intercept 0)."""
    n = len(xs)
    if n == 0:
        raise ValueError("no points to fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, (my / mx if mx else 0.0)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def affine_costs(points: Mapping[int, float], sizes: Sequence[int]) -> dict[int, float]:
    """Cost of one execution at each compiled size: measured where measured, else from the
    least-squares line through the measured (rows, seconds) points (never below the
    smallest measured cost)."""
    intercept, slope = fit_line(list(points), list(points.values()))
    floor = min(points.values())
    return {
        size: points[size] if size in points else max(floor, intercept + slope * size)
        for size in sizes
    }


# ------------------------------------------------------------------------------ tables


def ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def live_table(windows: Sequence[Window]) -> str:
    """The live modes side by side, then lpt_packing's ratios over round_robin."""
    head = (
        f"| {'mode':<12} | {'requests':>8} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | "
        f"{'loads':>6} | {'loads/1k req':>12} | {'rows/batch':>10} |"
    )
    out = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for w in windows:
        out.append(
            f"| {w.mode:<12} | {w.requests:>8} | {w.rps:>7.1f} | {w.p50 * 1e3:>7.1f} | "
            f"{w.p99 * 1e3:>7.1f} | {w.loads:>6.0f} | {w.loads_per_1000:>12.1f} | "
            f"{w.mean_batch_rows:>10.2f} |"
        )
    return "\n".join(out)


@attrs.frozen
class Goals:
    """The issue's two live goals, from one round_robin and one lpt_packing window."""

    fewer_loads: float  # round_robin loads/1k over lpt_packing's (goal >= 2)
    throughput: float  # lpt_packing req/s over round_robin's (goal >= 1.3)

    @classmethod
    def of(cls, rr: Window, lpt: Window) -> Goals:
        return cls(ratio(rr.loads_per_1000, lpt.loads_per_1000), ratio(lpt.rps, rr.rps))

    def lines(self) -> list[str]:
        def mark(ok: bool) -> str:
            return "met" if ok else "NOT met"

        loads = (
            "inf (lpt_packing loaded nothing)"
            if math.isinf(self.fewer_loads)
            else (f"{self.fewer_loads:.2f}x")
        )
        return [
            f"weight loads per 1k requests, round_robin / lpt_packing: {loads} "
            f"(goal >= 2x: {mark(self.fewer_loads >= 2)})",
            f"throughput, lpt_packing / round_robin: {self.throughput:.2f}x "
            f"(goal >= 1.3x: {mark(self.throughput >= 1.3)})",
        ]


@attrs.frozen
class Prediction:
    """What the simulator predicted for one mode."""

    mode: str
    rps: float
    p50: float
    p99: float
    loads_per_second: float
    loads_per_1000: float
    mean_batch_rows: float
    mean_load_seconds: float = math.nan
    #: Per worker: (fraction of the window executing, fraction on per-request worker CPU,
    #: models placed on it or served).
    workers: Mapping[str, tuple[float, float, tuple[str, ...]]] = attrs.field(factory=dict)
    #: The simulated window, seconds, and the weight loads in it.
    window: float = 0.0
    weight_loads: int = 0
    #: What the simulated lpt_packing controller did (None in the other modes).
    control: Control | None = None


def error(predicted: float, measured: float) -> float:
    """Relative error of a prediction; 0 when both are 0, inf when only the truth is 0."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / measured


def count_within(live: float, predicted: float, tolerance: float) -> bool:
    """The count rule of the module docstring: ``predicted`` events within ``tolerance`` of
    the ``live`` count, or within one event of it."""
    return abs(predicted - live) <= max(tolerance * live, 1.0)


def predicted_events(live: Window, sim: Prediction) -> float:
    """The simulated weight loads over the live window's length (the simulated count when
    the two windows are equally long, as the benchmark runs them)."""
    return sim.loads_per_second * live.seconds


def prediction_table(pairs: Sequence[tuple[Window, Prediction]], tolerance: float) -> str:
    """Predicted beside measured per mode: p50 and weight-load rate (the goal), and the
    figures that explain them. The load rate is a count: its ``events`` column gives the
    live and the predicted loads over the live window, and it is within by
    :func:`count_within`."""
    head = (
        f"| {'mode':<12} | {'figure':<13} | {'live':>8} | {'simulated':>9} | {'error':>7} | "
        f"{'events live / sim':>17} | {'within':>6} |"
    )
    out = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for live, sim in pairs:
        events = (live.loads, predicted_events(live, sim))
        rows = (
            ("p50 ms", live.p50 * 1e3, sim.p50 * 1e3, True, None),
            ("loads/s", live.loads_per_second, sim.loads_per_second, True, events),
            ("loads/1k req", live.loads_per_1000, sim.loads_per_1000, False, None),
            ("req/s", live.rps, sim.rps, False, None),
            ("p99 ms", live.p99 * 1e3, sim.p99 * 1e3, False, None),
            ("rows/batch", live.mean_batch_rows, sim.mean_batch_rows, False, None),
        )
        for figure, measured, predicted, goal, counts in rows:
            e = error(predicted, measured)
            shown = f"{e:+.0%}" if math.isfinite(e) else "inf"
            if counts is None:
                ok = abs(e) <= tolerance
                count_cell = ""
            else:
                ok = count_within(counts[0], counts[1], tolerance)
                count_cell = f"{counts[0]:.0f} / {counts[1]:.1f}"
            within = ("yes" if ok else "NO") if goal else ""
            out.append(
                f"| {live.mode:<12} | {figure:<13} | {measured:>8.2f} | {predicted:>9.2f} | "
                f"{shown:>7} | {count_cell:>17} | {within:>6} |"
            )
    return "\n".join(out)


def control_lines(pairs: Sequence[tuple[Window, Prediction]]) -> list[str]:
    """What each lpt_packing controller did, live beside simulated."""
    out = []
    for live, sim in pairs:
        if live.control is None and sim.control is None:
            continue
        for side, control in (("live", live.control), ("simulated", sim.control)):
            shown = control.describe() if control is not None else "not reported"
            out.append(f"{live.mode} {side:>9}: {shown}")
    return out


# ------------------------------------------------------------------------------ records


def window_to_json(w: Window) -> dict[str, Any]:
    """A window as JSON-ready values (``bench_fleet.py --save``)."""
    return attrs.asdict(w, recurse=True)


def window_from_json(data: Mapping[str, Any]) -> Window:
    """The inverse of :func:`window_to_json`."""
    control = data["control"]
    return Window(
        mode=data["mode"],
        seconds=data["seconds"],
        latencies=tuple(data["latencies"]),
        loads=data["loads"],
        load_seconds=data["load_seconds"],
        dispatches=data["dispatches"],
        rows=data["rows"],
        per_model={k: tuple(v) for k, v in data["per_model"].items()},
        model_workers={k: tuple(v) for k, v in data["model_workers"].items()},
        worker_compute=dict(data["worker_compute"]),
        control=None
        if control is None
        else Control(
            repacks=dict(control["repacks"]),
            moved_by_operator=tuple(control["moved_by_operator"]),
            moved_in_warmup=tuple(control["moved_in_warmup"]),
            moved_in_window=tuple(control["moved_in_window"]),
        ),
    )

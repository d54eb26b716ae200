"""``reactantserver plan``: the smallest fleet that meets the goal, and the one below it.

Theory of operation
-------------------
A fleet of ``n`` devices is judged by simulating it (:func:`.fleet.evaluate`: the fleet
simulator, the gateway's packer, the host-contention model). The planner searches ``n``:

1. **Start** at the device-time lower bound: an open loop asks
   ``sum(rate x cost per row at a full batch x rows)`` device-seconds per second (the
   least any batching could make of it), and no fleet smaller than that keeps up. A closed
   loop has no such bound: it starts at 1.
2. **Gallop**: evaluate the start, then grow by half (at least one; capped at
   ``device.max_devices``) until a fleet meets the goal -- by half rather than double
   because a larger fleet costs more to simulate and overshooting is the dear mistake.
   None does: the plan says so, with the largest fleet's reasons.
3. **Bisect** between the largest failing and the smallest meeting fleet so far.
4. **Down** instead, when the start meets the goal already (a closed loop's start of 1, or
   a loose bound): gallop down (1, 2, 4, ... below) to a failing fleet, then bisect. Either
   way the search ends with the smallest meeting fleet whose next-smaller one was
   evaluated and failed.

Invariants (``tests/planning/test_planning_search.py``, for *any* verdict function, monotone or
not): the answer meets the goal; every evaluated fleet smaller than the answer fails and
every evaluated fleet at least as large meets it, so the table a plan prints never shows a
larger fleet failing where a smaller one met the goal; the fleet one smaller than the
answer is evaluated (unless the answer is 1) and fails. With a monotone verdict (more
devices never hurt), the answer is the smallest fleet that meets the goal, found in
O(log n) evaluations. Each evaluation is deterministic (the simulator's seed), so the same
inputs give the same plan.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .costs import Costs
from .device import Device
from .fleet import FleetOutcome, Goal, Run, evaluate
from .traffic import Traffic

__all__ = ["Plan", "lower_bound", "make_plan", "plan_json", "render_plan", "search"]


def search(
    meets: Callable[[int], bool], start: int, top: int
) -> tuple[int | None, dict[int, bool]]:
    """The answer and every verdict asked for (see the module docstring, steps 2-4)."""
    seen: dict[int, bool] = {}

    def ask(n: int) -> bool:
        if n not in seen:
            seen[n] = meets(n)
        return seen[n]

    n = max(1, min(start, top))
    low = 0  # the largest failing fleet known (0: none); every other failure is below it
    if ask(n):
        high, step = n, 1  # the bound was loose: gallop down
        while high - step >= 1:
            if not ask(high - step):
                low = high - step
                break
            high -= step
            step *= 2
    else:
        low = n
        while True:
            if n >= top:
                return None, seen
            n = min(top, max(n + 1, math.ceil(1.5 * n)))
            if ask(n):
                high = n
                break
            low = n
    while high - low > 1:
        mid = (low + high) // 2
        if ask(mid):
            high = mid
        else:
            low = mid
    return high, seen


def lower_bound(traffic: Traffic, costs: Costs) -> int:
    """Devices an open loop needs at least: its device-seconds per second at full batches."""
    if traffic.closed:
        return 1
    need = 0.0
    for name, t in traffic.models.items():
        table = costs.models[name].costs
        top = max(table)
        need += t.rate * t.mean_rows * table[top] / top
    return max(1, math.ceil(need - 1e-9))


@attrs.frozen(kw_only=True)
class Plan:
    traffic: Traffic
    device: Device
    goal: Goal
    run: Run
    #: The smallest fleet that meets the goal (None: none up to device.max_devices).
    answer: FleetOutcome | None
    #: The fleet one device smaller, and why it fails (None when the answer is 1).
    next_smaller: FleetOutcome | None
    #: Every fleet evaluated, by size.
    evaluated: tuple[FleetOutcome, ...]
    seconds: float


def make_plan(
    traffic: Traffic,
    costs: Costs,
    device: Device,
    goal: Goal,
    run: Run = Run(),  # noqa: B008
) -> Plan:
    """Search the fleet sizes (module docstring) and return the plan."""
    unknown = sorted(set(traffic.models) - set(costs.models))
    if unknown:
        raise ValueError(
            f"the traffic names models the costs do not know: {', '.join(unknown[:10])}"
            + (" ..." if len(unknown) > 10 else "")
        )
    t0 = time.monotonic()
    outcomes: dict[int, FleetOutcome] = {}

    def meets(n: int) -> bool:
        outcomes[n] = evaluate(n, traffic, costs, device, goal, run)
        return outcomes[n].meets

    answer, _ = search(meets, lower_bound(traffic, costs), device.max_devices)
    return Plan(
        traffic=traffic,
        device=device,
        goal=goal,
        run=run,
        answer=outcomes[answer] if answer is not None else None,
        next_smaller=outcomes.get(answer - 1) if answer is not None else None,
        evaluated=tuple(outcomes[n] for n in sorted(outcomes)),
        seconds=time.monotonic() - t0,
    )


# ------------------------------------------------------------------------------ output


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.1f}"


def _money(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _describe_traffic(traffic: Traffic) -> str:
    n = len(traffic.models)
    if traffic.closed:
        return f"{n} models, a closed loop of {traffic.clients} clients"
    return f"{n} models, {traffic.rate:.1f} req/s offered"


def render_plan(plan: Plan, *, top: int = 12) -> str:
    """The plain tables an operator reads."""
    d, g = plan.device, plan.goal
    price = f", {d.price_per_hour:.2f}/h each" if d.price_per_hour is not None else ""
    lines = [
        f"plan: {_describe_traffic(plan.traffic)}; goal p99 <= {g.p99 * 1e3:.4g} ms, errors <= "
        f"{g.error_budget:.2%}",
        f"device: {d.name} ({d.weight_budget_bytes / 1e6:,.1f} MB weight budget{price}); "
        f"each fleet simulated {plan.run.seconds:.1f} s after {plan.run.warmup:.1f} s of "
        f"warm-up, seed {plan.run.seed}",
        "",
    ]
    rows = [
        ("devices", "verdict", "p50 ms", "p99 ms", "req/s", "errors", "loads/s", "busy", "cost/h")
    ]
    for o in plan.evaluated:
        rows.append(
            (
                str(o.workers),
                "meets" if o.meets else "fails",
                _ms(o.p50),
                _ms(o.p99),
                f"{o.throughput:.1f}",
                f"{o.error_share:.2%}",
                f"{o.loads_per_second:.1f}",
                f"{o.busy:.0%}",
                _money(o.price_per_hour),
            )
        )
    lines += _table(rows, left=0)
    lines.append("")
    if plan.answer is None:
        largest = plan.evaluated[-1]
        lines.append(
            f"no fleet of up to {d.max_devices} devices meets the goal; {largest.workers} "
            f"fail: {'; '.join(largest.reasons)}"
        )
        return "\n".join(lines)
    a = plan.answer
    cost = f" ({a.price_per_hour:.2f}/h)" if a.price_per_hour is not None else ""
    hosts = f" on {a.hosts} host{'s' if a.hosts != 1 else ''}"
    lines.append(
        f"smallest fleet that meets the goal: {a.workers} device{'s' if a.workers != 1 else ''}{hosts}{cost}"
    )
    if plan.next_smaller is not None:
        n = plan.next_smaller.workers
        lines.append(
            f"{n} device{'s' if n != 1 else ''} fail{'s' if n == 1 else ''}: "
            f"{'; '.join(plan.next_smaller.reasons)}"
        )
    lines += ["", "placement (lpt_packing):"]
    for w in a.fleet:
        shown = " ".join(w.models[:8]) + (
            f" ... ({len(w.models)} models)" if len(w.models) > 8 else ""
        )
        lines.append(
            f"  {w.name} ({w.host}): busy {w.busy:.0%}, {w.assigned_bytes / 1e6:,.1f} MB: {shown}"
        )
    host_busy = ", ".join(f"{h} {s:.0%}" for h, s in sorted(a.host_busy.items()))
    if host_busy:
        lines.append(f"  host cores busy: {host_busy}")
    lines += [
        "",
        f"per model ({a.workers} device{'s' if a.workers != 1 else ''}, the "
        f"{min(top, len(a.models))} busiest):",
    ]
    rows = [
        (
            "model",
            "req/s",
            "p50 ms",
            "p99 ms",
            "rows/exec",
            "errors",
            "J/req",
            "cost/1M req",
            "workers",
        )
    ]
    busiest = sorted(a.models, key=lambda m: (-m.requests_per_second, m.name))[:top]
    for m in busiest:
        rows.append(
            (
                m.name,
                f"{m.requests_per_second:.1f}",
                _ms(m.p50),
                _ms(m.p99),
                f"{m.rows_per_execution:.2f}",
                str(m.errors),
                "-" if m.joules_per_request is None else f"{m.joules_per_request:.4f}",
                _money(m.cost_per_million, 4),
                ",".join(m.workers),
            )
        )
    lines += _table(rows)
    if len(a.models) > top:
        lines.append(f"... ({len(a.models) - top} more models; --json has them all)")
    return "\n".join(lines)


def _outcome_json(o: FleetOutcome) -> dict[str, Any]:
    data = attrs.asdict(o, recurse=True)
    data["error_share"] = o.error_share
    data["models"] = [attrs.asdict(m) for m in o.models]
    data["fleet"] = [attrs.asdict(w) for w in o.fleet]
    return _finite(data)


def _finite(value: Any) -> Any:
    """NaN (no request in a window) as null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def plan_json(plan: Plan) -> str:
    """The plan for tools (``--json``): the same figures, every model, ``null`` where
    unknown; seconds throughout."""
    data = {
        "goal": attrs.asdict(plan.goal),
        "device": attrs.asdict(plan.device),
        "run": attrs.asdict(plan.run),
        "traffic": {
            "models": len(plan.traffic.models),
            "clients": plan.traffic.clients,
            "offered": None if plan.traffic.closed else plan.traffic.rate,
        },
        "answer": None if plan.answer is None else plan.answer.workers,
        "next_smaller": None if plan.next_smaller is None else plan.next_smaller.workers,
        "evaluated": [_outcome_json(o) for o in plan.evaluated],
    }
    return json.dumps(data, indent=2)

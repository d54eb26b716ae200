"""The traffic a plan is for: the traffic file, or a window recorded from a live /metrics.

The traffic file (YAML)::

    # Open loop (the default): each model a Poisson process at its rate.
    models:
      resnet: {rate: 120}                  # requests per second
      bert: {rate: 30, rows: [1, 4], deadline_ms: 250}

    # Or a closed loop: ``clients`` clients, each sending its next request when its last
    # one is answered (after ``think_ms``), to a model drawn by ``share``.
    clients: 16
    think_ms: 0
    models:
      resnet: {share: 3}
      bert: {share: 1}

    # Optional: the CPU a load generator on the same host spends per request (a benchmark
    # whose clients share the machine with the fleet; 0 when clients are elsewhere), with
    # many in flight, and what more a request costs it when its loop was idle.
    generator_seconds: 0.00016
    generator_wake_seconds: 0.0001

``rows`` is the rows of each request (a whole number, or a list drawn from uniformly;
default 1). ``deadline_ms`` is when the client gives up: a request answered later counts
as an error against the goal's error budget.

:func:`traffic_from_metrics` builds the same record from two scrapes of a worker's or a
gateway's ``/metrics`` ``seconds`` apart (``worker_requests_served_total`` and
``worker_rows_served_total`` per model), so ``plan --traffic ADDRESS`` plans for the
traffic a live fleet is serving; :func:`render_traffic` writes it as a traffic file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..config.source import SourceMap, raise_all, read_yaml
from .checks import MISSING, Checker

__all__ = [
    "ModelTraffic",
    "Traffic",
    "read_traffic",
    "render_traffic",
    "traffic_from_data",
    "traffic_from_metrics",
]


@attrs.frozen(kw_only=True)
class ModelTraffic:
    name: str
    #: Requests per second (open loop), or the share of a closed loop's requests.
    rate: float
    rows: tuple[int, ...] = (1,)
    #: Seconds after which the client gives up (None: never).
    deadline: float | None = None

    @property
    def mean_rows(self) -> float:
        return sum(self.rows) / len(self.rows)


@attrs.frozen(kw_only=True)
class Traffic:
    models: Mapping[str, ModelTraffic]
    #: Closed loop: this many clients (None: open loop, Poisson arrivals at each rate).
    clients: int | None = None
    think: float = 0.0
    #: CPU a load generator on the fleet's first host spends per request with many in
    #: flight (0: elsewhere), and what more one costs that finds its loop idle.
    generator_seconds: float = 0.0
    generator_wake_seconds: float = 0.0
    source: str = ""

    @property
    def closed(self) -> bool:
        return self.clients is not None

    @property
    def rate(self) -> float:
        """Requests per second offered (open loop); the sum of the shares (closed)."""
        return sum(m.rate for m in self.models.values())

    def shares(self) -> dict[str, float]:
        total = self.rate
        return {n: m.rate / total for n, m in self.models.items()} if total > 0 else {}


def read_traffic(path: str | Path) -> Traffic:
    data, lines = read_yaml(path)
    return traffic_from_data(data, lines, source=str(path))


def traffic_from_data(data: Mapping[str, Any], lines: SourceMap, *, source: str = "") -> Traffic:
    """The traffic file's record, validated (every problem at once, ``FILE:LINE: ...``)."""
    c = Checker(lines)
    c.keys(
        data, (), ("models", "clients", "think_ms", "generator_seconds", "generator_wake_seconds")
    )
    clients = c.integer(data, ("clients",), minimum=1, default=None)
    think = c.number(data, ("think_ms",), minimum=0.0, default=0.0)
    if "think_ms" in data and "clients" not in data:
        c.problem(("think_ms",), "only means something with clients: (a closed loop)")
    generator = c.number(data, ("generator_seconds",), minimum=0.0, default=0.0)
    generator_wake = c.number(data, ("generator_wake_seconds",), minimum=0.0, default=0.0)
    models_data = c.mapping(data, ("models",))
    key = "share" if "clients" in data else "rate"
    other = "rate" if key == "share" else "share"
    models: dict[str, ModelTraffic] = {}
    for name in models_data:
        path = ("models", name)
        entry = c.mapping(models_data, path)
        c.keys(entry, path, ("rate", "share", "rows", "deadline_ms"))
        if other in entry:
            why = (
                "a closed loop (clients:) gives each model a share"
                if key == "share"
                else ("an open loop gives each model a rate (or set clients: for a closed loop)")
            )
            c.problem((*path, other), f"not used here: {why}")
        rate = c.number(
            entry, (*path, key), minimum=0.0, default=None if other in entry else MISSING
        )
        rows = c.rows(entry, (*path, "rows"))
        deadline = c.number(entry, (*path, "deadline_ms"), minimum=0.0, strict=True, default=None)
        if isinstance(rate, float):
            models[str(name)] = ModelTraffic(
                name=str(name),
                rate=rate,
                rows=rows or (1,),
                deadline=deadline / 1e3 if deadline is not None else None,
            )
    if not models_data and "models" in data:
        c.problem(("models",), "expected at least one model")
    if models and not c.problems and sum(m.rate for m in models.values()) <= 0:
        c.problem(("models",), f"expected a {key} > 0 for at least one model")
    raise_all(c.problems)
    return Traffic(
        models=models,
        clients=clients,
        think=(think or 0.0) / 1e3,
        generator_seconds=generator or 0.0,
        generator_wake_seconds=generator_wake or 0.0,
        source=source,
    )


def render_traffic(traffic: Traffic, comment: str = "") -> str:
    """A traffic file's text (:func:`read_traffic` reads it back)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    key = "share" if traffic.closed else "rate"
    if traffic.closed:
        lines += [f"clients: {traffic.clients}", f"think_ms: {traffic.think * 1e3:g}"]
    if traffic.generator_seconds:
        lines.append(f"generator_seconds: {traffic.generator_seconds:.6g}")
    if traffic.generator_wake_seconds:
        lines.append(f"generator_wake_seconds: {traffic.generator_wake_seconds:.6g}")
    lines.append("models:")
    for name, m in sorted(traffic.models.items()):
        cells = [f"{key}: {m.rate:.6g}"]
        if m.rows != (1,):
            cells.append(f"rows: {list(m.rows)}" if len(m.rows) > 1 else f"rows: {m.rows[0]}")
        if m.deadline is not None:
            cells.append(f"deadline_ms: {m.deadline * 1e3:g}")
        lines.append(f"  {name}: {{{', '.join(cells)}}}")
    return "\n".join(lines) + "\n"


def traffic_from_metrics(before: str, after: str, seconds: float, source: str = "") -> Traffic:
    """The traffic between two ``/metrics`` expositions ``seconds`` apart: per model the
    requests answered per second and the mean rows per request (rounded to whole rows),
    summed over the workers (a gateway with ``metrics_endpoints`` carries theirs)."""
    from ..energy.report import parse

    old, new = parse(before), parse(after)
    requests: dict[str, float] = {}
    rows: dict[str, float] = {}
    for (worker, model), fields in new.models.items():
        prior = old.models.get((worker, model), {})
        for field, into in (("requests", requests), ("rows", rows)):
            value = fields.get(field, 0.0)
            base = prior.get(field, 0.0)
            into[model] = into.get(model, 0.0) + (value - base if value >= base else value)
    models = {}
    for name, n in sorted(requests.items()):
        if n <= 0:
            continue
        mean = rows.get(name, n) / n
        models[name] = ModelTraffic(name=name, rate=n / seconds, rows=(max(1, round(mean)),))
    if not models:
        raise ValueError(f"no model answered a request in the {seconds:g} s window")
    return Traffic(models=models, source=source)

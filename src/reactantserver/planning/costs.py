"""What the planner knows about the models and the machine: the costs file.

A :class:`Costs` record is what ``reactantserver calibrate`` measures (and writes as a
costs file), or what a live worker's or gateway's ``/metrics`` shows
(:mod:`.metrics_input`). Per model: the device seconds of one execution at each compiled
batch size and the weight bytes. For the machine: the weight load time (a fixed part plus
bytes over a bandwidth), what a worker spends on the host's cores besides the device
(:class:`~reactantserver.fleet.host.HostCosts`), the cores the machine had and how many were
busy with other work, the rest of an idle round trip (``network_seconds``, one way), and,
when calibrated through a gateway, the gateway's CPU per request (with many in flight, and
what more a request costs that finds it idle: its wake-up). The two ``spread`` lists are the
measured spread of loads and executions around their means: the simulator draws each load's
and each execution's time from them, which is what puts a live p99's tail into a plan.

The costs file (YAML; every number in base units, seconds and bytes)::

    backend: cpu
    source: calibrate examples/repo
    host:
      cores: 2                  # cores of the machine calibrated on
      cores_busy: 0.12          # of them, busy with other processes meanwhile
      background_threads: 0.3   # other processes' threads wanting a core, on average
      request_seconds: 0.00031  # worker event-loop CPU per request
      batch_seconds: 0.00009    # worker event-loop CPU per execution
      execution_threads: 1.4    # host cores an execution's work needs (0: a GPU)
      load_threads: 1.0         # host cores a weight load keeps busy (0: DMA)
      inline_seconds: 0.0001    # executions cheaper than this run on the loop (CPU)
      network_seconds: 0.0002   # one way, beyond the CPU: loopback, wake-ups
      gateway_seconds: 0.0004   # optional: the gateway's CPU per request, many in flight
      gateway_wake_seconds: 0.0002  # optional: more when the request finds it idle
    loads:
      latency_seconds: 0.0006
      bytes_per_second: 4.2e9
      spread: [0.8, 0.9, 1.0, 1.1, 2.2]  # optional: each measured load / the line above
    executions:
      spread: [0.9, 1.0, 1.0, 1.1]  # optional: each measured execution / its model's mean
    models:
      mlp:
        weight_bytes: 4400000
        costs: {1: 0.00063, 2: 0.00073, 4: 0.00076, 8: 0.00115}

:func:`read_costs` validates it with the configuration's errors (``FILE:LINE: key: expected
...``, every problem at once); :func:`render_costs` writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..config.source import SourceMap, raise_all, read_yaml
from ..fleet.host import HostCosts
from .checks import Checker

__all__ = ["Costs", "ModelCosts", "read_costs", "render_costs"]


@attrs.frozen(kw_only=True)
class ModelCosts:
    """One model: seconds per execution at each compiled batch size, and weight bytes."""

    name: str
    costs: Mapping[int, float]
    weight_bytes: int = 0

    def cost_per_request(self, rows: float = 1.0) -> float:
        """Device seconds per request of ``rows`` rows run alone: the cost of the smallest
        compiled size that holds them (the largest, per full batch, beyond it)."""
        sizes = sorted(self.costs)
        for size in sizes:
            if size >= rows:
                return self.costs[size]
        top = sizes[-1]
        return self.costs[top] * rows / top


@attrs.frozen(kw_only=True)
class Costs:
    """See the module docstring."""

    backend: str = "cpu"
    source: str = ""
    models: Mapping[str, ModelCosts] = attrs.field(factory=dict)
    #: A weight load takes ``load_latency + bytes / load_bandwidth`` seconds at idle.
    load_latency: float = 0.0
    load_bandwidth: float = 10e9
    host: HostCosts = attrs.field(factory=HostCosts)
    #: The machine calibrated on: its cores (0: unknown) and how many were busy with work
    #: that was not the calibration's.
    cores: float = 0.0
    cores_busy: float = 0.0
    #: Threads of other processes that wanted a core meanwhile (the mean run queue).
    background_threads: float = 0.0
    #: One way, beyond CPU: what an idle round trip took that no CPU figure accounts for.
    network_seconds: float = 0.0
    #: The gateway's CPU per request with many in flight (None: not calibrated through a
    #: gateway), and what more one costs that finds its loop idle (its wake-up).
    gateway_seconds: float | None = None
    gateway_wake_seconds: float = 0.0
    #: Measured / fitted time of each calibration load, and measured / mean time of each
    #: calibration execution, sorted (empty: every load and execution takes its mean).
    load_spread: tuple[float, ...] = ()
    execution_spread: tuple[float, ...] = ()


def _number(x: float) -> str:
    return f"{x:.6g}"


def _numbers(xs: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in xs) + "]"


def render_costs(costs: Costs, comment: str = "") -> str:
    """The costs file's text (:func:`read_costs` reads it back to an equal record)."""
    h = costs.host
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [
        f"backend: {costs.backend}",
        f"source: {costs.source!r}" if costs.source else "source: ''",
        "host:",
        f"  cores: {_number(costs.cores)}",
        f"  cores_busy: {_number(costs.cores_busy)}",
        f"  background_threads: {_number(costs.background_threads)}",
        f"  request_seconds: {_number(h.request_seconds)}",
        f"  batch_seconds: {_number(h.batch_seconds)}",
        f"  execution_threads: {_number(h.execution_threads)}",
        f"  load_threads: {_number(h.load_threads)}",
        f"  inline_seconds: {_number(h.inline_seconds)}",
        f"  network_seconds: {_number(costs.network_seconds)}",
    ]
    if costs.gateway_seconds is not None:
        lines.append(f"  gateway_seconds: {_number(costs.gateway_seconds)}")
    if costs.gateway_wake_seconds:
        lines.append(f"  gateway_wake_seconds: {_number(costs.gateway_wake_seconds)}")
    lines += [
        "loads:",
        f"  latency_seconds: {_number(costs.load_latency)}",
        f"  bytes_per_second: {_number(costs.load_bandwidth)}",
    ]
    if costs.load_spread:
        lines.append(f"  spread: {_numbers(costs.load_spread)}")
    if costs.execution_spread:
        lines += ["executions:", f"  spread: {_numbers(costs.execution_spread)}"]
    lines.append("models:")
    for name, m in sorted(costs.models.items()):
        cells = ", ".join(f"{size}: {_number(s)}" for size, s in sorted(m.costs.items()))
        lines += [f"  {name}:", f"    weight_bytes: {m.weight_bytes}", f"    costs: {{{cells}}}"]
    return "\n".join(lines) + "\n"


_HOST_KEYS = (
    "cores",
    "cores_busy",
    "background_threads",
    "request_seconds",
    "batch_seconds",
    "execution_threads",
    "load_threads",
    "inline_seconds",
    "network_seconds",
    "gateway_seconds",
    "gateway_wake_seconds",
)


def read_costs(path: str | Path) -> Costs:
    """A costs file, validated: every problem at once, one ``FILE:LINE: key: ...`` line each."""
    data, lines = read_yaml(path)
    return costs_from_data(data, lines)


def costs_from_data(data: Mapping[str, Any], lines: SourceMap) -> Costs:
    c = Checker(lines)
    c.keys(data, (), ("backend", "source", "host", "loads", "executions", "models"))
    backend = c.choice(data, ("backend",), ("cpu", "cuda", "metrics"), default="cpu")
    source = c.text(data, ("source",), default="")
    host = c.mapping(data, ("host",), required=False)
    c.keys(host, ("host",), _HOST_KEYS)
    loads = c.mapping(data, ("loads",), required=False)
    c.keys(loads, ("loads",), ("latency_seconds", "bytes_per_second", "samples", "spread"))
    executions = c.mapping(data, ("executions",), required=False)
    c.keys(executions, ("executions",), ("spread",))
    models_data = c.mapping(data, ("models",))
    models: dict[str, ModelCosts] = {}
    for name in models_data:
        path = ("models", name)
        entry = c.mapping(models_data, path)
        c.keys(entry, path, ("weight_bytes", "costs"))
        nbytes = c.integer(entry, (*path, "weight_bytes"), minimum=0, default=0)
        costs = c.size_table(entry, (*path, "costs"))
        if costs:
            models[str(name)] = ModelCosts(name=str(name), costs=costs, weight_bytes=nbytes)
    if not models_data and not c.problems:
        c.problem(("models",), "expected at least one model")
    gateway = c.number(host, ("host", "gateway_seconds"), minimum=0.0, default=None)
    costs_record = Costs(
        backend=backend,
        source=source,
        models=models,
        load_latency=c.number(loads, ("loads", "latency_seconds"), minimum=0.0, default=0.0),
        load_bandwidth=c.number(
            loads, ("loads", "bytes_per_second"), minimum=0.0, strict=True, default=10e9
        ),
        host=HostCosts(
            request_seconds=c.number(host, ("host", "request_seconds"), minimum=0.0, default=0.0),
            batch_seconds=c.number(host, ("host", "batch_seconds"), minimum=0.0, default=0.0),
            execution_threads=c.number(
                host, ("host", "execution_threads"), minimum=0.0, default=0.0
            ),
            load_threads=c.number(host, ("host", "load_threads"), minimum=0.0, default=0.0),
            inline_seconds=c.number(host, ("host", "inline_seconds"), minimum=0.0, default=0.0),
        ),
        cores=c.number(host, ("host", "cores"), minimum=0.0, default=0.0),
        cores_busy=c.number(host, ("host", "cores_busy"), minimum=0.0, default=0.0),
        background_threads=c.number(host, ("host", "background_threads"), minimum=0.0, default=0.0),
        network_seconds=c.number(host, ("host", "network_seconds"), minimum=0.0, default=0.0),
        gateway_seconds=gateway,
        gateway_wake_seconds=c.number(
            host, ("host", "gateway_wake_seconds"), minimum=0.0, default=0.0
        ),
        load_spread=c.spread(loads, ("loads", "spread")),
        execution_spread=c.spread(executions, ("executions", "spread")),
    )
    raise_all(c.problems)
    return costs_record

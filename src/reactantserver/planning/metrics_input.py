"""Costs read from a live worker's or gateway's ``/metrics`` (``plan --costs ADDRESS``).

A running fleet already knows what its models cost: each worker keeps the fastest
execution it has seen at every compiled size (``worker_model_batch_fastest_seconds``: the
program's own cost, what a shared machine's time slices added left out) and exports each model's weight bytes
(``worker_model_weight_bytes``) and its weight loads (``worker_weight_loads_total``,
``worker_weight_load_seconds_total``). A gateway with ``metrics_endpoints`` carries every
worker's series. Per model the cost at each size is the mean over the workers that report
it; a load is the mean seconds per load over the workers that loaded, charged as a
bandwidth for the mean weight size (the exposition has no bytes per load).

What ``/metrics`` does not show is the host: the worker's CPU per request, per execution
and per load, and the machine's cores. The record leaves them at 0 -- a plan made from it
assumes the host never slows a worker, which is close for GPU workers on a host with cores
to spare and wrong on a crowded CPU host; ``reactantserver calibrate`` measures them.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from .costs import Costs, ModelCosts

__all__ = ["costs_from_metrics"]


def costs_from_metrics(text: str, source: str = "") -> Costs:
    """The costs a worker's or a gateway's exposition shows (module docstring)."""
    per_size: dict[str, dict[int, list[float]]] = {}
    nbytes: dict[str, int] = {}
    loads: dict[str, float] = {}
    load_seconds: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            worker = s.labels.get("worker", "")
            if s.name == "worker_model_batch_fastest_seconds" and "model" in s.labels:
                size = int(s.labels.get("batch_size", "0") or 0)
                if size >= 1 and s.value > 0:
                    per_size.setdefault(s.labels["model"], {}).setdefault(size, []).append(s.value)
            elif s.name == "worker_model_weight_bytes" and "model" in s.labels:
                nbytes[s.labels["model"]] = int(s.value)
            elif s.name == "worker_weight_loads_total":
                loads[worker] = s.value
            elif s.name == "worker_weight_load_seconds_total":
                load_seconds[worker] = s.value
    models = {
        name: ModelCosts(
            name=name,
            costs={size: sum(v) / len(v) for size, v in sorted(sizes.items())},
            weight_bytes=nbytes.get(name, 0),
        )
        for name, sizes in sorted(per_size.items())
    }
    if not models:
        raise ValueError(
            "the exposition has no worker_model_batch_fastest_seconds series: no model has "
            "run yet, or the address is not a worker's (or a gateway's with metrics_endpoints)"
        )
    total_loads = sum(loads.values())
    latency, bandwidth = 0.0, 10e9
    if total_loads > 0:
        per_load = sum(load_seconds.values()) / total_loads
        mean_bytes = sum(m.weight_bytes for m in models.values()) / len(models)
        if per_load > 0 and mean_bytes > 0:
            bandwidth = mean_bytes / per_load
    return Costs(
        backend="metrics",
        source=source,
        models=models,
        load_latency=latency,
        load_bandwidth=bandwidth,
    )

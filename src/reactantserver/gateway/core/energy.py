"""The gateway's energy series: its workers' energy summed, and the price of a device-hour.

The gateway learns its workers' numbers the one way it learns any of their metrics: by
scraping ``metrics_endpoints`` when its own ``/metrics`` is scraped (:mod:`..scrape`). From
those families, :func:`energy_series` adds

* ``gateway_energy_joules_total{model}`` -- every worker's ``worker_energy_joules_total``
  of the model, summed (a model served by three workers: the three added);
* ``gateway_idle_energy_joules_total`` and ``gateway_device_power_watts`` -- the workers'
  idle energy and power, summed;
* ``gateway_workers_energy_measured`` -- how many of the scraped workers read a counter,
  so a sum over fewer workers than serve is seen for what it is;
* ``gateway_cost_device_hour`` -- gateway.yml's ``cost.device_hour``, when set: the price
  for workers whose own ``worker_cost_device_hour`` is absent.

Where no worker measures energy, the sums are absent, not 0: no made-up number. The sums
restart lower when a worker restarts or is not scraped (its counters leave the sum);
Prometheus's ``rate`` reads such a drop as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def energy_series(workers: Iterable[Metric], device_hour: float | None) -> Iterator[Metric]:
    """The gateway's energy and cost families from the workers' families (module doc)."""
    per_model: dict[str, float] = {}
    idle = watts = 0.0
    measured = 0
    seen_idle = seen_watts = False
    for family in workers:
        for sample in family.samples:
            if sample.name == "worker_energy_joules_total":
                model = sample.labels.get("model", "")
                per_model[model] = per_model.get(model, 0.0) + sample.value
            elif sample.name == "worker_idle_energy_joules_total":
                idle += sample.value
                seen_idle = True
            elif sample.name == "worker_device_power_watts":
                watts += sample.value
                seen_watts = True
            elif sample.name == "worker_energy_measured":
                measured += int(sample.value == 1)
    yield _one(
        GaugeMetricFamily(
            "gateway_workers_energy_measured",
            "Scraped workers whose device energy is measured (the sums below cover these).",
        ),
        measured,
    )
    if device_hour is not None:
        yield _one(
            GaugeMetricFamily(
                "gateway_cost_device_hour",
                "cost.device_hour of gateway.yml: the price of one device-hour, for workers "
                "that do not export their own.",
            ),
            device_hour,
        )
    if not (per_model or seen_idle):
        return
    joules = CounterMetricFamily(
        "gateway_energy_joules",
        "Device energy attributed to the model, summed over the workers.",
        labels=["model"],
    )
    for model, value in sorted(per_model.items()):
        joules.add_metric([model], value)
    yield joules
    yield _one(
        CounterMetricFamily(
            "gateway_idle_energy_joules", "Idle device energy, summed over the workers."
        ),
        idle,
    )
    if seen_watts:
        yield _one(
            GaugeMetricFamily("gateway_device_power_watts", "The workers' device power, summed."),
            watts,
        )


def _one(family: GaugeMetricFamily | CounterMetricFamily, value: float) -> Metric:
    family.add_metric([], value)
    return family

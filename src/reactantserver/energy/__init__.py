"""Energy per model: measured device energy, attributed by device time (docs/monitoring.md).

``ledger``   the sans-IO attribution: given ``now``, batches' device seconds and counter
             readings, it splits each interval's energy among models and idle
``readers``  the counters: NVML on a GPU, RAPL on a CPU, or a reason why none is read
``meter``    the worker's driver: batch completions and scrapes feed the ledger
``report``   ``reactantserver report``: per-model rates, energy and cost from /metrics

Nothing here imports trio or JAX.
"""

from __future__ import annotations

from .ledger import EnergyLedger, EnergyReading, EnergyStatistics, Interval
from .meter import SAMPLE_INTERVAL, EnergyMeter
from .readers import EnergyReader, NvmlReader, RaplReader, open_reader

__all__ = [
    "SAMPLE_INTERVAL",
    "EnergyLedger",
    "EnergyMeter",
    "EnergyReader",
    "EnergyReading",
    "EnergyStatistics",
    "Interval",
    "NvmlReader",
    "RaplReader",
    "open_reader",
]

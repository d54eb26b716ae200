"""The worker's energy meter: a reader and a ledger, driven from the dispatch loop.

Theory of operation
-------------------
The scheduler calls :meth:`EnergyMeter.on_batch` on the loop once per batch that reached
the device (``Scheduler(on_batch=...)``) with the device seconds it is charged. The meter
books them in the ledger and reads the counter only when the ledger says a sample is
due -- at most once per ``min_interval`` (:data:`SAMPLE_INTERVAL`) -- so a batch costs a
dictionary update, and one NVML call or two file reads per interval, whatever the rate.
No thread and no timer of its own: an idle device is sampled when ``/metrics`` is
scraped (:meth:`sample_at_scrape`), which the admin port does just before it collects.

A scrape while a batch is on the device does not sample: the interval it would close
holds part of that batch's energy but none of its device seconds (they are charged when
it completes), so the energy would be booked as idle. The batch's completion closes the
interval instead.

The clock is injected (the worker passes ``trio.current_time``): the same clock the
scheduler charges device seconds on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .ledger import EnergyLedger, EnergyStatistics
from .readers import EnergyReader

if TYPE_CHECKING:  # a record of the scheduler, read as data: energy stays a leaf
    from ..scheduling.records import Batch

#: Seconds between counter reads at batch completion (scrapes read besides).
SAMPLE_INTERVAL = 1.0


class EnergyMeter:
    """Feeds batches and readings to an :class:`EnergyLedger` (module docstring)."""

    def __init__(
        self,
        reader: EnergyReader,
        clock: Callable[[], float],
        *,
        min_interval: float = SAMPLE_INTERVAL,
    ) -> None:
        self.reader = reader
        self.ledger = EnergyLedger(reader.source, min_interval=min_interval)
        self._clock = clock
        self.reads = 0
        self._sample(clock())  # the baseline

    def on_batch(self, batch: Batch, seconds: float) -> None:
        """The scheduler's ``on_batch`` hook: book the batch, read the counter if due."""
        ledger = self.ledger
        ledger.ran(batch.model, seconds)
        now = self._clock()
        if ledger.due(now):
            self._sample(now)

    def sample_at_scrape(self, *, executing: bool) -> None:
        """Close the open interval now, unless a batch is on the device."""
        if not executing:
            self._sample(self._clock())

    def _sample(self, now: float) -> None:
        reading = self.reader.read()
        self.reads += 1
        if reading is not None:
            self.ledger.sample(now, reading)

    def statistics(self) -> EnergyStatistics:
        return self.ledger.statistics()

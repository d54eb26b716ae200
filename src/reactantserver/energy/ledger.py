"""Attribution of a device's measured energy to the models that ran on it (sans-IO).

Theory of operation
-------------------
A power counter (NVML's total-energy counter on a GPU, RAPL's ``energy_uj`` on a CPU)
says how much energy the *device* used; it knows nothing of models. The dispatch loop
knows, for every batch, which model ran and how many device seconds it was charged.
:class:`EnergyLedger` joins the two:

* ``ran(model, seconds)`` is told each batch's device seconds as the batch completes;
  they accumulate in the *open interval*.
* ``sample(now, reading)`` closes the interval that began at the previous sample. The
  counter's advance ``E`` over the interval's wall length ``T`` is split by device time:
  a model that ran ``t_m`` seconds in it gets ``E * t_m / max(T, sum t)``; what is left,
  ``E * (1 - sum t / T)`` when the device was busy less than ``T``, is **idle energy**.
  The denominator ``max(T, sum t)`` keeps the split whole when the device seconds charged
  in an interval exceed its length (a batch that began before the interval opened is
  charged when it completes).

Invariants (``tests/energy/test_energy.py`` states them as Hypothesis properties):

1. Every joule of the counter's advance is accounted: attributed plus idle equals the
   advance of each interval, and so of all of them (up to floating-point rounding).
2. A model that did not run in an interval gets nothing from it.
3. Within an interval, models' shares are proportional to their device seconds.
4. Totals never decrease (they are Prometheus counters). A reading *below* the previous
   one (the driver was reloaded, the counter reset) starts a new baseline: that interval
   is dropped -- its energy is unknown, and is not guessed -- and ``resets`` counts it.

The first reading only sets the baseline; device time charged before it is dropped too
(there is no energy to split). Attribution by device time is the method's limit: it
assumes a model's batch draws the device's average power over the interval; a model
whose kernels draw more than another's is charged like it per second (docs/monitoring.md
says so, with the other limits). The class reads no clock and no device: it is given
``now`` and readings, so it is tested and simulated exactly.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class EnergyReading:
    """One read of a device's power counter."""

    #: Energy since some fixed origin, in joules (monotone, except at a counter reset).
    joules: float
    #: Power now, in watts, where the device reports it (NVML); ``None`` for RAPL.
    watts: float | None = None


@attrs.frozen
class Interval:
    """What one closed interval's energy went to (``EnergyLedger.sample``'s answer)."""

    #: Wall-clock length (seconds, the loop's clock) and the counter's advance (joules).
    seconds: float
    joules: float
    #: Joules per model that ran in the interval (no entry for a model that did not).
    attributed: Mapping[str, float]
    idle_joules: float
    #: Device seconds per model charged in the interval.
    device_seconds: Mapping[str, float]


@attrs.frozen
class EnergyStatistics:
    """Cumulative totals since the first reading (what ``/metrics`` exports)."""

    #: Where the readings come from: ``nvml`` or ``rapl``.
    source: str
    #: Joules attributed to each model that ever ran in a measured interval.
    model_joules: Mapping[str, float]
    idle_joules: float
    #: Watts at the last reading: the device's own figure, else the last interval's mean;
    #: ``None`` before two readings.
    watts: float | None
    #: Wall seconds covered by closed intervals, and intervals dropped at counter resets.
    measured_seconds: float
    resets: int


class EnergyLedger:
    """Splits each interval's energy by device time (see the module docstring)."""

    def __init__(self, source: str, *, min_interval: float) -> None:
        self.source = source
        #: Batch completions sample at most this often (``due``); scrapes always may.
        self.min_interval = min_interval
        self._open: dict[str, float] = {}
        self._last: EnergyReading | None = None
        self._last_time = 0.0
        self._model_joules: dict[str, float] = {}
        self._idle = 0.0
        self._watts: float | None = None
        self._measured = 0.0
        self._resets = 0

    def ran(self, model: str, seconds: float) -> None:
        """A batch of ``model`` completed, charged ``seconds`` of device time."""
        if seconds > 0:
            self._open[model] = self._open.get(model, 0.0) + seconds

    def due(self, now: float) -> bool:
        """Whether a batch completion at ``now`` should read the counter."""
        return self._last is None or now - self._last_time >= self.min_interval

    def sample(self, now: float, reading: EnergyReading) -> Interval | None:
        """Close the open interval at ``now`` with ``reading``; ``None`` when nothing
        could be attributed (the first reading, a counter reset, no time passed)."""
        last = self._last
        if last is None or reading.joules < last.joules:
            if last is not None:
                self._resets += 1
            self._baseline(now, reading)
            return None
        seconds = now - self._last_time
        if seconds <= 0 and reading.joules == last.joules:
            return None  # the same instant again (a scrape right after a batch)
        advance = reading.joules - last.joules
        busy = sum(self._open.values())
        span = max(seconds, busy)
        if span > 0:
            attributed = {model: advance * t / span for model, t in self._open.items()}
            # Busy the whole interval: no idle energy. The shares were computed against
            # ``busy`` itself, so they already sum to the advance.
            idle = 0.0 if busy >= span else advance - sum(attributed.values())
        else:
            attributed, idle = {}, advance  # energy with no time and no batch: nobody ran
        for model, joules in attributed.items():
            self._model_joules[model] = self._model_joules.get(model, 0.0) + joules
        self._idle += idle
        self._measured += max(seconds, 0.0)
        if reading.watts is not None:
            self._watts = reading.watts
        elif seconds > 0:
            self._watts = advance / seconds
        interval = Interval(
            seconds=seconds,
            joules=advance,
            attributed=attributed,
            idle_joules=idle,
            device_seconds=dict(self._open),
        )
        self._open = {}
        self._last = reading
        self._last_time = now
        return interval

    def _baseline(self, now: float, reading: EnergyReading) -> None:
        self._open = {}
        self._last = reading
        self._last_time = now
        if reading.watts is not None:
            self._watts = reading.watts

    def statistics(self) -> EnergyStatistics:
        return EnergyStatistics(
            source=self.source,
            model_joules=dict(self._model_joules),
            idle_joules=self._idle,
            watts=self._watts,
            measured_seconds=self._measured,
            resets=self._resets,
        )

"""An honest fake power counter: a device whose energy advances with its executions.

``FakeGpu`` integrates power over time on a clock it is given (virtual time in Trio
tests, a hand-advanced ``now`` in the sans-IO ones): ``idle_watts`` while nothing runs,
the running model's own draw while one does. Its counter is reported as NVML reports
it -- whole millijoules, truncated -- so the counter's resolution is part of what the
tests meet. ``FakeNvml`` is the slice of the ``pynvml`` module the reader calls, over a
list of such devices. ``powercap_tree`` writes a fake ``/sys/class/powercap``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs


class FakeGpu:
    """Energy = the integral of power over the clock; power follows executions."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        idle_watts: float = 60.0,
        watts: Mapping[str, float] | None = None,
        busy_watts: float = 300.0,
    ) -> None:
        self._clock = clock
        self.idle_watts = idle_watts
        self.watts = dict(watts or {})
        self.busy_watts = busy_watts
        self._joules = 0.0
        self._at = clock()
        self._power = idle_watts
        self.running: str | None = None

    def _accrue(self) -> None:
        now = self._clock()
        self._joules += self._power * (now - self._at)
        self._at = now

    def start(self, model: str) -> None:
        """An execution of ``model`` begins now."""
        self._accrue()
        self.running = model
        self._power = self.watts.get(model, self.busy_watts)

    def stop(self) -> None:
        """The execution ends now: back to idle draw."""
        self._accrue()
        self.running = None
        self._power = self.idle_watts

    @property
    def millijoules(self) -> int:
        self._accrue()
        return int(self._joules * 1000)

    @property
    def milliwatts(self) -> int:
        return int(self._power * 1000)


class FakeNvmlError(Exception):
    pass


@attrs.define
class _Card:
    name: str
    uuid: str
    gpu: FakeGpu | None
    #: False: the energy counter is NotSupported (pre-Volta, MIG).
    energy: bool = True


class FakeNvml:
    """The ``pynvml`` calls ``NvmlReader`` makes, over fake cards."""

    NVMLError = FakeNvmlError

    def __init__(self, cards: Sequence[tuple[str, str, FakeGpu | None]], **unsupported: bool):
        self.cards = [_Card(n, u, g, not unsupported.get(u, False)) for n, u, g in cards]
        self.initialized = 0

    def nvmlInit(self) -> None:
        self.initialized += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Card:
        if not 0 <= index < len(self.cards):
            raise FakeNvmlError("Invalid Argument")
        return self.cards[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Card:
        for card in self.cards:
            if card.uuid == uuid:
                return card
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetName(self, card: _Card) -> str:
        return card.name

    def nvmlDeviceGetUUID(self, card: _Card) -> str:
        return card.uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, card: _Card) -> int:
        if not card.energy or card.gpu is None:
            raise FakeNvmlError("Not Supported")
        return card.gpu.millijoules

    def nvmlDeviceGetPowerUsage(self, card: _Card) -> int:
        if card.gpu is None:
            raise FakeNvmlError("Not Supported")
        return card.gpu.milliwatts


def powercap_tree(root: Path, zones: Mapping[str, tuple[str, int, int]]) -> Path:
    """Write ``root/<zone>/{name,energy_uj,max_energy_range_uj}`` for each
    ``zone: (name, energy_uj, max_energy_range_uj)``; return ``root``."""
    for zone, (name, energy, max_range) in zones.items():
        d = root / zone
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text(f"{name}\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return root


def set_energy(root: Path, zone: str, energy_uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")


def one_gpu(clock: Callable[[], float], **kwargs: Any) -> tuple[FakeGpu, FakeNvml]:
    gpu = FakeGpu(clock, **kwargs)
    return gpu, FakeNvml([("NVIDIA H100 80GB HBM3", "GPU-0000-fake", gpu)])

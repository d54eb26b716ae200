"""Where a worker's energy readings come from: NVML on a GPU, RAPL on a CPU, or nowhere.

Theory of operation
-------------------
A reader turns one device's power counter into :class:`~.ledger.EnergyReading`\\ s:
cumulative joules (monotone but for a reset) and, where the device says, watts now.
Reading one costs one library call or two small file reads; the worker's meter decides
how often (at most every ``SAMPLE_INTERVAL`` seconds at batch completion, and at each
scrape), never a thread of its own.

* :class:`NvmlReader` -- NVIDIA's management library through ``nvidia-ml-py`` (module
  ``pynvml``, in the ``cuda`` extra): ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules
  since the driver loaded; Volta and later) and ``nvmlDeviceGetPowerUsage`` (milliwatts).
  NVML numbers GPUs by PCI bus, CUDA fastest-first: an index names the same card in both
  only when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, when there is one GPU, or when every GPU is
  the same model (CUDA breaks ties by PCI bus). Otherwise the reader refuses the index
  and asks for a UUID -- which the node supervisor passes when it detects GPUs itself --
  rather than read another card's counter (:func:`nvml_target`).
* :class:`RaplReader` -- Linux's powercap tree: the ``package`` zones of
  ``/sys/class/powercap/intel-rapl:N`` (AMD's RAPL appears there too). Each zone's
  ``energy_uj`` wraps to 0 past ``max_energy_range_uj``; the reader unwraps every read
  against the previous one (one wrap between reads at most: at 200 W a 262 kJ range
  wraps every ~20 minutes, and a scrape every 15 s samples far more often). Sub-zones
  (``dram``, cores) are inside or beside the package and are not added; ``psys`` (the
  whole platform) would count the package twice and is skipped. Since 2020 kernels make
  ``energy_uj`` readable by root only (CVE-2020-8694): then the reader is not opened.

:func:`open_reader` picks the reader for a backend and says, in words, why none could
be opened: the worker logs it and ``/metrics`` exports no energy series -- never a
made-up number.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from .ledger import EnergyReading

log = logging.getLogger(__name__)

POWERCAP_ROOT = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


class EnergyReader(Protocol):
    """One device's power counter."""

    #: ``nvml`` or ``rapl``: the ``source`` label of the metrics.
    source: str
    #: What is measured, for the log (``NVIDIA H100 80GB HBM3 GPU-8a1c...``, ``package-0``).
    description: str

    def read(self) -> EnergyReading | None:
        """The counter now; ``None`` when this read failed (the meter skips it)."""
        ...


# ----------------------------------------------------------------------------- NVML


@attrs.frozen
class NvmlTarget:
    """Which NVML device a worker's CUDA device is: by UUID, or by NVML index."""

    uuid: str | None = None
    index: int | None = None


def nvml_target(token: str, names: Sequence[str], device_order: str | None) -> NvmlTarget | str:
    """The NVML device for CUDA device ``token`` (an ordinal or a ``GPU-``/``MIG-`` UUID),
    given the names of NVML's devices in NVML order; a string saying why not otherwise."""
    token = token.strip()
    if token.startswith(("GPU-", "MIG-")):
        return NvmlTarget(uuid=token)
    if not token.isdigit():
        return f"CUDA device {token!r} is neither an ordinal nor a GPU UUID"
    index = int(token)
    if index >= len(names):
        return f"CUDA device {index} is not among NVML's {len(names)} GPU(s)"
    if len(names) == 1 or device_order == "PCI_BUS_ID" or len(set(names)) == 1:
        return NvmlTarget(index=index)
    return (
        f"CUDA device {index} may not be NVML's device {index} on a machine with different "
        "GPU models (CUDA numbers them fastest-first); give the worker its GPU by UUID "
        "(CUDA_VISIBLE_DEVICES=GPU-...) or set CUDA_DEVICE_ORDER=PCI_BUS_ID"
    )


class NvmlReader:
    """Reads one GPU's total-energy counter and power through NVML (module docstring)."""

    source = "nvml"

    def __init__(self, nvml: Any, handle: Any, description: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self.description = description

    @classmethod
    def open(
        cls, token: str, *, nvml: Any = None, env: Mapping[str, str] | None = None
    ) -> NvmlReader | str:
        """Open CUDA device ``token``'s counter; a reason string when it cannot be read.

        ``nvml`` is the ``pynvml`` module (imported when not given; tests pass a fake)."""
        if nvml is None:
            try:
                import pynvml  # the nvidia-ml-py distribution (the cuda extra)
            except ImportError:
                return "nvidia-ml-py is not installed (pip install 'reactantserver[cuda]')"
            nvml = pynvml
        error: type[BaseException] = getattr(nvml, "NVMLError", OSError)
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            names = [
                _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)
            ]
            target = nvml_target(token, names, (env or {}).get("CUDA_DEVICE_ORDER"))
            if isinstance(target, str):
                return target
            if target.uuid is not None:
                handle = nvml.nvmlDeviceGetHandleByUUID(target.uuid)
            else:
                handle = nvml.nvmlDeviceGetHandleByIndex(target.index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NotSupported before Volta
        except error as exc:
            return f"NVML cannot read the energy counter of CUDA device {token!r}: {exc}"
        return cls(nvml, handle, f"{name} {uuid}")

    def read(self) -> EnergyReading | None:
        nvml = self._nvml
        try:
            millijoules = nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            milliwatts = nvml.nvmlDeviceGetPowerUsage(self._handle)
        except getattr(nvml, "NVMLError", OSError) as exc:
            log.debug("NVML read failed: %s", exc)
            return None
        return EnergyReading(joules=millijoules / 1000.0, watts=milliwatts / 1000.0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# ----------------------------------------------------------------------------- RAPL


@attrs.define
class _Zone:
    path: Path
    name: str
    max_range: int
    last: int


class RaplReader:
    """Sums the CPU packages' RAPL counters, unwrapped (see the module docstring)."""

    source = "rapl"

    def __init__(self, zones: Sequence[_Zone]) -> None:
        self._zones = list(zones)
        self._joules = 0.0
        self.description = ", ".join(z.name for z in self._zones)

    @classmethod
    def open(cls, root: Path = POWERCAP_ROOT) -> RaplReader | str:
        """Open every readable package zone under ``root``; a reason string when none."""
        if not root.is_dir():
            return f"{root} does not exist: no RAPL on this machine or kernel"
        zones: list[_Zone] = []
        problems: list[str] = []
        for entry in sorted(root.iterdir()):
            if not _PACKAGE_ZONE.match(entry.name):
                continue
            try:
                name = (entry / "name").read_text().strip()
                if not name.startswith("package"):
                    continue  # psys: the whole platform, the packages included
                max_range = int((entry / "max_energy_range_uj").read_text())
                last = int((entry / "energy_uj").read_text())
            except (OSError, ValueError) as exc:
                problems.append(f"{entry.name}: {exc}")
                continue
            zones.append(_Zone(entry, name, max_range, last))
        if not zones:
            why = "; ".join(problems) or "no package zone"
            return f"no readable RAPL package zone under {root} ({why})"
        return cls(zones)

    def read(self) -> EnergyReading | None:
        advance = 0
        for zone in self._zones:
            try:
                raw = int((zone.path / "energy_uj").read_text())
            except (OSError, ValueError) as exc:
                log.debug("RAPL read of %s failed: %s", zone.path, exc)
                return None
            advance += unwrap(zone.last, raw, zone.max_range)
            zone.last = raw
        self._joules += advance / 1e6
        return EnergyReading(joules=self._joules)


def unwrap(last: int, raw: int, max_range: int) -> int:
    """Microjoules between two reads of a counter that wraps to 0 past ``max_range``."""
    if raw >= last:
        return raw - last
    return max_range - last + raw


# ----------------------------------------------------------------------------- choice


def open_reader(
    backend: str,
    token: str,
    *,
    env: Mapping[str, str],
    nvml: Any = None,
    powercap: Path = POWERCAP_ROOT,
) -> EnergyReader | str:
    """The reader for this worker's device (``token``: its CUDA device, as the ``gpu``
    label), or why there is none: NVML on ``cuda``, RAPL on ``cpu``."""
    if backend == "cuda":
        return NvmlReader.open(token, nvml=nvml, env=env)
    return RaplReader.open(powercap)

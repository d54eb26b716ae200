"""The hardware a plan buys: the device file.

One kind of device (one worker each) and the hosts that hold them (YAML)::

    name: a100-40g
    weight_budget_bytes: 30000000000   # on-demand weight budget of one worker
                                       # (its weight_cache_max_bytes)
    price_per_hour: 1.10               # per device, for the cost per million requests
    watts_busy: 250                    # optional: power executing / idle, for joules
    watts_idle: 60
    devices_per_host: 8                # devices sharing one host's cores (0: all on one)
    host_cores: 32                     # cores of each host (default: the costs file's)
    host_background_threads: 0         # other processes' threads wanting a core on it
                                       # (default: what calibrate saw)
    gateway_on_host: true              # the node's embedded gateway runs on the first host
    max_devices: 64                    # the largest fleet the search tries

Everything but ``name`` and ``weight_budget_bytes`` has a default (below). Read with the
configuration's errors (``FILE:LINE: key: expected ...``, every problem at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..config.source import SourceMap, raise_all, read_yaml
from .checks import Checker

__all__ = ["Device", "device_from_data", "read_device"]


@attrs.frozen(kw_only=True)
class Device:
    name: str
    #: On-demand weight budget of one worker, bytes (0: every model resident, no loads).
    weight_budget_bytes: int
    price_per_hour: float | None = None
    watts_busy: float | None = None
    watts_idle: float | None = None
    #: Devices on one host (sharing its cores); 0: every device on one host.
    devices_per_host: int = 8
    #: Cores of each host (None: the cores calibrate measured on).
    host_cores: float | None = None
    #: Other processes' threads wanting a core on each host (None: what calibrate saw).
    host_background_threads: float | None = None
    gateway_on_host: bool = True
    max_devices: int = 64


_KEYS = (
    "name",
    "weight_budget_bytes",
    "price_per_hour",
    "watts_busy",
    "watts_idle",
    "devices_per_host",
    "host_cores",
    "host_background_threads",
    "gateway_on_host",
    "max_devices",
)


def read_device(path: str | Path) -> Device:
    data, lines = read_yaml(path)
    return device_from_data(data, lines)


def device_from_data(data: Mapping[str, Any], lines: SourceMap) -> Device:
    c = Checker(lines)
    c.keys(data, (), _KEYS)
    name = c.text(data, ("name",))
    budget = c.integer(data, ("weight_budget_bytes",), minimum=0)
    price = c.number(data, ("price_per_hour",), minimum=0.0, default=None)
    busy = c.number(data, ("watts_busy",), minimum=0.0, default=None)
    idle = c.number(data, ("watts_idle",), minimum=0.0, default=None)
    if (busy is None) != (idle is None) and not c.problems:
        missing = "watts_idle" if idle is None else "watts_busy"
        c.problem((missing,), "missing: give watts_busy and watts_idle together (or neither)")
    per_host = c.integer(data, ("devices_per_host",), minimum=0, default=8)
    cores = c.number(data, ("host_cores",), minimum=0.0, strict=True, default=None)
    background = c.number(data, ("host_background_threads",), minimum=0.0, default=None)
    on_host = data.get("gateway_on_host", True)
    if not isinstance(on_host, bool):
        c.problem(("gateway_on_host",), "expected true or false")
        on_host = True
    top = c.integer(data, ("max_devices",), minimum=1, default=64)
    raise_all(c.problems)
    return Device(
        name=name,
        weight_budget_bytes=budget,
        price_per_hour=price,
        watts_busy=busy,
        watts_idle=idle,
        devices_per_host=per_host,
        host_cores=cores,
        host_background_threads=background,
        gateway_on_host=on_host,
        max_devices=top,
    )

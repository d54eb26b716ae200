"""The values of GatewayControlService calls: checked and converted, or refused precisely.

``SetSchedulingPolicy`` names the ``SchedulingPolicy`` fields to change (its update mask);
:func:`policy_value` checks one field's value against the same range rules gateway.yml is held
to (``config.rules.GATEWAY_RULES``) and converts it to the configuration's type
(``default_replicas: -1`` is ``all``). The controller checks every field before it applies
any, so a call is all or nothing. Errors are ``InvalidArgument`` naming the field; the
transport maps them to INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from reactantserver.config.convert import INFLIGHT_REMOVED
from reactantserver.config.rules import GATEWAY_RULES
from reactantserver.errors import FailedPrecondition, InvalidArgument

#: Longest an operator's Repack call may wait for its result.
MAX_REPACK_WAIT_SECONDS = 120.0

#: SchedulingPolicy fields an operator may set (proto field names), and their kinds.
POLICY_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "rebalance_compute_seconds": "float",
        "first_rebalance_compute_seconds": "float",
        "hysteresis": "float",
        "ema_halflife_compute_seconds": "float",
        "default_replicas": "replicas",
        "routing_policy": "choice",
        "routing_fill_factor": "float",
        "routing_fill_mode": "choice",
        "compaction_mode": "choice",
        "compaction_interval": "int",
        "forbid_memory_oversubscription": "bool",
        "work_basis": "choice",
    }
)
_CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "routing_policy": ("fill_rr", "fill_least"),
        "routing_fill_mode": ("run", "spread"),
        "compaction_mode": ("eager", "scheduled", "off"),
        "work_basis": ("compute", "items", "requests"),
    }
)
_RULES = {path[1]: check for path, check in GATEWAY_RULES if path[0] == "scheduling"}


def not_lpt(mode: str) -> FailedPrecondition:
    """The error of a GatewayControlService call when the gateway is not in lpt_packing."""
    return FailedPrecondition(
        f"the gateway runs scheduling.mode {mode}; placement and the GatewayControlService "
        "apply to lpt_packing only (set scheduling.mode: lpt_packing in gateway.yml)"
    )


def check_repack_wait(seconds: float) -> float:
    """Validate Repack's ``wait_seconds``."""
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_REPACK_WAIT_SECONDS):
        raise InvalidArgument(
            f"wait_seconds: expected a number in [0, {MAX_REPACK_WAIT_SECONDS:g}]; got {seconds}"
        )
    return seconds


def policy_value(name: str, value: Any) -> Any:
    """One SchedulingPolicy field, checked and converted to the config's type."""
    kind = POLICY_FIELDS.get(name)
    if kind is None:
        if name == "generation":
            raise InvalidArgument("generation: read-only (reported by GetSchedulingStatus)")
        raise InvalidArgument(
            f"{name}: not a SchedulingPolicy field; expected one of {', '.join(POLICY_FIELDS)}"
        )
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise InvalidArgument(f"{name}: expected a number; got {value!r}")
        value = float(value)
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{name}: expected an integer; got {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name}: expected true or false; got {value!r}")
        return value
    elif kind == "replicas":
        if value == -1 or value == "all":
            return "all"
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"{name}: expected a positive integer or -1 (all); got {value!r}")
        return value
    elif kind == "choice":
        choices = _CHOICES[name]
        if value not in choices:
            if name == "routing_fill_mode" and value == "inflight":
                raise InvalidArgument(f"{name}: {INFLIGHT_REMOVED}")
            raise InvalidArgument(f"{name}: expected one of {', '.join(choices)}; got {value!r}")
        return value
    rule = _RULES.get(name)
    problem = rule(value) if rule is not None else None
    if problem is not None:
        raise InvalidArgument(f"{name}: {problem}")
    return value

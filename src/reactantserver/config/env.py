"""Environment overrides: ``INFERENCE_SERVER_*`` for a worker, ``REACTANT_GATEWAY_*`` for a gateway.

Theory of operation
-------------------
The variable names are *derived from the schema*, not written by hand: every scalar or
list leaf of ``ServerConfig`` (except ``name`` and the per-model ``scheduler.models``
map) is ``INFERENCE_SERVER_`` + its key path joined by ``_`` and upper-cased
(``scheduler.discipline`` -> ``INFERENCE_SERVER_SCHEDULER_DISCIPLINE``; top-level
``model_poll_seconds`` -> ``INFERENCE_SERVER_MODEL_POLL_SECONDS``). The gateway's are
``REACTANT_GATEWAY_`` + the path, except its three lists, which keep the historical names
``REACTANT_GATEWAY_WORKERS`` (endpoints), ``_WORKER_METRICS`` and ``_WORKER_NAMES``.
Because field names contain underscores, a name is matched *whole* against this table
(never split on ``_``); the table is checked to be unambiguous when it is built. Any other
variable with the prefix is an error naming it, so a typo cannot silently do nothing.

Values are text and are parsed to the leaf's type here (integers, numbers including
``inf``, booleans ``1/true/yes/on`` and ``0/false/no/off``, lists split on ``:`` for a
worker and ``,`` for a gateway, empty items dropped). The parsed value is then placed in
the raw tree with an ``EnvOrigin`` and goes through the very same structuring and rule
checks as a value from the file; an error names the variable instead of a line.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union, get_args, get_origin

import attrs

from .convert import LEGACY_KEYS, Invalid, expected
from .schema import GatewayConfig, ServerConfig
from .source import EnvOrigin, Path, Problem, RawTree

WORKER_PREFIX = "INFERENCE_SERVER_"
GATEWAY_PREFIX = "REACTANT_GATEWAY_"
#: Names the gateway.yml to read (``load_gateway``); not a setting itself.
GATEWAY_FILE_VAR = "REACTANT_GATEWAY_FILE"
#: Names the worker ``resolve_worker(node)`` runs when no name is given.
WORKER_NAME_VAR = "REACTANT_WORKER_NAME"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@attrs.frozen
class EnvSetting:
    """One overridable leaf: the variable, the key path it sets, the leaf's type."""

    var: str
    path: Path
    type: Any
    #: List separator for tuple-valued leaves.
    sep: str = ":"


def _leaves(cls: type, prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    for field in attrs.fields(attrs.resolve_types(cls)):
        path = (*prefix, field.name)
        if attrs.has(field.type):
            yield from _leaves(field.type, path)
        elif get_origin(field.type) in (Mapping, dict):
            continue  # per-model maps: model names cannot be spelled in a variable name
        else:
            yield path, field.type


def _table(
    cls: type, prefix: str, sep: str, skip: set[Path], renamed: Mapping[Path, str]
) -> dict[str, EnvSetting]:
    table: dict[str, EnvSetting] = {}
    for path, tp in _leaves(cls):
        if path in skip:
            continue
        var = prefix + renamed.get(path, "_".join(str(p) for p in path).upper())
        if var in table:  # pragma: no cover -- a schema change made two paths collide
            raise RuntimeError(f"{var} would name both {table[var].path} and {path}")
        table[var] = EnvSetting(var, path, tp, sep)
    return table


#: Every ``INFERENCE_SERVER_*`` variable, by name.
#: (``restricted:`` lists are records: they are written in the file, or given with
#: ``--grpc-restricted-protocol``, not as one variable.)
WORKER_ENV: dict[str, EnvSetting] = _table(
    ServerConfig, WORKER_PREFIX, ":", {("name",), ("endpoints", "restricted")}, {}
)

#: Every ``REACTANT_GATEWAY_*`` setting variable, by name.
GATEWAY_ENV: dict[str, EnvSetting] = _table(
    GatewayConfig,
    GATEWAY_PREFIX,
    ",",
    {("restricted",)},
    {
        ("endpoints",): "WORKERS",
        ("metrics_endpoints",): "WORKER_METRICS",
        ("worker_names",): "WORKER_NAMES",
    },
)


def parse(text: str, tp: Any, sep: str) -> Any:
    """Parse an environment value to the leaf type ``tp`` (the check of *which* values are
    allowed is left to structuring and the rules, so it is the same as for the file)."""
    value = text.strip()
    if tp is bool:
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise expected("1, true, yes, on, 0, false, no or off", text)
    if tp is int:
        try:
            return int(value)
        except ValueError:
            raise expected("an integer", text) from None
    if tp is float:
        try:
            number = float(value)
        except ValueError:
            raise expected("a number", text) from None
        if math.isnan(number):
            raise expected("a number", text)
        return number
    if tp is str or get_origin(tp) is Literal:
        return value
    if get_origin(tp) is tuple:
        return [item.strip() for item in text.split(sep) if item.strip()]
    if get_origin(tp) in (Union, types.UnionType):
        arms = [arm for arm in get_args(tp) if arm is not type(None)]
        for arm in arms:
            if get_origin(arm) is Literal and value in get_args(arm):
                return value
        if int in arms:
            return parse(text, int, sep)
        if float in arms:  # cost.device_hour
            return parse(text, float, sep)
        return value
    raise AssertionError(f"no environment parser for {tp}")  # pragma: no cover


def _legacy(var: str) -> str | None:
    for key, message in LEGACY_KEYS.items():
        if key.upper() in var:
            return message
    return None


def read(
    env: Mapping[str, str], prefix: str, table: Mapping[str, EnvSetting], ignore: frozenset[str]
) -> tuple[list[tuple[EnvSetting, Any]], list[Problem]]:
    """The overrides ``env`` sets (parsed), and the problems with the ones it gets wrong."""
    found: list[tuple[EnvSetting, Any]] = []
    wrong: list[Problem] = []
    for var in sorted(env):
        if not var.startswith(prefix) or var in ignore:
            continue
        origin = EnvOrigin(var)
        setting = table.get(var)
        if setting is None:
            legacy = _legacy(var)
            if legacy is not None:
                wrong.append(Problem(origin, legacy))
                continue
            # Compare the parts after the prefix: the shared prefix would make every
            # name look close to every other.
            suffixes = {v[len(prefix) :]: v for v in table}
            close = difflib.get_close_matches(var[len(prefix) :], list(suffixes), n=1)
            hint = (
                f"did you mean {suffixes[close[0]]}?"
                if close
                else f"no {prefix}* setting has this name"
            )
            wrong.append(Problem(origin, f"unknown variable; {hint}"))
            continue
        try:
            found.append((setting, parse(env[var], setting.type, setting.sep)))
        except Invalid as exc:
            wrong.append(Problem(origin, exc.message))
    return found, wrong


def apply(
    tree: RawTree,
    env: Mapping[str, str],
    prefix: str,
    table: Mapping[str, EnvSetting],
    ignore: frozenset[str],
    found: list[Problem],
) -> None:
    """Set on ``tree`` the overrides ``env`` sets (:func:`read`), each at its variable's
    origin; the problems with the ones it gets wrong go to ``found``."""
    overrides, wrong = read(env, prefix, table, ignore)
    found.extend(wrong)
    for setting, value in overrides:
        tree.set(setting.path, value, EnvOrigin(setting.var))


def place(tree: dict[str, Any], path: Path, value: Any) -> None:
    """Set ``value`` at ``path`` of a raw tree, creating mappings on the way."""
    node = tree
    for key in path[:-1]:
        child = node.get(str(key))
        if not isinstance(child, dict):
            child = node[str(key)] = {}
        node = child
    node[str(path[-1])] = value

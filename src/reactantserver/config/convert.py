"""Structuring plain data into the frozen records, strictly, with a path on every error.

Theory of operation
-------------------
One ``cattrs.Converter`` (``forbid_extra_keys``, ``detailed_validation``) turns plain
data into the attrs records of ``schema``. Its hooks are *strict* where cattrs' defaults
are lenient, because a config that "works" by accident is worse than one that fails:

* ``int`` takes an integer only (not ``true``, not ``"8080"``, not ``8080.0``);
  ``float`` takes an integer or a float (not ``true``, not NaN); ``str`` a string;
  ``bool`` only ``true``/``false``;
* a ``Literal`` takes one of its values (``expected one of fair, fifo, edf``);
* a record, a mapping or a list must be one (cattrs would otherwise iterate a string);
* the unions of the schema (``gpus``, replica counts, ``fill_mode``) have their own hooks.

A failure surfaces as cattrs' exception groups, whose notes name the attribute, list
index or mapping key at each level. ``leaves`` walks them and yields each ``Flaw`` (path and message)
in the YAML's key space (``global_`` is written ``global``; a worker entry's ``settings``
are its own keys). ``try_structure`` turns those into ``Problem``s through a
caller-supplied ``locate`` and then *keeps going*: it drops each flawed value (a missing
required key gets a stand-in) and structures again, until the record builds or nothing
more can be repaired, so every structural problem is found in one load and the record
can still be held to the value rules. ``structure`` raises them all as one
``ConfigError``.

The node file's ``global:`` block and worker override keys are structured into
``Settings``: their keys and block shapes are checked here (unknown keys, the removed
``batch_policy``/``residency_mode``, ports that belong to the node file, the
``pin_to_gpu`` alias); their values are checked by resolving each worker.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_mapping_structure_fn, override

from .schema import (
    SETTINGS_KEYS,
    FillMode,
    GatewayModelConfig,
    Gpus,
    NodeConfig,
    Replicas,
    Settings,
    WorkerEntry,
)
from .source import Origin, Path, Problem, raise_all, show

T = TypeVar("T")

#: Keys of a worker entry that are the worker's own rather than settings.
WORKER_KEYS: tuple[str, ...] = ("name", "port", "metrics_port", "gpu")

#: Keys removed from the schema, and what replaced them. They are refused wherever they
#: appear, with this instead of "unknown key".
LEGACY_KEYS: dict[str, str] = {
    "batch_policy": (
        "removed; batches are coalesced at the bundle's compiled batch sizes: cap rows per "
        "dispatch with scheduler.models.<name>.max_batch_size and choose the dispatch order "
        "with scheduler.discipline"
    ),
    "residency_mode": (
        "removed; use the top-level model_control_mode instead ('explicit' replaces "
        "'externally_managed'; 'dynamic' and 'static' are self-managed)"
    ),
}

#: Settings-block keys with a better answer than "unknown key".
_SETTINGS_HINTS: dict[str, str] = {
    "name": "a worker's name is set in its workers: entry, not in a settings block",
    "gpu": "gpu: belongs in a workers: entry (or use the top-level gpus:)",
    "port": "port: belongs in a workers: entry (or use the top-level base_port)",
    "metrics_port": (
        "metrics_port: belongs in a workers: entry (or use the top-level metrics_base_port)"
    ),
    "model_dirs": "the model repository is the top-level model_repo",
    "model_repo": "model_repo is a top-level key of the node file",
}

_ENDPOINT_PORT_HINTS: dict[str, str] = {
    "port": (
        "not set in a settings block; worker i listens on base_port + i, or on its "
        "workers: entry's port:"
    ),
    "metrics_port": (
        "not set in a settings block; worker i's admin port is metrics_base_port + i, or "
        "its workers: entry's metrics_port:"
    ),
}

_REQUIRED_HINTS: dict[str, str] = {
    "model_repo": "expected the model repository directory (every subdirectory holding a "
    "manifest.yaml is a bundle)",
    "name": "expected the worker's name",
}

#: Attribute names that are spelled differently in YAML; ``None`` = not a YAML key level.
_YAML_NAMES: dict[str, str | None] = {"global_": "global", "settings": None}
_HIDDEN_FIELDS = frozenset({"source", "settings"})


class Invalid(Exception):
    """A leaf error: the message, and the key path below the value that was being structured."""

    def __init__(self, message: str, subpath: Path = ()) -> None:
        super().__init__(message)
        self.message = message
        self.subpath = subpath


def expected(what: str, got: object, subpath: Path = ()) -> Invalid:
    return Invalid(f"expected {what}; got {show(got)}", subpath)


def yaml_keys(cls: type) -> tuple[str, ...]:
    """The keys a record accepts in YAML, in schema order."""
    keys: list[str] = []
    for field in attrs.fields(cls):
        if field.name in _HIDDEN_FIELDS:
            if field.name == "settings":
                keys.extend(SETTINGS_KEYS)
            continue
        keys.append(_YAML_NAMES.get(field.name) or field.name)
    return tuple(keys)


def unknown_key(key: object, allowed: tuple[str, ...], hints: Mapping[str, str] = {}) -> str:
    name = str(key)
    if name in LEGACY_KEYS:
        return LEGACY_KEYS[name]
    if name in hints:
        return f"unknown key; {hints[name]}"
    message = f"unknown key; expected one of {', '.join(allowed)}"
    close = difflib.get_close_matches(name, allowed, n=1)
    return f"{message} (did you mean {close[0]}?)" if close else message


# --- strict scalar hooks -----------------------------------------------------------------


def _int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise expected("an integer", value)
    return int(value)


def _float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise expected("a number", value)
    result = float(value)
    if math.isnan(result):
        raise expected("a number", value)
    return result


def _str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise expected("a string", value)
    return value


def _bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise expected("true or false", value)
    return value


def _is_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal


def _literal(value: Any, tp: Any) -> Any:
    choices = get_args(tp)
    if not isinstance(value, str) or value not in choices:
        raise expected("one of " + ", ".join(str(c) for c in choices), value)
    return value


def _mapping_of(value: Any) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise expected("a mapping", value)
    return value


# --- containers ---------------------------------------------------------------------------


def _is_tuple(tp: Any) -> bool:
    args = get_args(tp)
    return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_factory(tp: Any, conv: cattrs.Converter) -> Callable[[Any, Any], tuple[Any, ...]]:
    item_type = get_args(tp)[0]

    def hook(value: Any, _: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise expected("a list", value)
        out: list[Any] = []
        errors: list[Exception] = []
        for index, item in enumerate(value):
            try:
                out.append(conv.structure(item, item_type))
            except Exception as exc:
                exc.add_note(IterableValidationNote(f"@ index {index}", index, item_type))
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {tp}", errors, tp)
        return tuple(out)

    return hook


def _is_mapping(tp: Any) -> bool:
    return get_origin(tp) in (Mapping, dict) or tp in (Mapping, dict)


def _mapping_factory(tp: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    key_type, val_type = get_args(tp) or (str, Any)
    inner = make_mapping_structure_fn(
        tp, conv, structure_to=dict, key_type=key_type, val_type=val_type, detailed_validation=True
    )
    return lambda value, t: inner(_mapping_of(value), t)


def _attrs_factory(tp: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    inner = make_dict_structure_fn(
        tp, conv, _cattrs_forbid_extra_keys=True, _cattrs_detailed_validation=True
    )
    return lambda value, t: inner(_mapping_of(value), t)


# --- the schema's unions ------------------------------------------------------------------


def _replicas(value: Any, _: Any) -> int | str:
    if value == "all" or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise expected("a positive integer or all", value)


def _replicas_or_inherit(value: Any, tp: Any) -> int | str | None:
    return None if value is None else _replicas(value, tp)


#: Why ``inflight`` is refused (docs/gateway.md says the same).
INFLIGHT_REMOVED = (
    "the inflight fill mode was removed: it keeps routing to the replica with the most "
    "requests in flight and parks a model on one worker; use run or spread"
)


def _fill_mode(value: Any, _: Any) -> str:
    if value == "inflight":
        raise Invalid(INFLIGHT_REMOVED)
    if value in ("run", "spread"):
        return value
    raise expected("one of run, spread", value)


def _fill_mode_or_inherit(value: Any, tp: Any) -> str | None:
    if value is None or value == "inherit":
        return None
    try:
        return _fill_mode(value, tp)
    except Invalid as exc:
        if value == "inflight":
            raise
        raise expected("one of run, spread, inherit", value) from exc


def _gpus(value: Any, _: Any) -> Gpus:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, list | tuple):
        wrong = [
            expected("a device ordinal or UUID", item, (index,))
            for index, item in enumerate(value)
            if isinstance(item, bool) or not isinstance(item, int | str)
        ]
        if wrong:
            raise ExceptionGroup("While structuring gpus", wrong)
        return tuple(value)
    raise expected("auto, a GPU count, or a list of devices", value)


# --- node-file blocks ---------------------------------------------------------------------


def structure_settings(value: Any, also_allowed: tuple[str, ...] = ()) -> Settings:
    """Check a settings block's keys and block shapes; normalise ``pin_to_gpu``."""
    block = dict(_mapping_of(value))
    allowed = also_allowed + SETTINGS_KEYS
    for key, item in block.items():
        if key not in SETTINGS_KEYS:
            raise Invalid(unknown_key(key, allowed, _SETTINGS_HINTS), (key,))
        if key in ("runtime", "scheduler", "endpoints", "cost") and not isinstance(item, Mapping):
            raise expected("a mapping", item, (key,))
    endpoints = block.get("endpoints", {})
    for key in ("port", "metrics_port"):
        if key in endpoints:
            raise Invalid(_ENDPOINT_PORT_HINTS[key], ("endpoints", key))
    scheduler = block.get("scheduler")
    if scheduler is not None and "models" in scheduler:
        block["scheduler"] = {**scheduler, "models": _pin_aliases(scheduler["models"])}
    return Settings(block)


def _pin_aliases(models: Any) -> dict[str, Any]:
    """``pin_to_gpu: true`` -> ``residency: device`` in each ``scheduler.models`` entry."""
    out: dict[str, Any] = {}
    for name, entry in _mapping_of_at(models, ("scheduler", "models")).items():
        at: Path = ("scheduler", "models", name)
        entry = dict(_mapping_of_at(entry, at))
        if "pin_to_gpu" in entry:
            pin = entry.pop("pin_to_gpu")
            if not isinstance(pin, bool):
                raise expected("true or false", pin, (*at, "pin_to_gpu"))
            residency = entry.get("residency")
            if residency is not None and (residency == "device") != pin:
                raise Invalid(
                    f"pin_to_gpu: {show(pin)} contradicts residency: {residency} (pin_to_gpu: "
                    "true is an alias for residency: device); keep only residency",
                    (*at, "pin_to_gpu"),
                )
            if pin:
                entry["residency"] = "device"
        out[name] = entry
    return out


def _mapping_of_at(value: Any, at: Path) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise expected("a mapping", value, at)
    return value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _int)
    conv.register_structure_hook(float, _float)
    conv.register_structure_hook(str, _str)
    conv.register_structure_hook(bool, _bool)
    conv.register_structure_hook_func(_is_literal, _literal)
    conv.register_structure_hook_factory(_is_tuple, lambda tp: _tuple_factory(tp, conv))
    conv.register_structure_hook_factory(_is_mapping, lambda tp: _mapping_factory(tp, conv))
    conv.register_structure_hook_factory(attrs.has, lambda tp: _attrs_factory(tp, conv))
    conv.register_structure_hook(Replicas, _replicas)
    hints = attrs.resolve_types(GatewayModelConfig)
    conv.register_structure_hook(attrs.fields(hints).replicas.type, _replicas_or_inherit)
    conv.register_structure_hook(attrs.fields(hints).fill_mode.type, _fill_mode_or_inherit)
    conv.register_structure_hook_func(lambda tp: tp == FillMode, _fill_mode)
    conv.register_structure_hook(Gpus, _gpus)
    conv.register_structure_hook(Settings, lambda value, _: structure_settings(value))

    worker_fields = make_dict_structure_fn(
        WorkerEntry,
        conv,
        settings=override(omit=True),
        _cattrs_forbid_extra_keys=True,
        _cattrs_detailed_validation=True,
    )

    def worker(value: Any, _: Any) -> WorkerEntry:
        entry = _mapping_of(value)
        errors: list[Exception] = []
        settings = Settings()
        try:
            settings = structure_settings(
                {k: v for k, v in entry.items() if k not in WORKER_KEYS}, WORKER_KEYS
            )
        except Invalid as exc:
            errors.append(exc)
        try:
            own = worker_fields({k: v for k, v in entry.items() if k in WORKER_KEYS}, WorkerEntry)
        except Exception as exc:
            errors.append(exc)
        if errors:
            raise ExceptionGroup("While structuring WorkerEntry", errors)
        return attrs.evolve(own, settings=settings)

    conv.register_structure_hook(WorkerEntry, worker)
    node = make_dict_structure_fn(
        NodeConfig,
        conv,
        global_=override(rename="global"),
        source=override(omit=True),
        _cattrs_forbid_extra_keys=True,
        _cattrs_detailed_validation=True,
    )
    conv.register_structure_hook(NodeConfig, lambda value, t: node(_mapping_of(value), t))
    return conv


CONVERTER = _make_converter()


@attrs.frozen
class Flaw:
    """One leaf error of a structuring attempt, in YAML key space.

    ``missing`` is the attribute's type when the flaw is a required key that is absent.
    """

    path: Path
    message: str
    missing: Any = None


def leaves(exc: BaseException, path: Path = (), missing: Any = None) -> Iterator[Flaw]:
    """Every leaf error under ``exc``."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            step: Path = ()
            kind: Any = None
            for note in getattr(sub, "__notes__", ()):
                if isinstance(note, AttributeValidationNote):
                    name = _YAML_NAMES.get(note.name, note.name)
                    step = (name,) if name is not None else ()
                    kind = note.type
                elif isinstance(note, IterableValidationNote):
                    step = (note.index,)
            yield from leaves(sub, path + step, kind)
    elif isinstance(exc, ForbiddenExtraKeysError):
        allowed = yaml_keys(exc.cl)
        for key in sorted(exc.extra_fields):
            yield Flaw((*path, key), unknown_key(key, allowed))
    elif isinstance(exc, Invalid):
        yield Flaw(path + exc.subpath, exc.message)
    elif isinstance(exc, KeyError) and path:
        # detailed validation reports a missing required attribute as KeyError(name),
        # noted with that attribute, so ``path`` already ends with it.
        hint = _REQUIRED_HINTS.get(str(path[-1]))
        message = f"required key missing; {hint}" if hint else "required key missing"
        yield Flaw(path, message, missing)
    else:
        yield Flaw(path, f"invalid value ({exc})")


# --- structuring past errors ----------------------------------------------------------------

#: Stand-ins for a missing required key, so the rest of the record can still be checked.
#: Only these types can be stood in for; a required key of another type ends the attempt.
_STAND_INS: dict[Any, Any] = {str: "", int: 0, float: 0.0, bool: False}

#: Structuring attempts per record; each one drops at least one bad value, and a record has
#: far fewer levels of nesting than this.
_MAX_ATTEMPTS = 64


def _target(flaw: Flaw) -> Path | None:
    """The key to drop (or stand in for) so that structuring gets past ``flaw``.

    Normally the flawed key itself: a key of a mapping is dropped (its default applies),
    a missing required key gets a stand-in. A flawed *list item* takes its whole list
    with it: dropping one item would renumber the others, and a later message about
    ``gpus[2]`` must mean the operator's ``gpus[2]``.
    """
    path = flaw.path
    if path and isinstance(path[-1], int):
        path = path[:-1]
        while path and isinstance(path[-1], int):  # an item of a list of lists
            path = path[:-1]
    if not path or (flaw.missing is not None and flaw.missing not in _STAND_INS):
        return None
    return path


def _repair(data: Any, flaw: Flaw, target: Path) -> Any | None:
    """``data`` with ``target`` dropped or stood in for; None when that changes nothing
    (the next attempt would fail the same way)."""
    if flaw.missing is not None and target == flaw.path:
        return _replace(data, target, _STAND_INS[flaw.missing])
    if _lookup(data, target) is _ABSENT:
        return None
    return _replace(data, target, _ABSENT)


_ABSENT = object()


def _lookup(data: Any, path: Path) -> Any:
    node = data
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                return _ABSENT
        elif not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _replace(data: Any, path: Path, value: Any) -> Any:
    """A copy of ``data`` (copied along ``path`` only) with ``value`` at ``path``
    (``_ABSENT``: the key removed). Missing mappings on the way are created."""
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        if not isinstance(data, list) or not 0 <= head < len(data):
            return data
        items = list(data)
        items[head] = _replace(items[head], rest, value) if rest else value
        return items
    out = dict(data) if isinstance(data, Mapping) else {}
    if rest:
        out[head] = _replace(out.get(head, {}), rest, value)
    elif value is _ABSENT:
        out.pop(head, None)
    else:
        out[head] = value
    return out


def try_structure(
    cls: type[T], data: Any, locate: Callable[[Path], Origin]
) -> tuple[T | None, list[Problem]]:
    """Structure ``data`` into ``cls``, getting past every error it can.

    Returns the record and every problem found. When structuring fails, each flawed value
    is dropped (or a missing required key stood in for, see ``_repair``) and structuring
    tried again, so one bad key does not hide the next: the record returned is then built
    from the repaired data -- good enough to run the value rules on, with the problems
    ``covering`` the repaired keys -- and ``None`` only when nothing more can be repaired.
    """
    found: list[Problem] = []
    seen: set[Path] = set()
    covered: dict[Path, Origin] = {}
    for _ in range(_MAX_ATTEMPTS):
        try:
            return CONVERTER.structure(data, cls), found
        except Exception as exc:
            flaws = [f for f in leaves(exc) if f.path not in seen]
        progress = False
        for flaw in flaws:
            seen.add(flaw.path)
            target = _target(flaw)
            if target is not None and target not in covered:
                repaired = _repair(data, flaw, target)
                if repaired is not None:
                    data = repaired
                    covered[target] = locate(target)
                    progress = True
            cover = covered.get(target) if target is not None else None
            found.append(Problem(locate(flaw.path), flaw.message, cover))
        if not progress:
            break
    return None, found


def structure(cls: type[T], data: Any, locate: Callable[[Path], Origin]) -> T:
    """Structure ``data`` into ``cls``, or raise one ``ConfigError`` listing every problem."""
    result, problems = try_structure(cls, data, locate)
    raise_all(problems)
    assert result is not None
    return result

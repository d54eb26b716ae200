"""The ``config`` parameter of RepositoryModelLoad: a JSON ModelConfig, the part we honour.

Triton lets a load carry a model configuration in JSON (``load_model(name, config=...)``)
that replaces the one on disk for that load. A bundle is not a Triton model directory:
its tensors, its batch axis and its compiled batch sizes are fixed by its export. So a
``config`` may **restate** what the model's ModelConfig says (a client that reads the
config as JSON, edits a field and sends it back must not be refused for the rest) and
may **change** only what the worker can honour without a new export:

==============================================  ======================================
field                                           honoured as
==============================================  ======================================
``max_batch_size``                              from 1 up to the largest compiled size
                                                (0 only for a model without a batch
                                                axis): the scheduler's cap on the rows
                                                coalesced into a batch, as
                                                ``scheduler.models.<name>.max_batch_size``
                                                is (a request is never split)
``dynamic_batching.preferred_batch_size``       the compiled sizes the scheduler may pad
                                                a batch to: any of the compiled sizes,
                                                the largest at least ``max_batch_size``
``parameters.weight.string_value``              the fair-share weight (``fair``), as
                                                SetModelPolicy sets it
==============================================  ======================================

Everything else is checked against what the model's ModelConfig reports: a field given
with that value (or a default value: 0, false, empty -- "not configured", which says
nothing) is accepted, any other value is refused with a message naming the field; a field
left out keeps what the model has. That
covers ``name`` (must be the model's), the tensors, ``instance_group`` (one instance, on
this worker's device: one execution at a time is the design, more instances are more
workers), ``dynamic_batching.max_queue_delay_microseconds`` (0: the scheduler never holds
a request back waiting for company), ``version_policy``, ``model_transaction_policy``
(not decoupled) and ``response_cache`` (off). ``parameters.generation`` numbers the
loads of a name and is read-only: any value is accepted and none is applied (a config read
from ModelConfig carries the generation of the version it was read from). Fields of
Triton's ModelConfig this server does not serve at all (sequence batching, ensembles,
optimization, warm-up...) are refused by name, and unknown fields as such. Field names
may be written as in the proto (``max_batch_size``) or in protobuf's JSON
(``maxBatchSize``); integers as numbers or, as protobuf's JSON writes 64-bit ones, as
decimal strings.

``file:`` parameters (Triton's model upload: files written into the model directory,
the path of CVE-2023-31036) are refused by the service before this module sees a load.

Where it acts (docs/lifecycle.md, "Loading with a config"): :func:`parse` reads the text
when the RPC arrives (INVALID_ARGUMENT before anything happens); :meth:`Override.resolve`
checks it against the bundle once it is read and gives the version's scheduling values;
the override lives with the version it built (``ServedModel.override``): a later load
without ``config`` goes back to the node configuration's values. The weight is the
exception, as it is for SetModelPolicy: it is the scheduler entry's, so it stays until
something sets it again.

No I/O, no JAX.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .errors import InvalidArgument

__all__ = ["MAX_TEXT", "Override", "Resolved", "parse"]

#: Characters of ``config`` text read at most (a ModelConfig is a few hundred).
MAX_TEXT = 64 * 1024
#: Fields of Triton's ModelConfig that this server does not serve, and why.
UNSERVED: Mapping[str, str] = {
    "sequence_batching": "sequence batching is not served (every request stands alone)",
    "ensemble_scheduling": "ensembles are meta models here (kind: meta bundles)",
    "optimization": "optimization policies are the export's (XLA compiles the artifact)",
    "batch_input": "batch inputs are not served",
    "batch_output": "batch outputs are not served",
    "model_warmup": "the worker warms every compiled size up by itself",
    "model_operations": "model operations are not served",
    "model_repository_agents": "repository agents are not served",
    "cc_model_filenames": "a bundle has one artifact",
    "metric_tags": "metric tags are not served",
    "model_metrics": "model metrics are not served",
}
#: Top-level fields restated, not applied (compared with the model's ModelConfig).
RESTATED = (
    "platform",
    "backend",
    "runtime",
    "default_model_filename",
    "version_policy",
    "input",
    "output",
    "instance_group",
    "model_transaction_policy",
    "response_cache",
)
_DYNAMIC_SET = "preferred_batch_size"
_INT = re.compile(r"-?[0-9]{1,19}")


@attrs.frozen
class Resolved:
    """What a version serves with: its cap, its batch sizes, its weight (None: keep)."""

    max_batch_size: int
    batch_sizes: tuple[int, ...]
    weight: float | None


@attrs.frozen
class Override:
    """A parsed ``config``: the values it changes and what it restates (module docstring).

    Two overrides that change the same values are equal, whatever they restate: a load
    repeated with the same ``config`` changes nothing.
    """

    model: str
    max_batch_size: int | None = None
    preferred_batch_sizes: tuple[int, ...] | None = None
    weight: float | None = None
    #: ``(field path, canonical value)`` of what the config restates.
    restated: tuple[tuple[str, Any], ...] = attrs.field(default=(), eq=False)

    def resolve(
        self,
        reported: Mapping[str, Any],
        *,
        compiled: Sequence[int],
        batched: bool,
        max_batch_size: int,
    ) -> Resolved:
        """Check the override against the model it loads: ``reported`` is the model's
        ModelConfig as protobuf's JSON without the override,
        ``compiled`` its compiled batch sizes, ``batched`` whether it has a batch axis and
        ``max_batch_size`` its cap without the override. ``InvalidArgument`` naming
        every field that cannot be honoured."""
        problems = []
        reported = _canonical(reported)
        largest = max(compiled, default=0)
        cap = max_batch_size
        if self.max_batch_size is not None:
            wanted = self.max_batch_size
            if not batched:
                if wanted != 0:
                    problems.append(
                        f"max_batch_size: {wanted}, but the model has no batch axis (only 0)"
                    )
            elif not 1 <= wanted <= largest:
                problems.append(
                    f"max_batch_size: {wanted}, but the bundle is compiled for batches of up to "
                    f"{largest} rows (give 1 to {largest}, or export larger batch sizes)"
                )
            else:
                cap = wanted
        sizes = tuple(compiled)
        if self.preferred_batch_sizes is not None:
            wanted_sizes = self.preferred_batch_sizes
            others = sorted(set(wanted_sizes) - set(compiled))
            if not batched:
                problems.append(
                    "dynamic_batching.preferred_batch_size: the model has no batch axis"
                )
            elif not wanted_sizes or others:
                problems.append(
                    f"dynamic_batching.preferred_batch_size: {list(wanted_sizes)}, but every "
                    "batch runs at a compiled size and the bundle is compiled for "
                    f"{list(compiled)}" + (f" ({others} are not)" if others else "")
                )
            elif max(wanted_sizes) < cap:
                problems.append(
                    f"dynamic_batching.preferred_batch_size: the largest, "
                    f"{max(wanted_sizes)}, is below max_batch_size {cap}: a batch of more rows "
                    "would have no size to run at (add a size, or lower max_batch_size)"
                )
            else:
                sizes = tuple(sorted(set(wanted_sizes)))
        for path, value in self.restated:
            have = _canonical(_lookup(reported, path))
            if not _agrees(value, have):
                says = _show(have) if have is not None else "nothing (not configured)"
                problems.append(
                    f"{path}: {_show(value)}, but the model's ModelConfig says {says}; {_why(path)}"
                )
        if problems:
            raise InvalidArgument(f"config: {'; '.join(problems)}")
        return Resolved(cap, sizes, self.weight)


def parse(model: str, text: str) -> Override:
    """Read ``config`` (JSON) for loading ``model``; ``InvalidArgument`` naming every
    field that is refused (module docstring) before anything is loaded."""
    if len(text) > MAX_TEXT:
        raise InvalidArgument(
            f"config: {len(text)} characters; a ModelConfig in JSON is at most {MAX_TEXT}"
        )
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidArgument("config: nested too deeply to be a ModelConfig") from None
    except ValueError as exc:
        raise InvalidArgument(f"config: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidArgument(
            f"config: a JSON object (a ModelConfig) is expected, got {_kind(data)}"
        )
    problems: list[str] = []
    values: dict[str, Any] = {}
    restated: list[tuple[str, Any]] = []
    for key, value in _fields(data).items():
        if key == "name":
            if value != model:
                problems.append(
                    f"name: {_show(value)}, but the model loaded is {model!r} (the name is "
                    "the bundle's directory)"
                )
        elif key == "max_batch_size":
            number = _integer(value, key, problems)
            if number is not None:
                values["max_batch_size"] = number
        elif key == "dynamic_batching":
            _dynamic(value, values, restated, problems)
        elif key == "parameters":
            _parameters(value, values, restated, problems)
        elif key in RESTATED:
            restated.append((key, _canonical(value)))
        elif key in UNSERVED:
            if not _is_default(value):
                problems.append(f"{key}: {UNSERVED[key]}")
        else:
            problems.append(f"{key}: not a field of ModelConfig")
    if problems:
        raise InvalidArgument(f"config: {'; '.join(problems)}")
    return Override(model, restated=tuple(restated), **values)


# ------------------------------------------------------------------------------ the parts


def _dynamic(value: Any, values: dict[str, Any], restated: list[tuple[str, Any]],
             problems: list[str]) -> None:  # fmt: skip
    if not isinstance(value, dict):
        problems.append(f"dynamic_batching: an object is expected, got {_kind(value)}")
        return
    for key, item in _fields(value).items():
        path = f"dynamic_batching.{key}"
        if key == _DYNAMIC_SET:
            if not isinstance(item, list):
                problems.append(f"{path}: a list of batch sizes is expected, got {_kind(item)}")
                continue
            sizes = [_integer(v, path, problems) for v in item]
            if all(s is not None for s in sizes):
                values["preferred_batch_sizes"] = tuple(s for s in sizes if s is not None)
        else:
            # max_queue_delay_microseconds, default_queue_policy, preserve_ordering,
            # priority levels...: what ModelConfig says (mostly: not configured).
            restated.append((path, _canonical(item)))


def _parameters(value: Any, values: dict[str, Any], restated: list[tuple[str, Any]],
                problems: list[str]) -> None:  # fmt: skip
    if not isinstance(value, dict):
        problems.append(f"parameters: an object is expected, got {_kind(value)}")
        return
    for key, item in value.items():  # parameter names are the user's: not re-cased
        path = f"parameters.{key}"
        if key == "generation":
            continue  # read-only: numbers the loads (module docstring)
        if key != "weight":
            restated.append((path, _canonical(item)))
            continue
        text = _fields(item).get("string_value") if isinstance(item, dict) else None
        try:
            weight = float(text) if isinstance(text, str) else math.nan
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            problems.append(
                f"{path}: {_show(item)}; the fair-share weight is "
                '{"string_value": "<a finite number > 0>"}'
            )
        else:
            values["weight"] = weight


def _integer(value: Any, path: str, problems: list[str]) -> int | None:
    """A protobuf JSON integer: a number without a fraction, or a decimal string."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and _INT.fullmatch(value)
    ):
        return int(value)
    problems.append(f"{path}: an integer is expected, got {_show(value)}")
    return None


def _fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """An object's fields under their proto names (``maxBatchSize`` -> ``max_batch_size``)."""
    return {_snake(k): v for k, v in data.items()}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower() if not name.islower() else name


def _canonical(value: Any) -> Any:
    """A JSON value compared as protobuf would read it: field names in proto form,
    integer strings as integers, default values (0, false, "", [], {}) dropped."""
    if isinstance(value, dict):
        fields = {_snake(k): _canonical(v) for k, v in value.items()}
        return {k: v for k, v in sorted(fields.items()) if not _is_default(v)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str) and _INT.fullmatch(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _is_default(value: Any) -> bool:
    """0, false, "", null, or an empty list or object (protobuf: "not set")."""
    value = _canonical(value)
    return value is None or value in (0, "", [], {})


def _agrees(given: Any, have: Any) -> bool:
    """Whether a restated value says what the model's ModelConfig says: every field it
    sets has the reported value (a field it leaves out, or sets to a default, says
    nothing); a list has the reported elements, those with a name matched by name."""
    if _is_default(given):
        return True
    if isinstance(given, dict):
        return isinstance(have, dict) and all(_agrees(v, have.get(k)) for k, v in given.items())
    if isinstance(given, list):
        if not isinstance(have, list) or len(given) != len(have):
            return False
        named = {e.get("name"): e for e in have if isinstance(e, dict) and e.get("name")}
        pairs = [
            (g, named.get(g["name"]) if isinstance(g, dict) and g.get("name") in named else h)
            for g, h in zip(given, have, strict=True)
        ]
        return all(_agrees(g, h) for g, h in pairs)
    return bool(given == have)


def _lookup(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _why(path: str) -> str:
    top = path.split(".", 1)[0]
    if top in ("input", "output"):
        return "the tensors are the bundle's, fixed by its export"
    if top == "instance_group":
        return (
            "a worker runs one execution at a time on its one device; more instances are "
            "more workers behind a gateway"
        )
    if path == "dynamic_batching.max_queue_delay_microseconds":
        return "the scheduler never holds a request back waiting for company"
    if top == "parameters":
        return "only parameters.weight can be set (parameters.generation is read-only)"
    return "only max_batch_size, dynamic_batching.preferred_batch_size and the weight can change"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."

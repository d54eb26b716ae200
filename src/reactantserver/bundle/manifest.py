"""``manifest.yaml``: the typed manifest of one bundle and its validation.

Theory of operation
-------------------
``parse_manifest`` turns the YAML text of a bundle's ``manifest.yaml`` into a frozen
``Manifest`` or raises ``BundleError``. Parsing is strict: unknown keys are refused
(a typo such as ``compiled_batch_size`` must not silently yield an unbatched model),
every value is type-checked, and every message names the file and line, the key path
and what was expected (and, where a known name is close, which one was probably meant),
e.g.::

    bundle 'mlp': manifest.yaml:7: inputs[0].datatype: expected one of BOOL, ..., got 'FLOAT'

**Every problem at once**, as a node file's (``reactantserver.config``): the checks do not
stop at the first problem. ``_Checker`` records each one; a value that cannot be used is
abandoned (``_Abandon``) and the check moves to the next independent part -- the next
key, the next tensor -- so one load reports an unknown key *and* each bad datatype. A
check that depends on a bad value is skipped rather than run on a stand-in, so the report
has no echoes (a misspelt ``batching:`` key does not also make every ``-1`` axis an
error). Lines come from ruamel's round-trip loader (``load_yaml_lines``); data handed in
by the exporter has none, and its messages say only ``manifest.yaml:``.

The rules (format 1), all checked here without touching any other file:

* ``format_version`` is required and must be ``1``.
* ``kind: model`` (the default) needs ``inputs`` and ``outputs`` (the *executable*
  tensors, in the artifact's argument/result order), and may give ``artifact``
  (default ``model.jaxexport``), ``weights`` (default ``weights.safetensors``),
  ``batching.compiled_batch_sizes`` and, only with a ``model.py``, ``client_inputs`` /
  ``client_outputs`` (what clients see when the hooks change it).
* ``kind: meta`` needs a ``model.py``, non-empty ``client_inputs`` and
  ``client_outputs`` and may list ``calls``; it has no artifact, weights, executable
  tensors or batching.
* Shapes are in wire (row-major) order. A model with a non-empty
  ``compiled_batch_sizes`` is *batched*: every executable input and output carries
  ``-1`` on axis 0 (the batch axis) and fixed extents elsewhere. An unbatched model has
  fixed extents everywhere. Variable axes (``-1`` outside axis 0) are refused on
  executable tensors in format 1; client-facing tensors may have them, since
  ``preprocess`` turns whatever the client sends into the fixed executable shapes.
* ``BYTES`` exists only on client-facing tensors (a device cannot hold it).

Invariants of a ``Manifest`` that passed: tensor names are unique per section, batch
sizes are positive, unique and sorted, every executable tensor has the batch axis iff
the model is batched, and meta/model-only keys never appear on the other kind.

Why one module of this size: every rule of the manifest format, with the message that
names each violation, in one place an author can read top to bottom.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn, ParamSpec, TypeVar

import attrs
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ..errors import BundleError
from ..names import did_you_mean
from ..tensors import DATATYPES, to_numpy_dtype
from ..yaml_lines import YamlTooLarge, line_of, load_round_trip, plain_scalar

_T = TypeVar("_T")
_D = TypeVar("_D")
_P = ParamSpec("_P")

MANIFEST_FILE = "manifest.yaml"
MODEL_PY = "model.py"
DEFAULT_ARTIFACT = "model.jaxexport"
DEFAULT_WEIGHTS = "weights.safetensors"

#: The manifest format this code reads and the exporter writes.
FORMAT_VERSION = "1"
_ACCEPTED_VERSIONS = {"1", "1.0"}

Kind = Literal["model", "meta"]

#: Datatypes a device tensor may have (everything but BYTES).
EXECUTABLE_DATATYPES: tuple[str, ...] = tuple(d for d in DATATYPES if d != "BYTES")

_MODEL_KEYS = (
    "format_version",
    "kind",
    "name",
    "description",
    "inputs",
    "outputs",
    "client_inputs",
    "client_outputs",
    "batching",
    "artifact",
    "weights",
    "provenance",
)
_META_KEYS = (
    "format_version",
    "kind",
    "name",
    "description",
    "client_inputs",
    "client_outputs",
    "calls",
    "provenance",
)
_ALL_KEYS = tuple(dict.fromkeys((*_MODEL_KEYS, *_META_KEYS)))
_TENSOR_KEYS = ("name", "datatype", "shape")
_BATCHING_KEYS = ("compiled_batch_sizes",)


@attrs.frozen
class TensorSpec:
    """One named tensor: KServe datatype and wire-order shape (``-1`` = batch/variable)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> Any:
        """The numpy dtype (``object`` for BYTES)."""
        return to_numpy_dtype(self.datatype)

    def with_batch(self, rows: int) -> tuple[int, ...]:
        """The concrete shape for ``rows`` rows on the batch axis (axis 0)."""
        return (rows, *self.shape[1:])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@attrs.frozen
class Manifest:
    """A validated ``manifest.yaml`` (see the module docstring for the rules)."""

    format_version: str
    kind: Kind
    #: Executable inputs/outputs in the artifact's order (empty for meta bundles).
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: Client-facing tensors when model.py changes them; ``None`` = same as executable.
    client_inputs: tuple[TensorSpec, ...] | None
    client_outputs: tuple[TensorSpec, ...] | None
    #: Ascending, unique, positive; empty = unbatched (fixed shapes).
    compiled_batch_sizes: tuple[int, ...]
    #: File names inside the bundle (``None`` for meta bundles).
    artifact: str | None
    weights: str | None
    #: Models a meta bundle may call (empty for model bundles).
    calls: tuple[str, ...]
    description: str
    declared_name: str | None
    provenance: Mapping[str, Any]

    @property
    def batched(self) -> bool:
        return bool(self.compiled_batch_sizes)

    @property
    def max_batch_size(self) -> int:
        """Largest compiled batch size, 0 when unbatched."""
        return self.compiled_batch_sizes[-1] if self.compiled_batch_sizes else 0

    @property
    def effective_client_inputs(self) -> tuple[TensorSpec, ...]:
        return self.client_inputs if self.client_inputs is not None else self.inputs

    @property
    def effective_client_outputs(self) -> tuple[TensorSpec, ...]:
        return self.client_outputs if self.client_outputs is not None else self.outputs

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain data, in the key order the exporter writes."""
        out: dict[str, Any] = {"format_version": self.format_version, "kind": self.kind}
        if self.declared_name is not None:
            out["name"] = self.declared_name
        if self.description:
            out["description"] = self.description
        if self.kind == "model":
            out["inputs"] = [t.to_dict() for t in self.inputs]
            out["outputs"] = [t.to_dict() for t in self.outputs]
            out["batching"] = {"compiled_batch_sizes": list(self.compiled_batch_sizes)}
            out["artifact"] = self.artifact
            out["weights"] = self.weights
        else:
            out["calls"] = list(self.calls)
        if self.client_inputs is not None:
            out["client_inputs"] = [t.to_dict() for t in self.client_inputs]
        if self.client_outputs is not None:
            out["client_outputs"] = [t.to_dict() for t in self.client_outputs]
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out


class _Abandon(Exception):
    """A value cannot be used: its problem is recorded, and what depends on it is skipped
    (checking goes on with the next key)."""


class _Checker:
    """Typed access to plain YAML data that records ``file:line: key.path: message``
    problems -- every one of them, like a node file's -- and raises them together at the
    end (:meth:`finish`).

    ``fail`` records a problem and abandons the value being checked (``_Abandon``, caught
    by :meth:`attempt` around each independent part); ``problem`` records one and goes
    on. ``lines`` maps key paths (``inputs[0].datatype``) to 1-based lines; a missing key
    is reported at the line of the mapping that lacks it, data without lines (the
    exporter's) without a line.
    """

    def __init__(self, bundle: str, file: str, lines: Mapping[str, int] | None = None) -> None:
        self.bundle = bundle
        self.file = file
        self.lines = lines
        #: (line, order found, text): reported in file order.
        self.problems: list[tuple[int, int, str]] = []

    def problem(self, path: str, message: str) -> None:
        line = self._line(path)
        where = f"{self.file}:{line}" if line else self.file
        text = f"{where}: {path}: {message}" if path else f"{where}: {message}"
        if all(text != known for _, _, known in self.problems):
            self.problems.append((line, len(self.problems), text))

    def fail(self, path: str, message: str) -> NoReturn:
        self.problem(path, message)
        raise _Abandon

    def attempt(
        self, default: _D, check: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T | _D:
        """``check(*args, **kwargs)``, or ``default`` when it abandoned its value (its
        problem is recorded)."""
        try:
            return check(*args, **kwargs)
        except _Abandon:
            return default

    @property
    def count(self) -> int:
        return len(self.problems)

    def finish(self) -> None:
        """Raise every problem found as one ``BundleError`` (none: return); its public
        reason names the lines only, since the problems quote the file's values."""
        if self.problems:
            ordered = sorted(self.problems)
            lines = sorted({line for line, _, _ in ordered if line})
            at = f" (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"
            count = f"{len(ordered)} problem{'s' if len(ordered) > 1 else ''}"
            raise BundleError(
                self.bundle,
                *(text for _, _, text in ordered),
                public=f"{self.file} is not a valid manifest: {count}{at if lines else ''}; "
                "the worker's log says what is wrong",
            )

    def _line(self, path: str) -> int:
        if self.lines is None:
            return 0
        probe = path
        while probe not in self.lines and probe:
            cut = probe.rfind("[") if probe.endswith("]") else probe.rfind(".")
            probe = probe[: max(cut, 0)]
        return self.lines.get(probe, 0)

    def mapping(self, value: Any, path: str, allowed: Sequence[str]) -> Mapping[str, Any]:
        """``value`` as a mapping; each unknown key is a problem of its own (and ignored)."""
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        for key in value:
            if key not in allowed:
                sub = f"{path}.{key}" if path else str(key)
                hint = did_you_mean(str(key), allowed)
                self.problem(
                    sub, f"unknown key; expected one of {', '.join(allowed)}{_paren(hint)}"
                )
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a non-empty string, got {_describe(value)}")
        return value

    def file_name(self, value: Any, path: str) -> str:
        name = self.string(value, path)
        # A bundle is self-contained: its files live in its own directory.
        if "/" in name or "\\" in name or name in (".", ".."):
            self.fail(path, f"expected a file name inside the bundle directory, got {name!r}")
        return name

    def positive_int(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(path, f"expected a positive integer, got {_describe(value)}")
        return value

    def sequence(self, value: Any, path: str, what: str) -> Sequence[Any]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list of {what}, got {_describe(value)}")
        return value


def _paren(hint: str) -> str:
    """``"; did you mean 'x'?"`` -> ``" (did you mean 'x'?)"``, as config messages say it."""
    return f" ({hint.removeprefix('; ')})" if hint else ""


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _tensor(
    c: _Checker, value: Any, path: str, *, client: bool, batched: bool | None, meta: bool
) -> TensorSpec:
    """One tensor; every problem of it recorded, then abandoned if it had any."""
    before = c.count
    m = c.mapping(value, path, _TENSOR_KEYS)
    for key in _TENSOR_KEYS:
        if key not in m:
            c.problem(f"{path}.{key}", "required key is missing")
    name = c.attempt("", c.string, m["name"], f"{path}.name") if "name" in m else ""
    datatype = m.get("datatype")
    allowed = DATATYPES if client else EXECUTABLE_DATATYPES
    if "datatype" not in m:
        pass
    elif datatype == "BYTES" and not client:
        c.problem(
            f"{path}.datatype",
            "BYTES is allowed only on client_inputs/client_outputs of a bundle with a model.py",
        )
    elif not isinstance(datatype, str) or datatype not in allowed:
        hint = did_you_mean(datatype, allowed) if isinstance(datatype, str) else ""
        c.problem(
            f"{path}.datatype",
            f"expected one of {', '.join(allowed)}, got {_describe(datatype)}{_paren(hint)}",
        )
    shape: list[int] = []
    if "shape" in m:
        raw_shape = c.attempt(None, c.sequence, m["shape"], f"{path}.shape", "axis extents")
        for i, d in enumerate(raw_shape or ()):
            if isinstance(d, bool) or not isinstance(d, int) or (d <= 0 and d != -1):
                c.problem(
                    f"{path}.shape[{i}]", f"expected a positive extent or -1, got {_describe(d)}"
                )
            else:
                shape.append(d)
        if raw_shape is not None and len(shape) == len(raw_shape):
            _check_axes(c, shape, path, client=client, batched=batched, meta=meta)
    if c.count > before:
        raise _Abandon
    return TensorSpec(name=name, datatype=str(datatype), shape=tuple(shape))


def _check_axes(
    c: _Checker, shape: list[int], path: str, *, client: bool, batched: bool | None, meta: bool
) -> None:
    """The batch-axis rules; ``batched`` None: not known (meta, or a bad ``batching:``)."""
    if batched is None:
        return
    if batched and (not shape or shape[0] != -1):
        c.problem(
            f"{path}.shape",
            "expected -1 on axis 0 (the batch axis) because "
            f"batching.compiled_batch_sizes is set, got {shape}",
        )
        return
    if not client and not meta:
        first = 1 if batched else 0
        for i in range(first, len(shape)):
            if shape[i] != -1:
                continue
            if batched:
                c.problem(
                    f"{path}.shape[{i}]",
                    "variable axes (-1 outside the batch axis) are not supported on "
                    "executable tensors in format 1; export one bundle per shape",
                )
            else:
                c.problem(
                    f"{path}.shape[{i}]",
                    "-1 needs batching.compiled_batch_sizes (this bundle is unbatched, so "
                    "every axis of an executable tensor is fixed)",
                )


def _tensors(
    c: _Checker, value: Any, path: str, *, client: bool, batched: bool | None, meta: bool = False
) -> tuple[TensorSpec, ...]:
    """A list of tensors: every tensor checked, then abandoned if any had a problem."""
    items = c.sequence(value, path, "tensors ({name, datatype, shape})")
    if not items:
        c.fail(path, "expected at least one tensor, got an empty list")
    before = c.count
    specs: list[TensorSpec] = []
    for i, v in enumerate(items):
        spec = c.attempt(
            None, _tensor, c, v, f"{path}[{i}]", client=client, batched=batched, meta=meta
        )
        if spec is not None:
            specs.append(spec)
    seen: set[str] = set()
    for i, v in enumerate(items):
        name = v.get("name") if isinstance(v, Mapping) else None
        if isinstance(name, str) and name:
            if name in seen:
                c.problem(f"{path}[{i}].name", f"duplicate tensor name {name!r}")
            seen.add(name)
    if c.count > before:
        raise _Abandon
    return tuple(specs)


def _batch_sizes(c: _Checker, value: Any) -> tuple[int, ...]:
    before = c.count
    m = c.mapping(value, "batching", _BATCHING_KEYS)
    if c.count > before:
        # A misspelt key: whether the model is batched is unknown, and the batch-axis
        # rules would only echo the typo.
        raise _Abandon
    raw = m.get("compiled_batch_sizes", [])
    path = "batching.compiled_batch_sizes"
    items = c.sequence(raw, path, "positive integers")
    sizes = [c.attempt(0, c.positive_int, v, f"{path}[{i}]") for i, v in enumerate(items)]
    for i, size in enumerate(sizes):
        if size and size in sizes[:i]:
            c.problem(f"{path}[{i}]", f"duplicate batch size {size}")
    if c.count > before:
        raise _Abandon
    return tuple(sorted(sizes))


def load_yaml(bundle: str, text: str, file: str = MANIFEST_FILE) -> Any:
    """Parse YAML text (safe loader), mapping syntax errors to ``BundleError``."""
    return load_yaml_lines(bundle, text, file)[0]


def load_yaml_lines(
    bundle: str, text: str, file: str = MANIFEST_FILE
) -> tuple[Any, dict[str, int]]:
    """Parse YAML text into plain data and the 1-based line of every key path
    (``inputs[0].datatype``; ``""`` is line 1), mapping syntax errors to ``BundleError``.

    The round-trip loader keeps positions; its containers and scalars are turned into the
    plain ``dict`` / ``list`` / ``int`` / ``float`` / ``bool`` / ``str`` the safe loader
    gives, so the rules see the same values either way.
    """
    try:
        doc = load_round_trip(text)
    except YamlTooLarge as exc:
        raise BundleError(bundle, f"{file}:{exc.line}: refused: {exc.problem}") from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark else ""
        column = f" (column {mark.column + 1})" if mark else ""
        what = exc.problem or exc.context or "unreadable"
        raise BundleError(
            bundle,
            f"{file}{where}: not valid YAML: {what}{column}",
            public=f"{file}{where}: not valid YAML{column}; the worker's log says why",
        ) from None
    except YAMLError:
        raise BundleError(
            bundle, f"{file}: not valid YAML", public=f"{file}: not valid YAML"
        ) from None
    lines: dict[str, int] = {"": 1}
    return _plain(doc, "", lines), lines


def _plain(node: Any, path: str, lines: dict[str, int]) -> Any:
    if isinstance(node, Mapping):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            child = f"{path}.{key}" if path else str(key)
            lines[child] = line_of(node, key, item=False) or lines.get(path, 1)
            out[plain_scalar(key)] = _plain(value, child, lines)
        return out
    if isinstance(node, list):
        items = []
        for index, value in enumerate(node):
            child = f"{path}[{index}]"
            lines[child] = line_of(node, index, item=True) or lines.get(path, 1)
            items.append(_plain(value, child, lines))
        return items
    return plain_scalar(node)


def parse_manifest(bundle: str, text: str, *, has_model_py: bool) -> Manifest:
    """Parse and validate manifest text for the bundle named ``bundle``: every problem of
    it at once, each with its line.

    ``has_model_py`` says whether the bundle directory holds a ``model.py``: client
    tensors and ``kind: meta`` need one.
    """
    data, lines = load_yaml_lines(bundle, text)
    return _validate(_Checker(bundle, MANIFEST_FILE, lines), data, has_model_py=has_model_py)


def manifest_from_data(bundle: str, data: Any, *, has_model_py: bool) -> Manifest:
    """Validate already-loaded manifest data (used by the parser and the exporter)."""
    return _validate(_Checker(bundle, MANIFEST_FILE), data, has_model_py=has_model_py)


def _validate(c: _Checker, data: Any, *, has_model_py: bool) -> Manifest:
    """Every rule of the module docstring; all problems at once (``BundleError``)."""
    try:
        manifest = _checked(c, data, has_model_py=has_model_py)
    except _Abandon:
        manifest = None
    c.finish()
    assert manifest is not None  # no problem recorded: every part was built
    return manifest


def _checked(c: _Checker, data: Any, *, has_model_py: bool) -> Manifest | None:
    """The manifest, or None when a problem was recorded (``_Abandon`` when nothing more
    can be checked)."""
    if data is None:
        c.fail("", "the file is empty; expected a mapping with format_version, kind, ...")
    top = c.mapping(data, "", _ALL_KEYS)
    if "format_version" not in top:
        c.problem("format_version", f"required key is missing (expected {FORMAT_VERSION})")
    elif isinstance(top["format_version"], bool) or str(top["format_version"]) not in (
        _ACCEPTED_VERSIONS
    ):
        c.problem(
            "format_version",
            f"expected {FORMAT_VERSION}, got {_describe(top['format_version'])}",
        )
    kind = top.get("kind", "model")
    if kind not in ("model", "meta"):
        c.fail("kind", f"expected one of model, meta, got {_describe(kind)}")
    allowed = _MODEL_KEYS if kind == "model" else _META_KEYS
    for key in top:
        if key in _ALL_KEYS and key not in allowed:
            c.problem(key, f"not allowed in a kind: {kind} bundle")
    description = top.get("description", "")
    if not isinstance(description, str):
        c.problem("description", f"expected a string, got {_describe(description)}")
    declared = top.get("name")
    if declared is not None:
        declared = c.attempt(None, c.string, declared, "name")
    provenance = top.get("provenance", {})
    if not isinstance(provenance, Mapping):
        c.problem("provenance", f"expected a mapping, got {_describe(provenance)}")
        provenance = {}

    for key in ("client_inputs", "client_outputs"):
        if key in top and not has_model_py:
            c.problem(key, f"allowed only in a bundle with a {MODEL_PY} (none found)")

    if kind == "meta":
        if not has_model_py:
            c.problem("kind", f"a kind: meta bundle needs a {MODEL_PY} (none found)")
        client: list[tuple[TensorSpec, ...] | None] = []
        for key in ("client_inputs", "client_outputs"):
            if key not in top:
                c.problem(key, "required key is missing (a kind: meta bundle declares its tensors)")
                client.append(None)
                continue
            client.append(
                c.attempt(None, _tensors, c, top[key], key, client=True, batched=None, meta=True)
            )
        calls: tuple[str, ...] = c.attempt((), _calls, c, top.get("calls", []), c.bundle)
        if c.count:
            return None
        client_in, client_out = client
        assert client_in is not None and client_out is not None
        return Manifest(
            format_version=FORMAT_VERSION,
            kind="meta",
            inputs=(),
            outputs=(),
            client_inputs=client_in,
            client_outputs=client_out,
            compiled_batch_sizes=(),
            artifact=None,
            weights=None,
            calls=calls,
            description=description,
            declared_name=declared,
            provenance=dict(provenance),
        )

    sizes = c.attempt(None, _batch_sizes, c, top["batching"]) if "batching" in top else ()
    # Batching unknown (its own problem): the batch-axis rules are not checked.
    batched = bool(sizes) if sizes is not None else None
    tensors: dict[str, tuple[TensorSpec, ...] | None] = {}
    for key in ("inputs", "outputs"):
        if key not in top:
            c.problem(key, "required key is missing (the executable's tensors, in argument order)")
            continue
        tensors[key] = c.attempt(None, _tensors, c, top[key], key, client=False, batched=batched)
    for key in ("client_inputs", "client_outputs"):
        if key in top:
            tensors[key] = c.attempt(None, _tensors, c, top[key], key, client=True, batched=batched)
    artifact = c.attempt("", c.file_name, top.get("artifact", DEFAULT_ARTIFACT), "artifact")
    weights = c.attempt("", c.file_name, top.get("weights", DEFAULT_WEIGHTS), "weights")
    if artifact and artifact == weights:
        c.problem("weights", f"must differ from artifact ({artifact!r})")
    if c.count:
        return None
    inputs, outputs = tensors["inputs"], tensors["outputs"]
    assert inputs is not None and outputs is not None and sizes is not None
    return Manifest(
        format_version=FORMAT_VERSION,
        kind="model",
        inputs=inputs,
        outputs=outputs,
        client_inputs=tensors.get("client_inputs"),
        client_outputs=tensors.get("client_outputs"),
        compiled_batch_sizes=sizes,
        artifact=artifact,
        weights=weights,
        calls=(),
        description=description,
        declared_name=declared,
        provenance=dict(provenance),
    )


def _calls(c: _Checker, value: Any, bundle: str) -> tuple[str, ...]:
    raw = c.sequence(value, "calls", "model names")
    before = c.count
    calls = [c.attempt("", c.string, v, f"calls[{i}]") for i, v in enumerate(raw)]
    for i, callee in enumerate(calls):
        if callee and callee in calls[:i]:
            c.problem(f"calls[{i}]", f"duplicate model name {callee!r}")
        if callee == bundle:
            c.problem(f"calls[{i}]", "a meta model cannot call itself")
    if c.count > before:
        raise _Abandon
    return tuple(calls)


def dump_manifest(manifest: Manifest) -> str:
    """YAML text for ``manifest``: block style, keys in a fixed order, short lists inline."""
    import io

    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            out = CommentedMap()
            for k, v in value.items():
                out[k] = convert(v)
            return out
        if isinstance(value, list | tuple):
            seq = CommentedSeq(convert(v) for v in value)
            # Shapes, batch sizes and call lists read best on one line.
            if all(not isinstance(v, Mapping | list | tuple) for v in value):
                seq.fa.set_flow_style()
            return seq
        if isinstance(value, str) and any(not c.isprintable() for c in value):
            # Line breaks YAML knows (NEL, LS, PS) and control characters survive a
            # round trip only escaped in a double-quoted scalar.
            return DoubleQuotedScalarString(value)
        return value

    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    buf = io.StringIO()
    yaml.dump(convert(manifest.to_dict()), buf)
    return buf.getvalue()

"""``manifest.yaml``: the typed manifest of one bundle and its validation.

Theory of operation
-------------------
``parse_manifest`` turns the YAML text of a bundle's ``manifest.yaml`` into a frozen
``Manifest`` or raises ``BundleError``. Parsing is strict: unknown keys are refused
(a typo such as ``compiled_batch_size`` must not silently yield an unbatched model),
every value is type-checked, and every message names the file, the key path and what
was expected, e.g.::

    bundle 'mlp': manifest.yaml: inputs[0].datatype: expected one of BOOL, ..., got 'FLOAT'

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

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NoReturn

import attrs
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ..errors import BundleError
from ..tensors import DATATYPES, to_numpy_dtype

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


class _Checker:
    """Typed access to plain YAML data that fails with ``file: key.path: message``."""

    def __init__(self, bundle: str, file: str) -> None:
        self.bundle = bundle
        self.file = file

    def fail(self, path: str, message: str) -> NoReturn:
        where = f"{self.file}: {path}: " if path else f"{self.file}: "
        raise BundleError(self.bundle, where + message)

    def mapping(self, value: Any, path: str, allowed: Sequence[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        for key in value:
            if key not in allowed:
                sub = f"{path}.{key}" if path else str(key)
                self.fail(sub, f"unknown key; expected one of {', '.join(allowed)}")
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
    m = c.mapping(value, path, _TENSOR_KEYS)
    for key in _TENSOR_KEYS:
        if key not in m:
            c.fail(f"{path}.{key}", "required key is missing")
    name = c.string(m["name"], f"{path}.name")
    datatype = m["datatype"]
    allowed = DATATYPES if client else EXECUTABLE_DATATYPES
    if datatype == "BYTES" and not client:
        c.fail(
            f"{path}.datatype",
            "BYTES is allowed only on client_inputs/client_outputs of a bundle with a model.py",
        )
    if not isinstance(datatype, str) or datatype not in allowed:
        c.fail(
            f"{path}.datatype", f"expected one of {', '.join(allowed)}, got {_describe(datatype)}"
        )
    raw_shape = c.sequence(m["shape"], f"{path}.shape", "axis extents")
    shape: list[int] = []
    for i, d in enumerate(raw_shape):
        if isinstance(d, bool) or not isinstance(d, int) or (d <= 0 and d != -1):
            c.fail(f"{path}.shape[{i}]", f"expected a positive extent or -1, got {_describe(d)}")
        shape.append(d)
    if batched and (not shape or shape[0] != -1):
        c.fail(
            f"{path}.shape",
            "expected -1 on axis 0 (the batch axis) because "
            f"batching.compiled_batch_sizes is set, got {shape}",
        )
    if not client and not meta:
        first = 1 if batched else 0
        for i in range(first, len(shape)):
            if shape[i] == -1:
                if batched:
                    c.fail(
                        f"{path}.shape[{i}]",
                        "variable axes (-1 outside the batch axis) are not supported on "
                        "executable tensors in format 1; export one bundle per shape",
                    )
                c.fail(
                    f"{path}.shape[{i}]",
                    "-1 needs batching.compiled_batch_sizes (this bundle is unbatched, so "
                    "every axis of an executable tensor is fixed)",
                )
    return TensorSpec(name=name, datatype=datatype, shape=tuple(shape))


def _tensors(
    c: _Checker, value: Any, path: str, *, client: bool, batched: bool | None, meta: bool = False
) -> tuple[TensorSpec, ...]:
    items = c.sequence(value, path, "tensors ({name, datatype, shape})")
    if not items:
        c.fail(path, "expected at least one tensor, got an empty list")
    specs = tuple(
        _tensor(c, v, f"{path}[{i}]", client=client, batched=batched, meta=meta)
        for i, v in enumerate(items)
    )
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            c.fail(f"{path}[{i}].name", f"duplicate tensor name {spec.name!r}")
        seen.add(spec.name)
    return specs


def _batch_sizes(c: _Checker, value: Any) -> tuple[int, ...]:
    m = c.mapping(value, "batching", _BATCHING_KEYS)
    raw = m.get("compiled_batch_sizes", [])
    path = "batching.compiled_batch_sizes"
    items = c.sequence(raw, path, "positive integers")
    sizes = [c.positive_int(v, f"{path}[{i}]") for i, v in enumerate(items)]
    for i, s in enumerate(sizes):
        if s in sizes[:i]:
            c.fail(f"{path}[{i}]", f"duplicate batch size {s}")
    return tuple(sorted(sizes))


def load_yaml(bundle: str, text: str, file: str = MANIFEST_FILE) -> Any:
    """Parse YAML text (safe loader), mapping syntax errors to ``BundleError``."""
    try:
        return YAML(typ="safe", pure=True).load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BundleError(bundle, f"{file}: not valid YAML: {exc.problem}{where}") from None
    except YAMLError as exc:
        raise BundleError(bundle, f"{file}: not valid YAML: {exc}") from None


def parse_manifest(bundle: str, text: str, *, has_model_py: bool) -> Manifest:
    """Parse and validate manifest text for the bundle named ``bundle``.

    ``has_model_py`` says whether the bundle directory holds a ``model.py``: client
    tensors and ``kind: meta`` need one.
    """
    return manifest_from_data(bundle, load_yaml(bundle, text), has_model_py=has_model_py)


def manifest_from_data(bundle: str, data: Any, *, has_model_py: bool) -> Manifest:
    """Validate already-loaded manifest data (used by the parser and the exporter)."""
    c = _Checker(bundle, MANIFEST_FILE)
    if data is None:
        c.fail("", "the file is empty; expected a mapping with format_version, kind, ...")
    top = c.mapping(data, "", _ALL_KEYS)
    if "format_version" not in top:
        c.fail("format_version", f"required key is missing (expected {FORMAT_VERSION})")
    version = str(top["format_version"])
    if isinstance(top["format_version"], bool) or version not in _ACCEPTED_VERSIONS:
        c.fail(
            "format_version",
            f"expected {FORMAT_VERSION}, got {_describe(top['format_version'])}",
        )
    kind = top.get("kind", "model")
    if kind not in ("model", "meta"):
        c.fail("kind", f"expected one of model, meta, got {_describe(kind)}")
    allowed = _MODEL_KEYS if kind == "model" else _META_KEYS
    for key in top:
        if key not in allowed:
            c.fail(key, f"not allowed in a kind: {kind} bundle")
    description = top.get("description", "")
    if not isinstance(description, str):
        c.fail("description", f"expected a string, got {_describe(description)}")
    declared = top.get("name")
    if declared is not None:
        declared = c.string(declared, "name")
    provenance = top.get("provenance", {})
    if not isinstance(provenance, Mapping):
        c.fail("provenance", f"expected a mapping, got {_describe(provenance)}")

    for key in ("client_inputs", "client_outputs"):
        if key in top and not has_model_py:
            c.fail(key, f"allowed only in a bundle with a {MODEL_PY} (none found)")

    if kind == "meta":
        if not has_model_py:
            c.fail("kind", f"a kind: meta bundle needs a {MODEL_PY} (none found)")
        for key in ("client_inputs", "client_outputs"):
            if key not in top:
                c.fail(key, "required key is missing (a kind: meta bundle declares its tensors)")
        client_in = _tensors(
            c, top["client_inputs"], "client_inputs", client=True, batched=None, meta=True
        )
        client_out = _tensors(
            c, top["client_outputs"], "client_outputs", client=True, batched=None, meta=True
        )
        raw_calls = c.sequence(top.get("calls", []), "calls", "model names")
        calls = tuple(c.string(v, f"calls[{i}]") for i, v in enumerate(raw_calls))
        for i, callee in enumerate(calls):
            if callee in calls[:i]:
                c.fail(f"calls[{i}]", f"duplicate model name {callee!r}")
            if callee == bundle:
                c.fail(f"calls[{i}]", "a meta model cannot call itself")
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

    sizes = _batch_sizes(c, top["batching"]) if "batching" in top else ()
    batched = bool(sizes)
    executable = []
    for key in ("inputs", "outputs"):
        if key not in top:
            c.fail(key, "required key is missing (the executable's tensors, in argument order)")
        executable.append(_tensors(c, top[key], key, client=False, batched=batched))
    inputs, outputs = executable
    client_inputs = (
        _tensors(c, top["client_inputs"], "client_inputs", client=True, batched=batched)
        if "client_inputs" in top
        else None
    )
    client_outputs = (
        _tensors(c, top["client_outputs"], "client_outputs", client=True, batched=batched)
        if "client_outputs" in top
        else None
    )
    artifact = c.file_name(top.get("artifact", DEFAULT_ARTIFACT), "artifact")
    weights = c.file_name(top.get("weights", DEFAULT_WEIGHTS), "weights")
    if artifact == weights:
        c.fail("weights", f"must differ from artifact ({artifact!r})")
    return Manifest(
        format_version=FORMAT_VERSION,
        kind="model",
        inputs=inputs,
        outputs=outputs,
        client_inputs=client_inputs,
        client_outputs=client_outputs,
        compiled_batch_sizes=sizes,
        artifact=artifact,
        weights=weights,
        calls=(),
        description=description,
        declared_name=declared,
        provenance=dict(provenance),
    )


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

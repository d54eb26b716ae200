"""``weights.safetensors``: the weight arguments of an artifact, in argument order.

Theory of operation
-------------------
An artifact is called as ``exe(*inputs, *weights)``; the weights are explicit
arguments, never constants baked into the program, so the server can keep them in
host RAM and move them on and off the device independently of the compiled code.
Which tensor is which argument is fixed by the ``argument_order`` entry of the
safetensors ``__metadata__``: a JSON list of tensor names. safetensors itself stores
tensors sorted by name, so without this list the order would be lost.

``read_weight_specs`` reads only the header (names, dtypes, shapes) so scanning a
repository is cheap; ``read_weights`` reads the data, in argument order, when the
weights are actually needed on a host. Both refuse a file whose ``argument_order``
is missing, malformed, or does not name exactly the tensors in the file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..errors import BundleError

ARGUMENT_ORDER_KEY = "argument_order"

# safetensors dtype tag -> numpy dtype name (ml_dtypes provides the exotic ones; it
# is imported lazily because only BF16/FP8 weights need it).
_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def _numpy_dtype(name: str) -> np.dtype[Any]:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


@attrs.frozen
class WeightSpec:
    """One weight argument: its name in the file, numpy dtype and shape."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _argument_order(bundle: str, file: str, metadata: Mapping[str, str] | None) -> list[str]:
    raw = (metadata or {}).get(ARGUMENT_ORDER_KEY)
    where = f"{file}: __metadata__.{ARGUMENT_ORDER_KEY}"
    if raw is None:
        raise BundleError(
            bundle,
            f"{where}: required key is missing (a JSON list of tensor names in the "
            "artifact's weight-argument order)",
        )
    try:
        order = json.loads(raw)
    except ValueError:
        raise BundleError(bundle, f"{where}: expected a JSON list of names, got {raw!r}") from None
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        raise BundleError(bundle, f"{where}: expected a JSON list of names, got {raw!r}")
    return order


def read_weight_specs(bundle: str, path: Path) -> tuple[WeightSpec, ...]:
    """The weight arguments of ``path``, in argument order, from the header alone."""
    from safetensors import SafetensorError, safe_open

    file = path.name
    if not path.is_file():
        raise BundleError(bundle, f"{file}: file not found (manifest key 'weights')")
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata()
            keys = set(f.keys())
            tags = {
                k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in keys
            }
    except (SafetensorError, OSError) as exc:
        raise BundleError(bundle, f"{file}: not a readable safetensors file ({exc})") from None
    order = _argument_order(bundle, file, metadata)
    where = f"{file}: __metadata__.{ARGUMENT_ORDER_KEY}"
    seen: set[str] = set()
    for i, name in enumerate(order):
        if name in seen:
            raise BundleError(bundle, f"{where}[{i}]: {name!r} is listed twice")
        if name not in keys:
            raise BundleError(bundle, f"{where}[{i}]: {name!r} is not a tensor in the file")
        seen.add(name)
    extra = sorted(keys - seen)
    if extra:
        raise BundleError(
            bundle, f"{where}: tensors in the file but not in the list: {', '.join(extra)}"
        )
    specs = []
    for name in order:
        tag, shape = tags[name]
        if tag not in _DTYPES:
            raise BundleError(bundle, f"{file}: tensor {name!r}: unsupported dtype {tag}")
        specs.append(WeightSpec(name=name, dtype=_numpy_dtype(_DTYPES[tag]), shape=shape))
    return tuple(specs)


def read_weights(bundle: str, path: Path, specs: Sequence[WeightSpec]) -> list[np.ndarray]:
    """Host copies of the weights in argument order, checked against ``specs``.

    ``specs`` is what the bundle was validated with; a file changed on disk since
    then (a different tensor set or shape) is refused rather than half-loaded. The data
    is read with plain reads (:func:`reactantserver.weights.host.materialize`), never
    through a memory map: a file truncated while it is read is a load error, not a
    SIGBUS that kills the worker (issue 41).
    """
    from ..weights.host import materialize, read_layout

    try:
        layout = read_layout(path)
    except BundleError as exc:
        raise BundleError(bundle, f"{path.name}: cannot read weights ({exc.detail})") from None
    tensors = {t.name: t for t in layout.tensors}
    for spec in specs:
        got = tensors.get(spec.name)
        if got is None:
            raise BundleError(
                bundle, f"{path.name}: tensor {spec.name!r} changed on disk: it is gone"
            )
        if got.dtype != spec.dtype or got.shape != spec.shape:
            raise BundleError(
                bundle,
                f"{path.name}: tensor {spec.name!r} changed on disk: now "
                f"{got.dtype}{list(got.shape)}, loaded as {spec.dtype}{list(spec.shape)}",
            )
    host = materialize(bundle, layout)  # a short read (the file cut) is a BundleError
    by_name = dict(zip((t.name for t in layout.tensors), host.arrays, strict=True))
    return [by_name[spec.name] for spec in specs]


def write_weights(path: Path, named: Sequence[tuple[str, np.ndarray]]) -> None:
    """Write ``named`` weights with their order recorded as ``argument_order``."""
    from safetensors.numpy import save_file

    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate weight names in {names}")
    tensors = {n: np.ascontiguousarray(a) for n, a in named}
    save_file(tensors, str(path), metadata={ARGUMENT_ORDER_KEY: json.dumps(names)})
    # safetensors creates the file owner-only (0600); give it the usual umask-derived
    # mode like every other bundle file, so a server running as another user reads it.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)

"""KServe V2 datatypes, numpy dtypes, and overflow-safe shape and byte arithmetic.

JAX-free: the transport, the bundle parser and the client all use this module.

KServe names a tensor element type with a string (``FP32``, ``INT64``, ``BYTES``...).
Fixed-width types map one-to-one onto numpy dtypes; ``BF16`` maps onto JAX's
bfloat16 numpy dtype when ``ml_dtypes`` is importable (it is whenever JAX is) and is
otherwise carried as raw 2-byte words. ``BYTES`` is variable length: on the wire each
element is a 4-byte little-endian length followed by that many bytes; in numpy it is
an ``object`` array of ``bytes``.

Shapes coming off the wire are hostile: every product and byte count here is
computed with an explicit upper bound so a request cannot make us allocate or
index past what it actually sent.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgument

#: Upper bound on any element count or byte count we accept from a peer (1 TiB).
MAX_BYTES = 1 << 40


def _bfloat16() -> np.dtype[Any] | None:
    try:
        import ml_dtypes  # shipped with JAX; tiny and JAX-free itself
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return np.dtype(ml_dtypes.bfloat16)


_FIXED: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_BF16 = _bfloat16()
if _BF16 is not None:
    _FIXED["BF16"] = _BF16

#: Every datatype name we understand, in a stable order for messages.
DATATYPES: tuple[str, ...] = (*_FIXED.keys(), *(() if _BF16 is not None else ("BF16",)), "BYTES")

_BY_DTYPE: dict[np.dtype[Any], str] = {dt: name for name, dt in _FIXED.items()}


#: The ``InferTensorContents`` list each datatype travels in when sent as typed contents
#: rather than raw bytes (FP16 and BF16 have none: they travel raw only).
TYPED_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def is_datatype(name: str) -> bool:
    return name in DATATYPES


def to_numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype for a KServe datatype (``object`` for BYTES)."""
    if datatype == "BYTES":
        return np.dtype(object)
    try:
        return _FIXED[datatype]
    except KeyError:
        if datatype == "BF16":
            raise InvalidArgument("datatype BF16 needs the ml_dtypes package") from None
        raise InvalidArgument(
            f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def from_numpy_dtype(dtype: np.dtype[Any] | type) -> str:
    """The KServe datatype for a numpy dtype (``object`` and bytes/str arrays are BYTES)."""
    dt = np.dtype(dtype)
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _BY_DTYPE[dt]
    except KeyError:
        raise InvalidArgument(f"numpy dtype {dt} has no KServe datatype") from None


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-width datatype; BYTES has none."""
    if datatype == "BYTES":
        raise InvalidArgument("BYTES has no fixed element size")
    return to_numpy_dtype(datatype).itemsize


def element_count(shape: Sequence[int], *, what: str = "tensor") -> int:
    """Product of ``shape``, refusing negative dims and anything above ``MAX_BYTES``."""
    n = 1
    for d in shape:
        if d < 0:
            raise InvalidArgument(f"{what}: shape {list(shape)} has a negative dimension")
        n *= d
        if n > MAX_BYTES:
            raise InvalidArgument(f"{what}: shape {list(shape)} is too large")
    return n


def byte_size(datatype: str, shape: Sequence[int], *, what: str = "tensor") -> int:
    """Bytes a fixed-width tensor of this shape occupies, overflow-checked."""
    n = element_count(shape, what=what) * element_size(datatype)
    if n > MAX_BYTES:
        raise InvalidArgument(f"{what}: shape {list(shape)} is too large")
    return n


def shape_matches(declared: Sequence[int], actual: Sequence[int]) -> bool:
    """True when ``actual`` fits ``declared``, where ``-1`` in declared matches any extent."""
    if len(declared) != len(actual):
        return False
    # A plain loop, not all(): no generator per call (every request asks, twice).
    for d, a in zip(declared, actual, strict=True):  # noqa: SIM110
        if d != a and d != -1:
            return False
    return True


def serialize_bytes(values: Iterable[Any]) -> bytes:
    """Encode BYTES elements as KServe raw contents (u32 length + data, each)."""
    parts: list[bytes] = []
    for v in values:
        b = v.encode() if isinstance(v, str) else bytes(v)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(buf: bytes | memoryview, count: int, *, what: str = "tensor") -> np.ndarray:
    """Decode ``count`` BYTES elements from raw contents into an object array."""
    mv = memoryview(buf)
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(mv):
            raise InvalidArgument(f"{what}: BYTES contents end after {i} of {count} elements")
        (n,) = struct.unpack_from("<I", mv, pos)
        pos += 4
        if pos + n > len(mv):
            raise InvalidArgument(f"{what}: BYTES element {i} claims {n} bytes past the end")
        out[i] = bytes(mv[pos : pos + n])
        pos += n
    if pos != len(mv):
        raise InvalidArgument(
            f"{what}: {len(mv) - pos} trailing bytes after {count} BYTES elements"
        )
    return out

"""Array-likes to a model's declared datatype, never losing a value on the way.

Sans-IO: ``to_declared(name, value, datatype)`` is a pure function;
:mod:`reactantserver.client.core` decides when to call it (for inputs that are not
numpy arrays, once it knows the model's declared datatypes).

Why
---
``np.asarray([[1.0] * 16])`` is float64 and ``np.asarray([1, 2])`` int64, so a plain
Python list sent as is would be refused by a model that takes FP32 or INT32 -- the
client knows better, because the model's metadata says what it takes. numpy arrays are
*not* converted: their dtype is taken as meant (and they are sent without a copy).

The rules (what "without loss" means)
-------------------------------------
A value is converted to the declared datatype only when nothing the caller wrote is
lost; otherwise the call is refused before anything is sent, naming the input, the
first offending value and why:

* **integers to an integer type**: every value must be in the type's range
  (``300`` is not a UINT8, ``-1`` not a UINT32);
* **numbers to BOOL**: only ``0``/``1`` (``False``/``True``);
* **floats to an integer type**: every value must be finite and whole (``2.0`` is the
  INT32 ``2``; ``2.5`` is refused) and in range;
* **integers to a floating type**: every value must be exactly representable
  (``16777217`` is refused for FP32, whose integers are exact only up to 2**24);
* **floats to a floating type**: rounding to the nearest representable value is
  accepted -- that is what a decimal literal such as ``0.1`` means, and float64 does
  the same -- but a finite value that would become infinite (``1e39`` as FP32) or a
  non-zero value that would become zero (``1e-50`` as FP32) is refused. NaN and the
  infinities stay what they are;
* **text and bytes** go only to BYTES, and only text and bytes go to BYTES; complex
  numbers and other objects are refused.

A **ragged** list -- rows of different lengths, a list beside a number -- is no tensor:
``as_array`` refuses it naming the first place where it breaks (``input 'x': x[1] has
1 element where x[0] has 2``), instead of numpy's ``setting an array element with a
sequence ... inhomogeneous shape``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from reactantserver import tensors
from reactantserver.errors import InvalidArgument

_TEXT_KINDS = frozenset("OSU")


def _refuse(name: str, datatype: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"input {name!r}: cannot convert to {datatype} without loss: {why}; pass a numpy "
        "array to choose the dtype yourself"
    )


def _first(src: np.ndarray, bad: np.ndarray) -> Any:
    """The first offending element, as the caller wrote it (a Python scalar)."""
    value = src.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])]
    return value.item() if hasattr(value, "item") else value


def _integer_bounds(dtype: np.dtype[Any]) -> tuple[float, float]:
    """``[low, high)`` of an integer dtype as floats that compare exactly (powers of 2)."""
    bits = dtype.itemsize * 8
    if dtype.kind == "u":
        return 0.0, float(2**bits)
    return -float(2 ** (bits - 1)), float(2 ** (bits - 1))


def _cast(src: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``src.astype(dtype)`` without numpy's overflow warnings: the callers check."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return src.astype(dtype)


def as_array(name: str, value: Any) -> np.ndarray:
    """``np.asarray(value)``; a ragged nesting is refused saying where (module doc)."""
    try:
        return np.asarray(value)
    except ValueError as exc:
        where = _ragged(name, value, "")
        if where is None:
            raise InvalidArgument(f"input {name!r}: not an array ({exc})") from None
        raise InvalidArgument(
            f"input {name!r}: a ragged list is not a tensor: {where}; give every row the "
            "same length (pad it, or send rows of other lengths as requests of their own)"
        ) from None


def _ragged(name: str, value: Any, path: str) -> str | None:
    """Where the nesting of ``value`` stops being rectangular (None: nowhere)."""
    if not _nested(value):
        return None
    lengths = [len(v) if _nested(v) else None for v in value]
    for index, length in enumerate(lengths):
        if length != lengths[0]:
            return (
                f"{name}{path}[{index}] has {_elements(length)} where {name}{path}[0] has "
                f"{_elements(lengths[0])}"
            )
    for index, item in enumerate(value):
        found = _ragged(name, item, f"{path}[{index}]")
        if found is not None:
            return found
    return None


def _nested(value: Any) -> bool:
    """A list, tuple or array with an axis (not text, not a scalar)."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, list | tuple)


def _elements(length: int | None) -> str:
    if length is None:
        return "a single value"
    return f"{length} element{'' if length == 1 else 's'}"


def to_declared(name: str, value: Any, datatype: str) -> np.ndarray:
    """``value`` (a list, tuple, scalar, ...) as an array of ``datatype``; see the module
    doc for what is refused (``InvalidArgument``)."""
    src = as_array(name, value)
    if datatype == "BYTES":
        if src.dtype.kind in _TEXT_KINDS:
            return src
        raise _refuse(name, datatype, f"got {src.dtype} numbers; BYTES takes text or bytes")
    target = tensors.to_numpy_dtype(datatype)
    if src.dtype == target:
        return src
    if src.dtype.kind in _TEXT_KINDS:
        shown = "text or objects" if src.dtype.kind == "O" else "text"
        raise _refuse(name, datatype, f"got {shown}; {datatype} takes numbers")
    if src.dtype.kind not in "biuf":
        raise _refuse(name, datatype, f"got {src.dtype} values")
    if src.size == 0:
        return _cast(src, target)
    if target.kind == "b":
        bad = (src != 0) & (src != 1)
        if bad.any():
            raise _refuse(name, datatype, f"{_first(src, bad)!r} is neither 0 nor 1")
        return _cast(src, target)
    if target.kind in "iu":
        low, high = _integer_bounds(target)
        if src.dtype.kind == "f":
            bad = ~np.isfinite(src)
            if bad.any():
                raise _refuse(name, datatype, f"{_first(src, bad)!r} is not a number")
            bad = src != np.trunc(src)
            if bad.any():
                raise _refuse(name, datatype, f"{_first(src, bad)!r} has a fractional part")
            bad = (src < low) | (src >= high)
        else:
            info = np.iinfo(target)
            wide = src.astype(np.int64) if src.dtype.kind == "b" else src
            bad = (wide < info.min) | (wide > info.max)
        if bad.any():
            raise _refuse(name, datatype, f"{_first(src, bad)!r} is out of {datatype}'s range")
        return _cast(src, target)
    # A floating target (FP16, BF16, FP32, FP64).
    out = _cast(src, target)
    if src.dtype.kind in "biu":
        back = _cast(out, src.dtype)
        bad = (back != src) | ~np.isfinite(out)
        if bad.any():
            raise _refuse(
                name, datatype, f"{_first(src, bad)!r} is not exactly representable in {datatype}"
            )
        return out
    bad = np.isinf(out) & np.isfinite(src)
    if bad.any():
        raise _refuse(name, datatype, f"{_first(src, bad)!r} is out of {datatype}'s range")
    bad = (out == 0) & (src != 0)
    if bad.any():
        raise _refuse(name, datatype, f"{_first(src, bad)!r} would become 0 in {datatype}")
    return out

"""KServe datatype mapping and the overflow-safe size arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from reactantserver import tensors
from reactantserver.errors import InvalidArgument


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("BOOL", np.bool_),
        ("UINT8", np.uint8),
        ("UINT64", np.uint64),
        ("INT8", np.int8),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
    ],
)
def test_fixed_width_round_trip(name: str, dtype: type) -> None:
    assert tensors.to_numpy_dtype(name) == np.dtype(dtype)
    assert tensors.from_numpy_dtype(np.dtype(dtype)) == name


def test_bf16_maps_to_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert tensors.to_numpy_dtype("BF16") == np.dtype(ml_dtypes.bfloat16)
    assert tensors.element_size("BF16") == 2


def test_bytes_is_object() -> None:
    assert tensors.to_numpy_dtype("BYTES") == np.dtype(object)
    assert tensors.from_numpy_dtype(np.array([b"a"]).dtype) == "BYTES"
    with pytest.raises(InvalidArgument, match="BYTES has no fixed element size"):
        tensors.element_size("BYTES")


def test_unknown_datatype_lists_the_known_ones() -> None:
    with pytest.raises(
        InvalidArgument, match=r"unknown datatype 'FLOAT'; expected one of BOOL, UINT8"
    ):
        tensors.to_numpy_dtype("FLOAT")


def test_byte_size_and_hostile_shapes() -> None:
    assert tensors.byte_size("FP32", [4, 16]) == 256
    assert tensors.byte_size("UINT8", []) == 1
    with pytest.raises(InvalidArgument, match="negative dimension"):
        tensors.element_count([2, -3], what="input x")
    with pytest.raises(InvalidArgument, match=r"input x: shape .* is too large"):
        tensors.byte_size("FP64", [1 << 30, 1 << 30], what="input x")
    # A product that overflows int64 in C is still refused, not wrapped.
    with pytest.raises(InvalidArgument, match="too large"):
        tensors.element_count([1 << 62, 1 << 62])


def test_shape_matches_wildcards() -> None:
    assert tensors.shape_matches([-1, 16], [8, 16])
    assert not tensors.shape_matches([-1, 16], [8, 15])
    assert not tensors.shape_matches([-1, 16], [8, 16, 1])


def test_bytes_codec_round_trip_and_truncation() -> None:
    raw = tensors.serialize_bytes([b"ab", "c", b""])
    assert raw == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    out = tensors.deserialize_bytes(raw, 3)
    assert list(out) == [b"ab", b"c", b""]
    with pytest.raises(InvalidArgument, match="claims 2 bytes past the end"):
        tensors.deserialize_bytes(raw[:5], 3)
    with pytest.raises(InvalidArgument, match="trailing bytes"):
        tensors.deserialize_bytes(raw + b"x", 3)
    with pytest.raises(InvalidArgument, match="end after 3 of 4"):
        tensors.deserialize_bytes(raw, 4)

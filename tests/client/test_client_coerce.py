"""Array-likes converted to a model's declared datatype: accepted exactly when lossless.

``to_declared`` is vectorised numpy; the oracle here judges one element at a time in
plain Python, so the two agree only if the rules of ``reactantserver.client.coerce`` are
what its docstring says.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from strategies import client_array_likes

from reactantserver import tensors
from reactantserver.client.coerce import to_declared
from reactantserver.errors import InvalidArgument


def _integer_range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _element_ok(value: object, target: np.dtype) -> bool:
    """Whether one value survives conversion to ``target`` (the rules, one at a time)."""
    if isinstance(value, bool):
        return True  # False/True are 0/1 in every numeric type
    if target.kind == "b":
        return value in (0, 1)
    if target.kind in "iu":
        low, high = _integer_range(target)
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                return False
            value = int(value)
        assert isinstance(value, int)
        return low <= value <= high
    # A floating target.
    with np.errstate(all="ignore"):
        converted = float(np.asarray(value).astype(target))
    if isinstance(value, int):
        return math.isfinite(converted) and int(converted) == value
    assert isinstance(value, float)
    if math.isfinite(value) and math.isinf(converted):
        return False
    return not (value != 0 and converted == 0)


@given(client_array_likes())
def test_conversion_is_refused_exactly_when_a_value_would_be_lost(
    case: tuple[list[object], str],
) -> None:
    """For a list of numbers and a declared datatype: the conversion is accepted if and
    only if every element survives it (integers in range and exact, floats whole for an
    integer type, no float turned infinite or zero), and an accepted conversion has the
    declared dtype and the values numpy's own cast gives -- for integer and BOOL targets
    and integer sources, exactly the values written."""
    values, datatype = case
    target = tensors.to_numpy_dtype(datatype)
    expected_ok = all(_element_ok(v, target) for v in values)
    try:
        out = to_declared("x", values, datatype)
    except InvalidArgument as exc:
        assert not expected_ok, f"refused a lossless conversion: {exc}"
        assert str(exc).startswith(f"input 'x': cannot convert to {datatype} without loss: ")
        return
    assert expected_ok, f"accepted a lossy conversion to {datatype}: {values} -> {out}"
    assert out.dtype == target
    src = np.asarray(values)
    with np.errstate(all="ignore"):
        assert np.array_equal(out, src.astype(target), equal_nan=True)
    if target.kind in "biu" or src.dtype.kind in "biu":
        assert [type(v)(x) for v, x in zip(values, out.tolist(), strict=True)] == values


@pytest.mark.parametrize(
    ("value", "datatype", "why"),
    [
        ([1.5, 2.0], "INT32", "1.5 has a fractional part"),
        ([300], "UINT8", "300 is out of UINT8's range"),
        ([-1], "UINT32", "-1 is out of UINT32's range"),
        ([float("nan")], "INT64", "nan is not a number"),
        ([2], "BOOL", "2 is neither 0 nor 1"),
        ([16777217], "FP32", "16777217 is not exactly representable in FP32"),
        ([1e39], "FP32", "1e+39 is out of FP32's range"),
        ([1e-50], "FP32", "1e-50 would become 0 in FP32"),
        ([70000.0], "FP16", "70000.0 is out of FP16's range"),
        (["a"], "FP32", "got text; FP32 takes numbers"),
        ([1, 2], "BYTES", "got int64 numbers; BYTES takes text or bytes"),
        ([1j], "FP32", "got complex128 values"),
    ],
)
def test_refusals_name_the_input_the_value_and_why(value: object, datatype: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        to_declared("x", value, datatype)
    assert str(err.value) == (
        f"input 'x': cannot convert to {datatype} without loss: {why}; pass a numpy array to "
        "choose the dtype yourself"
    )


def test_what_a_newcomer_writes_just_works() -> None:
    assert to_declared("x", [[1.0] * 16], "FP32").dtype == np.float32
    assert to_declared("x", [[0.1, 0.2]], "FP32").tolist() == [
        [np.float32(0.1).item(), np.float32(0.2).item()]
    ]
    assert to_declared("ids", [1, 2, 3], "INT32").dtype == np.int32
    assert to_declared("flag", True, "BOOL").shape == ()
    assert to_declared("t", [0.5], "FP64").dtype == np.float64
    assert to_declared("scale", [2.0, 3.0], "UINT8").tolist() == [2, 3]
    assert to_declared("s", ["hello", "world"], "BYTES").tolist() == ["hello", "world"]
    empty = to_declared("x", [], "FP32")
    assert empty.dtype == np.float32 and empty.shape == (0,)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ([[1.0, 2.0], [3.0]], "x[1] has 1 element where x[0] has 2 elements"),
        ([1.0, [2.0]], "x[1] has 1 element where x[0] has a single value"),
        ([[[1.0], [2.0]], [[3.0], [4.0, 5.0]]], "x[1][1] has 2 elements where x[1][0] has 1"),
        ([np.zeros(2), np.zeros(3)], "x[1] has 3 elements where x[0] has 2 elements"),
    ],
)
def test_a_ragged_list_is_refused_saying_where(value: object, where: str) -> None:
    """Issue 42: numpy's raw ``setting an array element with a sequence ... inhomogeneous
    shape`` came out of ``reactantserver.client``. Now: what is wrong and where."""
    with pytest.raises(InvalidArgument) as info:
        to_declared("x", value, "FP32")
    message = str(info.value)
    assert message.startswith("input 'x': a ragged list is not a tensor: ")
    assert where in message and "inhomogeneous" not in message


def test_a_ragged_list_through_the_client_is_refused_before_anything_is_sent() -> None:
    """The same refusal from ``Client.infer`` for an input whose datatype it does not
    know (no metadata asked): the wire encoder says it too."""
    from reactantserver.client.codec import wire_array

    with pytest.raises(InvalidArgument, match=r"input 'x': a ragged list is not a tensor: x\[1\]"):
        wire_array("x", [[1, 2], [3]])

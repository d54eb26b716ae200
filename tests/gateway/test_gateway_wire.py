"""The gateway's peek at ModelInfer bytes (``gateway.core.wire``).

The peek is checked against protobuf's own parser (tritonclient's ``service_pb2``) on
arbitrary messages, with unknown fields spliced in and with every kind of damage. (The
``grpc-timeout`` the gateway writes is ``reactantserver.grpcwire``'s: test_grpcwire.py.)
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import codec_unknown_field, model_infer_requests
from tritonclient.grpc import service_pb2

from reactantserver.errors import InvalidArgument
from reactantserver.gateway.core import wire
from reactantserver.gateway.core.wire import InferPeek, grpc_message, peek_infer, peek_name
from reactantserver.protocol import inference as pb
from reactantserver.protocol.wire_reader import MAX_DIMS, MAX_FIELDS

Seen = tuple[str, str, str, list[tuple[str, tuple[int, ...]]]]


def _expected(data: bytes) -> Seen:
    message = service_pb2.ModelInferRequest.FromString(data)
    inputs = [(t.name, tuple(t.shape)) for t in message.inputs]
    return message.model_name, message.model_version, message.id, inputs


def _seen(peek: InferPeek) -> Seen:
    return peek.model, peek.version, peek.id, list(peek.inputs)


def _field(number: int, payload: bytes) -> bytes:
    assert number < 16 and len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


@given(model_infer_requests())
def test_the_peek_reads_what_protobuf_reads(request: pb.ModelInferRequest) -> None:
    """For any ModelInferRequest, the peek's model name, version, id and input (name,
    shape) pairs are exactly those protobuf's parser reads from the same bytes."""
    data = bytes(request)
    assert _seen(peek_infer(data)) == _expected(data)


@given(
    model_infer_requests(),
    st.lists(codec_unknown_field(), max_size=3),
    st.lists(codec_unknown_field(), max_size=3),
)
def test_unknown_fields_are_skipped_at_both_levels(
    request: pb.ModelInferRequest, before: list[bytes], inside: list[bytes]
) -> None:
    """Fields the schema does not use, of any wire type (groups too), anywhere -- at the top
    level or inside an input tensor -- change nothing the peek reads."""
    tensor = bytes(pb.ModelInferRequestInferInputTensor(name="u", shape=[3, 4]))
    data = b"".join(before) + bytes(request) + _field(5, tensor + b"".join(inside))
    assert _seen(peek_infer(data)) == _expected(data)


def _general(data: bytes) -> object:
    """What the general peek answers for ``data``: its reading, or its error's message."""
    try:
        return _seen(wire._peek(data))
    except InvalidArgument as exc:
        return str(exc)


@given(model_infer_requests(), st.data())
def test_the_usual_path_reads_the_usual_message_as_the_general_one(
    request: pb.ModelInferRequest, data: st.DataObject
) -> None:
    """The one-pass peek (``_peek_usual``) takes every message a client's protobuf library
    writes with one-byte field tags -- it does not hand it to the general reader -- and
    reads the same model, id and shapes from it. With a byte changed anywhere, or the
    message cut short, it reads what the general reader reads or hands the bytes over
    (None): never a different reading, never an error of its own."""
    raw = bytes(request)
    usual = wire._peek_usual(raw)
    if all(-1 < extent < 2**28 for tensor in request.inputs for extent in tensor.shape):
        assert usual is not None
    if usual is not None:
        assert _seen(usual) == _general(raw)
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    damaged = bytearray(raw[: data.draw(st.integers(0, len(raw)))])
    if at < len(damaged):
        damaged[at] = data.draw(st.integers(0, 255))
    usual = wire._peek_usual(bytes(damaged))
    if usual is not None:
        assert _seen(usual) == _general(bytes(damaged))


@given(st.binary(max_size=96))
def test_the_usual_path_never_reads_bytes_differently(data: bytes) -> None:
    """For any bytes, the one-pass peek reads what the general reader reads, or hands
    the bytes over to it (None)."""
    usual = wire._peek_usual(data)
    if usual is not None:
        assert _seen(usual) == _general(data)


@given(st.binary(max_size=64))
def test_any_bytes_peek_or_fail_as_invalid_argument(data: bytes) -> None:
    """Whatever arrives, the peek returns or raises InvalidArgument -- never another error."""
    try:
        peek_infer(data)
    except InvalidArgument:
        pass


@given(model_infer_requests(), st.data())
def test_a_cut_message_peeks_or_fails_cleanly(
    request: pb.ModelInferRequest, data: st.DataObject
) -> None:
    """Any prefix of a valid message (a stream cut short) is read or refused as
    InvalidArgument."""
    raw = bytes(request)
    cut = data.draw(st.integers(0, len(raw)))
    try:
        peek_infer(raw[:cut])
    except InvalidArgument:
        pass


def test_the_last_model_name_wins_and_shapes_accept_both_encodings() -> None:
    unpacked = bytes([3 << 3 | 0, 4, 3 << 3 | 0, 16])  # shape 4, 16 as two varints
    data = (
        _field(1, b"first")
        + _field(1, b"double")
        + _field(3, b"req-7")
        + _field(5, _field(1, b"x") + unpacked)
    )
    peek = peek_infer(data)
    assert (peek.model, peek.id, peek.inputs) == ("double", "req-7", (("x", (4, 16)),))
    assert peek.shape_of("x") == (4, 16)
    assert peek.shape_of("y") is None


def test_tensor_bytes_are_skipped_not_read() -> None:
    big = b"\x00" * 1_000_000
    message = pb.ModelInferRequest(
        model_name="m",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="UINT8", shape=[1, 10**6])],
        raw_input_contents=[big],
    )
    assert peek_infer(bytes(message)).inputs == (("x", (1, 10**6)),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x05abc", "length 5 at byte 1 runs past the end"),
        (b"\x0a\x02\xff\xfe", "model_name is not valid UTF-8"),
        (b"\x08\x01", "model_name has wire type 0, expected 2"),
        (b"\x00\x01", "field number 0 at byte 0"),
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\x2a\x05\x1d\x00\x00\x00\x00", "InferInputTensor: shape has wire type 5"),
        (b"\x7c", "END_GROUP 15 outside any group"),
    ],
)
def test_damage_is_named(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        peek_infer(data)


def _long_field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


@pytest.mark.parametrize(
    "hostile",
    [
        b"\x52\x01\x00" * (MAX_FIELDS + 1),  # unknown fields, three bytes each
        b"\x1a\x00" * (MAX_FIELDS + 1),  # the id, sent again and again
        _long_field(5, b"\x52\x01\x00" * MAX_FIELDS),  # unknown fields inside an input
        _field(5, _field(1, b"x") + b"\x52\x01\x00" * 3) * (MAX_FIELDS // 5 + 1),  # 5 each
    ],
)
def test_the_work_budget_refuses_a_message_of_too_many_fields(hostile: bytes) -> None:
    """However the fields are spread, past the budget the peek refuses: its work on the
    gateway's loop is bounded by MAX_FIELDS fields, not by the message's size."""
    with pytest.raises(InvalidArgument, match=f"more than {MAX_FIELDS} protobuf fields"):
        peek_infer(hostile)


def test_a_message_within_the_work_budget_is_read() -> None:
    assert peek_infer(b"\x52\x01\x00" * (MAX_FIELDS - 1) + _field(1, b"m")).model == "m"


def test_a_packed_shape_of_too_many_extents_is_refused_before_it_is_read() -> None:
    with pytest.raises(InvalidArgument, match=f"shape has more than {MAX_DIMS} extents"):
        peek_infer(_long_field(5, _long_field(3, bytes(10_000_000))))


def test_peek_name_reads_field_one_of_small_requests() -> None:
    assert peek_name(bytes(pb.ModelReadyRequest(name="double", version="3"))) == "double"
    assert peek_name(bytes(pb.ModelStatisticsRequest())) == ""
    with pytest.raises(InvalidArgument, match="malformed ModelConfigRequest"):
        peek_name(b"\x0a\x09", what="ModelConfigRequest")


def test_grpc_message_prefixes_the_length() -> None:
    assert grpc_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert grpc_message(memoryview(b"")) == b"\x00\x00\x00\x00\x00"

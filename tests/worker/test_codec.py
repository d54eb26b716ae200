"""The lean ModelInfer codec against the two protobuf runtimes that define "correct".

Every decoded request is compared field for field with what betterproto (our other
codec) and Google's protobuf runtime (tritonclient's ``service_pb2``, what real clients
use) read from the same bytes; every encoded response is compared byte for byte with
betterproto's serialization and parsed back by protobuf. Hostile bytes must fail with
``InvalidArgument`` naming the problem, never with another exception, and the server
must answer them with INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import betterproto
import grpc
import numpy as np
import pytest
import trio
import tritonclient.grpc.aio as tca
from fake_host import FakeHost
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import codec_responses, codec_unknown_field, model_infer_requests
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult, service_pb2
from tritonclient.grpc import _utils as triton_utils

from reactantserver.config.schema import EndpointsConfig
from reactantserver.errors import InvalidArgument
from reactantserver.protocol import codec as codec_module
from reactantserver.protocol import inference as pb
from reactantserver.protocol.codec import (
    MAX_ENTRIES,
    decode_infer_request,
    encode_infer_response,
    encode_infer_response_parts,
    encode_infer_response_sized,
    encode_stream_error,
    from_message,
    peek_request_id,
    stream_response_head,
)
from reactantserver.protocol.wire_reader import MAX_DIMS, MAX_FIELDS, MAX_GROUP_DEPTH
from reactantserver.records import InferRequest, InferResponse, OutputTensor, ParamValue
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc

# ------------------------------------------------------------------------------ canonical forms
# A request as nested tuples of plain values, so that three parsers' results compare with ==.

_KIND = {
    "bool_param": bool,
    "int64_param": int,
    "uint64_param": int,
    "string_param": str,
    "double_param": float,
}

# Servers started in this process run as the worker does: Trio is asyncio's guest.
pytestmark = pytest.mark.guest


#: InferTensorContents' lists, in field order.
_CONTENTS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)


def _lists(contents: Any) -> tuple[list[Any], ...]:
    return tuple(list(getattr(contents, f)) for f in _CONTENTS)


def _lean_params(params: dict[str, ParamValue]) -> dict[str, Any]:
    return {k: None if v is None else (type(v).__name__, v) for k, v in params.items()}


def _bp_params(params: dict[str, pb.InferParameter]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind, value = betterproto.which_one_of(param, "parameter_choice")
        out[key] = (_KIND[kind].__name__, value) if kind else None
    return out


def _proto_params(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = (_KIND[kind].__name__, getattr(param, kind)) if kind else None
    return out


def canon_lean(r: InferRequest) -> tuple[Any, ...]:
    return (
        r.model_name,
        r.model_version,
        r.id,
        _lean_params(r.parameters),
        [
            (
                t.name,
                t.datatype,
                t.shape,
                _lean_params(t.parameters),
                None if t.contents is None else _lists(t.contents),
            )
            for t in r.inputs
        ],
        [(o.name, _lean_params(o.parameters)) for o in r.outputs],
        [bytes(raw) for raw in r.raw_input_contents],
    )


def canon_betterproto(r: pb.ModelInferRequest) -> tuple[Any, ...]:
    def contents(t: pb.ModelInferRequestInferInputTensor) -> tuple[list[Any], ...] | None:
        return _lists(t.contents) if betterproto.serialized_on_wire(t.contents) else None

    return (
        r.model_name,
        r.model_version,
        r.id,
        _bp_params(r.parameters),
        [
            (t.name, t.datatype, list(t.shape), _bp_params(t.parameters), contents(t))
            for t in r.inputs
        ],
        [(o.name, _bp_params(o.parameters)) for o in r.outputs],
        list(r.raw_input_contents),
    )


def canon_protobuf(r: Any) -> tuple[Any, ...]:
    def contents(t: Any) -> tuple[list[Any], ...] | None:
        return _lists(t.contents) if t.HasField("contents") else None

    return (
        r.model_name,
        r.model_version,
        r.id,
        _proto_params(r.parameters),
        [
            (t.name, t.datatype, list(t.shape), _proto_params(t.parameters), contents(t))
            for t in r.inputs
        ],
        [(o.name, _proto_params(o.parameters)) for o in r.outputs],
        list(r.raw_input_contents),
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# ------------------------------------------------------------------------------ what clients send


def _triton_request() -> tuple[bytes, Any]:
    """What ``tritonclient`` sends: raw inputs, a shared-memory input, requested outputs
    with parameters, request parameters (timeout, priority, custom ones)."""
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    a = InferInput("x", [2, 16], "FP32")
    a.set_data_from_numpy(x)
    b = InferInput("mask", [2], "BOOL")
    b.set_data_from_numpy(np.array([True, False]))
    c = InferInput("big", [4, 4], "FP64")
    c.set_shared_memory("region", 128, offset=64)
    y = InferRequestedOutput("y")
    y.set_shared_memory("out", 128)
    z = InferRequestedOutput("z", class_count=3)
    request = triton_utils._get_inference_request(
        model_name="mlp",
        inputs=[a, b, c],
        model_version="2",
        request_id="req-7",
        outputs=[y, z],
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=5,
        timeout=250_000,
        parameters={"flag": True, "ratio": 0.5, "label": "é", "neg": -3},
    )
    return request.SerializeToString(), request


def test_a_tritonclient_request_decodes_field_for_field() -> None:
    data, sent = _triton_request()
    got = decode_infer_request(data)
    assert canon_lean(got) == canon_protobuf(sent)
    assert got.parameters["timeout"] == 250_000 and got.parameters["priority"] == 5
    assert got.parameters["flag"] is True and got.parameters["neg"] == -3
    assert got.inputs[2].parameters == {
        "shared_memory_region": "region",
        "shared_memory_byte_size": 128,
        "shared_memory_offset": 64,
    }
    assert got.outputs[1].parameters == {"classification": 3}
    # Raw contents are views of the received message, not copies.
    assert [raw.obj is data for raw in got.raw_input_contents] == [True, True]


def test_from_message_keeps_the_messages_own_raw_bytes() -> None:
    raw = np.arange(16, dtype=np.float32).tobytes()
    message = pb.ModelInferRequest(
        model_name="m",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[raw],
    )
    lean = from_message(message)
    assert canon_lean(lean) == canon_betterproto(message)
    assert lean.raw_input_contents[0] is raw


@given(model_infer_requests())
def test_any_request_decodes_as_betterproto_and_protobuf_decode_it(
    request: pb.ModelInferRequest,
) -> None:
    """For any ModelInferRequest, the lean decode of its bytes holds exactly the fields
    betterproto and Google's protobuf runtime read from the same bytes."""
    data = bytes(request)
    lean = decode_infer_request(data)
    assert canon_lean(lean) == canon_betterproto(request)
    assert canon_lean(lean) == canon_protobuf(service_pb2.ModelInferRequest.FromString(data))


@given(
    model_infer_requests(),
    st.lists(codec_unknown_field(), max_size=3),
    st.lists(codec_unknown_field(), max_size=3),
)
def test_unknown_fields_are_skipped_everywhere(
    request: pb.ModelInferRequest, before: list[bytes], inside: list[bytes]
) -> None:
    """Fields of numbers the schema does not use, of any wire type (groups included), are
    skipped at the top level and inside tensors, as protobuf skips them."""
    baseline = decode_infer_request(bytes(request))
    tensor = pb.ModelInferRequestInferInputTensor(name="u", datatype="INT8", shape=[3])
    spliced = (
        b"".join(before)
        + bytes(request)
        + _field(5, bytes(tensor) + b"".join(inside))
        + b"".join(inside)
    )
    got = decode_infer_request(spliced)
    expected = canon_lean(baseline)
    expected[4].append(("u", "INT8", [3], {}, None))
    assert canon_lean(got) == expected
    assert canon_protobuf(service_pb2.ModelInferRequest.FromString(spliced)) == expected


def test_the_last_value_of_a_singular_field_wins_and_repeated_ones_append() -> None:
    first = pb.ModelInferRequest(model_name="a", id="1")
    second = pb.ModelInferRequest(model_name="b")
    tensor = _field(1, b"x") + _field(5, bytes(pb.InferTensorContents(int_contents=[1])))
    more = _field(5, bytes(pb.InferTensorContents(int_contents=[2])))
    data = bytes(first) + bytes(second) + _field(5, tensor + more)
    got = decode_infer_request(data)
    theirs = service_pb2.ModelInferRequest.FromString(data)
    assert (got.model_name, got.id) == ("b", "1") == (theirs.model_name, theirs.id)
    # The contents message sent twice merges: both packed chunks count (betterproto
    # would keep only the second).
    assert got.inputs[0].contents is not None
    assert list(got.inputs[0].contents.int_contents) == [1, 2]
    assert canon_lean(got) == canon_protobuf(theirs)


def test_typed_contents_follow_protobufs_scalar_rules() -> None:
    # int32 keeps the low 32 bits of its varint (sign included); uint32 likewise; floats
    # come packed or one by one.
    varints = b"".join(_varint(v) for v in (2**64 - 1, 2**32 + 5, 2**31))
    contents = (
        _field(2, varints)
        + _field(4, varints)
        + b"\x35"  # fp32_contents, unpacked (fixed32)
        + np.float32(1.5).tobytes()
        + _field(6, np.array([2.5, -0.0], np.float32).tobytes())
        + b"\x08\x02"  # bool_contents, unpacked: any non-zero is true
    )
    data = _field(5, _field(1, b"t") + _field(5, contents))
    got = decode_infer_request(data)
    theirs = service_pb2.ModelInferRequest.FromString(data)
    contents = got.inputs[0].contents
    assert contents is not None
    assert list(contents.int_contents) == [-1, 5, -(2**31)]
    assert list(contents.uint_contents) == [2**32 - 1, 5, 2**31]
    assert list(contents.fp32_contents) == [1.5, 2.5, -0.0]
    assert list(contents.bool_contents) == [True]
    assert canon_lean(got) == canon_protobuf(theirs)


def test_unpacked_shapes_and_negative_extents() -> None:
    # shape as individual varints (unpacked), and -1 as ten bytes of two's complement.
    shape = b"".join(b"\x18" + _varint(d & (2**64 - 1)) for d in (-1, 16, 2**40))
    data = _field(5, _field(1, b"x") + shape)
    assert decode_infer_request(data).inputs[0].shape == [-1, 16, 2**40]
    assert list(service_pb2.ModelInferRequest.FromString(data).inputs[0].shape) == [
        -1,
        16,
        2**40,
    ]


# ------------------------------------------------------------------------------ responses


def _as_betterproto(response: InferResponse) -> pb.ModelInferResponse:
    return pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=[
            pb.ModelInferResponseInferOutputTensor(
                name=o.name, datatype=o.datatype, shape=list(o.shape), parameters=dict(o.parameters)
            )
            for o in response.outputs
        ],
        raw_output_contents=[bytes(r) for r in response.raw_output_contents],
    )


@settings(max_examples=200)
@given(codec_responses())
def test_responses_are_byte_for_byte_betterprotos(response: InferResponse) -> None:
    """The hand-written encoder writes exactly the bytes betterproto writes for the same
    response, and protobuf reads back every field."""
    data = encode_infer_response(response)
    reference = _as_betterproto(response)
    assert data == bytes(reference)
    theirs = service_pb2.ModelInferResponse.FromString(data)
    assert (theirs.model_name, theirs.model_version, theirs.id) == (
        response.model_name,
        response.model_version,
        response.id,
    )
    assert [(o.name, o.datatype, list(o.shape)) for o in theirs.outputs] == [
        (o.name, o.datatype, o.shape) for o in response.outputs
    ]
    assert list(theirs.raw_output_contents) == [bytes(r) for r in response.raw_output_contents]


def test_a_response_as_tritonclient_reads_it() -> None:
    y = np.arange(32, dtype=np.float32).reshape(2, 16)
    response = InferResponse("mlp", "3", "req-7")
    response.outputs.append(OutputTensor("y", "FP32", [2, 16]))
    response.raw_output_contents.append(y.reshape(-1).view(np.uint8).data)
    shm = {
        "shared_memory_region": pb.InferParameter(string_param="out"),
        "shared_memory_byte_size": pb.InferParameter(int64_param=128),
    }
    response.outputs.append(OutputTensor("z", "FP32", [2, 16], shm))
    response.raw_output_contents.append(b"")
    data = encode_infer_response(response)
    result = InferResult(service_pb2.ModelInferResponse.FromString(data))
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    assert result.get_output("z").parameters["shared_memory_byte_size"].int64_param == 128
    assert result.get_response().id == "req-7"


@settings(max_examples=100)
@given(codec_responses())
def test_a_stream_response_wraps_the_response_as_protobuf_reads_it(
    response: InferResponse,
) -> None:
    """ModelStreamInfer's answer: a ``ModelStreamInferResponse`` whose ``infer_response``
    protobuf reads back as exactly the unary response, with no error message."""
    parts = encode_infer_response_parts(response)
    size = sum(memoryview(p).nbytes for p in parts)
    data = stream_response_head(size) + b"".join(bytes(p) for p in parts)
    theirs = service_pb2.ModelStreamInferResponse.FromString(data)
    assert theirs.error_message == ""
    unary = service_pb2.ModelInferResponse.FromString(encode_infer_response(response))
    assert theirs.infer_response == unary


@settings(max_examples=100)
@given(codec_responses())
def test_the_sized_encoding_counts_its_pieces_and_copies_no_tensor(
    response: InferResponse,
) -> None:
    """``encode_infer_response_sized``: its pieces join to exactly the unary encoding, its
    size is their length, every raw output is one of the pieces as it was given (not
    copied), and the fields around them are joined: at most one piece before each raw
    output and one after the last."""
    parts, size = encode_infer_response_sized(response)
    joined = b"".join(bytes(p) for p in parts)
    assert joined == encode_infer_response(response)
    assert size == len(joined)
    raws = list(response.raw_output_contents)
    assert [p for p in parts if any(p is r for r in raws)] == raws
    assert len(parts) <= 2 * len(raws) + 1


@pytest.mark.parametrize(
    ("request_bytes", "request_id"),
    [
        (bytes(pb.ModelInferRequest(model_name="m", id="req-9")), "req-9"),
        (bytes(pb.ModelInferRequest(model_name="m")), ""),
        (b"\x1a\x02ab\x1a\x01c", "c"),  # the last id wins, as protobuf reads it
        (b"\x1a\x02ab\x0a\x80", "ab"),  # malformed after the id: what was read
        (b"\xff\xff", ""),  # not a message at all
    ],
)
def test_a_stream_error_carries_the_message_and_the_requests_id(
    request_bytes: bytes, request_id: str
) -> None:
    """As Triton answers a failed request in a stream: the error message, and an
    ``infer_response`` holding only the request's id."""
    assert peek_request_id(request_bytes) == request_id
    data = b"".join(bytes(p) for p in encode_stream_error(request_bytes, "it failed: ünïcode"))
    theirs = service_pb2.ModelStreamInferResponse.FromString(data)
    assert theirs.error_message == "it failed: ünïcode"
    assert theirs.infer_response == service_pb2.ModelInferResponse(id=request_id)


# ------------------------------------------------------------------------------ hostile bytes


def _message(data: bytes) -> str:
    with pytest.raises(InvalidArgument) as info:
        decode_infer_request(data)
    return str(info.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x0a\x80", "varint at byte 1 is truncated"),
        (b"\x80", "varint at byte 0 is truncated"),
        (b"\x48" + b"\xff" * 10 + b"\x01", "varint at byte 1 is longer than 10 bytes"),
        (b"\x0a\x05abc", "length 5 at byte 1 runs past the end of the message (5)"),
        (b"\x08\x01", "model_name has wire type 0, expected 2"),
        (b"\x3d\x00\x00\x00\x00", "raw_input_contents has wire type 5, expected 2"),
        (b"\x00", "field number 0 at byte 0"),
        (b"\x4e", "field 9 has invalid wire type 6"),
        (b"\x4c", "END_GROUP 9 outside any group"),
        (b"\x4b\x54", "group 9 closed by END_GROUP 10"),
        (b"\x49\x00\x00\x00", "fixed-width field 9 runs past the end of the message"),
        (b"\x0a\x02\xff\xfe", "model_name is not valid UTF-8"),
    ],
)
def test_hostile_top_level_bytes(data: bytes, expected: str) -> None:
    assert _message(data) == f"malformed ModelInferRequest: {expected}"


def test_a_nested_length_cannot_reach_past_its_message() -> None:
    # The tensor says its name has 9 bytes; the tensor itself holds 3, the buffer more.
    tensor = b"\x0a\x09abc"
    data = _field(5, tensor) + b"x" * 20
    assert _message(data) == (
        "malformed ModelInferRequest.InferInputTensor: length 9 at byte 3 runs past the "
        "end of the message (7)"
    )


def test_nested_messages_name_themselves() -> None:
    param = _field(1, b"k") + _field(2, b"\x10")  # int64_param with its varint cut off
    assert _message(_field(4, param)) == "malformed InferParameter: varint at byte 8 is truncated"
    bad_contents = _field(5, _field(1, b"x") + _field(5, b"\x12\x05\x01"))
    assert _message(bad_contents) == (
        "malformed InferTensorContents: length 5 at byte 8 runs past the end of the message (10)"
    )
    partial = _field(5, _field(5, _field(6, b"\x00\x00\x80")))
    assert (
        _message(partial)
        == "malformed InferTensorContents: contents.fp32_contents holds a partial element"
    )
    wrong = _field(5, _field(5, b"\x31" + bytes(8)))  # fp32_contents as fixed64
    assert _message(wrong) == (
        "malformed InferTensorContents: contents.fp32_contents has wire type 1, expected 5 or 2"
    )


def test_deeply_nested_groups_are_refused_not_a_recursion_error() -> None:
    data = b"\x4b" * (MAX_GROUP_DEPTH + 5)
    assert (
        _message(data)
        == f"malformed ModelInferRequest: groups nested deeper than {MAX_GROUP_DEPTH}"
    )


def test_counts_that_would_become_millions_of_objects_are_refused() -> None:
    """A few bytes per entry on the wire, hundreds of bytes per Python object: lists and
    maps are capped so that one message cannot become gigabytes of objects."""
    many = _field(7, b"") * (MAX_ENTRIES + 1)
    assert _message(many) == (
        f"malformed ModelInferRequest: more than {MAX_ENTRIES} raw_input_contents entries"
    )
    assert len(decode_infer_request(many[:-2]).raw_input_contents) == MAX_ENTRIES
    params = b"".join(_field(4, _field(1, str(i).encode())) for i in range(MAX_ENTRIES + 1))
    assert _message(params) == f"malformed ModelInferRequest: more than {MAX_ENTRIES} parameters"
    dims = _field(5, _field(3, bytes(MAX_DIMS + 1)))
    assert _message(dims) == (
        f"malformed ModelInferRequest.InferInputTensor: shape has more than {MAX_DIMS} extents"
    )


_BUDGET_SPENT = (
    f"ModelInferRequest has more than {MAX_FIELDS} protobuf fields (nested ones and the "
    "elements of packed integer lists counted): no client sends one so intricate, and "
    "decoding it would hold up every other call; send tensors in raw_input_contents or "
    "shared memory"
)


@pytest.mark.parametrize(
    "hostile",
    [
        b"\x52\x01\x00" * 1_000_000,  # 3 MB of unknown fields (issue 41: 0.4-3.8 s)
        b"\x1a\x00" * (MAX_FIELDS + 1),  # a singular field sent again and again
        _field(5, b"\x52\x01\x00" * MAX_FIELDS),  # unknown fields inside an input
        _field(5, _field(5, _field(2, bytes(MAX_FIELDS + 1)))),  # packed int32 contents
        _field(5, _field(5, b"\x10\x00" * (MAX_FIELDS + 1))),  # unpacked int32 contents
        b"\x5b" * 20 + b"\x52\x01\x00" * MAX_FIELDS + b"\x5c" * 20,  # inside groups
    ],
)
def test_the_work_budget_refuses_a_message_of_too_many_fields(hostile: bytes) -> None:
    """However the fields are spread -- unknown, repeated, nested, packed -- decoding
    stops at the budget: its work on the loop is bounded by MAX_FIELDS, not by the size."""
    assert _message(hostile) == _BUDGET_SPENT


def test_a_request_within_the_work_budget_decodes() -> None:
    contents = _field(5, _field(5, _field(2, bytes(MAX_FIELDS - 3))))  # 3 tags before it
    request = decode_infer_request(contents)
    assert request.inputs[0].contents is not None
    assert len(request.inputs[0].contents.int_contents) == MAX_FIELDS - 3


@given(st.binary(max_size=64))
def test_arbitrary_bytes_fail_only_with_invalid_argument(data: bytes) -> None:
    """Whatever the bytes, decoding returns a request or raises InvalidArgument."""
    try:
        decode_infer_request(data)
    except InvalidArgument:
        pass


def test_every_truncation_fails_exactly_where_protobuf_fails() -> None:
    """Cut a realistic request at every byte: ours decodes a prefix exactly when protobuf
    does (at field boundaries), and then to the same fields."""
    data, _ = _triton_request()
    for end in range(len(data)):
        prefix = data[:end]
        try:
            theirs = service_pb2.ModelInferRequest.FromString(prefix)
        except Exception:
            theirs = None
        try:
            ours = decode_infer_request(prefix)
        except InvalidArgument:
            ours = None
        assert (ours is None) == (theirs is None), f"prefix of {end} bytes"
        if ours is not None:
            assert canon_lean(ours) == canon_protobuf(theirs)


# ------------------------------------------------------------------------------ on the wire


async def test_the_server_answers_malformed_requests_with_invalid_argument(
    nursery: trio.Nursery,
) -> None:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    port = await nursery.start(serve_grpc, service, EndpointsConfig(host="127.0.0.1", port=0))
    x = np.arange(16, dtype=np.float32)
    good = bytes(
        pb.ModelInferRequest(
            model_name="double",
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
            raw_input_contents=[x.tobytes()],
        )
    )

    def call(payload: bytes) -> tuple[grpc.StatusCode, Any]:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            try:
                return grpc.StatusCode.OK, infer(payload, timeout=10)
            except grpc.RpcError as exc:
                return exc.code(), exc.details()

    code, details = await trio.to_thread.run_sync(call, b"\x0a\x05abc")
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details == (
        "malformed ModelInferRequest: length 5 at byte 1 runs past the end of the message (5)"
    )
    # Unknown fields (here a group and a fixed64) are skipped; the call is served.
    code, answer = await trio.to_thread.run_sync(call, good + b"\x4b\x48\x01\x4c\x51" + bytes(8))
    assert code is grpc.StatusCode.OK
    response = service_pb2.ModelInferResponse.FromString(answer)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), 2 * x)
    assert service.statistics().rpcs[("ModelInfer", "INVALID_ARGUMENT")] == 1


async def test_large_frames_are_accepted_from_the_first_read(nursery: trio.Nursery) -> None:
    """End to end with the large frames the server allows: a fresh connection sends 24
    requests of 256 KiB at once, and every answer is right. (The race this invites is
    pinned down deterministically by the next test.)"""
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    port = await nursery.start(serve_grpc, service, EndpointsConfig(host="127.0.0.1", port=0))
    x = np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16)  # 256 KiB per request

    def burst() -> list[Any]:
        async def main() -> list[Any]:
            client = tca.InferenceServerClient(f"127.0.0.1:{port}")
            inp = InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                return await asyncio.gather(*(client.infer("double", [inp]) for _ in range(24)))
            finally:
                await client.close()

        return asyncio.run(main())

    for result in await trio.to_thread.run_sync(burst):
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)


class _Wire(asyncio.Transport):
    """A transport that records what the server writes."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def take(self) -> bytes:
        data, self.sent = bytes(self.sent), bytearray()
        return data


def test_a_settings_ack_and_a_large_frame_in_one_read() -> None:
    """h2 raises its inbound frame limit only for the read *after* the peer acknowledges
    our SETTINGS; the server must accept a large DATA frame arriving in the same read as
    that acknowledgement (a fresh client sending big requests at once does exactly this)
    instead of failing the connection with a protocol error."""
    from grpclib.encoding.proto import ProtoCodec
    from h2.config import H2Configuration
    from h2.connection import H2Connection

    from reactantserver.transport.core.limits import WireLimits
    from reactantserver.transport.server import GuardedServer

    limits = WireLimits()
    MAX_FRAME_SIZE = limits.max_frame_size

    async def main() -> _Wire:
        server = GuardedServer({}, codec=ProtoCodec(), limits=limits)
        protocol = server._protocol()
        wire = _Wire()
        protocol.connection_made(wire)
        await asyncio.sleep(0)  # the corked SETTINGS go out at the end of the pass
        client = H2Connection(H2Configuration(client_side=True))
        client.initiate_connection()
        client.receive_data(wire.take())  # our SETTINGS: the client queues its ACK
        client.send_headers(
            1,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "localhost"),
                (":path", "/inference.GRPCInferenceService/ModelInfer"),
                ("content-type", "application/grpc"),
            ],
        )
        assert client.max_outbound_frame_size == MAX_FRAME_SIZE
        client.send_data(1, bytes(200_000))  # one DATA frame, far above 16 KiB
        protocol.data_received(client.data_to_send())  # ACK + HEADERS + DATA in one read
        await asyncio.sleep(0)
        return wire

    wire = asyncio.run(main())
    assert not wire.closed


def _as_values(request: Any) -> Any:
    """A decoded request as plain values (contents by their bytes)."""

    def contents(c: Any) -> Any:
        if c is None:
            return None
        return tuple(
            getattr(c, f).tobytes() if hasattr(getattr(c, f), "tobytes") else tuple(getattr(c, f))
            for f in c.__slots__
        )

    inputs = tuple(
        (t.name, t.datatype, tuple(t.shape), dict(t.parameters), contents(t.contents))
        for t in request.inputs
    )
    outputs = tuple((o.name, dict(o.parameters)) for o in request.outputs)
    raw = tuple(bytes(r) for r in request.raw_input_contents)
    head = (request.model_name, request.model_version, request.id, dict(request.parameters))
    return head, inputs, outputs, raw


@settings(max_examples=200)
@given(model_infer_requests(), st.randoms(use_true_random=False))
def test_a_known_layout_decodes_as_a_fresh_parse_does(message: Any, rng: Any) -> None:
    """A message of a layout seen before (``codec.Layout``: the same bytes but for the raw
    contents) is not parsed again, and its request is exactly what a parse of its own
    bytes gives: the same head, and its own raw contents (not the earlier message's)."""
    first = bytes(message)
    again = pb.ModelInferRequest().parse(first)
    again.raw_input_contents = [
        bytes(rng.randrange(256) for _ in r) for r in again.raw_input_contents
    ]
    second = bytes(again)
    try:
        want = _as_values(codec_module._parse(second, None))
    except InvalidArgument as exc:
        with pytest.raises(InvalidArgument, match="^" + re.escape(str(exc)) + "$"):
            decode_infer_request(first)
        return
    decode_infer_request(first)  # the layout, kept when its raw contents come last
    got = decode_infer_request(second)
    assert _as_values(got) == want
    if got.layout is not None:  # kept: the second came from it, not from a parse
        assert [bytes(r) for r in got.raw_input_contents] == list(again.raw_input_contents)
        assert decode_infer_request(second).layout is got.layout


def test_a_layout_is_kept_only_when_its_raw_contents_come_last() -> None:
    """Protobuf writes the raw contents last; a message with a field after them (any
    order is valid protobuf) is parsed every time, and so is one over the head limit."""
    usual = bytes(pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x01\x02"]))
    assert decode_infer_request(usual).layout is not None
    after = usual + bytes(pb.ModelInferRequest(id="late"))
    assert decode_infer_request(after).layout is None
    assert decode_infer_request(after).id == "late"
    long_head = bytes(pb.ModelInferRequest(model_name="m" * 5000, raw_input_contents=[b"\x01"]))
    assert decode_infer_request(long_head).layout is None


def test_the_layouts_kept_are_bounded() -> None:
    """A client that never repeats its layout costs a parse each time, never memory: at
    most ``LAYOUTS`` layouts are kept, however many distinct ones arrive."""
    for i in range(codec_module.LAYOUTS + 50):
        data = bytes(pb.ModelInferRequest(model_name=f"m{i}", raw_input_contents=[b"\x00"]))
        assert decode_infer_request(data).model_name == f"m{i}"
        kept = sum(len(layouts) for layouts in codec_module._LAYOUTS.values())
        assert 1 <= kept <= codec_module.LAYOUTS

"""reactantserver.client without a server: the codec, the error mapping, the retry
policy, the shared-memory region, and the import-without-JAX guarantee.

The codec is checked against two independent protobuf implementations: betterproto
(what the server's generated messages use) and Google's protobuf runtime inside
``tritonclient`` (what Triton clients use).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import stat
import subprocess
import sys

import betterproto
import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as triton_pb
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    client_arrays,
    client_infer_responses,
    client_input_maps,
    client_parameter_values,
)

from reactantserver import errors, tensors
from reactantserver.client import RetryPolicy, SharedMemoryRegion
from reactantserver.client.codec import Placement, decode_outputs, encode_request
from reactantserver.client.core import parse_url
from reactantserver.client.shm import NAME_PREFIX
from reactantserver.client.status import CATEGORIES, NEAREST, RETRYABLE, error_for, translate
from reactantserver.client.wire import InferRequestWire, InferResponseWire
from reactantserver.protocol import inference as pb
from reactantserver.shm import SHM_ROOT
from reactantserver.status import CATEGORY_CODES, StatusCode, code_of

# ----------------------------------------------------------------------------- helpers


def wire_bytes(arr: np.ndarray) -> bytes:
    """What raw contents must hold for ``arr``: row-major, little-endian (or BYTES)."""
    if arr.dtype.kind in "OSU":
        return tensors.serialize_bytes(arr.ravel())
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def datatype_of(arr: np.ndarray) -> str:
    return tensors.from_numpy_dtype(arr.dtype.newbyteorder("="))


def my_shm_objects() -> list[str]:
    return sorted(n for n in os.listdir(SHM_ROOT) if n.startswith(f"{NAME_PREFIX}{os.getpid()}_"))


# ------------------------------------------------------------------------------- codec


@settings(max_examples=60, deadline=None)
@given(inputs=client_input_maps(), outputs=st.lists(st.sampled_from(["y", "z", "w"]), unique=True))
def test_request_encoding_is_what_both_protobuf_runtimes_read(
    inputs: dict[str, np.ndarray], outputs: list[str]
) -> None:
    """The hand-joined request parses, in betterproto and in Google's protobuf, to the
    message a caller means: every input with its datatype, shape and exact bytes."""
    encoded = encode_request("m", inputs, outputs=outputs, request_id="r1")
    data = encoded.SerializeToString()
    ours = pb.ModelInferRequest().parse(data)
    theirs = triton_pb.ModelInferRequest.FromString(data)
    for message in (ours, theirs):
        assert message.model_name == "m" and message.id == "r1"
        assert [t.name for t in message.inputs] == list(inputs)
        assert [o.name for o in message.outputs] == outputs
        for tensor, raw, arr in zip(
            message.inputs, message.raw_input_contents, inputs.values(), strict=True
        ):
            assert tensor.datatype == datatype_of(arr)
            assert list(tensor.shape) == list(arr.shape)
            assert bytes(raw) == wire_bytes(arr)


def test_request_sends_contiguous_arrays_without_copying() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    encoded = encode_request("m", {"x": x})
    (raw,) = encoded.raw
    assert isinstance(raw, memoryview)
    assert np.shares_memory(np.frombuffer(raw, np.float32), x)


def test_request_with_shared_memory_carries_references_only() -> None:
    x = np.ones((2, 16), np.float32)
    encoded = encode_request(
        "m",
        {"x": x},
        outputs=["y"],
        input_placements={"x": Placement("r", 64, x.nbytes)},
        output_placements={"y": Placement("r", 256, 128)},
    )
    message = triton_pb.ModelInferRequest.FromString(encoded.SerializeToString())
    assert len(message.raw_input_contents) == 0
    params = message.inputs[0].parameters
    assert params["shared_memory_region"].string_param == "r"
    assert params["shared_memory_offset"].int64_param == 64
    assert params["shared_memory_byte_size"].int64_param == x.nbytes
    assert message.outputs[0].parameters["shared_memory_offset"].int64_param == 256


def test_unsupported_dtype_names_the_input() -> None:
    with pytest.raises(errors.InvalidArgument, match=r"input 'c': numpy dtype complex64"):
        encode_request("m", {"c": np.zeros(2, np.complex64)})


def _response_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    response = pb.ModelInferResponse(model_name="m", id="r1")
    for name, arr in arrays.items():
        response.outputs.append(
            pb.ModelInferResponseInferOutputTensor(
                name=name, datatype=datatype_of(arr), shape=list(arr.shape)
            )
        )
        response.raw_output_contents.append(wire_bytes(arr))
    return bytes(response)


@settings(max_examples=60, deadline=None)
@given(outputs=client_input_maps())
def test_response_decoding_views_the_received_bytes(outputs: dict[str, np.ndarray]) -> None:
    """Every output decodes to the array sent; fixed-width outputs are read-only views
    into the received buffer (no copy after the socket read)."""
    data = _response_bytes(outputs)
    got = decode_outputs(InferResponseWire.FromString(data))
    assert list(got) == list(outputs)
    start = np.frombuffer(data, np.uint8).ctypes.data
    for name, want in outputs.items():
        arr = got[name]
        if want.dtype.kind in "OSU":
            assert [bytes(v) for v in arr.ravel()] == [
                v.encode() if isinstance(v, str) else bytes(v) for v in want.ravel()
            ]
            continue
        np.testing.assert_array_equal(arr, want)
        assert arr.dtype == want.dtype.newbyteorder("=")
        assert not arr.flags.writeable
        if arr.nbytes:
            assert start <= arr.ctypes.data < start + len(data)


def test_response_in_the_original_systems_layout() -> None:
    """A server that leaves out the raw entry of a shared-memory output (as the original
    did) is read correctly too: inline entries belong to inline outputs, in order."""
    y = np.arange(4, dtype=np.int32)
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.append(
        pb.ModelInferResponseInferOutputTensor(
            name="s",
            datatype="INT32",
            shape=[4],
            parameters={
                "shared_memory_region": pb.InferParameter(string_param="r"),
                "shared_memory_byte_size": pb.InferParameter(int64_param=16),
            },
        )
    )
    response.outputs.append(
        pb.ModelInferResponseInferOutputTensor(name="y", datatype="INT32", shape=[4])
    )
    response.raw_output_contents.append(y.tobytes())
    read: list[Placement] = []

    def read_shm(placement: Placement, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
        read.append(placement)
        return np.zeros(shape, np.int32)

    got = decode_outputs(InferResponseWire.FromString(bytes(response)), read_shm=read_shm)
    np.testing.assert_array_equal(got["y"], y)
    assert read == [Placement("r", 0, 16)]


def test_typed_contents_are_read_when_there_is_no_raw_entry() -> None:
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.append(
        pb.ModelInferResponseInferOutputTensor(
            name="y",
            datatype="FP32",
            shape=[2],
            contents=pb.InferTensorContents(fp32_contents=[1.5, 2.5]),
        )
    )
    got = decode_outputs(InferResponseWire.FromString(bytes(response)))
    np.testing.assert_array_equal(got["y"], np.array([1.5, 2.5], np.float32))


def test_inconsistent_or_malformed_answers_are_the_servers_fault() -> None:
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.append(
        pb.ModelInferResponseInferOutputTensor(name="y", datatype="FP32", shape=[3])
    )
    response.raw_output_contents.append(b"\0" * 8)
    with pytest.raises(errors.ExecutionFailed, match=r"output 'y': the server sent 8 bytes"):
        decode_outputs(InferResponseWire.FromString(bytes(response)))
    with pytest.raises(errors.ExecutionFailed, match="malformed"):
        InferResponseWire.FromString(b"\x32\x10abc")  # field 6, length 16, 3 bytes follow
    with pytest.raises(errors.ExecutionFailed, match="malformed"):
        InferResponseWire.FromString(b"\x0b")  # wire type 3 (group): not in this message
    with pytest.raises(errors.ExecutionFailed, match="malformed"):
        InferResponseWire.FromString(b"\x0a\x02\xff\xfe")  # model_name is not UTF-8


def test_encoded_request_round_trips_through_betterproto() -> None:
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    encoded = encode_request("m", {"x": x})
    assert isinstance(encoded, InferRequestWire)
    assert encoded.to_message().raw_input_contents == [x.tobytes()]


def _param_value(param: pb.InferParameter) -> object:
    """betterproto's reading of a parameter, as the plain value the client reads."""
    kind, value = betterproto.which_one_of(param, "parameter_choice")
    return value if kind else None


@settings(max_examples=150, deadline=None)
@given(message=client_infer_responses())
def test_response_reading_agrees_with_betterproto(message: pb.ModelInferResponse) -> None:
    """The hand-written reader sees every field of any response exactly as betterproto
    does: names, shapes (negative ones too), every parameter kind, typed contents, and the
    raw entries byte for byte."""
    data = bytes(message)
    want = pb.ModelInferResponse().parse(data)
    got = InferResponseWire.FromString(data)
    assert (got.model_name, got.model_version, got.id) == (
        want.model_name,
        want.model_version,
        want.id,
    )
    assert got.parameters == {k: _param_value(v) for k, v in want.parameters.items()}
    assert [bytes(r) for r in got.raw] == list(want.raw_output_contents)
    assert len(got.outputs) == len(want.outputs)
    for ours, theirs in zip(got.outputs, want.outputs, strict=True):
        assert (ours.name, ours.datatype, ours.shape) == (
            theirs.name,
            theirs.datatype,
            list(theirs.shape),
        )
        assert ours.parameters == {k: _param_value(v) for k, v in theirs.parameters.items()}
        if betterproto.serialized_on_wire(theirs.contents):
            assert ours.contents is not None and bytes(ours.contents) == bytes(theirs.contents)
        else:
            assert ours.contents is None


@settings(max_examples=100, deadline=None)
@given(
    params=st.dictionaries(st.text(max_size=6), client_parameter_values, max_size=4),
    shape=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
)
def test_request_parameters_and_shapes_as_both_runtimes_read_them(
    params: dict[str, object], shape: list[int]
) -> None:
    from reactantserver.client.wire import InputWire, RequestedOutputWire

    request = InferRequestWire("m", id="i", parameters=params)  # type: ignore[arg-type]
    request.inputs.append(InputWire("x", "FP32", shape, params))  # type: ignore[arg-type]
    request.outputs.append(RequestedOutputWire("y", params))  # type: ignore[arg-type]
    data = request.SerializeToString()
    message = pb.ModelInferRequest().parse(data)
    theirs = triton_pb.ModelInferRequest.FromString(data)
    for got in (
        {k: _param_value(v) for k, v in message.parameters.items()},
        {k: _param_value(v) for k, v in message.inputs[0].parameters.items()},
        {k: _param_value(v) for k, v in message.outputs[0].parameters.items()},
    ):
        assert got == params
    assert list(message.inputs[0].shape) == shape == list(theirs.inputs[0].shape)
    assert {k: v.WhichOneof("parameter_choice") for k, v in theirs.parameters.items()} == {
        k: _kind(v) for k, v in params.items()
    }


def _kind(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool_param"
    if isinstance(value, int):
        return "int64_param" if value < 2**63 else "uint64_param"
    return "double_param" if isinstance(value, float) else "string_param"


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("code", sorted(CATEGORIES))
def test_every_category_code_maps_back_onto_itself(code: StatusCode) -> None:
    """The inverse of reactantserver.status: the error a status becomes has that status, and
    carries the server's message unchanged."""
    error = error_for(code, "the server's words")
    assert str(error) == "the server's words"
    assert code_of(error) == code


def test_the_mapping_inverts_the_servers_categories() -> None:
    for category, code in CATEGORY_CODES:
        if category is errors.BundleError:
            continue  # a server-side bundle problem: FAILED_PRECONDITION for clients
        assert isinstance(error_for(code, "m"), CATEGORIES[code])
        assert issubclass(CATEGORIES[code], category) or issubclass(category, CATEGORIES[code])


@pytest.mark.parametrize("code", sorted(NEAREST))
def test_foreign_codes_keep_their_name_in_the_message(code: StatusCode) -> None:
    error = error_for(code, "why")
    assert str(error) == f"{code.name}: why"
    assert isinstance(error, errors.RequestError)


def test_translate_transport_outcomes() -> None:
    where = {"rpc": "ModelInfer", "target": "h:1"}
    code, error = translate(GRPCError(Status.NOT_FOUND, "model 'x' is not loaded"), **where) or (
        None,
        None,
    )
    assert code is StatusCode.NOT_FOUND and isinstance(error, errors.NotFound)
    assert str(error) == "model 'x' is not loaded"
    outcome = translate(TimeoutError(), **where)
    assert outcome is not None and outcome[0] is StatusCode.DEADLINE_EXCEEDED
    for exc in (ConnectionRefusedError(111, "refused"), StreamTerminatedError("reset")):
        outcome = translate(exc, **where)
        assert outcome is not None and outcome[0] is StatusCode.UNAVAILABLE
        assert "h:1" in str(outcome[1])
    assert translate(asyncio.CancelledError(), **where) is None
    assert translate(KeyError("a bug"), **where) is None
    assert {StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNAVAILABLE} == RETRYABLE


# ------------------------------------------------------------------------------- retry


@given(
    retry=st.integers(0, 70),
    now=st.floats(0, 1e6),
    budget=st.floats(0, 100) | st.just(math.inf),
    seed=st.integers(0, 2**32),
    base=st.floats(0, 10),
    cap=st.floats(0, 60),
)
def test_backoff_never_outlives_the_deadline(
    retry: int, now: float, budget: float, seed: int, base: float, cap: float
) -> None:
    """A pause is either refused (None) or ends strictly before the deadline, and lies in
    [0, min(cap, base * 2**retry)]; no pause once the retries are spent."""
    policy = RetryPolicy(max_retries=5, base_delay=base, max_delay=cap)
    delay = policy.next_delay(retry, now=now, deadline=now + budget, rng=random.Random(seed))
    if retry >= 5:
        assert delay is None
    if delay is not None:
        assert 0 <= delay <= min(cap, base * 2.0 ** min(retry, 64))
        assert now + delay < now + budget


def test_backoff_defaults_and_growth() -> None:
    policy = RetryPolicy()
    assert (policy.max_retries, policy.base_delay) == (2, 1.0)
    assert [policy.bound(k) for k in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert RetryPolicy.never().next_delay(0, now=0, deadline=math.inf, rng=random.Random()) is None
    draws = [
        RetryPolicy().next_delay(1, now=0, deadline=math.inf, rng=random.Random(s))
        for s in range(200)
    ]
    assert all(d is not None and 0 <= d <= 2.0 for d in draws)
    assert len({round(d or 0, 6) for d in draws}) > 150  # jittered, not a fixed pause
    with pytest.raises(ValueError, match="base_delay"):
        RetryPolicy(base_delay=-1)
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)


def test_url_forms() -> None:
    assert parse_url("localhost:8080") == ("localhost", 8080)
    assert parse_url("grpc://10.0.0.1:9/") == ("10.0.0.1", 9)
    assert parse_url("[::1]:8001") == ("::1", 8001)
    for bad in ("localhost", "host:port", ":80", "h:0", "h:70000"):
        with pytest.raises(ValueError, match="expected host:port"):
            parse_url(bad)


# ------------------------------------------------------------------------------ region


def test_region_lifecycle_placement_and_cleanup() -> None:
    with SharedMemoryRegion(4096) as region:
        path = os.path.join(SHM_ROOT, region.key[1:])
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.path.getsize(path) == 4096
        x = region.empty((2, 3), np.float32)
        x[...] = 7
        assert region.offset_of(x) == 0
        assert region.offset_of(np.ones(3)) is None
        assert region.offset_of(x.T) is None  # not contiguous: would be copied in
        placed = region.write_inputs({"a": np.arange(5, dtype=np.int16), "s": np.array([b"x"])})
        assert region.offset_of(placed["a"]) == 0  # write_inputs starts afresh
        assert placed["s"].dtype.kind == "S"  # BYTES stays inline, unchanged
        with region.claim():
            wired = {"a": ("INT16", placed["a"]), "b": ("FP64", np.ones(2))}
            inputs = region.place_inputs(wired)
            assert inputs["a"] == Placement(region.name, 0, 10)
            assert inputs["b"].offset % 64 == 0 and inputs["b"].offset >= 10
            np.testing.assert_array_equal(
                region.view(inputs["b"].offset, 16).view(np.float64), np.ones(2)
            )
            outputs = region.place_outputs({"y": 24})
            out = region.read(outputs["y"], "INT32", (2, 3))
            assert out.flags.writeable and out.shape == (2, 3)
            busy = pytest.raises(errors.InvalidArgument, match="in use by another infer call")
            with busy, region.claim():
                pass
            with pytest.raises(errors.ExecutionFailed, match="wrote 8 bytes"):
                region.read(Placement(region.name, 0, 8), "INT32", (3,))
        with region.claim(), pytest.raises(errors.InvalidArgument, match="no room for output"):
            region.place_outputs({"huge": 1 << 20})
        kept = out  # a view the caller still holds when the region closes
    assert not os.path.exists(path) and region.closed
    assert kept.shape == (2, 3)  # still readable: the pages go with the last view
    region.close()  # idempotent


def test_region_is_unlinked_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), SharedMemoryRegion(100) as region:
        assert my_shm_objects() == [region.key[1:]]
        raise RuntimeError("boom")
    assert my_shm_objects() == []


# ------------------------------------------------------------------------------ imports


def test_importing_the_client_imports_neither_jax_nor_trio() -> None:
    code = (
        "import sys\n"
        "import reactantserver.client\n"
        "from reactantserver.client import Client, AsyncClient, SharedMemoryRegion\n"
        "heavy = ('jax', 'jaxlib', 'trio', 'sniffio')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@settings(max_examples=30, deadline=None)
@given(arr=client_arrays())
def test_single_arrays_round_trip_through_request_and_response(arr: np.ndarray) -> None:
    """What the client sends for an array is what it reads back for the same bytes."""
    encoded = encode_request("m", {"x": arr})
    message = encoded.to_message()
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.append(
        pb.ModelInferResponseInferOutputTensor(
            name="x", datatype=message.inputs[0].datatype, shape=message.inputs[0].shape
        )
    )
    response.raw_output_contents.append(message.raw_input_contents[0])
    (back,) = decode_outputs(InferResponseWire.FromString(bytes(response))).values()
    if arr.dtype.kind in "OSU":
        assert back.shape == arr.shape
    else:
        np.testing.assert_array_equal(back, arr)

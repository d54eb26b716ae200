"""ModelInfer request decoding and response encoding, without a server.

Every validation rule of ``reactantserver.inferio`` is checked with its exact message;
shared-memory inputs and outputs use real POSIX shared memory; Hypothesis checks the
raw round trip for every fixed-width datatype and that hostile requests only ever fail
with our own errors.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from strategies import inferio_hostile_inputs, inferio_wire_arrays

from reactantserver import tensors
from reactantserver.bundle.manifest import TensorSpec
from reactantserver.errors import ExecutionFailed, FailedPrecondition, InvalidArgument
from reactantserver.inferio import (
    MAX_RANK,
    InferCall,
    RequestedOutput,
    ShmTarget,
    decode_request,
    encode_response,
)
from reactantserver.protocol import inference as pb
from reactantserver.shm import SharedMemoryRegistry

X = TensorSpec("x", "FP32", (-1, 16))
K = TensorSpec("k", "INT8", (-1,))
Y = TensorSpec("y", "FP32", (-1, 16))
Z = TensorSpec("z", "INT64", (-1,))
NOW = 100.0

Param = pb.InferParameter
Input = pb.ModelInferRequestInferInputTensor
Output = pb.ModelInferRequestInferRequestedOutputTensor


def inp(
    name: str = "x",
    datatype: str = "FP32",
    shape: Sequence[int] = (2, 16),
    *,
    params: dict[str, Param] | None = None,
    contents: pb.InferTensorContents | None = None,
) -> Input:
    t = Input(name=name, datatype=datatype, shape=list(shape), parameters=params or {})
    if contents is not None:
        t.contents = contents
    return t


def req(
    *inputs: Input,
    raw: Sequence[bytes] = (),
    outputs: Sequence[Output] = (),
    params: dict[str, Param] | None = None,
) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="mlp",
        id="r1",
        inputs=list(inputs),
        raw_input_contents=list(raw),
        outputs=list(outputs),
        parameters=params or {},
    )


def shm_params(region: str, byte_size: int | None, offset: int | None = None) -> dict[str, Param]:
    out = {"shared_memory_region": Param(string_param=region)}
    if byte_size is not None:
        out["shared_memory_byte_size"] = Param(int64_param=byte_size)
    if offset is not None:
        out["shared_memory_offset"] = Param(int64_param=offset)
    return out


def decode(
    request: pb.ModelInferRequest,
    inputs: Sequence[TensorSpec] = (X,),
    outputs: Sequence[TensorSpec] = (Y, Z),
    registry: SharedMemoryRegistry | None = None,
    deadline: float = math.inf,
) -> InferCall:
    return decode_request(
        request,
        inputs=inputs,
        outputs=outputs,
        registry=registry or SharedMemoryRegistry(),
        now=NOW,
        deadline=deadline,
    )


def message(
    request: pb.ModelInferRequest,
    inputs: Sequence[TensorSpec] = (X,),
    registry: SharedMemoryRegistry | None = None,
    error: type[Exception] = InvalidArgument,
) -> str:
    with pytest.raises(error) as info:
        decode(request, inputs, registry=registry)
    assert type(info.value) is error
    return str(info.value)


def f32(rows: int = 2, cols: int = 16) -> np.ndarray:
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)


def root(arr: np.ndarray) -> Any:
    """The object that finally owns ``arr``'s memory."""
    base: Any = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


# ------------------------------------------------------------------------------- raw inputs


def test_raw_contents_are_viewed_without_a_copy() -> None:
    data = f32().tobytes()
    call = decode(req(inp(), raw=[data]))
    x = call.inputs["x"]
    assert x.dtype == np.float32 and x.shape == (2, 16)
    np.testing.assert_array_equal(x, f32())
    assert root(x) is data  # np.frombuffer over the request's own bytes


def test_raw_byte_count_must_match_the_shape() -> None:
    x8 = TensorSpec("x", "FP32", (-1, 8))
    assert message(req(inp(shape=(2, 8)), raw=[bytes(60)]), [x8]) == (
        "model 'mlp': input 'x': raw contents hold 60 bytes, shape [2, 8] of FP32 needs 64"
    )


def test_raw_contents_all_or_none() -> None:
    two = (X, K)
    request = req(inp(), inp("k", "INT8", (2,)), raw=[f32().tobytes()])
    assert message(request, two) == (
        "model 'mlp': raw_input_contents has 1 entries but 2 inputs are sent inline "
        "(not in shared memory); give every inline input an entry, or none"
    )


def test_raw_and_typed_contents_together_are_refused() -> None:
    contents = pb.InferTensorContents(fp32_contents=[0.0] * 32)
    assert message(req(inp(contents=contents), raw=[f32().tobytes()])) == (
        "contents field must not be specified when using raw_input_contents for 'x' for "
        "model 'mlp'; send every inline input in raw_input_contents, or every one in its "
        "typed contents"
    )


def test_the_contents_conflict_is_named_before_the_raw_count() -> None:
    """Triton's grpc_explicit_int_content_client: two inputs in typed contents and one raw
    entry beside them. The conflict is what the client did wrong, not the count (one raw
    entry for two inline inputs), and it is said in Triton's words."""
    two = (X, K)
    contents = pb.InferTensorContents(fp32_contents=[0.0] * 32)
    ints = pb.InferTensorContents(int_contents=[0, 1])
    request = req(inp(contents=contents), inp("k", "INT8", (2,), contents=ints),
                  raw=[f32().tobytes()])  # fmt: skip
    assert message(request, two).startswith(
        "contents field must not be specified when using raw_input_contents for 'x' for model 'mlp'"
    )


def test_bytes_from_raw_contents() -> None:
    s = TensorSpec("s", "BYTES", (-1,))
    data = tensors.serialize_bytes([b"ab", b"", b"c"])
    call = decode(req(inp("s", "BYTES", (3,)), raw=[data]), [s], [s])
    assert call.inputs["s"].tolist() == [b"ab", b"", b"c"]
    assert message(req(inp("s", "BYTES", (2,)), raw=[data]), [s]) == (
        "model 'mlp': input 's': raw contents: 5 trailing bytes after 2 BYTES elements"
    )
    lying = (100).to_bytes(4, "little") + b"abcd"
    assert message(req(inp("s", "BYTES", (2,)), raw=[lying]), [s]) == (
        "model 'mlp': input 's': raw contents: BYTES element 0 claims 100 bytes past the end"
    )
    # The shape cannot make us allocate: each element needs at least 4 bytes.
    assert message(req(inp("s", "BYTES", (2**39,)), raw=[data]), [s]) == (
        f"model 'mlp': input 's': raw contents hold 15 bytes, too few for {2**39} BYTES "
        "elements (each needs a 4-byte length)"
    )


def test_fp16_and_bf16_come_raw() -> None:
    h = TensorSpec("h", "FP16", (2,))
    call = decode(req(inp("h", "FP16", (2,)), raw=[np.array([1.5, -2], np.float16).tobytes()]), [h])
    assert call.inputs["h"].tolist() == [1.5, -2.0]
    b = TensorSpec("b", "BF16", (2,))
    bf16 = tensors.to_numpy_dtype("BF16")
    data = np.array([1.0, 0.5], dtype=bf16).tobytes()
    assert decode(req(inp("b", "BF16", (2,)), raw=[data]), [b]).inputs["b"].dtype == bf16
    typed = pb.InferTensorContents(fp32_contents=[1.0, 2.0])
    assert message(req(inp("h", "FP16", (2,), contents=typed)), [h]) == (
        "model 'mlp': input 'h': FP16 has no typed contents field; "
        "send it in raw_input_contents or shared memory"
    )


# ----------------------------------------------------------------------------- typed inputs


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("BOOL", "bool_contents", [True, False]),
        ("INT8", "int_contents", [-128, 127]),
        ("INT16", "int_contents", [-3, 300]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1]),
        ("UINT8", "uint_contents", [0, 255]),
        ("UINT16", "uint_contents", [0, 65535]),
        ("UINT32", "uint_contents", [0, 2**32 - 1]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1]),
        ("FP32", "fp32_contents", [0.5, -1.25]),
        ("FP64", "fp64_contents", [1e300, -2.5]),
        ("BYTES", "bytes_contents", [b"a", b"bc"]),
    ],
)
def test_typed_contents_by_datatype(datatype: str, field: str, values: list[Any]) -> None:
    spec = TensorSpec("t", datatype, (2,))
    contents = pb.InferTensorContents(**{field: values})
    arr = decode(req(inp("t", datatype, (2,), contents=contents)), [spec]).inputs["t"]
    assert arr.dtype == spec.numpy_dtype
    assert arr.tolist() == values


def test_typed_contents_element_count() -> None:
    contents = pb.InferTensorContents(fp32_contents=[1.0] * 30)
    assert message(req(inp(contents=contents))) == (
        "model 'mlp': input 'x': contents.fp32_contents holds 30 elements, shape [2, 16] needs 32"
    )


def test_typed_contents_field_must_match_the_datatype() -> None:
    contents = pb.InferTensorContents(int_contents=[1] * 32)
    assert message(req(inp(contents=contents))) == (
        "model 'mlp': input 'x': datatype FP32 takes contents.fp32_contents, "
        "got contents.int_contents"
    )


def test_typed_contents_integer_range() -> None:
    contents = pb.InferTensorContents(int_contents=[1, 200])
    assert message(req(inp("k", "INT8", (2,), contents=contents)), [K]) == (
        "model 'mlp': input 'k': contents.int_contents holds values outside the range of INT8 "
        "[-128, 127]"
    )


def test_no_data_at_all() -> None:
    assert message(req(inp())) == (
        "model 'mlp': input 'x': no data; send raw_input_contents, contents or shared memory "
        "parameters"
    )
    # An empty tensor needs no data.
    assert decode(req(inp(shape=(0, 16)))).inputs["x"].shape == (0, 16)


# ------------------------------------------------------------------------ names and shapes


def test_unknown_duplicate_and_missing_inputs() -> None:
    data = f32().tobytes()
    assert message(req(inp("q"), raw=[data])) == (
        "model 'mlp': input 'q': unknown input; the model's inputs are x"
    )
    assert message(req(inp(), inp(), raw=[data, data])) == (
        "model 'mlp': input 'x': given more than once"
    )
    contents = pb.InferTensorContents(int_contents=[1, 2])
    assert message(req(inp("k", "INT8", (2,), contents=contents)), [X, K]) == (
        "model 'mlp': missing input 'x'; the model's inputs are x, k"
    )
    assert message(req(), [X, K]) == (
        "model 'mlp': missing inputs 'x', 'k'; the model's inputs are x, k"
    )


def test_datatype_must_match() -> None:
    assert message(req(inp(datatype="INT32"), raw=[bytes(128)])) == (
        "model 'mlp': input 'x': expected datatype FP32, got INT32"
    )
    assert message(req(inp(datatype=""), raw=[bytes(128)])) == (
        "model 'mlp': input 'x': expected datatype FP32, got none"
    )


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((2, 15), "expected shape [-1, 16], got [2, 15]"),
        ((2, 16, 1), "expected shape [-1, 16], got [2, 16, 1]"),
        ((32,), "expected shape [-1, 16], got [32]"),
        ((2, -16), "shape [2, -16] has a negative extent"),
        ((1,) * (MAX_RANK + 1), f"rank {MAX_RANK + 1} exceeds the limit of {MAX_RANK}"),
    ],
)
def test_shape_rules(shape: tuple[int, ...], expected: str) -> None:
    assert message(req(inp(shape=shape), raw=[bytes(128)])) == f"model 'mlp': input 'x': {expected}"


def test_hostile_extents_are_refused_before_any_allocation() -> None:
    free = TensorSpec("v", "FP32", (-1, -1))
    huge = (2**40, 2**40)
    assert message(req(inp("v", shape=huge), raw=[bytes(16)]), [free]) == (
        f"model 'mlp': input 'v': shape [{huge[0]}, {huge[1]}] is too large"
    )
    assert message(req(inp("v", shape=(2**62, 2**62))), [free]) == (
        f"model 'mlp': input 'v': shape [{2**62}, {2**62}] is too large"
    )
    # Empty, yet numpy could not even represent it: refused like any other giant.
    assert message(req(inp("v", shape=(0, 2**62))), [free]) == (
        f"model 'mlp': input 'v': shape [0, {2**62}] is too large"
    )


# ---------------------------------------------------------------------- shared memory inputs


@pytest.fixture
def region() -> Iterator[tuple[SharedMemoryRegistry, shared_memory.SharedMemory]]:
    segment = shared_memory.SharedMemory(
        name=f"reactantserver-inferio_{uuid.uuid4().hex[:8]}", create=True, size=4096
    )
    registry = SharedMemoryRegistry()
    registry.register("r", "/" + segment.name, 0, 1024)
    try:
        yield registry, segment
    finally:
        registry.close()
        segment.close()
        segment.unlink()


def test_shm_input_is_read_into_the_request(region: tuple[SharedMemoryRegistry, Any]) -> None:
    registry, segment = region
    segment.buf[256:384] = f32().tobytes()
    call = decode(req(inp(params=shm_params("r", 128, 256))), registry=registry)
    np.testing.assert_array_equal(call.inputs["x"], f32())
    # Read, not mapped (a mapping of the client's file could SIGBUS the server): the
    # client's later writes do not change a request already decoded.
    segment.buf[256:260] = np.float32(42).tobytes()
    assert call.inputs["x"][0, 0] == 0
    # Offset defaults to 0; raw contents for the other, inline input still line up.
    two = decode(
        req(inp(params=shm_params("r", 128)), inp("k", "INT8", (2,)), raw=[b"\x01\x02"]),
        [X, K],
        registry=registry,
    )
    assert two.inputs["k"].tolist() == [1, 2]
    del call, two


def test_shm_input_rules(region: tuple[SharedMemoryRegistry, Any]) -> None:
    registry, _ = region
    where = "model 'mlp': input 'x': "

    def m(params: dict[str, Param], error: type[Exception] = InvalidArgument) -> str:
        return message(req(inp(params=params)), registry=registry, error=error)

    assert m(shm_params("r", 120)) == where + (
        "shared_memory_byte_size is 120, shape [2, 16] of FP32 needs 128"
    )
    assert m(shm_params("nope", 128), FailedPrecondition) == (
        "shared memory region 'nope' is not registered; call SystemSharedMemoryRegister first"
    )
    assert m(shm_params("r", 128, 1000)) == (
        "shared memory region 'r': offset 1000 + byte_size 128 is outside the registered 1024 bytes"
    )
    assert m(shm_params("r", 128, 2**62)) == (
        f"shared memory region 'r': offset {2**62} + byte_size 128 is outside the registered "
        "1024 bytes"
    )
    assert m(shm_params("r", None)) == where + (
        "shared_memory_region 'r' needs shared_memory_byte_size"
    )
    assert m(shm_params("r", 128, -8)) == where + (
        "shared memory offset and byte size must be >= 0 (got offset=-8, byte_size=128)"
    )
    assert m({"shared_memory_byte_size": Param(int64_param=128)}) == where + (
        "shared_memory_offset/shared_memory_byte_size given without shared_memory_region"
    )
    assert m({"shared_memory_region": Param(int64_param=1)}) == where + (
        "parameter 'shared_memory_region' must be a string_param, got int64_param"
    )
    assert m({**shm_params("r", 128), "shared_memory_byte_size": Param(string_param="128")}) == (
        where + "parameter 'shared_memory_byte_size' must be an int64_param, got string_param"
    )
    contents = pb.InferTensorContents(fp32_contents=[0.0] * 32)
    assert message(req(inp(params=shm_params("r", 128), contents=contents)), registry=registry) == (
        where + "both contents and shared memory are set"
    )


# ------------------------------------------------------------------------ requested outputs


def test_requested_outputs_order_and_default() -> None:
    raw = [f32().tobytes()]
    call = decode(req(inp(), raw=raw, outputs=[Output(name="z"), Output(name="y")]))
    assert call.output_names == ("z", "y")
    assert decode(req(inp(), raw=raw)).output_names == ("y", "z")


def test_requested_output_rules(region: tuple[SharedMemoryRegistry, Any]) -> None:
    registry, _ = region
    raw = [f32().tobytes()]

    def m(outputs: list[Output], error: type[Exception] = InvalidArgument) -> str:
        return message(req(inp(), raw=raw, outputs=outputs), registry=registry, error=error)

    assert m([Output(name="q")]) == (
        "model 'mlp': output 'q': unknown output; the model's outputs are y, z"
    )
    assert m([Output(name="y"), Output(name="y")]) == (
        "model 'mlp': output 'y': requested more than once"
    )
    assert m([Output(name="y", parameters={"classification": Param(int64_param=3)})]) == (
        "model 'mlp': output 'y': the classification parameter is not supported"
    )
    assert m([Output(name="y", parameters=shm_params("gone", 128))], FailedPrecondition) == (
        "shared memory region 'gone' is not registered; call SystemSharedMemoryRegister first"
    )
    call = decode(
        req(inp(), raw=raw, outputs=[Output(name="y", parameters=shm_params("r", 128, 64))]),
        registry=registry,
    )
    assert call.outputs == (RequestedOutput(Y, ShmTarget("r", 64, 128)),)


# --------------------------------------------------------------------- deadline, parameters


def test_deadline_is_the_earliest_of_grpc_and_parameters() -> None:
    raw = [f32().tobytes()]

    def due(params: dict[str, Param], grpc: float = math.inf) -> float:
        return decode(req(inp(), raw=raw, params=params), deadline=grpc).deadline

    assert due({}) == math.inf
    assert due({}, grpc=105.0) == 105.0
    # tritonclient's timeout= is microseconds.
    assert due({"timeout": Param(int64_param=250_000)}) == pytest.approx(NOW + 0.25)
    assert due({"timeout": Param(int64_param=250_000)}, grpc=100.1) == 100.1
    # The original system's parameter is nanoseconds.
    assert due({"reactant_timeout_ns": Param(int64_param=2_000_000_000)}) == NOW + 2.0
    both = {
        "timeout": Param(int64_param=3_000_000),
        "reactant_timeout_ns": Param(int64_param=1_000_000_000),
    }
    assert due(both) == NOW + 1.0
    assert due({"timeout": Param(int64_param=0)}) == math.inf  # 0 = none, as in Triton
    assert due({"timeout": Param(uint64_param=1_000_000)}) == NOW + 1.0


def test_parameter_rules() -> None:
    raw = [f32().tobytes()]

    def m(params: dict[str, Param]) -> str:
        return message(req(inp(), raw=raw, params=params))

    assert m({"timeout": Param(int64_param=-5)}) == (
        "model 'mlp': parameter 'timeout' must be >= 0, got -5"
    )
    assert m({"timeout": Param(string_param="1s")}) == (
        "model 'mlp': parameter 'timeout' must be an int64_param, got string_param"
    )
    assert m({"sequence_id": Param(int64_param=7)}) == (
        "model 'mlp': parameter 'sequence_id': sequence batching is not supported"
    )
    # Other parameters (priority, user keys) are accepted and ignored.
    decode(req(inp(), raw=raw, params={"priority": Param(uint64_param=1)}))


# ---------------------------------------------------------------------------------- encoding


def make_call(*outputs: RequestedOutput) -> InferCall:
    return InferCall(model="mlp", id="r9", inputs={}, outputs=outputs, deadline=math.inf)


def test_encode_inline_outputs() -> None:
    y = f32()
    z = np.array([7, -1], dtype=np.int64)
    response = encode_response(
        make_call(RequestedOutput(Z), RequestedOutput(Y)),
        {"y": y, "z": z, "ignored": np.zeros(1)},
        model_version="3",
        registry=SharedMemoryRegistry(),
    )
    assert (response.model_name, response.model_version, response.id) == ("mlp", "3", "r9")
    assert [(o.name, o.datatype, o.shape) for o in response.outputs] == [
        ("z", "INT64", [2]),
        ("y", "FP32", [2, 16]),
    ]
    assert response.raw_output_contents == [z.tobytes(), y.tobytes()]
    # A transposed (non-contiguous) result is serialized in row-major order.
    t = np.ascontiguousarray(f32().T).T
    encoded = encode_response(
        make_call(RequestedOutput(Y)), {"y": t}, model_version="", registry=SharedMemoryRegistry()
    )
    assert encoded.raw_output_contents == [f32().tobytes()]


def test_encode_bytes_output() -> None:
    t = TensorSpec("t", "BYTES", (-1,))
    response = encode_response(
        make_call(RequestedOutput(t)),
        {"t": np.array([b"x", "yz"], dtype=object)},
        model_version="",
        registry=SharedMemoryRegistry(),
    )
    assert response.raw_output_contents == [tensors.serialize_bytes([b"x", b"yz"])]


def test_encode_into_shared_memory(region: tuple[SharedMemoryRegistry, Any]) -> None:
    registry, segment = region
    response = encode_response(
        make_call(RequestedOutput(Y, ShmTarget("r", 512, 256)), RequestedOutput(Z)),
        {"y": f32(), "z": np.array([1, 2], dtype=np.int64)},
        model_version="",
        registry=registry,
    )
    written = np.frombuffer(segment.buf[512:640], dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(written, f32())
    del written
    echoed = response.outputs[0].parameters
    assert echoed["shared_memory_region"].string_param == "r"
    assert echoed["shared_memory_offset"].int64_param == 512
    assert echoed["shared_memory_byte_size"].int64_param == 128
    # One raw entry per output, empty for the one in shared memory (Triton's alignment).
    assert response.raw_output_contents == [b"", np.array([1, 2], np.int64).tobytes()]


def test_encode_shared_memory_too_small(region: tuple[SharedMemoryRegistry, Any]) -> None:
    registry, _ = region
    with pytest.raises(InvalidArgument) as info:
        encode_response(
            make_call(RequestedOutput(Y, ShmTarget("r", 0, 100))),
            {"y": f32()},
            model_version="",
            registry=registry,
        )
    assert str(info.value) == (
        "model 'mlp': output 'y': 128 bytes do not fit in shared_memory_byte_size=100 of "
        "shared memory region 'r'"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "model 'mlp': output 'y': the model returned no such output"),
        (
            np.zeros((2, 16), np.float64),
            "model 'mlp': output 'y': the model returned dtype float64, but declares FP32",
        ),
        (
            np.zeros((2, 8), np.float32),
            "model 'mlp': output 'y': the model returned shape [2, 8], but declares [-1, 16]",
        ),
    ],
)
def test_host_bugs_in_outputs_are_execution_failures(value: Any, expected: str) -> None:
    results = {} if value is None else {"y": value}
    with pytest.raises(ExecutionFailed) as info:
        encode_response(
            make_call(RequestedOutput(Y)),
            results,
            model_version="",
            registry=SharedMemoryRegistry(),
        )
    assert str(info.value) == expected


# ---------------------------------------------------------------------------------- properties


@given(inferio_wire_arrays())
def test_raw_round_trip_for_every_fixed_datatype(drawn: tuple[str, np.ndarray]) -> None:
    """Any fixed-width tensor sent raw decodes to the same bytes, dtype and shape, and
    encodes back to exactly the bytes that were sent."""
    datatype, arr = drawn
    spec = TensorSpec("t", datatype, tuple(-1 for _ in arr.shape))
    request = req(inp("t", datatype, arr.shape), raw=[arr.tobytes()])
    call = decode(request, [spec], [spec])
    got = call.inputs["t"]
    assert (got.dtype, got.shape, got.tobytes()) == (arr.dtype, arr.shape, arr.tobytes())
    response = encode_response(call, {"t": got}, model_version="", registry=SharedMemoryRegistry())
    assert response.raw_output_contents == [arr.tobytes()]
    assert response.outputs[0].shape == list(arr.shape)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(inferio_hostile_inputs())
# An empty tensor with an absurd extent: holds nothing, yet numpy cannot represent it.
@example({"datatype": "FP32", "shape": [0, 0, 2**62], "raw": b"", "typed": None, "shm": None})
@example({"datatype": "FP32", "shape": [0, 2**62], "raw": None, "typed": None, "shm": None})
def test_hostile_inputs_fail_only_with_our_errors(
    region: tuple[SharedMemoryRegistry, Any], hostile: dict[str, Any]
) -> None:
    """Whatever shape, bytes and shared-memory parameters a peer sends, decoding either
    yields an array that matches the declaration or raises InvalidArgument /
    FailedPrecondition -- never another exception, never an oversized allocation."""
    registry, _ = region
    # Declared with the datatype sent (FP32 when none), so every path gets exercised.
    spec = TensorSpec("v", hostile["datatype"] or "FP32", (-1, -1, -1))
    shape = hostile["shape"]
    # BYTES: 4 zero bytes per element encode an empty string each.
    width = 4 if spec.datatype == "BYTES" else spec.numpy_dtype.itemsize
    exact = width * math.prod(shape) if all(0 <= d <= 6 for d in shape) else 0
    params: dict[str, Param] = {}
    if hostile["shm"] is not None:
        name, offset, size = hostile["shm"]
        params["shared_memory_region"] = Param(string_param=name)
        if offset is not None:
            params["shared_memory_offset"] = Param(int64_param=offset)
        if size is not None:
            params["shared_memory_byte_size"] = Param(
                int64_param=exact if size == "exact" else size
            )
    contents = None
    if hostile["typed"] is not None:
        contents = pb.InferTensorContents(fp32_contents=hostile["typed"])
    tensor = inp("v", hostile["datatype"], shape, params=params, contents=contents)
    raw = {None: [], "exact": [bytes(exact)]}.get(hostile["raw"], [hostile["raw"]])
    try:
        call = decode(req(tensor, raw=raw), [spec], [spec], registry=registry)
    except (InvalidArgument, FailedPrecondition) as exc:
        event(type(exc).__name__)
        return
    event("decoded")
    v = call.inputs["v"]
    assert v.dtype == spec.numpy_dtype
    assert tensors.shape_matches(spec.shape, v.shape)
    del v, call


_LAYOUT_INPUTS = (X, K, TensorSpec("s", "BYTES", (-1,)))
_LAYOUT_OUTPUTS = (Y, Z)


@st.composite
def _layout_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """Requests for a model of inputs x (FP32 [-1, 16]), k (INT8 [-1]) and s (BYTES [-1]): mostly valid
    ones, and one near miss at a time (a wrong name, datatype, shape or byte count, a
    duplicate or missing input, an unknown or repeated output, a timeout parameter)."""
    rows = draw(st.sampled_from([0, 1, 2, 4]))
    tensors_ = draw(st.permutations([["x", "FP32", [rows, 16]], ["k", "INT8", [rows]],
                                     ["s", "BYTES", [rows]]]))  # fmt: skip
    tensors_ = [list(t) for t in tensors_]
    miss = draw(st.sampled_from(["none"] * 6 + ["name", "datatype", "shape", "bytes",
                                               "twice", "missing", "output", "param"]))  # fmt: skip
    if miss == "name":
        tensors_[0][0] = "q"
    elif miss == "datatype":
        tensors_[0][1] = draw(st.sampled_from(["INT8", "BYTES", "FP64"]))
    elif miss == "shape":
        tensors_[0][2] = [2, 8]
    elif miss == "twice":
        tensors_.append(list(tensors_[0]))
    elif miss == "missing":
        tensors_.pop()
    inputs, raw = [], []
    for name, datatype, shape in tensors_:
        size = {"FP32": 4, "INT8": 1, "FP64": 8, "BYTES": 5}[datatype] * math.prod(shape)
        if miss == "bytes" and not raw:
            size += 1
        inputs.append(inp(name, datatype, shape))
        raw.append(b"\x01\x00\x00\x00a" * (size // 5) if datatype == "BYTES" else bytes(size))
    wanted = draw(st.lists(st.sampled_from(["y", "z"]), max_size=2, unique=True))
    if miss == "output":
        wanted.append(draw(st.sampled_from(["w", "y"])))
    params = {"timeout": Param(int64_param=5)} if miss == "param" else None
    return req(*inputs, raw=raw, outputs=[Output(name=n) for n in wanted], params=params)


def _call_values(call: InferCall) -> Any:
    arrays = {
        n: (a.dtype, a.shape, a.tolist() if a.dtype == object else a.tobytes())
        for n, a in call.inputs.items()
    }
    return call.model, call.id, arrays, call.outputs, call.deadline, call.owner


@settings(max_examples=300)
@given(_layout_requests(), st.randoms(use_true_random=False))
def test_a_known_layout_is_checked_once_per_model_version(message: Any, rng: Any) -> None:
    """``decode_request`` keeps what it checked of a layout (``codec.Layout``) for the
    model version (its tensors, its batch sizes), when the layout alone decides it (no
    parameters, every input raw and fixed-width): a later request of that layout gets
    exactly the call a full check of its own bytes gives -- its own arrays, the same
    outputs and deadline -- or the same refusal, word for word."""
    from reactantserver.protocol import codec

    registry = SharedMemoryRegistry()
    first = bytes(message)
    again = pb.ModelInferRequest().parse(first)
    again.raw_input_contents = [
        bytes(rng.randrange(256) for _ in r) for r in again.raw_input_contents
    ]
    second = bytes(again)

    def decode(request: Any) -> Any:
        try:
            call = decode_request(
                request, inputs=_LAYOUT_INPUTS, outputs=_LAYOUT_OUTPUTS, registry=registry,
                now=NOW, deadline=NOW + 7, owner="me", batch_sizes=(1, 2, 4),
            )  # fmt: skip
        except InvalidArgument as exc:
            return str(exc)
        return _call_values(call)

    decode(codec.decode_infer_request(first))
    fresh = codec._parse(second, None)
    assert fresh.layout is None  # the full check
    known = codec.decode_infer_request(second)
    assert known.layout is not None  # the layout's
    got = decode(known)
    assert got == decode(fresh)
    event("refused" if isinstance(got, str) else "decoded")


def test_a_layout_keeps_its_checks_for_a_few_model_versions_only() -> None:
    """A layout checked against many model versions (reloads) keeps the checks of at most
    eight of them: the old versions' tensors are not held for ever."""
    from reactantserver.protocol import codec

    data = bytes(req(inp("x", "FP32", (1, 16)), raw=[bytes(64)]))
    request = codec.decode_infer_request(data)
    assert request.layout is not None
    for _ in range(20):
        version_inputs = (TensorSpec("x", "FP32", (-1, 16)),)  # a new version's own tuple
        call = decode_request(
            codec.decode_infer_request(data), inputs=version_inputs, outputs=(Y,),
            registry=SharedMemoryRegistry(), now=NOW,
        )  # fmt: skip
        assert call.inputs["x"].shape == (1, 16)
        assert 1 <= len(request.layout.checked) <= 8

"""What Triton's Python gRPC client examples check, in our words, against a worker and a gateway.

Users arrive with Triton's clients and Triton's examples (``triton-inference-server/client``,
``src/python/examples``). Those examples are not ours to ship; each test here does what one
of them checks, through ``tritonclient`` (and, where the example does, grpc's own stubs),
against the stand-in models of ``examples/triton/build.py`` served by a real worker in
explicit mode -- and again through a real gateway in front of it:

=======================================================  ======================================
Triton's example                                         test
=======================================================  ======================================
``simple_grpc_shm_client``, ``reuse_infer_objects_client``  ``test_shared_memory_after_the_reset``
``simple_grpc_shm_string_client``                        ``test_bytes_through_shared_memory``
``simple_grpc_string_infer_client``                      ``test_strings_and_bytes_round_trip``
``grpc_explicit_int8_content_client``                    ``test_typed_int8_contents_and_versions``
``grpc_explicit_int_content_client``                     ``test_contents_beside_raw_contents``
``simple_grpc_infer_client -C gzip`` / ``-C deflate``    ``test_compressed_requests``
``simple_grpc_model_control``                            ``test_model_control_with_a_config``
=======================================================  ======================================

(The examples themselves, run by hand, unmodified: docs/protocol.md, "Triton's client
examples".) The zip bomb is refused by both with RESOURCE_EXHAUSTED (``test_a_zip_bomb``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as tshm
from conftest import EXAMPLES, load_file
from gateway_harness import PAIRED, PAIRED_KEY_ENV, running_gateway
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from worker_harness import free_port, running_worker, worker_config

from reactantserver.client import Client
from reactantserver.config.schema import (
    GatewayConfig,
    GatewayGrpcConfig,
    GatewayTrust,
    ListenConfig,
    LoggingConfig,
)

STANDINS = ("simple", "simple_int8", "simple_string", "simple_identity")
#: Compiled sizes of the stand-ins here (the example repository compiles 1, 8, 16, 32).
BATCH_SIZES = (1, 16, 32)
#: The message limit of both servers: small, so that a bomb is cheap to refuse.
LIMIT = 4 * 1024 * 1024
#: The shared-memory keys the servers here open (``endpoints.shm_key_prefix``): Triton's
#: examples name theirs ``/input_simple`` and ``/output_simple``, outside the default
#: ``/reactantserver-``; an operator running them sets a prefix that admits their keys,
#: as these tests do for theirs (docs/protocol.md, "Triton's client examples").
SHM_PREFIX = "/rs_triton_"


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    build = load_file("reactantserver_examples_triton_build", EXAMPLES / "triton" / "build.py")
    build.build(out, extra=(), batch_sizes=BATCH_SIZES)
    return out


@attrs.frozen
class Fleet:
    worker: str
    gateway: str


@pytest.fixture(scope="module")
def fleet(triton_repo: Path) -> Iterator[Fleet]:
    config = worker_config(
        triton_repo,
        mode="explicit",
        metrics=False,
        max_message_bytes=LIMIT,
        shm_key_prefix=SHM_PREFIX,
        # The gateway registers its clients' regions with a key its workers trust.
        gateway=GatewayTrust(key_env=PAIRED_KEY_ENV),
    )
    with running_worker(config) as address:
        worker = f"127.0.0.1:{address.grpc_port}"
        gateway_config = GatewayConfig(
            listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
            endpoints=(worker,),
            worker_names=("w0",),
            health_interval_seconds=1.0,
            logging=LoggingConfig(format="text"),
            grpc=GatewayGrpcConfig(max_recv_msg_bytes=LIMIT, max_send_msg_bytes=LIMIT),
            worker_client=PAIRED,
        )
        with running_gateway(gateway_config) as gateway:
            yield Fleet(worker, gateway.grpc)


@pytest.fixture(params=["worker", "gateway"])
def url(request: pytest.FixtureRequest, fleet: Fleet) -> str:
    return str(getattr(fleet, request.param))


@pytest.fixture
def client(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url)
    yield c
    c.close()


def status(exc: InferenceServerException | grpc.RpcError) -> str:
    if isinstance(exc, grpc.RpcError):
        return str(exc.code().name)
    return str(exc.status()).removeprefix("StatusCode.")


def fails(fn: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        fn(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def pair_inputs(a: np.ndarray, b: np.ndarray, datatype: str) -> list[grpcclient.InferInput]:
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


# ------------------------------------------------------------------ shared memory


def test_shared_memory_after_the_reset(client: grpcclient.InferenceServerClient) -> None:
    """The examples reset both kinds of shared memory before they begin: unregistering
    CUDA regions succeeds (there are none: the status lists nothing), system regions then
    carry the inputs and the outputs, and the same input and output objects work again
    inline once their shared-memory settings are removed."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    refusal = fails(client.register_cuda_shared_memory, "gpu", b"aGFuZGxl", 0, 64)
    assert status(refusal) == "INVALID_ARGUMENT" and "GPUs not supported" in refusal.message()

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    size = a.nbytes
    key = f"{SHM_PREFIX}{free_port()}"
    regions = tshm.create_shared_memory_region("in", key + "_in", 2 * size), None
    out = tshm.create_shared_memory_region("out", key + "_out", 2 * size)
    try:
        tshm.set_shared_memory_region(regions[0], [a])
        tshm.set_shared_memory_region(regions[0], [b], offset=size)
        client.register_system_shared_memory("in", key + "_in", 2 * size)
        client.register_system_shared_memory("out", key + "_out", 2 * size)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                  grpcclient.InferInput("INPUT1", [1, 16], "INT32")]  # fmt: skip
        inputs[0].set_shared_memory("in", size)
        inputs[1].set_shared_memory("in", size, offset=size)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"),
                   grpcclient.InferRequestedOutput("OUTPUT1")]  # fmt: skip
        outputs[0].set_shared_memory("out", size)
        outputs[1].set_shared_memory("out", size, offset=size)
        result = client.infer("simple", inputs, outputs=outputs)
        assert result.get_output("OUTPUT0").datatype == "INT32"
        total = tshm.get_contents_as_numpy(out, np.int32, [1, 16])
        difference = tshm.get_contents_as_numpy(out, np.int32, [1, 16], offset=size)
        np.testing.assert_array_equal(total, a + b)
        np.testing.assert_array_equal(difference, a - b)
        assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {
            "in",
            "out",
        }
        # The same objects, inline now (reuse_infer_objects_client).
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(2 * b)
        for output in outputs:
            output.unset_shared_memory()
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 2 * b)
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(regions[0])
        tshm.destroy_shared_memory_region(out)


def test_bytes_through_shared_memory(client: grpcclient.InferenceServerClient) -> None:
    """BYTES inputs serialized into a system region, BYTES outputs read back from one."""
    from tritonclient.utils import (
        deserialize_bytes_tensor,
        serialize_byte_tensor,
        serialized_byte_size,
    )

    a = np.array([str(i).encode() for i in range(16)], dtype=object).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    wire_a, wire_b = serialize_byte_tensor(a), serialize_byte_tensor(b)
    size_a, size_b = serialized_byte_size(wire_a), serialized_byte_size(wire_b)
    key = f"{SHM_PREFIX}{free_port()}"
    space = 1024
    inp = tshm.create_shared_memory_region("sin", key + "_in", space)
    out = tshm.create_shared_memory_region("sout", key + "_out", space)
    try:
        tshm.set_shared_memory_region(inp, [wire_a])
        tshm.set_shared_memory_region(inp, [wire_b], offset=size_a)
        client.unregister_cuda_shared_memory()
        client.register_system_shared_memory("sin", key + "_in", space)
        client.register_system_shared_memory("sout", key + "_out", space)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"),
                  grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]  # fmt: skip
        inputs[0].set_shared_memory("sin", size_a)
        inputs[1].set_shared_memory("sin", size_b, offset=size_a)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"),
                   grpcclient.InferRequestedOutput("OUTPUT1")]  # fmt: skip
        outputs[0].set_shared_memory("sout", space // 2)
        outputs[1].set_shared_memory("sout", space // 2, offset=space // 2)
        result = client.infer("simple_string", inputs, outputs=outputs)
        sizes = [result.get_output(n).parameters["shared_memory_byte_size"].int64_param
                 for n in ("OUTPUT0", "OUTPUT1")]  # fmt: skip
        raw = tshm.get_contents_as_numpy(out, np.uint8, [space]).tobytes()
        total = deserialize_bytes_tensor(raw[: sizes[0]])
        difference = deserialize_bytes_tensor(raw[space // 2 : space // 2 + sizes[1]])
        assert [int(v) for v in total] == [i + 1 for i in range(16)]
        assert [int(v) for v in difference] == [i - 1 for i in range(16)]
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(inp)
        tshm.destroy_shared_memory_region(out)


def test_strings_and_bytes_round_trip(client: grpcclient.InferenceServerClient) -> None:
    """Decimal strings added as numbers; BYTES elements with a NUL in them, and binary
    blobs, answered exactly as sent."""
    a = np.array([str(i).encode() for i in range(16)], dtype=object).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    result = client.infer("simple_string", pair_inputs(a, b, "BYTES"))
    assert [int(v) for v in result.as_numpy("OUTPUT0")[0]] == [i + 1 for i in range(16)]
    assert [int(v) for v in result.as_numpy("OUTPUT1")[0]] == [i - 1 for i in range(16)]
    for elements in ([b"he\x00llo"] * 16, [b"\x00\x01\x02\x03"] * 16):
        data = np.array(elements, dtype=object).reshape(1, 16)
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
        tensor.set_data_from_numpy(data)
        answer = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
        assert answer.tolist() == data.tolist()


# ------------------------------------------------------------------ typed contents, versions


def typed_request(model: str, datatype: str, version: str = "") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        tensor.contents.int_contents[:] = values
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    return request


def test_typed_int8_contents_and_versions(url: str) -> None:
    """INT8 inputs in typed contents come back as raw INT8; the version asked for is
    checked: none or the served one is served, another integer is not found, a string
    that is not a version is refused in Triton's words -- for every RPC that takes one."""
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for version in ("", "1"):
            response = stub.ModelInfer(typed_request("simple_int8", "INT8", version))
            assert response.model_version == "1"
            total = np.frombuffer(response.raw_output_contents[0], dtype=np.int8)
            difference = np.frombuffer(response.raw_output_contents[1], dtype=np.int8)
            assert total.tolist() == [i + 1 for i in range(16)]
            assert difference.tolist() == [i - 1 for i in range(16)]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(typed_request("simple_int8", "INT8", "wrong_specification"))
        assert status(caught.value) == "INVALID_ARGUMENT"
        assert (
            "failed to get model version from specified version string 'wrong_specification'"
            in caught.value.details()
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(typed_request("simple_int8", "INT8", "7"))
        assert status(caught.value) == "NOT_FOUND"
        assert caught.value.details().startswith("model 'simple_int8' version 7 is not found")
    c = grpcclient.InferenceServerClient(url)
    try:
        assert c.is_model_ready("simple_int8", "1") and not c.is_model_ready("simple_int8", "7")
        assert c.get_model_metadata("simple_int8", "1").versions == ["1"]
        for call in (c.get_model_metadata, c.get_model_config, c.get_inference_statistics):
            assert status(fails(call, "simple_int8", "7")) == "NOT_FOUND"
            assert status(fails(call, "simple_int8", "x")) == "INVALID_ARGUMENT"
        assert status(fails(c.is_model_ready, "simple_int8", "-1")) == "INVALID_ARGUMENT"
    finally:
        c.close()


def test_contents_beside_raw_contents(url: str) -> None:
    """Typed contents and raw_input_contents in one request: the conflict is the error,
    in the words Triton's example looks for."""
    request = typed_request("simple", "INT32")
    request.raw_input_contents.extend([np.arange(8, dtype=np.int32).tobytes()])
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
    assert status(caught.value) == "INVALID_ARGUMENT"
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'simple'" in caught.value.details()
    )


# ------------------------------------------------------------------ compression


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    """tritonclient's compression_algorithm: the request goes compressed, is inflated, and
    is answered as if it had not been (32 rows: the message is worth compressing)."""
    a = np.tile(np.arange(16, dtype=np.int32), (32, 1))
    b = np.ones((32, 16), dtype=np.int32)
    result = client.infer("simple", pair_inputs(a, b, "INT32"), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_a_zip_bomb(client: grpcclient.InferenceServerClient) -> None:
    """A request that gzips to a few kilobytes but inflates past the message limit is
    refused RESOURCE_EXHAUSTED, naming the limit; one just under it is served."""
    rows = LIMIT // 64 + 1  # two inputs of 64 bytes a row: more than the limit in all
    zeros = np.zeros((rows, 16), dtype=np.int32)
    tensors = pair_inputs(zeros, zeros, "INT32")
    exc = fails(client.infer, "simple", tensors, compression_algorithm="gzip")
    assert status(exc) == "RESOURCE_EXHAUSTED"
    assert "inflates past the limit of 4194304 bytes" in exc.message()
    small = np.zeros((32, 16), dtype=np.int32)
    result = client.infer(
        "simple", pair_inputs(small, small, "INT32"), compression_algorithm="gzip"
    )
    assert result.as_numpy("OUTPUT0").shape == (32, 16)


# ------------------------------------------------------------------ model control


def test_model_control_with_a_config(
    client: grpcclient.InferenceServerClient, url: str, fleet: Fleet
) -> None:
    """Explicit mode: the index lists the repository with versions; a load with a config
    that is not JSON fails to load; one lowering max_batch_size is applied and visible in
    ModelConfig, and a load without config goes back; an unload makes the model not
    ready; a file upload and an unknown name fail to load."""
    index = {m.name: m.version for m in client.get_model_repository_index().models}
    assert index == dict.fromkeys(STANDINS, "1")
    client.load_model("simple")
    assert client.is_model_ready("simple")
    assert client.get_model_config("simple").config.max_batch_size == 32

    exc = fails(
        client.load_model, "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'
    )
    assert status(exc) == "INVALID_ARGUMENT" and "failed to load" in exc.message()

    client.load_model("simple", config='{"max_batch_size":"16"}')
    config = client.get_model_config("simple").config
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [1, 16]
    # The same config again: nothing is reloaded.
    generation = config.parameters["generation"].string_value
    client.load_model("simple", config='{"maxBatchSize": 16}')
    assert client.get_model_config("simple").config.parameters["generation"].string_value == (
        generation
    )
    # A config read back, edited and sent again: what it restates is accepted.
    edited = client.get_model_config("simple", as_json=True)["config"]
    edited["dynamic_batching"]["preferred_batch_size"] = [16]
    edited["parameters"]["weight"] = {"string_value": "2.5"}
    client.load_model("simple", config=json.dumps(edited))
    config = client.get_model_config("simple").config
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    assert config.parameters["weight"].string_value == "2.5"
    if url == fleet.worker:  # the scheduler's own view (a gateway refuses per-worker RPCs)
        with Client(url) as direct:
            (status_,) = [m for m in direct.control_status().models if m.name == "simple"]
        assert (status_.max_batch_size, status_.weight) == (16, 2.5)
    # Every batch now runs at 16 rows: a request of 17 has no size to run at.
    rows = np.ones((17, 16), dtype=np.int32)
    exc = fails(client.infer, "simple", pair_inputs(rows, rows, "INT32"))
    assert status(exc) == "INVALID_ARGUMENT" and "17 rows" in exc.message()
    client.infer("simple", pair_inputs(rows[:3], rows[:3], "INT32"))
    exc = fails(client.load_model, "simple", config='{"instance_group": [{"count": 4}]}')
    assert status(exc) == "INVALID_ARGUMENT"
    assert "instance_group" in exc.message() and "one execution at a time" in exc.message()
    assert client.get_model_config("simple").config.max_batch_size == 16  # still serving
    client.load_model("simple")  # no config: the bundle's values again
    assert client.get_model_config("simple").config.max_batch_size == 32

    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    index = {m.name: m.version for m in client.get_model_repository_index().models}
    assert index["simple"] == ""
    exc = fails(client.load_model, "simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert status(exc) == "INVALID_ARGUMENT" and "cannot be uploaded" in exc.message()
    assert client.is_server_live()
    exc = fails(client.load_model, "wrong_model_name")
    assert "failed to load" in exc.message()
    client.load_model("simple")
    assert client.is_model_ready("simple")

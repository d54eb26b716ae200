"""The sans-IO reflection answerer: requests in, the right descriptors out.

A reflection client rebuilds our schema from the FileDescriptorProto bytes it receives, so
the strongest check is to do the same here: load every answer into a fresh
``google.protobuf`` descriptor pool and use the rebuilt message classes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from reactantserver.protocol import inference as ip
from reactantserver.protocol.grpc.reflection import v1 as rpb_v1
from reactantserver.protocol.grpc.reflection import v1alpha as rpb
from reactantserver.protocol.reflection import (
    ReflectionAnswerer,
    ReflectionStatus,
    load_descriptor_set,
    split_descriptor_set,
)

SERVED = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
    "reactant_control.ControlService",
    "reactant_control.GatewayControlService",
)


@pytest.fixture(scope="module")
def answerer() -> ReflectionAnswerer:
    return ReflectionAnswerer.from_package()


def _files(response: rpb.ServerReflectionResponse) -> list[descriptor_pb2.FileDescriptorProto]:
    raw = response.file_descriptor_response.file_descriptor_proto
    assert raw, f"expected a file answer, got {response.to_dict()}"
    return [descriptor_pb2.FileDescriptorProto.FromString(b) for b in raw]


def _pool(files: list[descriptor_pb2.FileDescriptorProto]) -> descriptor_pool.DescriptorPool:
    """Build a pool as a client would: dependencies first (the answer lists them after)."""
    pool = descriptor_pool.DescriptorPool()
    for fdp in reversed(files):
        pool.Add(fdp)
    return pool


def test_list_services(answerer: ReflectionAnswerer) -> None:
    response = answerer.answer(rpb.ServerReflectionRequest(host="h", list_services="*"))
    names = [s.name for s in response.list_services_response.service]
    assert names == list(SERVED)
    assert response.valid_host == "h"
    assert response.original_request.list_services == "*"


def test_listed_services_can_be_restricted(answerer: ReflectionAnswerer) -> None:
    only = ReflectionAnswerer(
        load_descriptor_set(),
        services=["inference.GRPCInferenceService", "grpc.reflection.v1alpha.ServerReflection"],
    )
    assert only.services == (
        "grpc.reflection.v1alpha.ServerReflection",
        "inference.GRPCInferenceService",
    )
    with pytest.raises(ValueError, match="not defined"):
        ReflectionAnswerer(load_descriptor_set(), services=["inference.Nope"])


def test_file_containing_model_infer_request(answerer: ReflectionAnswerer) -> None:
    response = answerer.answer(
        rpb.ServerReflectionRequest(file_containing_symbol="inference.ModelInferRequest")
    )
    files = _files(response)
    assert [f.name for f in files] == ["inference.proto", "model_config.proto"]
    assert "ModelInferRequest" in [m.name for m in files[0].message_type]
    # The answer is a complete closure: a client can rebuild the message and decode our bytes.
    pool = _pool(files)
    descriptor = pool.FindMessageTypeByName("inference.ModelInferRequest")
    cls = message_factory.GetMessageClass(descriptor)
    ours = ip.ModelInferRequest(
        model_name="m",
        parameters={"reactant_timeout_ns": ip.InferParameter(int64_param=5)},
        raw_input_contents=[b"\x01\x02"],
    )
    decoded = cls.FromString(bytes(ours))
    assert decoded.model_name == "m"
    assert decoded.parameters["reactant_timeout_ns"].int64_param == 5
    assert list(decoded.raw_input_contents) == [b"\x01\x02"]


@pytest.mark.parametrize(
    ("symbol", "file_name"),
    [
        ("inference.GRPCInferenceService", "inference.proto"),
        ("inference.GRPCInferenceService.ModelInfer", "inference.proto"),
        ("inference.ModelInferRequest.InferInputTensor", "inference.proto"),
        ("inference.ModelInferRequest.raw_input_contents", "inference.proto"),
        ("inference.InferParameter.parameter_choice", "inference.proto"),
        (".inference.ModelConfig", "model_config.proto"),
        ("inference.DataType", "model_config.proto"),
        # Enum values live in the scope enclosing their enum.
        ("inference.TYPE_FP32", "model_config.proto"),
        ("inference.ModelInstanceGroup.KIND_GPU", "model_config.proto"),
        ("reactant_control.ControlService.CompactMemory", "reactant_control.proto"),
        ("reactant_control.ModelStatus.batch_axis", "reactant_control.proto"),
        ("reactant_control.PINNED_DEVICE", "reactant_control.proto"),
        ("grpc.reflection.v1alpha.ServerReflection", "grpc/reflection/v1alpha/reflection.proto"),
        ("grpc.reflection.v1.ServerReflectionRequest", "grpc/reflection/v1/reflection.proto"),
    ],
)
def test_symbols_resolve_to_their_file(
    answerer: ReflectionAnswerer, symbol: str, file_name: str
) -> None:
    response = answerer.answer(rpb.ServerReflectionRequest(file_containing_symbol=symbol))
    assert _files(response)[0].name == file_name


def test_every_symbol_of_every_file_is_found(answerer: ReflectionAnswerer) -> None:
    """Whatever a client's rebuilt descriptor pool can name, the answerer can locate."""
    for file_name in answerer.file_names:
        files = _files(answerer.answer(rpb.ServerReflectionRequest(file_by_filename=file_name)))
        assert files[0].name == file_name
        file_desc = _pool(files).FindFileByName(file_name)
        symbols: list[str] = []
        for service in file_desc.services_by_name.values():
            symbols.append(service.full_name)
            symbols.extend(m.full_name for m in service.methods)
        symbols.extend(e.full_name for e in file_desc.enum_types_by_name.values())
        stack = list(file_desc.message_types_by_name.values())
        while stack:
            message = stack.pop()
            symbols.append(message.full_name)
            symbols.extend(f.full_name for f in message.fields)
            symbols.extend(o.full_name for o in message.oneofs)
            symbols.extend(e.full_name for e in message.enum_types)
            stack.extend(message.nested_types)
        assert symbols, file_name
        for symbol in symbols:
            assert answerer.file_for_symbol(symbol) == file_name, symbol


def test_file_by_filename_includes_imports(answerer: ReflectionAnswerer) -> None:
    files = _files(answerer.answer(rpb.ServerReflectionRequest(file_by_filename="inference.proto")))
    assert [f.name for f in files] == ["inference.proto", "model_config.proto"]
    alone = _files(
        answerer.answer(rpb.ServerReflectionRequest(file_by_filename="model_config.proto"))
    )
    assert [f.name for f in alone] == ["model_config.proto"]


def test_answers_carry_source_comments(answerer: ReflectionAnswerer) -> None:
    """grpcurl describe prints these comments, so they must survive into the answer."""
    (control,) = _files(
        answerer.answer(rpb.ServerReflectionRequest(file_by_filename="reactant_control.proto"))
    )
    comments = " ".join(loc.leading_comments for loc in control.source_code_info.location)
    assert "counted from 1" in comments  # ModelStatus.batch_axis


def test_files_are_sent_byte_exact(answerer: ReflectionAnswerer) -> None:
    raw = {
        descriptor_pb2.FileDescriptorProto.FromString(b).name: b
        for b in split_descriptor_set(load_descriptor_set())
    }
    response = answerer.answer(rpb.ServerReflectionRequest(file_by_filename="inference.proto"))
    sent = response.file_descriptor_response.file_descriptor_proto
    assert sent == [raw["inference.proto"], raw["model_config.proto"]]


@pytest.mark.parametrize(
    "request_message",
    [
        rpb.ServerReflectionRequest(file_by_filename="grpc_service.proto"),
        rpb.ServerReflectionRequest(file_containing_symbol="inference.NoSuchMessage"),
        rpb.ServerReflectionRequest(
            file_containing_extension=rpb.ExtensionRequest(
                containing_type="inference.ModelInferRequest", extension_number=100
            )
        ),
        rpb.ServerReflectionRequest(all_extension_numbers_of_type="inference.Nope"),
    ],
)
def test_unknown_things_are_not_found(
    answerer: ReflectionAnswerer, request_message: rpb.ServerReflectionRequest
) -> None:
    response = answerer.answer(request_message)
    assert response.error_response.error_code == ReflectionStatus.NOT_FOUND == 5
    assert response.error_response.error_message
    assert response.original_request == request_message


def test_extension_numbers_of_a_known_type(answerer: ReflectionAnswerer) -> None:
    response = answerer.answer(
        rpb.ServerReflectionRequest(all_extension_numbers_of_type=".inference.ModelConfig")
    )
    numbers = response.all_extension_numbers_response
    assert numbers.base_type_name == "inference.ModelConfig"
    assert numbers.extension_number == []  # proto3 files declare no extensions


def test_empty_request_is_invalid(answerer: ReflectionAnswerer) -> None:
    response = answerer.answer(rpb.ServerReflectionRequest(host="h"))
    assert response.error_response.error_code == ReflectionStatus.INVALID_ARGUMENT


def test_answer_bytes_serves_v1_clients(answerer: ReflectionAnswerer) -> None:
    request = rpb_v1.ServerReflectionRequest(
        file_containing_symbol="reactant_control.ModelControlStatusResponse"
    )
    response = rpb_v1.ServerReflectionResponse().parse(answerer.answer_bytes(bytes(request)))
    assert response.original_request == request
    (fdp,) = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in response.file_descriptor_response.file_descriptor_proto
    ]
    assert fdp.name == "reactant_control.proto"
    listed = rpb_v1.ServerReflectionResponse().parse(
        answerer.answer_bytes(bytes(rpb_v1.ServerReflectionRequest(list_services="")))
    )
    assert [s.name for s in listed.list_services_response.service] == list(SERVED)


def test_descriptor_set_must_be_complete() -> None:
    files = split_descriptor_set(load_descriptor_set())
    by_name = {descriptor_pb2.FileDescriptorProto.FromString(b).name: b for b in files}
    # inference.proto alone lacks its import, model_config.proto.
    only_inference = b"\x0a" + _varint(len(by_name["inference.proto"])) + by_name["inference.proto"]
    with pytest.raises(ValueError, match=r"model_config\.proto"):
        ReflectionAnswerer(only_inference)
    with pytest.raises(ValueError, match="twice"):
        ReflectionAnswerer(load_descriptor_set() * 2)


@pytest.mark.parametrize("garbage", [b"\x12\x00", b"\x0a\x05abc", b"\x0a\xff"])
def test_malformed_descriptor_sets_are_refused(garbage: bytes) -> None:
    with pytest.raises(ValueError):
        split_descriptor_set(garbage)


@pytest.mark.parametrize("bad_file", [b"\x0b", b"\x12\x09name", b"\x49\x00"])
def test_malformed_file_descriptors_are_refused(bad_file: bytes) -> None:
    """A group (wire type 3), a truncated payload, a truncated fixed64: refused, not skipped."""
    with pytest.raises(ValueError):
        ReflectionAnswerer(b"\x0a" + _varint(len(bad_file)) + bad_file)


def test_reflection_imports_without_jax() -> None:
    code = (
        "import sys, reactantserver.protocol.reflection, reactantserver.protocol.grpc.reflection.v1\n"
        "print(any(m == 'jax' or m.startswith(('jax.', 'jaxlib')) for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize(
    ("symbol", "names"),
    [
        (
            "reactant_control.GatewayControlService.SetSchedulingPolicy",
            ["gateway_control.proto", "google/protobuf/field_mask.proto"],
        ),
        ("grpc.health.v1.Health.Check", ["grpc/health/v1/health.proto"]),
        ("grpc.health.v1.HealthCheckResponse.SERVING", ["grpc/health/v1/health.proto"]),
    ],
)
def test_gateway_and_health_services_are_reflected(
    answerer: ReflectionAnswerer, symbol: str, names: list[str]
) -> None:
    """The gateway's control service (with its FieldMask import) and grpc.health.v1 resolve
    to complete closures a client can rebuild."""
    response = answerer.answer(rpb.ServerReflectionRequest(file_containing_symbol=symbol))
    files = _files(response)
    assert [f.name for f in files] == names
    pool = _pool(files)
    if symbol.startswith("reactant_control"):
        request = pool.FindMessageTypeByName("reactant_control.SetSchedulingPolicyRequest")
        assert request.fields_by_name["update_mask"].message_type.full_name == (
            "google.protobuf.FieldMask"
        )

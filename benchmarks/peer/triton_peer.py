"""Triton Inference Server and PyTriton as ``bench_peer``'s peers, from PyPI's ``nvidia-pytriton``.

The ``nvidia-pytriton`` wheel (0.7.0) ships the real ``tritonserver`` binary (2.51), its
Python backend, a backend stub per Python version and every library they need (in
``nvidia_pytriton.libs``). It pins numpy below 2, so it lives in an interpreter of its
own (``--peer-python``; ``nox -s bench_peer -- --peer triton`` makes one), and the
servers run as that interpreter's processes:

* **Triton**: ``tritonserver`` over a model repository written here, into the run's work
  directory (never committed prebuilt): ``double``, ``backend: "python"``,
  ``max_batch_size: 64``, FP32 ``x`` of ``[16]`` in, ``y`` out, ``dynamic_batching {}``,
  one CPU instance; its ``model.py`` is the Python backend's ``execute`` as Triton's
  examples write it (each request's ``x`` read as numpy, ``2 * x`` answered). The
  backend directory is a copy of the wheel's Python backend with the stub of the peer
  interpreter's version.
* **PyTriton**: :data:`PYTRITON_SCRIPT` under the peer interpreter, the way PyTriton's
  documentation serves a function: ``Triton().bind(...)`` of an ``@batch`` function
  ``y = 2 * x``, ``max_batch_size`` 64 (PyTriton's default dynamic batcher).

Two facts of the wheel (issue 44): the backend stub must load the *same* libpython as
the interpreter whose standard library it uses, so that interpreter's ``LIBDIR`` goes
first on ``LD_LIBRARY_PATH`` (otherwise the model's initialize fails with
``'_thread.RLock' object has no attribute '_recursion_count'``); and a copied
binary -- the backend's ``libtriton_python.so`` here -- finds its libraries only with
``nvidia_pytriton.libs`` on ``LD_LIBRARY_PATH``. A third: the stub's embedded Python
finds its ``site-packages`` through the ``python3`` first on ``PATH`` (PyTriton puts its
own interpreter's directory there, and so do we); with another interpreter's numpy (2.x
where the stub was built against 1.x) every answer comes back *empty* -- the benchmark's
answer check caught it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import attrs

HERE = Path(__file__).resolve().parent
#: The model name every server serves (the same ModelInfer bytes go to each).
MODEL = "double"
MAX_BATCH = 64
FEATURES = 16

CONFIG_PBTXT = f"""\
name: "{MODEL}"
backend: "python"
max_batch_size: {MAX_BATCH}
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

MODEL_PY = '''\
"""y = 2 * x, as Triton's Python backend examples write a model (benchmarks/peer/triton_peer.py)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]))
        return responses
'''

#: The PyTriton server (run by the peer interpreter: ``python - PORT HTTP METRICS``).
PYTRITON_SCRIPT = f'''\
import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def infer(x):
    return {{"y": 2 * x}}


grpc, http, metrics = map(int, sys.argv[1:4])
config = TritonConfig(grpc_port=grpc, http_port=http, metrics_port=metrics, log_verbose=0)
with Triton(config=config) as triton:
    triton.bind(
        model_name="{MODEL}",
        infer_func=infer,
        inputs=[Tensor(name="x", dtype=np.float32, shape=({FEATURES},))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=({FEATURES},))],
        config=ModelConfig(max_batch_size={MAX_BATCH}),
    )
    triton.serve()
'''

#: What the peer interpreter reports of itself (``python -c PROBE``): JSON.
PROBE = """\
import json, sys, sysconfig, importlib.metadata
import pytriton
print(json.dumps({
    "site": sysconfig.get_paths()["purelib"],
    "libdir": sysconfig.get_config_var("LIBDIR"),
    "version": f"{sys.version_info.major}.{sys.version_info.minor}",
    "pytriton": importlib.metadata.version("nvidia-pytriton"),
}))
"""


@attrs.frozen
class PeerPython:
    """The interpreter holding ``nvidia-pytriton`` and what the servers need of it."""

    python: str
    #: Its ``site-packages`` (the wheel's files).
    site: Path
    #: Its libpython's directory (first on ``LD_LIBRARY_PATH``: module docstring).
    libdir: Path
    #: ``major.minor`` (which backend stub).
    version: str
    pytriton_version: str

    @classmethod
    def probe(cls, python: str) -> PeerPython:
        out = subprocess.run(
            [python, "-c", PROBE], capture_output=True, text=True, check=False, timeout=120
        )
        if out.returncode != 0:
            raise SystemExit(
                f"--peer-python {python}: cannot import pytriton there "
                f"({out.stderr.strip()[-400:]}); install it with "
                f"`{python} -m pip install nvidia-pytriton==0.7.0` (numpy < 2: an interpreter "
                "of its own), or run `nox -s bench_peer -- --peer triton`, which makes one"
            )
        found = json.loads(out.stdout)
        return cls(
            python,
            Path(found["site"]),
            Path(found["libdir"]),
            found["version"],
            found["pytriton"],
        )

    @property
    def tritonserver(self) -> Path:
        return self.site / "pytriton" / "tritonserver"

    def env(self) -> dict[str, str]:
        """The servers' environment: the three facts of the module docstring."""
        libs = [str(self.libdir), str(self.site / "nvidia_pytriton.libs")]
        old = os.environ.get("LD_LIBRARY_PATH")
        return {
            **os.environ,
            "LD_LIBRARY_PATH": os.pathsep.join([*libs, *([old] if old else [])]),
            "PATH": os.pathsep.join([str(Path(self.python).parent), os.environ.get("PATH", "")]),
        }


def write_repository(root: Path, peer: PeerPython) -> tuple[Path, Path]:
    """Triton's model repository and backend directory under ``root``: (repository,
    backends)."""
    repo = root / "triton_repo"
    model = repo / MODEL
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG_PBTXT)
    (model / "1" / "model.py").write_text(MODEL_PY)
    backends = root / "triton_backends"
    python = backends / "python"
    if python.exists():
        shutil.rmtree(python)
    shutil.copytree(peer.tritonserver / "backends" / "python", python)
    stub = peer.tritonserver / "python_backend_stubs" / peer.version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"the wheel has no Python backend stub for Python {peer.version}")
    shutil.copy2(stub, python / "triton_python_backend_stub")
    return repo, backends


def triton_command(peer: PeerPython, repo: Path, backends: Path, grpc_port: int) -> list[str]:
    return [
        str(peer.tritonserver / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends}",
        f"--grpc-port={grpc_port}",
        "--allow-http=false",
        "--allow-metrics=false",
        "--log-verbose=0",
    ]


def start(
    argv: list[str], env: dict[str, str], log: Path, cwd: Path, pin: Callable[[], None]
) -> subprocess.Popen[bytes]:
    """``argv`` as its own process on the servers' cores (``pin`` runs in the child before
    it starts, so every thread and child process it makes stays there)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin
        )

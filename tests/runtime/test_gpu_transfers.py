"""On a GPU: every program's transfer path and the memory its outputs and weights are in.

A worker on CUDA compiles each program with its outputs in pinned host memory
(``runtime/model.py``'s ``pinned_host`` path) and loads weights from pinned host copies
into device memory (``runtime/unpack.py``). If a pinned-host compile failed it would
fall back, with a warning only, to ``copy_to_host_async``, and serve on slower: this
test is what notices. ``gpu_scenarios.py transfer_paths`` runs every zoo model on a real
CUDA ``Runtime`` in a process of its own and reports each compiled size's path and the
memory kind of its launch's outputs, and of the weights the cache hands out.

The same scenario runs on the CPU in ``test_runtime_transfers.py`` (with the runtime put
on CUDA's path), so the logic is checked in every CI run; here it runs on the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ZOO_NAMES
from gpu_support import BACKEND
from harness import worker_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

HERE = Path(__file__).resolve().parents[1]


def test_every_program_outputs_to_pinned_host_and_weights_load_into_device_memory(
    zoo_repo: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, str(HERE / "gpu_scenarios.py"), "transfer_paths", str(zoo_repo), BACKEND],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "pinned host memory failed" not in out.stderr  # no compile fell back
    report = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["backend"] == BACKEND and report["runtime_path"] == "pinned_host"
    assert set(ZOO_NAMES) <= set(report["models"])
    for name, model in report["models"].items():
        assert set(model["paths"].values()) == {"pinned_host"}, name
        for size, kinds in model["output_kinds"].items():
            assert kinds == ["pinned_host"], (name, size)
        assert model["weight_kinds"] == ["device"], name
    assert report["pinned_host_staging"]
    assert report["staged_bytes"] == report["weight_bytes"]

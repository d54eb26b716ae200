"""The README's quick-start block is a capture of ``nox -s serve``: it must still be what
the code prints (the steps' lines, the build table, the ready block)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from reactantserver.announce import Startup, ready_block
from reactantserver.client import ModelMetadata, RepositoryModel, TensorMetadata

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402


def quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```console\n\$ nox -s serve\n(.*?)```", text, re.S)
    assert block is not None, "README.md has no captured `nox -s serve`"
    return block[1].splitlines()


def test_the_step_lines_are_the_noxfiles() -> None:
    steps = [line for line in quick_start() if line.startswith("nox > [")]
    assert steps == [
        f"nox > [1/3] {noxfile.installing('.nox/serve')}",
        f"nox > [2/3] {noxfile.BUILDING}",
        f"nox > [3/3] {noxfile.serving(['examples/node.yaml'])}",
    ]
    build = [line for line in quick_start() if re.match(r"\[\d/8\] ", line)]
    assert [line.split()[1] for line in build] == [
        "mlp",
        "resnet",
        "surrogate1d",
        "uint8_classifier",
        "double",
        "detector_backbone",
        "detector_classifier",
        "detector",
    ]


def test_the_ready_block_is_what_announce_prints() -> None:
    lines = quick_start()
    start = lines.index("-" * 78)
    captured = lines[start:]
    names = [
        "detector",
        "detector_backbone",
        "detector_classifier",
        "double",
        "mlp",
        "resnet",
        "surrogate1d",
        "uint8_classifier",
    ]
    double = ModelMetadata("double", (), "jax_cpu", (TensorMetadata("x", "FP32", (-1, 16)),), ())
    block = ready_block(
        grpc="127.0.0.1:8001",
        metrics="127.0.0.1:8002",
        startup=Startup.from_index([RepositoryModel(n, "", "READY", "") for n in names]),
        ready=True,
        example=(double, '{"x": [[1.0] * 16]}'),
    )
    # The commands are shown as run from the checkout, with nox's virtualenv.
    shown = re.sub(r"\S*/bin/(grpcurl|python)", r".nox/serve/bin/\1", block)
    shown = re.sub(r"^  (grpcurl|python) ", r"  .nox/serve/bin/\1 ", shown, flags=re.M)
    assert captured == shown.splitlines()

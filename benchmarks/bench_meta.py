"""Meta-model benchmark: what the glue layer costs on top of the stages it calls.

Builds the example detector (``examples/detector/build.py``) into a temporary
repository, serves it from a worker running in this process (its own Trio run on a
thread, gRPC on loopback), and measures with ``tritonclient.grpc`` (one request at a
time, after warm-up):

* ``detector_backbone`` called directly with one 64x64 image;
* ``detector_classifier`` called directly with the 8 crops the glue would send it;
* ``detector``, the meta model: both stages as sub-calls plus the numpy glue
  (threshold, NMS, crops, softmax) and the meta machinery (gate, context, checks);
* the same pipeline driven by the client: ``detector_backbone``, then the very same
  numpy glue (the bundle's ``model.py``) in the client, then ``detector_classifier``:
  two gRPC round trips instead of one, the glue outside the server.

Then requests/s of ``detector`` with 8 clients in flight (meta_concurrency 2).

    python benchmarks/bench_meta.py                 # about half a minute on a laptop
    python benchmarks/bench_meta.py --requests 500
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import trio
import tritonclient.grpc as grpcclient

from reactantserver.config import EndpointsConfig, SchedulerConfig, ServerConfig
from reactantserver.transport import guest
from reactantserver.worker import WorkerAddress, serve

ROOT = Path(__file__).resolve().parent.parent
DETECTOR = ROOT / "examples" / "detector"


def _build(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("detector_build", DETECTOR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["detector_build"] = module
    spec.loader.exec_module(module)
    module.build(out)


def _glue() -> Any:
    """The detector bundle's model.py (plain numpy)."""
    path = DETECTOR / "detector" / "model.py"
    spec = importlib.util.spec_from_file_location("detector_glue", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _worker(repo: Path, cache: Path) -> Iterator[WorkerAddress]:
    config = ServerConfig(
        model_dirs=(str(repo),),
        cache_dir=str(cache),
        model_control_mode="static",
        scheduler=SchedulerConfig(meta_concurrency=2),
        endpoints=EndpointsConfig(port=0, metrics_port=0),
    )
    box: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        box["stop"] = trio.Event()
        box["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            box["address"] = await nursery.start(
                lambda task_status: serve(config, stop=box["stop"], task_status=task_status)
            )
            started.set()

    # Trio as the guest of an asyncio loop, as ``reactantserver serve`` runs the worker.
    thread = threading.Thread(target=guest.run, args=(main,), daemon=True)
    thread.start()
    started.wait(300)
    address: WorkerAddress = box["address"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
    while not client.is_model_ready("detector"):
        time.sleep(0.05)
    client.close()
    try:
        yield address
    finally:
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(60)


def _input(name: str, arr: np.ndarray) -> grpcclient.InferInput:
    ii = grpcclient.InferInput(name, list(arr.shape), "FP32")
    ii.set_data_from_numpy(arr)
    return ii


def _latencies(call: Callable[[], Any], n: int) -> list[float]:
    for _ in range(max(5, n // 10)):
        call()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return sorted(out)


def _pct(values: Sequence[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="timed requests per row")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        _build(repo)
        with _worker(repo, Path(tmp) / "cache") as address:
            url = f"127.0.0.1:{address.grpc_port}"
            client = grpcclient.InferenceServerClient(url)
            image = np.random.default_rng(0).random((64, 64, 3), dtype=np.float32)
            threshold = np.array([0.0], np.float32)  # always 8 detections: 8 crops
            crops = np.random.default_rng(1).random((8, 16, 16, 3), dtype=np.float32)
            meta_inputs = [_input("image", image), _input("score_threshold", threshold)]
            glue = _glue()

            def client_side() -> Any:
                out = client.infer("detector_backbone", [_input("images", image[None])])
                boxes, scores = out.as_numpy("boxes")[0], out.as_numpy("scores")[0]
                keep = glue.select(boxes, scores, float(threshold[0]))
                kept = glue.crop(image, boxes[keep])
                logits = client.infer("detector_classifier", [_input("crops", kept)])
                return glue.softmax(logits.as_numpy("logits"))

            rows = {
                "detector_backbone (direct, 1 image)": lambda: client.infer(
                    "detector_backbone", [_input("images", image[None])]
                ),
                "detector_classifier (direct, 8 crops)": lambda: client.infer(
                    "detector_classifier", [_input("crops", crops)]
                ),
                "detector (meta: both stages + glue)": lambda: client.infer(
                    "detector", meta_inputs
                ),
                "same pipeline, glue in the client": client_side,
            }
            results = {name: _latencies(call, args.requests) for name, call in rows.items()}
            print(f"{'request':<40} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
            for name, lat in results.items():
                print(
                    f"{name:<40} {_pct(lat, 0.5) * 1e3:>8.2f} {_pct(lat, 0.99) * 1e3:>8.2f} "
                    f"{statistics.fmean(lat) * 1e3:>8.2f}"
                )

            def worker(_: int) -> int:
                c = grpcclient.InferenceServerClient(url)
                done = 0
                give_up = time.perf_counter() + 3.0
                while time.perf_counter() < give_up:
                    c.infer("detector", meta_inputs)
                    done += 1
                c.close()
                return done

            start = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                total = sum(pool.map(worker, range(8)))
            seconds = time.perf_counter() - start
            print(f"{'detector, 8 clients in flight':<40} {total / seconds:>8.1f} requests/s")
            client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""End to end on the CPU JAX backend: a real worker with ``scheduler.pipeline_depth: 2``.

The zoo's models behind the on-demand weight cache at about half their weight bytes, so
models are loaded and evicted while batches are launched; clients on several threads
send every model requests in a shuffled order, and every answer must be what the runtime
computes for that input (to the last bits a different compiled batch size may change). The metrics must show that every batch went through
the pipeline (nothing inline, at depth 2 there is no inline path), no failed dispatch
and no failed load: no batch ever ran without its weights.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from conftest import ZOO_NAMES
from prometheus_client.parser import text_string_to_metric_families
from reference import client_inputs, expected_outputs
from worker_harness import running_worker, worker_config

from reactantserver.bundle import load_bundle
from reactantserver.config import RuntimeConfig, SchedulerConfig, ServerConfig
from reactantserver.worker.core import pipeline_depth


def test_pipeline_depth_defaults_to_two_on_cuda_and_one_on_the_cpu() -> None:
    unset = ServerConfig()
    assert pipeline_depth(unset, "cuda") == 2
    assert pipeline_depth(unset, "cpu") == 1
    three = ServerConfig(scheduler=SchedulerConfig(pipeline_depth=3))
    assert pipeline_depth(three, "cpu") == pipeline_depth(three, "cuda") == 3


def _samples(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("place", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.mark.slow
def test_a_worker_at_pipeline_depth_two_answers_exactly(
    zoo_repo: Path, zoo_models: dict[str, Any], zoo_runtime: Any, tmp_path: Path
) -> None:
    sizes = {n: load_bundle(zoo_repo / n).weights_nbytes for n in ZOO_NAMES}
    budget = max(max(sizes.values()), sum(sizes.values()) // 2)
    config = worker_config(
        zoo_repo,
        include=ZOO_NAMES,
        cache_dir=tmp_path / "jaxcache",
        scheduler=SchedulerConfig(pipeline_depth=2),
        max_concurrent_requests=0,
    )
    config = attrs.evolve(
        config, runtime=RuntimeConfig(backend="cpu", arena_bytes=math.ceil(budget / 0.9))
    )
    plan = [name for name in ZOO_NAMES for _ in range(12)]
    random.Random(5).shuffle(plan)
    with running_worker(config) as address:

        def call(job: tuple[int, str]) -> None:
            i, name = job
            bundle = load_bundle(zoo_repo / name)
            inputs = client_inputs(bundle, 1 + i % 3, np.random.default_rng(i))
            infer = []
            for spec in bundle.client_inputs:
                ii = grpcclient.InferInput(spec.name, list(inputs[spec.name].shape), spec.datatype)
                ii.set_data_from_numpy(inputs[spec.name])
                infer.append(ii)
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
            try:
                result = client.infer(name, infer)
            finally:
                client.close()
            program, _ = zoo_models[name]
            for out_name, want in expected_outputs(bundle, program, zoo_runtime, inputs).items():
                # Coalesced with others, a request may run at a larger compiled size than
                # the reference's: the same model, a different program, a last-bit change.
                np.testing.assert_allclose(result.as_numpy(out_name), want, rtol=1e-5, atol=1e-5)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(call, enumerate(plan)))
        assert address.metrics_port is not None
        samples = _samples(address.metrics_port)
    assert samples[("worker_dispatches_by_place_total", "inline")] == 0
    assert samples[("worker_dispatches_by_place_total", "device_thread")] >= 1
    failed = {k: v for k, v in samples.items() if "fail" in k[0] and v}
    assert not failed, failed
    # The cache really churned while batches were in flight.
    assert samples[("worker_weight_evicts_total", "")] > 0


@pytest.mark.slow
def test_reloads_under_load_at_depth_two_answer_every_request(
    zoo_repo: Path,
    zoo_models: dict[str, Any],
    zoo_runtime: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RepositoryModelLoad of a serving model whose weights changed swaps in a new version
    while batches of the old one are launched: the old version drains (its launched
    batches count: their requests are answered on it) and only then is freed. Clients
    running through three swaps between two sets of weights (``mlp`` and its variant
    ``mlp_v000``, one artifact) each get an answer that is one version's, exactly, and
    nothing fails."""
    repo = tmp_path / "repo"
    for name in ("mlp", "resnet"):
        shutil.copytree(zoo_repo / name, repo / name)
    versions = [load_bundle(zoo_repo / "mlp"), load_bundle(zoo_repo / "mlp_v000")]
    assert versions[0].read_artifact() == versions[1].read_artifact()
    config = worker_config(
        repo,
        include=("mlp", "resnet"),
        cache_dir=tmp_path / "jaxcache",
        scheduler=SchedulerConfig(pipeline_depth=2),
        mode="explicit",
        max_concurrent_requests=0,
    )
    caplog.set_level(logging.INFO, logger="reactantserver")
    with running_worker(config) as address:
        stop = threading.Event()
        errors: list[BaseException] = []
        answered = [0]

        def check(name: str, inputs: dict[str, np.ndarray], result: Any) -> None:
            program, _ = zoo_models[name]
            candidates = versions if name == "mlp" else [load_bundle(zoo_repo / name)]
            for bundle in candidates:
                want = expected_outputs(bundle, program, zoo_runtime, inputs)
                if all(
                    np.allclose(result.as_numpy(k), v, rtol=1e-5, atol=1e-5)
                    for k, v in want.items()
                ):
                    return
            raise AssertionError(f"{name}: the answer is no version's")

        def client(seed: int) -> None:
            c = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
            rng = np.random.default_rng(seed)
            try:
                while not stop.is_set():
                    name = ("mlp", "resnet")[int(rng.integers(2))]
                    bundle = load_bundle(zoo_repo / name)
                    inputs = client_inputs(bundle, 1, rng)
                    infer = []
                    for spec in bundle.client_inputs:
                        arr = inputs[spec.name]
                        ii = grpcclient.InferInput(spec.name, list(arr.shape), spec.datatype)
                        ii.set_data_from_numpy(arr)
                        infer.append(ii)
                    check(name, inputs, c.infer(name, infer))
                    answered[0] += 1
            except BaseException as exc:
                errors.append(exc)
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        control = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")

        def some_answered() -> None:
            """Until the clients got another 8 answers (or one failed)."""
            target = answered[0] + 8
            wait_until(lambda: bool(errors) or answered[0] >= target, what=lambda: answered)

        try:
            for i in range(3):
                some_answered()  # by the version serving now
                weights = versions[(i + 1) % 2].path / "weights.safetensors"
                shutil.copyfile(weights, repo / "mlp" / "weights.safetensors")
                control.load_model("mlp")  # returns once the new version serves
            some_answered()  # by the last version
        finally:
            stop.set()
            for t in threads:
                t.join(60)
            control.close()
        assert address.metrics_port is not None
        samples = _samples(address.metrics_port)
    assert not errors, errors[:3]
    assert answered[0] > 20
    retired = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert len(retired) == 3, retired  # three old versions of mlp drained and freed
    failed = {k: v for k, v in samples.items() if "fail" in k[0] and v}
    assert not failed, failed

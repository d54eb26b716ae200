"""On a GPU: the zoo and a catalog served with ``runtime.backend: cuda`` (issue 20).

Every test starts a real worker process on the GPU (``benchmarks/gpu/harness.py``:
``python -m reactantserver.cli serve node.yaml``, ``allow_cpu_fallback: false``) and
talks to it as a client does, over gRPC with ``reactantserver.client`` and over
``/metrics``. The reference answers are computed in this process, on the CPU, by the
same compiled programs with each model's own weights (``reference.py``).

Tolerance. XLA runs float32 matrix products and convolutions on a GPU's tensor cores in
TF32 by default (10 mantissa bits in the products, float32 sums), where the CPU computes
in float32: expect relative errors near 1e-3 after a few layers. An answer passes when
``|got - want| / |want| <= 1e-2`` over the whole output (norms) and every element is
within ``2e-2 * max|want|``; integer outputs must be equal, except an argmax label
whose two best CPU scores are within that tolerance of each other.

Skipped where no GPU is visible (``gpu_support.py``). ``REACTANT_GPU_DRY_RUN=1`` runs
them on the CPU backend instead, to check the tests themselves.
"""

from __future__ import annotations

import math
import random
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from conftest import ZOO_NAMES, load_build_repo
from gpu_support import BACKEND, huge_bundle, require_gpu
from harness import WorkerProcess, gpu_memory, running_worker
from reference import client_inputs, expected_outputs

from reactantserver.bundle import load_bundle
from reactantserver.client import Client, RetryPolicy

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: Relative error (norms) and per-element error (fraction of the largest |want|).
REL_NORM = 1e-2
REL_ELEMENT = 2e-2

TEMPLATES = ("mlp", "resnet", "surrogate1d", "uint8_classifier")
#: Variants planned; those at their architecture's default width are built (20).
PLANNED = 36
#: Catalog weight bytes / on-demand budget.
RATIO = 10
ROUNDS = 3


def assert_close(name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """``got`` (GPU) equals ``want`` (CPU) within the module docstring's tolerance."""
    assert set(got) == set(want), name
    for out, w in want.items():
        g = np.asarray(got[out])
        assert g.shape == w.shape and g.dtype == w.dtype, f"{name}.{out}"
        if np.issubdtype(w.dtype, np.floating):
            scale = float(np.max(np.abs(w))) or 1.0
            rel = float(np.linalg.norm(g - w) / (np.linalg.norm(w) or 1.0))
            assert rel <= REL_NORM, f"{name}.{out}: relative error {rel:.2e} > {REL_NORM}"
            worst = float(np.max(np.abs(g - w)))
            assert worst <= REL_ELEMENT * scale, f"{name}.{out}: element error {worst:.2e}"
        else:
            differ = np.flatnonzero(g.ravel() != w.ravel())
            if differ.size and "probabilities" in want:
                # argmax labels: a flip is allowed only between near-equal CPU scores.
                probs = want["probabilities"].reshape(len(w.ravel()), -1)
                top2 = np.sort(probs[differ], axis=-1)[:, -2:]
                assert np.all(top2[:, 1] - top2[:, 0] <= REL_ELEMENT), f"{name}.{out}"
            else:
                assert differ.size == 0, f"{name}.{out}: {differ.size} elements differ"


def test_the_zoo_on_cuda_answers_as_the_cpu_does(
    zoo_repo: Path, zoo_models: dict[str, Any], zoo_runtime: Any, tmp_path: Path
) -> None:
    """Every zoo model, at every compiled batch size and at a padded one, through the
    worker's defaults (``mem_fraction`` 0.9, preallocated arena, cache on)."""
    with running_worker(
        tmp_path, zoo_repo, backend=BACKEND, include=ZOO_NAMES, cache_dir=tmp_path / "jax"
    ) as worker:
        assert f"runtime started: backend {BACKEND} (" in worker.log_text()
        rng = np.random.default_rng(20)
        with Client(worker.url, timeout=120, retry=RetryPolicy(max_retries=0)) as client:
            for name in ZOO_NAMES:
                bundle = load_bundle(zoo_repo / name)
                program, _ = zoo_models[name]
                sizes = bundle.compiled_batch_sizes
                for rows in sorted({*sizes, max(1, sizes[-1] - 1)}):
                    inputs = client_inputs(bundle, rows, rng)
                    got = client.infer(name, inputs)
                    want = expected_outputs(bundle, program, zoo_runtime, inputs)
                    assert_close(f"{name} rows={rows}", got, want)
        m = worker.metrics()
    assert m["worker_dispatch_failures_total"] == 0
    if BACKEND == "cuda":  # the device allocator's statistics are published
        assert m["worker_device_memory_limit_bytes"] > 0
        assert m["worker_device_memory_peak_in_use_bytes"] > 0


# ------------------------------------------------------------------ a catalog on a GPU


@attrs.frozen
class Catalog:
    repo: Path
    arch: dict[str, str]
    nbytes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.nbytes.values())


@pytest.fixture(scope="module")
def catalog(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """The four zoo templates and 20 seeded variants of them (no new export)."""
    build_repo = load_build_repo()
    out = tmp_path_factory.mktemp("gpu_catalog") / "repo"
    out.mkdir()
    for name in TEMPLATES:
        shutil.copytree(zoo_repo / name, out / name)
    planned = [
        p
        for p in build_repo.plan(PLANNED)
        if p.arch in TEMPLATES and p.width == build_repo.ZOO[p.arch].DEFAULT_WIDTH
    ]
    build_repo.build(out, catalog=PLANNED, only=[p.name for p in planned])
    nbytes = {p.name: load_bundle(out / p.name).weights_nbytes for p in planned}
    return Catalog(out, {p.name: p.arch for p in planned}, nbytes)


def budget_settings(budget: int, mem_fraction: float) -> dict[str, Any]:
    """``runtime:`` keys that make the on-demand budget at most ``budget`` bytes.

    On a GPU the arena is what the allocator reports (``mem_fraction`` of the device);
    ``weight_cache_fraction`` then cuts the budget from it: ``floor(fraction * arena)``
    while the scratch leaves more than that. The fraction is computed against
    ``mem_fraction`` of the *total* memory, an upper bound of the arena, so the budget
    can only come out smaller (the catalog ratio larger). On the CPU (dry run) the arena
    is ``runtime.arena_bytes``, 90 % of which is the budget (wiggle 0.1, no scratch).
    """
    if BACKEND == "cpu":
        return {"arena_bytes": math.ceil(budget / 0.9)}
    memory = gpu_memory()
    assert memory is not None, "nvidia-smi is needed to size the budget on a GPU"
    arena_bound = mem_fraction * memory.total_bytes
    return {
        "mem_fraction": mem_fraction,
        "preallocate": False,
        "weight_cache_fraction": budget / arena_bound,
    }


@pytest.fixture(scope="module")
def catalog_worker(
    catalog: Catalog, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    assert max(catalog.nbytes.values()) <= catalog.total // RATIO  # no oversize loads
    workdir = tmp_path_factory.mktemp("gpu_catalog_worker")
    with running_worker(
        workdir,
        catalog.repo,
        backend=BACKEND,
        cache_dir=workdir / "jax",
        runtime=budget_settings(catalog.total // RATIO, mem_fraction=0.5),
        scheduler={"compaction_interval": 40},
    ) as worker:
        yield worker


def test_a_catalog_ten_times_the_budget_is_served_correctly_under_load(
    catalog: Catalog,
    catalog_worker: WorkerProcess,
    zoo_models: dict[str, Any],
    zoo_runtime: Any,
) -> None:
    """Six client threads, every model three times in a shuffled order: each answer
    equals the CPU's for that model's own weights, while the cache loads, evicts (LRU)
    and compacts on the device."""
    m0 = catalog_worker.metrics()
    budget = int(m0["worker_weight_cache_max_bytes"])
    assert budget > 0 and catalog.total >= RATIO * budget
    calls = [name for _ in range(ROUNDS) for name in catalog.arch]
    random.Random(5).shuffle(calls)
    bundles = {name: load_bundle(catalog.repo / name) for name in catalog.arch}
    local = threading.local()
    clients: list[Client] = []

    def call(i: int, name: str) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = Client(catalog_worker.url, timeout=120)
            clients.append(client)
        data = np.random.default_rng(i)
        inputs = client_inputs(bundles[name], int(data.integers(1, 4)), data)
        return name, inputs, client.infer(name, inputs)

    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(call, range(len(calls)), calls))
    finally:
        for c in clients:
            c.close()
    for name, inputs, got in answers:
        program, _ = zoo_models[catalog.arch[name]]
        want = expected_outputs(bundles[name], program, zoo_runtime, inputs)
        assert_close(name, got, want)

    m = catalog_worker.metrics()
    print("catalog on", BACKEND, {k: v for k, v in sorted(m.items()) if "weight" in k})
    assert m["worker_weight_cache_resident_bytes"] <= budget
    assert m["worker_weight_loads_total"] >= len(catalog.arch)  # every model was loaded
    assert m["worker_weight_evicts_total"] > 0
    assert m["worker_weight_load_failures_total"] == 0
    assert m["worker_weight_oversize_loads_total"] == 0
    assert m["worker_weight_compactions_total"] >= 1  # scheduler.compaction_interval: 40
    assert m["worker_dispatch_failures_total"] == 0  # no batch ran without its weights
    assert m["worker_models_resident"] < len(catalog.arch)


def test_compaction_returns_the_on_demand_copies_to_the_allocator(
    catalog: Catalog, catalog_worker: WorkerProcess
) -> None:
    """CompactMemory frees every on-demand device copy: the allocator's bytes in use fall
    by at least the bytes the cache had resident, and a reload brings one model back."""
    with Client(catalog_worker.url, timeout=60) as client:
        for name in list(catalog.arch)[:3]:  # make something resident
            client.infer(
                name, client_inputs(load_bundle(catalog.repo / name), 1, np.random.default_rng(0))
            )
        before = catalog_worker.metrics()
        resident = before["worker_weight_cache_resident_bytes"]
        assert resident > 0
        emptied = client.compact_memory()
        assert emptied.resident_bytes_after == 0  # nothing is pinned on this worker
        after = catalog_worker.metrics()
        first = next(iter(catalog.arch))
        reloaded = client.compact_memory([first])
        assert reloaded.reloaded_models == 1
        assert reloaded.resident_bytes_after == catalog.nbytes[first]
    assert after["worker_weight_cache_resident_bytes"] == 0
    require_gpu("the allocator's bytes in use")
    freed = before["worker_device_memory_in_use_bytes"] - after["worker_device_memory_in_use_bytes"]
    # The allocator rounds every buffer up (256 bytes at least), so it frees at least
    # the tensors' own bytes.
    assert freed >= resident, (freed, resident)


# ---------------------------------------------------------------- out of device memory


def test_out_of_memory_loading_a_model_is_a_clean_error_and_the_worker_serves_on(
    zoo_repo: Path, tmp_path: Path
) -> None:
    """A model whose weights exceed the device arena fails to load with an out-of-memory
    reason (no traceback, no INTERNAL); the other models serve, and the memory the
    failed load took is back with the allocator."""
    require_gpu("a real allocator that runs out of memory")
    memory = gpu_memory()
    assert memory is not None
    arena = 512 * 2**20
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(zoo_repo / "double", repo / "double")
    huge_bundle(repo / "huge", 2 * arena)
    with running_worker(
        tmp_path,
        repo,
        backend=BACKEND,
        runtime={"mem_fraction": arena / memory.total_bytes, "preallocate": False},
    ) as worker:
        with Client(worker.url, timeout=60, retry=RetryPolicy(max_retries=0)) as client:
            index = {m.name: m for m in client.repository_index()}
            assert index["double"].state == "READY"
            assert index["huge"].state == "UNAVAILABLE"
            assert "out of memory" in index["huge"].reason, index["huge"].reason
            x = np.arange(64, dtype=np.float32).reshape(4, 16)
            np.testing.assert_array_equal(client.infer("double", {"x": x})["y"], 2 * x)
        m = worker.metrics()
        failures = {
            labels["model"]: value
            for name, labels, value in worker.samples()
            if name == "worker_model_load_failures_total"
        }
        log = worker.log_text()
    assert "Traceback" not in log
    assert failures == {"huge": 1}
    assert m["worker_weight_load_failures_total"] >= 1
    # Only double's weights (and allocator rounding) remain in use.
    assert m["worker_device_memory_in_use_bytes"] < 64 * 2**20

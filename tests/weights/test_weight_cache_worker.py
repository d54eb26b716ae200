"""End to end on the CPU: a real worker serving a catalog ten times its weight budget.

The catalog is the four zoo architectures plus 20 seeded variants of them (24 bundles,
``examples/build_repo.py``'s ``--catalog`` variants that reuse the zoo's artifacts), and
``runtime.arena_bytes`` is chosen so that the on-demand budget holds a tenth of the
catalog's weight bytes. Clients on several threads send every model requests in a
shuffled order with tritonclient; every answer is compared with what the runtime
computes for the same input with that model's own weights. The metrics must then show
the churn (loads, evictions, prefetches, an interval compaction), no failed load and
no failed dispatch: no batch ever ran without its weights.
"""

from __future__ import annotations

import math
import random
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import load_build_repo
from prometheus_client.parser import text_string_to_metric_families
from reference import client_input, expected_outputs
from tritonclient.utils import InferenceServerException
from worker_harness import running_worker, worker_config

from reactantserver.bundle import load_bundle
from reactantserver.config import RuntimeConfig, SchedulerConfig
from reactantserver.protocol import reactant_control as cpb
from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

TEMPLATES = ("mlp", "resnet", "surrogate1d", "uint8_classifier")
#: Variants planned; the ones at their architecture's default width are built (20).
PLANNED = 36
#: Catalog weight bytes / on-demand budget.
RATIO = 10
ROUNDS = 3


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
    build_repo = load_build_repo()
    out = tmp_path_factory.mktemp("catalog") / "repo"
    out.mkdir()
    for name in TEMPLATES:  # kept as they are: the templates every variant derives from
        shutil.copytree(zoo_repo / name, out / name)
    planned = [
        p
        for p in build_repo.plan(PLANNED)
        if p.arch in TEMPLATES and p.width == build_repo.ZOO[p.arch].DEFAULT_WIDTH
    ]
    built = build_repo.build(out, catalog=PLANNED, only=[p.name for p in planned])
    assert {b.how for b in built} <= {"kept", "derived"}  # no new export: fast
    nbytes = {p.name: load_bundle(out / p.name).weights_nbytes for p in planned}
    return Catalog(out, {p.name: p.arch for p in planned}, nbytes)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One persistent compilation cache for the module: later workers start from hits."""
    return tmp_path_factory.mktemp("jaxcache")


@pytest.fixture(scope="module")
def served(catalog: Catalog, compile_cache: Path) -> Iterator[tuple[WorkerAddress, int]]:
    # on_demand = floor(0.9 * arena) with the default fractions and no scratch on CPU.
    budget = catalog.total // RATIO
    arena = math.ceil(budget / 0.9)
    assert max(catalog.nbytes.values()) <= budget  # every model fits: no oversize path
    config = worker_config(
        catalog.repo,
        cache_dir=compile_cache,
        scheduler=SchedulerConfig(compaction_interval=40),
        max_concurrent_requests=0,
    )
    config = attrs.evolve(config, runtime=RuntimeConfig(backend="cpu", arena_bytes=arena))
    with running_worker(config, ready_timeout=300) as address:
        yield address, math.floor(0.9 * arena)


def _expected(
    catalog: Catalog,
    zoo_models: dict[str, Any],
    zoo_runtime: Any,
    name: str,
    inputs: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The template's compiled program run directly with ``name``'s own weights."""
    program, _ = zoo_models[catalog.arch[name]]
    return expected_outputs(load_bundle(catalog.repo / name), program, zoo_runtime, inputs)


def _metrics(address: WorkerAddress) -> dict[str, float]:
    """Unlabelled-by-model samples of ``/metrics`` by name (worker/gpu labels dropped)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{address.metrics_port}/metrics").read()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if set(s.labels) <= {"worker", "gpu"}:
                out[s.name] = s.value
    return out


def _control(address: WorkerAddress, method: str, request: Any, reply: type[Any]) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{address.grpc_port}") as channel:
        call = channel.unary_unary(
            f"/reactant_control.ControlService/{method}",
            request_serializer=bytes,
            response_deserializer=lambda data: reply().parse(data),
        )
        try:
            return call(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()


def test_a_catalog_ten_times_the_budget_answers_correctly(
    catalog: Catalog,
    served: tuple[WorkerAddress, int],
    zoo_models: dict[str, Any],
    zoo_runtime: Any,
) -> None:
    address, budget = served
    assert catalog.total >= RATIO * budget > 0
    rng = random.Random(5)
    calls = [name for _ in range(ROUNDS) for name in catalog.arch]
    rng.shuffle(calls)
    bundles = {name: load_bundle(catalog.repo / name) for name in catalog.arch}
    specs = {name: b.client_inputs for name, b in bundles.items()}

    def call(i: int, name: str) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
        data = np.random.default_rng(i)
        rows = int(data.integers(1, 4))
        inputs = {s.name: client_input(s, rows, data) for s in specs[name]}
        wire = []
        for s in specs[name]:
            ii = grpcclient.InferInput(s.name, list(inputs[s.name].shape), s.datatype)
            ii.set_data_from_numpy(inputs[s.name])
            wire.append(ii)
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = grpcclient.InferenceServerClient(
                f"127.0.0.1:{address.grpc_port}"
            )
            clients.append(client)
            # A first small call completes the HTTP/2 settings exchange on the connection.
            assert client.is_server_ready()
        result = client.infer(name, wire, client_timeout=60)
        outputs = {s.name: result.as_numpy(s.name) for s in bundles[name].client_outputs}
        return name, inputs, outputs

    local = threading.local()
    clients: list[grpcclient.InferenceServerClient] = []
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(call, range(len(calls)), calls))
    finally:
        for c in clients:
            c.close()

    for name, inputs, got in answers:
        want = _expected(catalog, zoo_models, zoo_runtime, name, inputs)
        assert set(got) == set(want), name
        for out_name, expected in want.items():
            # Concurrent requests may be coalesced into a larger compiled size: tolerance.
            np.testing.assert_allclose(got[out_name], expected, rtol=1e-5, atol=1e-6)

    m = _metrics(address)
    assert m["worker_weight_cache_max_bytes"] == budget
    assert m["worker_weight_cache_resident_bytes"] <= budget
    assert m["worker_weight_loads_total"] >= len(catalog.arch)  # every model was loaded
    assert m["worker_weight_evicts_total"] > 0
    assert m["worker_weight_load_failures_total"] == 0
    assert m["worker_weight_oversize_loads_total"] == 0
    assert m["worker_weight_compactions_total"] >= 1  # compaction_interval: 40
    assert m["worker_weight_cache_misses_total"] > 0 and m["worker_weight_load_seconds_total"] > 0
    assert m["worker_dispatch_failures_total"] == 0  # no batch ran without its weights
    assert m["worker_models_loaded"] == len(catalog.arch)
    assert m["worker_models_resident"] < len(catalog.arch)
    print(
        "catalog e2e:",
        {k: v for k, v in sorted(m.items()) if k.startswith("worker_weight")},
    )


def test_control_rpcs_drive_the_cache(catalog: Catalog, served: tuple[WorkerAddress, int]) -> None:
    address, budget = served
    status = _control(
        address,
        "ModelControlStatus",
        cpb.ModelControlStatusRequest(),
        cpb.ModelControlStatusResponse,
    )
    assert status.residency_mode == "self_managed"
    assert status.weight_cache_max_bytes == budget
    by_name = {m.name: m for m in status.models}
    assert set(by_name) == set(catalog.arch)
    system = int(cpb.Residency.PINNED_SYSTEM)
    for name, m in by_name.items():
        assert int(m.residency) == system and m.host_resident, name
        assert m.weight_nbytes == catalog.nbytes[name]
    resident = {n for n, m in by_name.items() if m.device_resident}
    assert sum(catalog.nbytes[n] for n in resident) <= budget

    reply = _control(
        address,
        "CompactMemory",
        cpb.CompactMemoryRequest(reload_models=["mlp_v000", "surrogate1d_v001"]),
        cpb.CompactMemoryResponse,
    )
    assert reply.reloaded_models == 2
    assert (
        reply.resident_bytes_after
        == catalog.nbytes["mlp_v000"] + catalog.nbytes["surrogate1d_v001"]
    )
    after = _control(
        address,
        "ModelControlStatus",
        cpb.ModelControlStatusRequest(),
        cpb.ModelControlStatusResponse,
    )
    assert {m.name for m in after.models if m.device_resident} == {"mlp_v000", "surrogate1d_v001"}
    # Residency is the control plane's only in explicit mode.
    refused = _control(
        address,
        "SetModelResidency",
        cpb.SetModelResidencyRequest(name="mlp_v000", target=cpb.Residency.PINNED_DEVICE),
        cpb.SetModelResidencyResponse,
    )
    assert refused[0] == "FAILED_PRECONDITION"


def _infer(client: grpcclient.InferenceServerClient, bundle: Any, rows: int = 2) -> Any:
    rng = np.random.default_rng(0)
    wire = []
    for s in bundle.client_inputs:
        arr = client_input(s, rows, rng)
        ii = grpcclient.InferInput(s.name, list(arr.shape), s.datatype)
        ii.set_data_from_numpy(arr)
        wire.append(ii)
    return client.infer(bundle.name, wire, client_timeout=60)


def test_explicit_mode_serves_only_what_the_control_plane_pins(
    catalog: Catalog, compile_cache: Path
) -> None:
    names = ("mlp_v000", "surrogate1d_v001", "resnet_v002")
    config = worker_config(catalog.repo, include=names, cache_dir=compile_cache, mode="explicit")
    budget = 40_000
    config = attrs.evolve(
        config, runtime=RuntimeConfig(backend="cpu", arena_bytes=math.ceil(budget / 0.9))
    )
    with running_worker(config, ready_timeout=300) as address:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
        try:
            assert client.is_server_ready()
            mlp = load_bundle(catalog.repo / "mlp_v000")
            # Warmed up at load on a transient copy, then freed: not on the device, so
            # not ready, and a request says what the control plane has to do.
            assert not client.is_model_ready("mlp_v000")
            with pytest.raises(
                InferenceServerException, match=r"UNAVAILABLE.*not ready.*SetModelResidency"
            ):
                _infer(client, mlp)

            def set_residency(name: str, target: cpb.Residency) -> Any:
                return _control(
                    address,
                    "SetModelResidency",
                    cpb.SetModelResidencyRequest(name=name, target=target),
                    cpb.SetModelResidencyResponse,
                )

            def status() -> dict[str, Any]:
                reply = _control(
                    address,
                    "ModelControlStatus",
                    cpb.ModelControlStatusRequest(),
                    cpb.ModelControlStatusResponse,
                )
                assert reply.residency_mode == "externally_managed"
                return {m.name: m for m in reply.models}

            assert not any(m.device_resident for m in status().values())
            reply = set_residency("mlp_v000", cpb.Residency.PINNED_DEVICE)
            assert reply.residency == cpb.Residency.PINNED_DEVICE
            after = status()
            assert after["mlp_v000"].device_resident and not after["mlp_v000"].host_resident
            assert client.is_model_ready("mlp_v000")
            assert _infer(client, mlp).as_numpy("logits").shape == (2, 10)
            m = _metrics(address)
            assert m["worker_weight_cache_pinned_bytes"] == catalog.nbytes["mlp_v000"]
            # Compaction never frees a pinned model.
            compacted = _control(
                address, "CompactMemory", cpb.CompactMemoryRequest(), cpb.CompactMemoryResponse
            )
            assert compacted.resident_bytes_after == catalog.nbytes["mlp_v000"]
            # Back to system: the host copy is read again, the device copy freed.
            reply = set_residency("mlp_v000", cpb.Residency.PINNED_SYSTEM)
            assert reply.residency == cpb.Residency.PINNED_SYSTEM
            after = status()
            assert not after["mlp_v000"].device_resident and after["mlp_v000"].host_resident
            assert set_residency("mlp_v000", cpb.Residency.UNSPECIFIED)[0] == "INVALID_ARGUMENT"
            assert set_residency("nope", cpb.Residency.PINNED_DEVICE)[0] == "NOT_FOUND"
        finally:
            client.close()

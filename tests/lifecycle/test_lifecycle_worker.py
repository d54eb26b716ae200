"""Model lifecycle end to end: a real worker whose repository changes under load.

Each test copies the zoo bundles it needs into its own repository, starts a real
worker on it (JAX compile on CPU, the scheduler, gRPC on loopback) and changes files
the way an operator would. Answers are checked against a numpy forward pass of the
weights on disk, so "the new version answers" means the numbers changed to the new
weights', not merely that something answered. A module-scoped persistent compilation
cache makes every start after the first a cache hit.

The in-process tests at the end drive ``Worker`` directly inside the test's Trio run,
so they can look at the queue at the moment an unload or a swap begins. The last ones
run the worker's model management on virtual time (``autojump_clock``) with every
blocking step inline (``conftest.inline``), so "not yet" and "never" are exact: a change
is not acted on after one poll, a failed version is not retried however many polls
pass, and without a watcher nothing on disk is ever picked up.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import grpc
import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as grpcclient
from clocks import trio_wait_until, wait_until
from conftest import inline
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException
from worker_harness import running_worker, worker_config

from reactantserver.bundle import load_bundle, write_weights
from reactantserver.config import SchedulerConfig, ServerConfig
from reactantserver.errors import NotFound
from reactantserver.lifecycle import ModelState
from reactantserver.protocol import reactant_control as cpb
from reactantserver.records import Answer
from reactantserver.worker import Worker, WorkerAddress

pytestmark = pytest.mark.slow

POLL = 0.2  # model_poll_seconds of the dynamic workers here


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jaxcache")


# ----------------------------------------------------------------------------- helpers


def copy_bundles(zoo_repo: Path, dest: Path, *names: str) -> Path:
    repo = dest / "repo"
    repo.mkdir()
    for name in names:
        shutil.copytree(zoo_repo / name, repo / name)
    return repo


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path`` atomically, as docs/lifecycle.md tells operators to."""
    tmp = path.parent / f".{path.name}.tmp"  # hidden: the watcher ignores it
    tmp.write_bytes(data)
    os.replace(tmp, path)


def dynamic(config: ServerConfig) -> ServerConfig:
    return attrs.evolve(config, model_control_mode="dynamic", model_poll_seconds=POLL)


def mlp_logits(bundle_dir: Path, x: np.ndarray) -> np.ndarray:
    """The mlp zoo model in numpy, from the weights file on disk."""
    bundle = load_bundle(bundle_dir)
    w = dict(zip((s.name for s in bundle.weight_specs), bundle.read_weights(), strict=True))
    h = np.maximum(x @ w["dense1.w"] + w["dense1.b"], 0)
    h = np.maximum(h @ w["dense2.w"] + w["dense2.b"], 0)
    return np.asarray(h @ w["head.w"] + w["head.b"])


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-4))


def status_of(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def index(client: grpcclient.InferenceServerClient) -> dict[str, tuple[str, str]]:
    reply = client.get_model_repository_index(as_json=True)
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in reply.get("models", [])}


def metrics(address: WorkerAddress) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics``: (name, labels without worker/gpu) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{address.metrics_port}/metrics").read()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("worker", "gpu"))
            out[s.name, labels] = s.value
    return out


def sample(
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return scraped.get((name, frozenset(labels.items())))


def control(address: WorkerAddress, method: str, request: Any, reply: type[Any]) -> Any:
    """One ControlService call: the reply, or ``(status name, details)`` on error."""
    with grpc.insecure_channel(f"127.0.0.1:{address.grpc_port}") as channel:
        call = channel.unary_unary(
            f"/reactant_control.ControlService/{method}",
            request_serializer=bytes,
            response_deserializer=lambda data: reply().parse(data),
        )
        try:
            return call(request, timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()


def control_status(address: WorkerAddress) -> cpb.ModelControlStatusResponse:
    status = control(
        address,
        "ModelControlStatus",
        cpb.ModelControlStatusRequest(),
        cpb.ModelControlStatusResponse,
    )
    assert isinstance(status, cpb.ModelControlStatusResponse), status
    return status


class ClientLoad:
    """``n`` client threads sending one model the same request in a loop.

    Each thread records one label per answer: ``classify(outputs)`` for a success, the
    status name (and message) for an error, so a test can read each client's history.
    """

    def __init__(
        self,
        address: WorkerAddress,
        model: str,
        x: np.ndarray,
        classify: Callable[[np.ndarray], str],
        *,
        n: int = 4,
        input_name: str = "features",
        output_name: str = "logits",
    ) -> None:
        self.histories: list[list[str]] = [[] for _ in range(n)]
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._args = (f"127.0.0.1:{address.grpc_port}", model, x, classify, input_name, output_name)
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)
        ]

    def _loop(self, i: int) -> None:
        url, model, x, classify, input_name, output_name = self._args
        client = grpcclient.InferenceServerClient(url)
        ii = grpcclient.InferInput(input_name, list(x.shape), "FP32")
        ii.set_data_from_numpy(x)
        try:
            while not self._stop.is_set():
                try:
                    out = client.infer(model, [ii]).as_numpy(output_name)
                    label = classify(out)
                except InferenceServerException as exc:
                    label = status_of(exc)
                    self.messages.append(exc.message())
                self.histories[i].append(label)
        finally:
            client.close()

    def __enter__(self) -> ClientLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def answered_at_least(self, n: int, label: str | None = None) -> bool:
        return all(sum(1 for x in h if label is None or x == label) >= n for h in self.histories)

    def all_last(self, label: str, n: int = 3) -> bool:
        return all(len(h) >= n and h[-n:] == [label] * n for h in self.histories)


def runs(history: list[str]) -> list[str]:
    """The history with repeats collapsed: ``[old, old, new, new] -> [old, new]``."""
    return [x for i, x in enumerate(history) if i == 0 or history[i - 1] != x]


@contextmanager
def client_for(address: WorkerAddress) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
    try:
        yield c
    finally:
        c.close()


# ------------------------------------------------------------------- dynamic mode, end to end


def test_weights_replaced_under_load_switch_answers_with_no_failure(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reactantserver.worker")
    repo = copy_bundles(zoo_repo, tmp_path, "mlp")
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    old = mlp_logits(repo / "mlp", x)
    new = mlp_logits(zoo_repo / "mlp_v000", x)
    assert not close(old, new)

    def classify(out: np.ndarray) -> str:
        return "old" if close(out, old) else "new" if close(out, new) else "WRONG"

    config = dynamic(worker_config(repo, cache_dir=compile_cache))
    with running_worker(config) as address, client_for(address) as c:
        nbytes = load_bundle(repo / "mlp").weights_nbytes
        with ClientLoad(address, "mlp", x, classify) as load:
            wait_until(lambda: load.answered_at_least(5, "old"), what="every client got answers")
            replace_file(
                repo / "mlp" / "weights.safetensors",
                (zoo_repo / "mlp_v000" / "weights.safetensors").read_bytes(),
            )
            wait_until(lambda: load.all_last("new", 5), what="every client gets the new answers")
        for history in load.histories:
            # Zero failures, and each client switches exactly once: a request admitted
            # after the swap never meets the old version again.
            assert runs(history) == ["old", "new"], runs(history)
        assert load.messages == []
        # Only weight values changed: the compiled programs were reused, not rebuilt.
        assert "model 'mlp': only the weights changed; reusing the compiled programs" in (
            caplog.messages
        )
        assert index(c) == {"mlp": ("READY", "")}
        assert c.get_model_config("mlp").config.parameters["generation"].string_value == "2"
        # The old version is retired once drained: one copy of the weights is left.
        wait_until(
            lambda: sample(metrics(address), "worker_resident_weight_bytes") == nbytes,
            what="the old version's weights are freed",
        )
        scraped = metrics(address)
        assert sample(scraped, "worker_model_state", model="mlp", state="ready") == 1
        assert sample(scraped, "worker_model_load_failures_total", model="mlp") is None


def test_directory_removed_under_load(zoo_repo: Path, compile_cache: Path, tmp_path: Path) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "mlp", "double")
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    want = mlp_logits(repo / "mlp", x)
    mlp_bytes = load_bundle(repo / "mlp").weights_nbytes
    double_bytes = load_bundle(repo / "double").weights_nbytes

    config = dynamic(worker_config(repo, cache_dir=compile_cache))
    with running_worker(config) as address, client_for(address) as c:
        assert sample(metrics(address), "worker_resident_weight_bytes") == mlp_bytes + double_bytes
        with ClientLoad(
            address, "mlp", x, lambda out: "ok" if close(out, want) else "WRONG"
        ) as load:
            wait_until(lambda: load.answered_at_least(5, "ok"), what="every client got answers")
            shutil.rmtree(repo / "mlp")
            wait_until(lambda: load.all_last("NOT_FOUND", 3), what="requests are refused")
        for history in load.histories:
            # Answered correctly until the unload began, NOT_FOUND after: nothing else.
            assert runs(history) == ["ok", "NOT_FOUND"], runs(history)
        # Refused at admission ("being unloaded" / "not loaded"); never failed from the
        # queue (the scheduler's "was unloaded"): every admitted request was answered.
        assert load.messages
        assert all("was unloaded" not in m for m in load.messages), set(load.messages)
        assert {m.split(":")[0] for m in load.messages} <= {
            "model 'mlp' is being unloaded",
            "model 'mlp' is not loaded",
        }
        wait_until(lambda: "mlp" not in index(c), what="the index forgets the removed model")
        assert index(c) == {"double": ("READY", "")}
        assert [m.name for m in control_status(address).models] == ["double"]
        scraped = metrics(address)
        assert sample(scraped, "worker_resident_weight_bytes") == double_bytes
        assert sample(scraped, "worker_model_state", model="mlp", state="draining") is None
        assert c.is_server_ready()  # the other model keeps the worker ready


def test_corrupt_new_version_keeps_the_old_one_serving(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "mlp")
    weights = repo / "mlp" / "weights.safetensors"
    x = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)
    old = mlp_logits(repo / "mlp", x)
    new = mlp_logits(zoo_repo / "mlp_v000", x)
    good = weights.read_bytes()

    config = dynamic(worker_config(repo, cache_dir=compile_cache))
    with running_worker(config) as address, client_for(address) as c:
        inp = grpcclient.InferInput("features", [2, 32], "FP32")
        inp.set_data_from_numpy(x)

        def answer() -> np.ndarray:
            out = c.infer("mlp", [inp]).as_numpy("logits")
            assert out is not None
            return out

        replace_file(weights, good[: len(good) // 2])  # a truncated copy
        # (Not just "a reason": while the new version is read, the index says it compiles.)
        wait_until(
            lambda: index(c)["mlp"][1].startswith("serving the previous version"),
            what="the failure shows in the index",
        )
        state, reason = index(c)["mlp"]
        assert state == "READY"
        assert reason.startswith("serving the previous version; the new one failed: ")
        assert "weights.safetensors: not a readable safetensors file" in reason
        assert close(answer(), old)  # the old version still serves
        scraped = metrics(address)
        assert sample(scraped, "worker_model_load_failures_total", model="mlp") == 1
        assert sample(scraped, "worker_model_state", model="mlp", state="ready") == 1
        # Polls that see the same broken files do not retry...
        polls = sample(metrics(address), "worker_repository_polls_total") or 0
        wait_until(
            lambda: (sample(metrics(address), "worker_repository_polls_total") or 0) >= polls + 4,
            what="four more polls saw the broken files",
        )
        assert sample(metrics(address), "worker_model_load_failures_total", model="mlp") == 1
        # ...fixed files are loaded: the reason clears and the new weights answer.
        replace_file(weights, (zoo_repo / "mlp_v000" / "weights.safetensors").read_bytes())
        wait_until(lambda: close(answer(), new), what="the fixed version serves")
        assert index(c) == {"mlp": ("READY", "")}


def test_new_bundles_are_loaded_and_broken_ones_reported(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "double")
    config = dynamic(worker_config(repo, cache_dir=compile_cache))
    with running_worker(config) as address, client_for(address) as c:
        # A new model with the double artifact and a scale of 3.
        staging = tmp_path / "staging"
        shutil.copytree(repo / "double", staging)
        write_weights(staging / "weights.safetensors", [("scale", np.array([3.0], np.float32))])
        os.rename(staging, repo / "triple")
        broken = repo / "broken"
        shutil.copytree(repo / "double", broken)
        (broken / "model.jaxexport").unlink()

        wait_until(lambda: index(c).get("triple") == ("READY", ""), what="triple is loaded")
        assert c.is_model_ready("triple")
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        inp = grpcclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("triple", [inp]).as_numpy("y"), 3 * x)
        wait_until(lambda: "broken" in index(c), what="broken is reported")
        state, reason = index(c)["broken"]
        assert state == "UNAVAILABLE"
        assert reason == "model.jaxexport: file not found (manifest key 'artifact')"
        assert not c.is_model_ready("broken")
        with pytest.raises(InferenceServerException) as info:
            c.infer("broken", [inp])
        assert status_of(info.value) == "NOT_FOUND"
        assert "failed to load: model.jaxexport: file not found" in info.value.message()
        scraped = metrics(address)
        assert sample(scraped, "worker_model_state", model="broken", state="failed") == 1
        assert sample(scraped, "worker_model_load_failures_total", model="broken") == 1
        assert sample(scraped, "worker_model_state", model="triple", state="ready") == 1


# ------------------------------------------------------------------------- modes and control


@pytest.mark.parametrize("mode", ["dynamic", "static", "explicit"])
def test_control_rpcs_in_each_mode(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path, mode: str
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "double")
    config = worker_config(repo, cache_dir=compile_cache, mode=mode)
    config = attrs.evolve(config, model_poll_seconds=POLL)
    explicit = mode == "explicit"
    with running_worker(config) as address, client_for(address) as c:
        ask = partial(control, address)

        # ModelControlStatus: every mode.
        status = control_status(address)
        assert status.residency_mode == ("externally_managed" if explicit else "self_managed")
        assert status.discipline == "fair"
        assert status.weight_cache_max_bytes == 0
        (double,) = status.models
        assert (double.name, double.residency) == ("double", cpb.Residency.PINNED_DEVICE)
        assert (double.device_resident, double.host_resident) == (True, False)
        assert (double.weight_nbytes, double.weight) == (4, 1.0)
        assert (double.max_batch_size, double.batch_input_name, double.batch_axis) == (8, "x", 1)

        # SetModelPolicy: every mode; live; a non-positive weight is refused.
        policy = partial(ask, "SetModelPolicy", reply=cpb.SetModelPolicyResponse)
        assert (
            policy(cpb.SetModelPolicyRequest("double", True, 2.5)) == cpb.SetModelPolicyResponse()
        )
        assert control_status(address).models[0].weight == 2.5
        for bad in (0.0, -1.0, math.nan):
            code, details = policy(cpb.SetModelPolicyRequest("double", True, bad))
            assert code == "INVALID_ARGUMENT"
            assert "weight must be finite and > 0" in details
        assert policy(cpb.SetModelPolicyRequest("nope", True, 1.0))[0] == "NOT_FOUND"
        assert control_status(address).models[0].weight == 2.5

        # SetModelResidency: explicit mode only.
        residency = partial(ask, "SetModelResidency", reply=cpb.SetModelResidencyResponse)
        device = residency(cpb.SetModelResidencyRequest("double", cpb.Residency.PINNED_DEVICE))
        system = residency(cpb.SetModelResidencyRequest("double", cpb.Residency.PINNED_SYSTEM))
        if explicit:
            assert device == cpb.SetModelResidencyResponse(cpb.Residency.PINNED_DEVICE)
            assert system[0] == "FAILED_PRECONDITION"
            assert "on-demand weight cache is off" in system[1]
        else:
            for refused in (device, system):
                assert refused[0] == "FAILED_PRECONDITION"
                assert (
                    f"needs model_control_mode: explicit; this worker runs in {mode}"
                    in (refused[1])
                )
        unknown = residency(cpb.SetModelResidencyRequest("nope", cpb.Residency.PINNED_DEVICE))
        assert unknown[0] == "NOT_FOUND"
        unspecified = residency(cpb.SetModelResidencyRequest("double", cpb.Residency.UNSPECIFIED))
        assert unspecified[0] == "INVALID_ARGUMENT"

        # CompactMemory: every mode (cache off: frees nothing, reloads nothing).
        compact = partial(ask, "CompactMemory", reply=cpb.CompactMemoryResponse)
        assert compact(cpb.CompactMemoryRequest(["double"])) == cpb.CompactMemoryResponse(0, 4)
        assert compact(cpb.CompactMemoryRequest(["nope"]))[0] == "NOT_FOUND"

        # RepositoryModelLoad/Unload: explicit mode only.
        if explicit:
            c.unload_model("double")
            assert not c.is_model_ready("double")
            c.load_model("double")
            assert c.is_model_ready("double")
        else:
            for call in (c.load_model, c.unload_model):
                with pytest.raises(InferenceServerException) as info:
                    call("double")
                assert status_of(info.value) == "FAILED_PRECONDITION"
                assert f"needs model_control_mode: explicit; this worker runs in {mode}" in (
                    info.value.message()
                )
        # Without a watcher a change on disk is never picked up: on virtual time, below
        # (test_without_a_watcher_nothing_on_disk_is_ever_picked_up).


def test_explicit_mode_loads_what_the_control_plane_asks(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "double", "mlp")
    config = worker_config(repo, include=("double",), cache_dir=compile_cache, mode="explicit")
    with running_worker(config) as address, client_for(address) as c:
        # The startup set is models_include; the rest of the repository is listed.
        assert index(c) == {"double": ("READY", ""), "mlp": ("UNAVAILABLE", "not loaded")}
        c.load_model("mlp")
        assert index(c)["mlp"] == ("READY", "")
        generation = c.get_model_config("mlp").config.parameters["generation"].string_value
        c.load_model("mlp")  # files unchanged: nothing is recompiled
        assert c.get_model_config("mlp").config.parameters["generation"].string_value == (
            generation
        )
        # A broken new version: refused, the old one keeps serving, the index says why.
        (repo / "mlp" / "model.jaxexport").rename(repo / "mlp" / "moved.jaxexport")
        with pytest.raises(InferenceServerException) as info:
            c.load_model("mlp")
        assert status_of(info.value) == "INVALID_ARGUMENT"
        assert "model.jaxexport: file not found" in info.value.message()
        assert c.is_model_ready("mlp")
        state, reason = index(c)["mlp"]
        assert state == "READY" and "the new one failed: model.jaxexport" in reason
        c.unload_model("mlp")
        assert index(c)["mlp"] == ("UNAVAILABLE", "not loaded")
        with pytest.raises(InferenceServerException) as info:
            c.unload_model("mlp")
        assert status_of(info.value) == "NOT_FOUND"
        with pytest.raises(InferenceServerException) as info:
            c.load_model("no_such_model")
        assert status_of(info.value) == "NOT_FOUND"
        scraped = metrics(address)
        assert sample(scraped, "worker_model_state", model="mlp", state="unloaded") == 1
        assert sample(scraped, "worker_model_load_failures_total", model="mlp") == 1


# --------------------------------------------------------------------- in process: the queue


async def with_worker(config: ServerConfig, body: Callable[[Worker], Awaitable[None]]) -> None:
    """Run a real worker in this Trio run, wait for its startup load, run ``body``."""
    from reactantserver.runtime import Runtime

    worker = Worker(config, Runtime.start(config.runtime, config.cache_dir))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(worker.run, stop=stop))
        await trio_wait_until(lambda: worker.readiness()[0], 120, "the worker ready")
        try:
            await body(worker)
        finally:
            stop.set()


@pytest.mark.guest  # a whole worker, gRPC listener included, as production runs it
async def test_unload_answers_every_queued_request(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "mlp", "double")
    # Every batch on the device thread: inline batches run back to back on the dispatch
    # loop without a checkpoint, so on a fast machine all 256 requests could be answered
    # before the unload even began draining, and DRAINING would never be seen.
    config = worker_config(
        repo,
        cache_dir=compile_cache,
        mode="explicit",
        metrics=False,
        scheduler=SchedulerConfig(inline_max_seconds=0.0),
    )
    x = np.random.default_rng(3).standard_normal((256, 32)).astype(np.float32)
    want = mlp_logits(repo / "mlp", x)
    results: dict[int, np.ndarray] = {}

    async def body(worker: Worker) -> None:
        before = worker.weights.resident_bytes
        nbytes = worker.served_models()["mlp"].bundle.weights_nbytes

        # Every request begun with no checkpoint in between: all of them are queued
        # (or in the first batch) when the unload starts, however fast the device is.
        answers = [Answer(lambda: None) for _ in range(len(x))]
        for i, answer in enumerate(answers):
            worker.begin("mlp", {"features": x[i : i + 1]}, ["logits"], math.inf, answer)
        assert worker.scheduler.statistics().policy.models["mlp"].queue_depth == len(x)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.unload, "mlp")
            with trio.fail_after(60):
                while worker.model_states.state("mlp") is ModelState.READY:
                    await trio.sleep(0)
            assert worker.model_states.state("mlp") is ModelState.DRAINING
            # Draining: new requests are refused at once, the queued ones still run.
            with pytest.raises(NotFound, match="model 'mlp' is being unloaded"):
                await worker.infer("mlp", {"features": x[:1]}, ["logits"], math.inf)
        for i, answer in enumerate(answers):
            results[i] = answer.result()["logits"]
        assert worker.model_states.state("mlp") is ModelState.UNLOADED
        assert sorted(results) == list(range(len(x)))
        for i, got in results.items():
            assert close(got, want[i : i + 1]), i
        assert worker.weights.resident_bytes == before - nbytes
        assert [m.name for m in worker.control_status().models] == ["double"]
        with pytest.raises(NotFound, match="model 'mlp' is not loaded"):
            await worker.infer("mlp", {"features": x[:1]}, ["logits"], math.inf)

    await with_worker(config, body)


@pytest.mark.guest
async def test_swap_to_other_batch_sizes_under_load(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path
) -> None:
    """A new version compiled for (4, 16) replaces one compiled for (1, 8, 32) while
    requests stream in: none fails, the old version only ever runs its own sizes and
    the new one only its own (the admission gate), and requests keep being answered
    while the new version compiles."""
    repo = copy_bundles(zoo_repo, tmp_path, "mlp")
    config = worker_config(repo, cache_dir=compile_cache, mode="explicit", metrics=False)
    x = np.random.default_rng(4).standard_normal((4, 32)).astype(np.float32)
    want = mlp_logits(repo / "mlp", x)
    manifest = repo / "mlp" / "manifest.yaml"

    async def body(worker: Worker) -> None:
        old = worker.served_models()["mlp"]
        answered = {"during_load": 0, "total": 0}
        loading = swapped = False
        failures: list[BaseException] = []

        async def client(k: int) -> None:
            rows = 1 + k % 4
            after_swap = 0
            while after_swap < 20:
                try:
                    out = await worker.infer("mlp", {"features": x[:rows]}, ["logits"], math.inf)
                    assert close(out["logits"], want[:rows])
                except BaseException as exc:  # recorded; the test fails below
                    failures.append(exc)
                    return
                answered["total"] += 1
                answered["during_load"] += loading and not swapped
                after_swap += swapped

        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(client, k)
            await trio_wait_until(lambda: answered["total"] >= 8, what="the first answers")
            text = manifest.read_text()
            assert "compiled_batch_sizes: [1, 8, 32]" in text
            replace_file(manifest, text.replace("[1, 8, 32]", "[4, 16]").encode())
            loading = True
            await worker.load("mlp")
            swapped = True
        assert failures == []
        new = worker.served_models()["mlp"]
        assert new is not old and new.compiled_batch_sizes == (4, 16)
        assert answered["during_load"] > 0, "requests stalled while the new version compiled"
        assert {b.batch_size for b in old.statistics().batches} <= {1, 8, 32}
        new_sizes = {b.batch_size for b in new.statistics().batches}
        assert new_sizes and new_sizes <= {4, 16}

    await with_worker(config, body)


# ------------------------------------------------------------- in process, virtual time


@asynccontextmanager
async def virtual_worker(config: ServerConfig) -> AsyncIterator[Worker]:
    """The worker's dispatch loop, lifecycle and model management on the test's clock,
    every blocking step inline (no gRPC or admin listener: nothing here needs them)."""
    from reactantserver.runtime import Runtime

    worker = Worker(config, Runtime.start(config.runtime, config.cache_dir), thread=inline)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.scheduler.run)
        await nursery.start(worker.lifecycle.run)
        await nursery.start(worker.serving.run)
        nursery.start_soon(worker.manage_models)
        while not worker.readiness()[0]:
            await trio.sleep(POLL / 10)  # virtual-clock: its three tests run on autojump
        yield worker
        nursery.cancel_scope.cancel()


async def next_poll(worker: Worker) -> None:
    """Wait until the watcher completes one more poll (and everything it set off)."""
    polls = worker.repository.statistics().polls
    while worker.repository.statistics().polls == polls:
        await trio.sleep(POLL / 10)  # virtual-clock: its three tests run on autojump
    await trio.testing.wait_all_tasks_blocked()


async def answer(worker: Worker, model: str = "double") -> np.ndarray:
    x = np.ones((1, 16), dtype=np.float32)
    out = await worker.infer(model, {"x": x}, ["y"], math.inf)
    return np.asarray(out["y"])


async def test_the_watcher_acts_on_the_second_identical_poll_and_never_retries_a_failure(
    zoo_repo: Path, compile_cache: Path, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "double")
    weights = repo / "double" / "weights.safetensors"
    config = dynamic(worker_config(repo, cache_dir=compile_cache, metrics=False))
    async with virtual_worker(config) as worker:
        first = worker.served_models()["double"]
        write_weights(weights, [("scale", np.array([3.0], np.float32))])
        await next_poll(worker)
        # Seen once: not yet acted on (it could still be half written).
        assert worker.served_models()["double"] is first
        np.testing.assert_array_equal(await answer(worker), np.full((1, 16), 2.0))
        await next_poll(worker)
        assert worker.served_models()["double"].generation == first.generation + 1
        np.testing.assert_array_equal(await answer(worker), np.full((1, 16), 3.0))

        replace_file(weights, weights.read_bytes()[:20])  # truncated
        await next_poll(worker)
        await next_poll(worker)
        assert worker.model_states.load_failures["double"] == 1
        for _ in range(10):  # the same broken files: never tried again
            await next_poll(worker)
        assert worker.model_states.load_failures["double"] == 1
        state, reason = worker.index()[0].state, worker.index()[0].reason
        assert state == "READY" and reason.startswith("serving the previous version")
        np.testing.assert_array_equal(await answer(worker), np.full((1, 16), 3.0))


async def test_a_directory_without_a_manifest_is_one_warning_and_a_typo_gets_a_hint(
    zoo_repo: Path,
    compile_cache: Path,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A repository directory that is no bundle (no manifest.yaml) is named once, however
    many polls see it, and again only if it comes back after it was fixed; a request for
    a misspelt model is told the name it probably meant."""
    repo = copy_bundles(zoo_repo, tmp_path, "double")
    (repo / "notes").mkdir()
    config = dynamic(worker_config(repo, cache_dir=compile_cache, metrics=False))
    caplog.set_level(logging.WARNING, logger="reactantserver.worker")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "has no manifest.yaml" in r.getMessage()]

    async with virtual_worker(config) as worker:
        for _ in range(5):
            await next_poll(worker)
        assert warnings() == [
            f"repository: {repo / 'notes'} has no manifest.yaml, so it is not a bundle (add "
            "the manifest, or move the directory out of the repository)"
        ]
        (repo / "notes").rmdir()
        await next_poll(worker)
        (repo / "notes").mkdir()
        await next_poll(worker)
        assert len(warnings()) == 2
        with pytest.raises(NotFound) as typo:
            await answer(worker, "doubel")
        assert str(typo.value) == "model 'doubel' is not loaded; did you mean 'double'?"


@pytest.mark.parametrize("mode", ["static", "explicit"])
async def test_without_a_watcher_nothing_on_disk_is_ever_picked_up(
    zoo_repo: Path,
    compile_cache: Path,
    tmp_path: Path,
    mode: str,
    autojump_clock: trio.testing.MockClock,
) -> None:
    repo = copy_bundles(zoo_repo, tmp_path, "double")
    config = worker_config(repo, cache_dir=compile_cache, mode=mode, metrics=False)
    config = attrs.evolve(config, model_poll_seconds=POLL)
    async with virtual_worker(config) as worker:
        first = worker.served_models()["double"]
        write_weights(
            repo / "double" / "weights.safetensors", [("scale", np.array([3.0], np.float32))]
        )
        await trio.sleep(1000 * POLL)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.served_models()["double"] is first
        assert worker.repository.statistics().polls == 0
        np.testing.assert_array_equal(await answer(worker), np.full((1, 16), 2.0))

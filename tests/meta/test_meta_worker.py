"""Meta models end to end: a real worker, real compiled stages, tritonclient over gRPC.

The repository (built once per module) holds three copies of the zoo's ``double``
bundle (``stage_a``, ``stage_b``, ``bystander``: ``y = 2 x``, each with its own
statistics) and small meta bundles written here, each exercising one behaviour. Their
glue awaits Trio sleeps or waits in a worker thread for a file the test creates, so
nothing depends on timing: whether a sub-call ran is read from the callee's
ModelStatistics ``execution_count``.
"""

from __future__ import annotations

import logging
import shutil
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from tritonclient.utils import InferenceServerException
from worker_harness import running_worker, worker_config

from reactantserver.config import SchedulerConfig
from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

FEATURES = 16
X = {"name": "x", "datatype": "FP32", "shape": [-1, FEATURES]}
Y = {"name": "y", "datatype": "FP32", "shape": [-1, FEATURES]}
PAUSE = {"name": "pause", "datatype": "FP32", "shape": [1]}

#: name -> (calls, client_inputs, client_outputs, body of run(inputs, ctx))
METAS: dict[str, tuple[list[str], list[dict[str, Any]], list[dict[str, Any]], str]] = {
    "chain": (
        ["stage_a", "stage_b"],
        [X],
        [Y],
        """
        y = (await ctx.infer("stage_a", {"x": inputs["x"]}))["y"]
        return await ctx.infer("stage_b", {"x": y}, outputs=["y"])
        """,
    ),
    "paused": (
        ["stage_a", "stage_b"],
        [X, PAUSE],
        [Y],
        """
        y = (await ctx.infer("stage_a", {"x": inputs["x"]}))["y"]
        await trio.sleep(float(inputs["pause"][0]))
        return await ctx.infer("stage_b", {"x": y})
        """,
    ),
    "undeclared": (
        ["stage_a"],
        [X],
        [Y],
        """
        return await ctx.infer("stage_b", {"x": inputs["x"]})
        """,
    ),
    "broken": (
        ["stage_a"],
        [X],
        [Y],
        """
        await ctx.infer("stage_a", {"x": inputs["x"]})
        raise RuntimeError("the glue exploded")
        """,
    ),
    "missing_callee": (
        ["stage_a", "not_there"],
        [X],
        [Y],
        """
        return await ctx.infer("stage_a", {"x": inputs["x"]})
        """,
    ),
    # Loads before plain_meta (names load in order): refused from plain_meta's manifest.
    "calls_meta": (
        ["stage_a", "plain_meta"],
        [X],
        [Y],
        """
        return await ctx.infer("plain_meta", {"x": inputs["x"]})
        """,
    ),
    "plain_meta": (
        [],
        [X],
        [Y],
        """
        return {"y": inputs["x"] + np.float32(1)}
        """,
    ),
    "gated": (
        ["stage_a"],
        [X],
        [{"name": "peak", "datatype": "INT32", "shape": [1]}],
        """
        global RUNNING, PEAK
        RUNNING += 1
        PEAK = max(PEAK, RUNNING)
        try:
            await ctx.infer("stage_a", {"x": inputs["x"]})
            await trio.sleep(0.3)
            return {"peak": np.array([PEAK], np.int32)}
        finally:
            RUNNING -= 1
        """,
    ),
    "blocking_glue": (
        ["stage_a", "stage_b"],
        [X],
        [Y],
        """
        y = (await ctx.infer("stage_a", {"x": inputs["x"]}))["y"]
        await ctx.run_sync(wait_for_release)  # stands for heavy numpy work
        return await ctx.infer("stage_b", {"x": y})
        """,
    ),
}

MODEL_PY = """
import time
from pathlib import Path

import numpy as np
import trio

RUNNING = 0
PEAK = 0
RELEASE = Path({release!r})


def wait_for_release():
    give_up = time.monotonic() + 20
    while not RELEASE.exists() and time.monotonic() < give_up:
        time.sleep(0.01)


async def run(inputs, ctx):
{body}
"""


def _yaml(value: Any) -> str:
    """Flow-style YAML for the small manifests here (JSON is valid YAML)."""
    import json

    return json.dumps(value)


def _write_meta(repo: Path, name: str, release: Path) -> None:
    calls, inputs, outputs, body = METAS[name]
    bundle = repo / name
    bundle.mkdir()
    (bundle / "manifest.yaml").write_text(
        "format_version: 1\nkind: meta\n"
        f"calls: {_yaml(calls)}\n"
        f"client_inputs: {_yaml(inputs)}\n"
        f"client_outputs: {_yaml(outputs)}\n"
    )
    code = textwrap.indent(textwrap.dedent(body).strip(), "    ")
    (bundle / "model.py").write_text(MODEL_PY.format(release=str(release), body=code))


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Created by a test to let ``blocking_glue``'s thread go on."""
    return tmp_path_factory.mktemp("signals") / "release"


@pytest.fixture(scope="module")
def meta_repo(tmp_path_factory: pytest.TempPathFactory, zoo_repo: Path, release: Path) -> Path:
    repo = tmp_path_factory.mktemp("meta") / "repo"
    repo.mkdir()
    for name in ("stage_a", "stage_b", "bystander"):
        shutil.copytree(zoo_repo / "double", repo / name)
    for name in METAS:
        _write_meta(repo, name, release)
    return repo


@pytest.fixture(scope="module")
def served(meta_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerAddress]:
    config = worker_config(
        meta_repo,
        cache_dir=tmp_path_factory.mktemp("jaxcache"),
        metrics=False,
        scheduler=SchedulerConfig(meta_concurrency=2),
    )
    with running_worker(config) as address:
        yield address


@pytest.fixture
def client(served: WorkerAddress) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    yield c
    c.close()


def inputs(x: np.ndarray, pause: float | None = None) -> list[grpcclient.InferInput]:
    out = [grpcclient.InferInput("x", list(x.shape), "FP32")]
    out[0].set_data_from_numpy(x)
    if pause is not None:
        p = grpcclient.InferInput("pause", [1], "FP32")
        p.set_data_from_numpy(np.array([pause], np.float32))
        out.append(p)
    return out


def executions(client: grpcclient.InferenceServerClient, model: str) -> int:
    return int(client.get_inference_statistics(model).model_stats[0].execution_count)


def rows(client: grpcclient.InferenceServerClient, model: str) -> int:
    """Rows ``model`` has executed (concurrent sub-calls may share one execution)."""
    return int(client.get_inference_statistics(model).model_stats[0].inference_count)


def status(exc: InferenceServerException) -> str:
    return str(exc.status())


X_IN = np.arange(2 * FEATURES, dtype=np.float32).reshape(2, FEATURES)


# ---------------------------------------------------------------------------- surface


def test_meta_models_answer_metadata_config_and_index(
    client: grpcclient.InferenceServerClient,
) -> None:
    meta = client.get_model_metadata("chain")
    assert meta.platform == "meta"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("x", "FP32", [-1, FEATURES])
    ]
    config = client.get_model_config("chain").config
    assert config.max_batch_size == 0
    assert config.parameters["calls"].string_value == "stage_a,stage_b"
    assert client.is_model_ready("chain")

    index = {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}
    assert index["chain"] == ("READY", "")
    assert index["missing_callee"][0] == "UNAVAILABLE"
    assert "its callee 'not_there' is not loaded" in index["missing_callee"][1]
    assert index["calls_meta"][0] == "UNAVAILABLE"
    assert "calls[1]: 'plain_meta' is a kind: meta model" in index["calls_meta"][1]


def test_chain_runs_both_stages(client: grpcclient.InferenceServerClient) -> None:
    before = {m: executions(client, m) for m in ("stage_a", "stage_b", "chain")}
    got = client.infer("chain", inputs(X_IN)).as_numpy("y")
    np.testing.assert_array_equal(got, 4 * X_IN)
    after = {m: executions(client, m) for m in before}
    assert {m: after[m] - before[m] for m in before} == {"stage_a": 1, "stage_b": 1, "chain": 1}


def test_zero_rows_through_a_chain_run_no_stage(client: grpcclient.InferenceServerClient) -> None:
    """A meta request is one request, not rows: its glue runs. Each sub-call of zero rows
    is answered with zero rows at once, so no stage executes and the answer has zero
    rows (before issue 42 each stage ran its padding row and the answer had one)."""
    before = {m: executions(client, m) for m in ("stage_a", "stage_b")}
    got = client.infer("chain", inputs(np.zeros((0, FEATURES), np.float32))).as_numpy("y")
    assert got.shape == (0, FEATURES)
    assert {m: executions(client, m) for m in before} == before


def test_compute_only_meta(client: grpcclient.InferenceServerClient) -> None:
    np.testing.assert_array_equal(client.infer("plain_meta", inputs(X_IN)).as_numpy("y"), X_IN + 1)


# ---------------------------------------------------------------------------- refusals


def test_calling_an_undeclared_model_is_internal(client: grpcclient.InferenceServerClient) -> None:
    before = executions(client, "stage_b")
    with pytest.raises(InferenceServerException) as info:
        client.infer("undeclared", inputs(X_IN))
    assert status(info.value) == "StatusCode.INTERNAL"
    assert "'stage_b' is not in the manifest's calls (declared: stage_a)" in info.value.message()
    assert executions(client, "stage_b") == before


def test_a_missing_callee_makes_the_meta_not_ready(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert not client.is_model_ready("missing_callee")
    with pytest.raises(InferenceServerException) as info:
        client.infer("missing_callee", inputs(X_IN))
    assert status(info.value) == "StatusCode.UNAVAILABLE"
    assert "its callee 'not_there' is not loaded" in info.value.message()


def test_a_meta_calling_a_meta_is_refused_at_load(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert not client.is_model_ready("calls_meta")
    with pytest.raises(InferenceServerException) as info:
        client.infer("calls_meta", inputs(X_IN))
    assert status(info.value) == "StatusCode.NOT_FOUND"
    assert "failed to load" in info.value.message()
    assert "meta model may call compiled models only" in info.value.message()


# ---------------------------------------------------------------------------- failures


def test_an_exception_in_run_is_internal_and_harms_nothing_else(
    client: grpcclient.InferenceServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="reactantserver.meta"):
        for _ in range(2):
            with pytest.raises(InferenceServerException) as info:
                client.infer("broken", inputs(X_IN))
            assert status(info.value) == "StatusCode.INTERNAL"
            assert "model 'broken': model.py run raised RuntimeError" in info.value.message()
    logged = [r for r in caplog.records if "'broken'" in r.getMessage()]
    assert len(logged) == 2
    assert all(r.exc_info is not None and r.exc_info[0] is RuntimeError for r in logged)
    assert client.is_model_ready("broken")
    np.testing.assert_array_equal(client.infer("chain", inputs(X_IN)).as_numpy("y"), 4 * X_IN)


def test_deadline_expiry_mid_pipeline_stops_before_the_next_stage(
    client: grpcclient.InferenceServerClient,
) -> None:
    a, b = executions(client, "stage_a"), executions(client, "stage_b")
    with pytest.raises(InferenceServerException) as info:
        client.infer("paused", inputs(X_IN, pause=30.0), client_timeout=1.0)
    assert status(info.value) == "StatusCode.DEADLINE_EXCEEDED"
    time.sleep(0.2)  # real-clock: an absence (stage_b never runs) has no event to wait for
    assert executions(client, "stage_a") == a + 1
    assert executions(client, "stage_b") == b


def test_client_cancel_mid_pipeline_runs_no_further_sub_call(
    client: grpcclient.InferenceServerClient,
) -> None:
    a, b = rows(client, "stage_a"), rows(client, "stage_b")
    answers: list[Any] = []
    # As many paused requests as there are meta slots: if cancelling did not end them,
    # they would hold every slot for 30 s and the request after them could not run.
    calls = [
        client.async_infer(
            "paused", inputs(X_IN, pause=30.0), lambda result, error: answers.append(error)
        )
        for _ in range(2)
    ]
    wait_until(lambda: rows(client, "stage_a") == a + 2 * len(X_IN))  # both are paused
    for call in calls:
        call.cancel()
    wait_until(lambda: len(answers) == 2)
    assert all(status(e) == "StatusCode.CANCELLED" for e in answers)
    got = client.infer("chain", inputs(X_IN), client_timeout=10.0).as_numpy("y")
    np.testing.assert_array_equal(got, 4 * X_IN)
    assert rows(client, "stage_b") == b + len(X_IN)  # chain's sub-call only: no paused one


# ---------------------------------------------------------------------------- concurrency


def test_meta_concurrency_bounds_running_meta_requests(served: WorkerAddress) -> None:
    def one(_: int) -> int:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
        try:
            return int(c.infer("gated", inputs(X_IN), client_timeout=30.0).as_numpy("peak")[0])
        finally:
            c.close()

    with ThreadPoolExecutor(6) as pool:
        peaks = list(pool.map(one, range(6)))
    # Six requests at once, each holding its slot 0.3 s: never more than two at a time.
    assert max(peaks) == 2


def test_other_models_are_served_while_the_glue_runs(
    client: grpcclient.InferenceServerClient, release: Path
) -> None:
    release.unlink(missing_ok=True)
    a = executions(client, "stage_a")
    done = threading.Event()
    answer: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        answer.append(error if error is not None else result.as_numpy("y"))
        done.set()

    client.async_infer("blocking_glue", inputs(X_IN), callback)
    wait_until(lambda: executions(client, "stage_a") == a + 1)
    # The glue is now blocked in its thread; the device and the loop serve others.
    np.testing.assert_array_equal(client.infer("bystander", inputs(X_IN)).as_numpy("y"), 2 * X_IN)
    np.testing.assert_array_equal(client.infer("plain_meta", inputs(X_IN)).as_numpy("y"), X_IN + 1)
    assert not done.is_set()
    release.touch()
    assert done.wait(20)
    np.testing.assert_array_equal(answer[0], 4 * X_IN)


# ---------------------------------------------------------------------------- control plane


def _control(served: WorkerAddress, call: Callable[[Any], Any]) -> Any:
    """Run ``call(ControlServiceStub)`` over a grpclib channel (asyncio, this thread)."""
    import asyncio

    from grpclib.client import Channel

    from reactantserver.protocol import reactant_control as cpb

    async def main() -> Any:
        channel = Channel("127.0.0.1", served.grpc_port)
        try:
            return await call(cpb.ControlServiceStub(channel))
        finally:
            channel.close()

    return asyncio.run(main())


def test_control_status_lists_a_meta_model_as_one_unit(
    served: WorkerAddress, client: grpcclient.InferenceServerClient
) -> None:
    from reactantserver.protocol import reactant_control as cpb

    client.infer("chain", inputs(X_IN))
    status = _control(
        served, lambda stub: stub.model_control_status(cpb.ModelControlStatusRequest())
    )
    models = {m.name: m for m in status.models}
    # Callees of loaded meta models are listed through them, not on their own.
    assert "stage_a" not in models and "stage_b" not in models
    assert "bystander" in models
    double_bytes = models["bystander"].weight_nbytes
    chain = models["chain"]
    assert chain.weight_nbytes == 2 * double_bytes
    assert chain.requests_served >= 1 and chain.rows_served == chain.requests_served
    assert chain.dispatch_count >= 2 * chain.requests_served  # two sub-calls per request
    assert (chain.max_batch_size, chain.batch_axis, chain.batch_input_name) == (0, 0, "")
    assert models["plain_meta"].weight_nbytes == 0

    # Control RPCs naming a meta model act on the models it calls.
    _control(
        served,
        lambda stub: stub.set_model_policy(
            cpb.SetModelPolicyRequest(name="chain", has_weight=True, weight=3.0)
        ),
    )
    status = _control(
        served, lambda stub: stub.model_control_status(cpb.ModelControlStatusRequest())
    )
    assert {m.name: m.weight for m in status.models}["chain"] == 3.0
    compacted = _control(
        served, lambda stub: stub.compact_memory(cpb.CompactMemoryRequest(reload_models=["chain"]))
    )
    assert compacted.reloaded_models == 0  # the weight cache is off: nothing to reload

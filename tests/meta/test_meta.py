"""Meta models, JAX-free: the context, the gate and the runner over a fake host.

The runner is driven exactly as the worker drives it (``MetaRunner.run`` on the
request's task); the host's model path is a fake that records every sub-call, or, for
the scheduling properties, the real ``Scheduler`` with a simulated device. Time is
virtual (``autojump_clock``), so every timing below is exact.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import trio.testing

from reactantserver.bundle import Bundle, TensorSpec, manifest_from_data
from reactantserver.config import SchedulerConfig
from reactantserver.errors import (
    DeadlineExceeded,
    ExecutionFailed,
    InvalidArgument,
    NotFound,
    QueueFull,
    Unavailable,
)
from reactantserver.hooks import Hooks
from reactantserver.meta import MetaModel, MetaRunner, declared_kind
from reactantserver.scheduling import Batch, Scheduler
from reactantserver.scheduling.simulate import SimulatedExecutor

X = TensorSpec("x", "FP32", (-1, 4))
Y = TensorSpec("y", "FP32", (-1, 4))


@attrs.define
class Stage:
    """A compiled model as the meta context sees it (a ``HostedModel`` subset)."""

    name: str
    inputs: Sequence[TensorSpec] = (X,)
    outputs: Sequence[TensorSpec] = (Y, TensorSpec("z", "FP32", (-1, 4)))
    up: bool = True

    def ready(self) -> tuple[bool, str]:
        return self.up, "" if self.up else "warming up"


@attrs.frozen
class SubCall:
    model: str
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[str, ...]
    deadline: float
    committed: bool
    at: float


class FakeHost:
    """Answers sub-calls with ``y = 2 x``, ``z = 3 x`` after ``delay`` seconds."""

    def __init__(self, models: Mapping[str, Any], *, delay: float = 1.0) -> None:
        self.models = dict(models)
        self.delay = delay
        self.calls: list[SubCall] = []
        self.finished: list[str] = []
        self.errors: dict[str, Exception] = {}
        self.in_flight = 0
        self.max_in_flight = 0

    def get(self, name: str) -> Any:
        if name not in self.models:
            raise NotFound(f"model {name!r} is not loaded")
        return self.models[name]

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        self.calls.append(
            SubCall(model, dict(inputs), tuple(outputs), deadline, committed, trio.current_time())
        )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(self.delay)  # virtual-clock: every test of it runs on autojump
        finally:
            self.in_flight -= 1
        if model in self.errors:
            raise self.errors[model]
        self.finished.append(model)
        x = inputs["x"]
        return {"y": 2 * x, "z": 3 * x}


def meta_model(
    name: str,
    run: Callable[..., Any],
    *,
    calls: Sequence[str] = ("stage",),
    outputs: Sequence[dict[str, Any]] = ({"name": "out", "datatype": "FP32", "shape": [-1, 4]},),
    problem: Callable[[str], str | None] = lambda callee: None,
) -> MetaModel:
    manifest = manifest_from_data(
        name,
        {
            "format_version": 1,
            "kind": "meta",
            "calls": list(calls),
            "client_inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "client_outputs": list(outputs),
        },
        has_model_py=True,
    )
    hooks = Hooks(
        path=Path("model.py"), preprocess=None, postprocess=None, run=run, module_name=name
    )
    bundle = Bundle(
        name=name, path=Path(name), manifest=manifest, weight_specs=(), hooks=hooks, signature=()
    )
    return MetaModel(bundle, generation=1, callee_problem=problem)


def ones(rows: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.ones((rows, 4), np.float32)}


async def chain(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
    y = (await ctx.infer("stage", {"x": inputs["x"]}))["y"]
    return {"out": y + 1}


# ---------------------------------------------------------------------------- the model


def test_meta_model_presents_its_client_tensors_and_no_batching() -> None:
    meta = meta_model("pipe", chain, calls=("a", "b"))
    assert meta.name == "pipe"
    assert meta.platform == "meta"
    assert [t.name for t in meta.inputs] == ["x"]
    assert [t.name for t in meta.outputs] == ["out"]
    assert (meta.max_batch_size, tuple(meta.compiled_batch_sizes)) == (0, ())
    assert meta.parameters["calls"] == "a,b"
    assert meta.statistics().execution_count == 0


def test_readiness_names_the_first_callee_that_cannot_be_called() -> None:
    loaded = {"a"}

    def problem(callee: str) -> str | None:
        return None if callee in loaded else f"its callee {callee!r} is not loaded"

    meta = meta_model("pipe", chain, calls=("a", "b"), problem=problem)
    assert meta.ready() == (False, "its callee 'b' is not loaded")
    loaded.add("b")  # computed when asked: no bookkeeping when models come and go
    assert meta.ready() == (True, "")


def test_declared_kind_reads_only_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.yaml").write_text("format_version: 1\nkind: meta\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "manifest.yaml").write_text("format_version: 1\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.yaml").write_text("kind: [\n")
    assert declared_kind(tmp_path / "m") == "meta"
    assert declared_kind(tmp_path / "c") == "model"
    assert declared_kind(tmp_path / "bad") is None
    assert declared_kind(tmp_path / "missing") is None


# ---------------------------------------------------------------------------- sub-calls


async def test_sub_call_is_committed_and_inherits_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = FakeHost({"stage": Stage("stage")})
    runner = MetaRunner(host, concurrency=2)
    deadline = trio.current_time() + 10.0
    out = await runner.run(meta_model("pipe", chain), ones(), deadline)
    np.testing.assert_array_equal(out["out"], np.full((2, 4), 3, np.float32))
    (call,) = host.calls
    assert call.model == "stage"
    assert call.committed is True
    assert call.deadline == deadline
    assert call.outputs == ("y", "z")


async def test_outputs_select_and_order_the_callee_outputs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[list[str]] = []

    async def run(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        got = await ctx.infer("stage", inputs, outputs=["z"])
        seen.append(list(got))
        return {"out": got["z"]}

    host = FakeHost({"stage": Stage("stage")})
    out = await MetaRunner(host, concurrency=1).run(meta_model("pipe", run), ones())
    assert seen == [["z"]]
    assert host.calls[0].outputs == ("z",)
    np.testing.assert_array_equal(out["out"], np.full((2, 4), 3, np.float32))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.infer("elsewhere", ones()), "'elsewhere' is not in the manifest's calls"),
        (lambda ctx: ctx.infer("stage", {"x": np.ones((2, 4))}), "input 'x' is float64"),
        (lambda ctx: ctx.infer("stage", {"x": np.ones((2, 5), np.float32)}), "shape [2, 5]"),
        (lambda ctx: ctx.infer("stage", {}), "input 'x' is missing"),
        (lambda ctx: ctx.infer("stage", {**ones(), "w": ones()["x"]}), "unknown input(s) 'w'"),
        (lambda ctx: ctx.infer("stage", ones(), outputs=["q"]), "unknown output(s) 'q'"),
        (lambda ctx: ctx.infer("inner", ones()), "'inner' is itself a meta model"),
    ],
    ids=["undeclared", "dtype", "shape", "missing", "unknown", "output", "meta"],
)
async def test_glue_bugs_fail_the_request_as_internal_without_a_sub_call(
    call: Callable[[Any], Any], message: str, autojump_clock: trio.testing.MockClock
) -> None:
    async def run(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        await call(ctx)
        raise AssertionError("unreachable")

    inner = meta_model("inner", chain)
    host = FakeHost({"stage": Stage("stage"), "inner": inner})
    meta = meta_model("pipe", run, calls=("stage", "inner"))
    with pytest.raises(ExecutionFailed, match="model 'pipe'") as info:
        await MetaRunner(host, concurrency=1).run(meta, ones())
    assert message in str(info.value)
    assert host.calls == []


async def test_a_missing_or_unready_callee_is_unavailable_naming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = FakeHost({"stage": Stage("stage", up=False)})
    runner = MetaRunner(host, concurrency=1)
    with pytest.raises(Unavailable, match="callee 'stage' is not ready: warming up"):
        await runner.run(meta_model("pipe", chain), ones())
    del host.models["stage"]
    with pytest.raises(Unavailable, match="callee 'stage' is unavailable"):
        await runner.run(meta_model("pipe", chain), ones())
    assert host.calls == []


@pytest.mark.parametrize(
    ("error", "expected", "message"),
    [
        (InvalidArgument("bad rows"), ExecutionFailed, "sub-call to 'stage' was refused: bad rows"),
        (NotFound("gone"), Unavailable, "no longer loaded"),
        (QueueFull("stage", 4), QueueFull.__mro__[1], "queue is full"),
        (DeadlineExceeded("late"), DeadlineExceeded, "sub-call to 'stage': late"),
        (ExecutionFailed("device"), ExecutionFailed, "sub-call to 'stage' failed: device"),
    ],
)
async def test_sub_call_errors_keep_their_category_and_name_both_models(
    autojump_clock: trio.testing.MockClock,
    error: Exception,
    expected: type[Exception],
    message: str,
) -> None:
    host = FakeHost({"stage": Stage("stage")})
    host.errors["stage"] = error
    with pytest.raises(expected, match="model 'pipe'") as info:
        await MetaRunner(host, concurrency=1).run(meta_model("pipe", chain), ones())
    assert type(info.value) is expected
    assert message in str(info.value)


async def test_one_sub_call_per_request_is_in_the_scheduler_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fan_out(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        results: list[np.ndarray] = []

        async def one() -> None:
            results.append((await ctx.infer("stage", inputs))["y"])

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
        return {"out": sum(results)}

    host = FakeHost({"stage": Stage("stage")}, delay=1.0)
    start = trio.current_time()
    out = await MetaRunner(host, concurrency=2).run(meta_model("pipe", fan_out), ones())
    np.testing.assert_array_equal(out["out"], np.full((2, 4), 6, np.float32))
    assert host.max_in_flight == 1
    assert [c.at - start for c in host.calls] == [0.0, 1.0, 2.0]


# ---------------------------------------------------------------------------- run errors


async def test_an_exception_in_run_is_internal_logged_with_the_model_name(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    async def broken(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        await ctx.infer("stage", inputs)
        raise ValueError("glue bug")

    runner = MetaRunner(FakeHost({"stage": Stage("stage")}), concurrency=1)
    with (
        caplog.at_level(logging.ERROR, logger="reactantserver.meta"),
        pytest.raises(ExecutionFailed, match=r"model 'broken': model\.py run raised ValueError"),
    ):
        await runner.run(meta_model("broken", broken), ones())
    (record,) = caplog.records
    assert "'broken'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    stats = runner.statistics()
    assert (stats.run_errors, stats.running) == (1, 0)
    # Only that request failed: its slot was given back and the next request runs.
    out = await runner.run(meta_model("ok", chain), ones())
    np.testing.assert_array_equal(out["out"], np.full((2, 4), 3, np.float32))


async def test_errors_raised_on_purpose_keep_their_status(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def picky(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        raise InvalidArgument("model 'picky': x must be positive")

    with pytest.raises(InvalidArgument, match="must be positive"):
        await MetaRunner(FakeHost({}), concurrency=1).run(meta_model("picky", picky), ones())


async def test_run_results_are_checked_against_the_manifest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def wrong(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        return {"out": inputs["x"].astype(np.float64)}

    with pytest.raises(ExecutionFailed, match=r"model\.py run returned 'out' as float64"):
        await MetaRunner(FakeHost({}), concurrency=1).run(meta_model("m", wrong, calls=()), ones())


# ---------------------------------------------------------------------------- the gate


async def test_the_gate_bounds_concurrent_meta_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = FakeHost({"stage": Stage("stage")}, delay=1.0)
    runner = MetaRunner(host, concurrency=2)
    meta = meta_model("pipe", chain)
    peak = 0
    done: list[float] = []

    async def watch() -> None:
        nonlocal peak
        while len(done) < 5:
            peak = max(peak, runner.statistics().running)
            await trio.sleep(0.25)

    async def one() -> None:
        await runner.run(meta, ones())
        done.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        for _ in range(5):
            nursery.start_soon(one)
    assert peak == 2
    assert host.max_in_flight == 2
    assert sorted(t - start for t in done) == [1.0, 1.0, 2.0, 2.0, 3.0]
    stats = meta.statistics()
    assert stats.execution_count == 5
    assert stats.queue.ns == round(2 * 1e9 + 2e9)  # two waited 1 s, one 2 s


async def test_compute_only_metas_bypass_the_gate(autojump_clock: trio.testing.MockClock) -> None:
    async def glue(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        await trio.sleep(1.0)
        return {"out": inputs["x"]}

    runner = MetaRunner(FakeHost({}), concurrency=1)
    meta = meta_model("glue", glue, calls=())
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(runner.run, meta, ones())
    assert trio.current_time() - start == 1.0


async def test_waiting_for_the_gate_is_bounded_by_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = FakeHost({"stage": Stage("stage")}, delay=5.0)
    runner = MetaRunner(host, concurrency=1)
    meta = meta_model("pipe", chain)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run, meta, ones())
        await trio.sleep(0.5)
        with pytest.raises(DeadlineExceeded, match="meta_concurrency=1"):
            await runner.run(meta, ones(), trio.current_time() + 1.0)
        assert runner.statistics().waiting == 0
    assert len(host.calls) == 1  # the second request never reached its sub-call


# ---------------------------------------------------------------------------- cancellation


async def test_cancelling_the_request_cancels_its_pending_sub_call_and_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def two_stages(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        y = (await ctx.infer("a", inputs))["y"]
        z = (await ctx.infer("b", {"x": y}))["z"]
        return {"out": z}

    host = FakeHost({"a": Stage("a"), "b": Stage("b")}, delay=1.0)
    runner = MetaRunner(host, concurrency=1)
    meta = meta_model("pipe", two_stages, calls=("a", "b"))
    with trio.move_on_after(1.5):  # the client goes away during stage b
        await runner.run(meta, ones())
    assert [c.model for c in host.calls] == ["a", "b"]
    assert host.finished == ["a"]
    assert runner.statistics().running == 0
    with trio.move_on_after(0.5):  # ... or during stage a: b is never called
        await runner.run(meta, ones())
    assert [c.model for c in host.calls] == ["a", "b", "a"]
    assert host.finished == ["a"]
    assert meta.statistics().execution_count == 0


async def test_a_deadline_that_passes_between_sub_calls_stops_the_next_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow_glue(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        y = (await ctx.infer("a", inputs))["y"]
        await ctx.run_sync(lambda: None)
        assert ctx.remaining() <= 0  # glue overran the deadline without awaiting it
        return {"out": (await ctx.infer("b", {"x": y}))["y"]}

    host = FakeHost({"a": Stage("a"), "b": Stage("b")}, delay=2.0)
    runner = MetaRunner(host, concurrency=1)
    meta = meta_model("pipe", slow_glue, calls=("a", "b"))
    with pytest.raises(DeadlineExceeded, match="deadline passed before the sub-call to 'b'"):
        await runner.run(meta, ones(), trio.current_time() + 2.0)
    assert [c.model for c in host.calls] == ["a"]


# ---------------------------------------------------------------------------- with the scheduler


class SchedulerHost(FakeHost):
    """Sub-calls go to a real ``Scheduler``; the simulated device answers with the payload."""

    def __init__(self, scheduler: Scheduler, models: Mapping[str, Any]) -> None:
        super().__init__(models)
        self.scheduler = scheduler

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        self.calls.append(
            SubCall(model, dict(inputs), tuple(outputs), deadline, committed, trio.current_time())
        )
        x = await self.scheduler.submit(
            model,
            inputs["x"],
            rows=len(inputs["x"]),
            deadline=None if math.isinf(deadline) else deadline,
            committed=committed,
        )
        return {"y": 2 * x, "z": 3 * x}


async def test_sub_calls_are_not_shed_for_edf_laxity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The learned cost (1 s) says a request with 0.5 s left cannot finish; the device
    really takes 0.2 s. EDF sheds a plain request on that estimate, never a sub-call."""
    executor = SimulatedExecutor(lambda model, size: 0.2)
    scheduler = Scheduler(SchedulerConfig(discipline="edf"), executor)
    scheduler.add_model("stage", (1, 2, 4))
    for size in (1, 2, 4):
        scheduler.seed_cost("stage", size, 1.0)
    host = SchedulerHost(scheduler, {"stage": Stage("stage")})
    runner = MetaRunner(host, concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        with pytest.raises(DeadlineExceeded):
            await scheduler.submit(
                "stage", np.ones((2, 4), np.float32), rows=2, deadline=trio.current_time() + 0.5
            )
        assert executor.trace == []
        out = await runner.run(meta_model("pipe", chain), ones(), trio.current_time() + 0.5)
        np.testing.assert_array_equal(out["out"], np.full((2, 4), 3, np.float32))
        assert [r.model for r in executor.trace] == ["stage"]
        await scheduler.aclose()


class TraceExecutor:
    """A device taking 1 s per batch; records (model, start, first value of each payload)."""

    def __init__(self) -> None:
        self.trace: list[tuple[str, float, list[float]]] = []

    async def prepare(self, batch: Batch) -> None:
        return None

    async def execute(self, batch: Batch) -> Sequence[Any]:
        values = [float(r.payload.flat[0]) for r in batch.requests]
        self.trace.append((batch.model, trio.current_time(), values))
        await trio.sleep(1.0)  # virtual-clock: its test runs on autojump
        return [r.payload for r in batch.requests]


async def test_sub_calls_jump_ahead_of_queued_work(autojump_clock: trio.testing.MockClock) -> None:
    """Three fresh requests for ``a`` (payload 0) are queued at t=0; a meta request arriving
    at t=0.5 runs its stage ``a`` (payload 1) as soon as the device is free, ahead of the
    two still queued, and its stage ``b`` (payload 2) also before the last of them."""
    executor = TraceExecutor()
    scheduler = Scheduler(SchedulerConfig(discipline="fifo"), executor)
    scheduler.add_model("a", (1,))
    scheduler.add_model("b", (1,))
    host = SchedulerHost(scheduler, {"a": Stage("a"), "b": Stage("b")})

    async def two_stages(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
        y = (await ctx.infer("a", inputs))["y"]
        return {"out": (await ctx.infer("b", {"x": y}))["y"]}

    runner = MetaRunner(host, concurrency=1)
    meta = meta_model("pipe", two_stages, calls=("a", "b"))
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        for _ in range(3):
            nursery.start_soon(partial(scheduler.submit, "a", np.zeros((1, 4), np.float32), rows=1))
        await trio.sleep(0.5)
        nursery.start_soon(runner.run, meta, ones(1))
        await trio.sleep(10)
        await scheduler.aclose()
    trace = executor.trace
    assert trace[:2] == [("a", 0.0, [0.0]), ("a", 1.0, [1.0])]
    assert [t[0] for t in trace].count("b") == 1
    b_at = next(i for i, t in enumerate(trace) if t[0] == "b")
    assert trace[b_at] in (("b", 2.0, [2.0]), ("b", 3.0, [2.0]))
    assert b_at < len(trace) - 1  # at least one older fresh request ran after it


def test_the_meta_module_imports_without_jax() -> None:
    import subprocess
    import sys

    code = "import sys, reactantserver.meta; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

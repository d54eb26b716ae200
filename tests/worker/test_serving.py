"""The worker's request path (``worker.serving``) at a version gate, on virtual time.

The real ``Serving``, ``ModelVersions``, ``LifecycleDriver`` and ``Scheduler``; the versions
are ``ServedModel``\\ s over stand-in bundles (no JAX), and the executor echoes ``2 x`` once
the test releases it. A swap to other batch sizes gates the new version's requests until
the old one drains: these tests check that a gated request waits in the gate table (not
in a task), continues when the gate opens, leaves the table when its caller withdraws,
and is failed -- not forgotten -- when the worker closes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from conftest import inline

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config import SchedulerConfig
from reactantserver.config.schema import ModelSchedConfig
from reactantserver.errors import InvalidArgument, Unavailable
from reactantserver.lifecycle import ModelVersions
from reactantserver.models import ServedModel
from reactantserver.records import Answer
from reactantserver.scheduling import Batch, Scheduler
from reactantserver.worker.build import batching_of
from reactantserver.worker.lifecycle import LifecycleDriver
from reactantserver.worker.serving import Serving

X = TensorSpec("x", "FP32", (-1, 4))
Y = TensorSpec("y", "FP32", (-1, 4))


def version(
    sizes: tuple[int, ...],
    generation: int,
    outputs: Sequence[TensorSpec] = (Y,),
    hooks: Any = None,
) -> ServedModel:
    bundle = SimpleNamespace(
        name="m",
        inputs=[X],
        outputs=[Y],
        client_inputs=[X],
        client_outputs=list(outputs),
        compiled_batch_sizes=sizes,
        batched=True,
        hooks=hooks,
        manifest=SimpleNamespace(max_batch_size=max(sizes)),
    )
    return ServedModel(
        bundle,  # type: ignore[arg-type]
        SimpleNamespace(),  # type: ignore[arg-type]
        ModelSchedConfig(),
        platform="fake",
        generation=generation,
        max_queue_depth=64,
    )


class Gated:
    """Runs ``y = 2 x`` once ``release`` is set; notes (generation, size) of each batch."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.batches: list[tuple[int, int]] = []

    async def prepare(self, batch: Batch) -> None:
        pass

    async def execute(self, batch: Batch) -> Sequence[Any]:
        await self.release.wait()
        self.batches.append((batch.group.generation, batch.size))  # type: ignore[attr-defined]
        return [{"y": 2 * r.payload["x"]} for r in batch.requests]


class Rig:
    def __init__(self) -> None:
        self.versions: ModelVersions[Any] = ModelVersions()
        self.executor = Gated()
        self.scheduler = Scheduler(SchedulerConfig(), self.executor)
        self.lifecycle = LifecycleDriver(
            self.versions,
            self.scheduler,
            None,  # type: ignore[arg-type]  # weights: only the retirement loop uses them
            None,  # type: ignore[arg-type]  # builder: no builds here
            thread=inline,
        )
        self.serving = Serving(
            self.versions, self.scheduler, self.lifecycle, meta_concurrency=1, hook_thread=inline
        )

    def load(self, served: ServedModel) -> None:
        self.versions.begin_load("m")
        self.lifecycle.carry_out(self.versions.loaded("m", served, batching=batching_of(served)))

    def begin(self, value: float) -> tuple[Any, Answer]:
        answer = Answer(lambda: None)
        x = np.full((1, 4), value, np.float32)
        return self.serving.begin("m", {"x": x}, ["y"], math.inf, answer), answer


async def with_rig(body: Any) -> None:
    rig = Rig()
    async with trio.open_nursery() as nursery:
        await nursery.start(rig.scheduler.run)
        await nursery.start(rig.serving.run)
        await body(rig)
        nursery.cancel_scope.cancel()


async def test_a_gated_request_waits_in_the_table_and_runs_on_its_version_once_the_gate_opens(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def body(rig: Rig) -> None:
        old, new = version((1,), 1), version((2,), 2)
        rig.load(old)
        _, first = rig.begin(1.0)  # admitted to the old version, on the device
        await trio.sleep(0.1)
        rig.load(new)  # other batch sizes: the new version's requests are gated
        _, second = rig.begin(2.0)
        assert rig.serving.gated == 1
        assert rig.scheduler.admitted == 1  # not queued: it is in the gate table
        rig.executor.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert rig.serving.gated == 0
        np.testing.assert_array_equal(first.result()["y"], np.full((1, 4), 2.0))
        np.testing.assert_array_equal(second.result()["y"], np.full((1, 4), 4.0))
        # Each request ran on the version that admitted it, at that version's sizes.
        assert rig.executor.batches == [(1, 1), (2, 2)]
        assert rig.versions.outstanding(new) == 0

    await with_rig(body)


async def test_a_withdrawn_gated_request_leaves_the_table_and_never_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def body(rig: Rig) -> None:
        old, new = version((1,), 1), version((2,), 2)
        rig.load(old)
        _, first = rig.begin(1.0)
        await trio.sleep(0.1)
        rig.load(new)
        entry, second = rig.begin(2.0)
        assert rig.versions.outstanding(new) == 1
        rig.serving.withdraw(entry)  # synchronous, as a client cancel does it
        assert rig.serving.gated == 0
        assert rig.versions.outstanding(new) == 0  # its version is finished at once
        rig.executor.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert first.settled and not second.settled  # nobody answers a withdrawn request
        assert rig.executor.batches == [(1, 1)]

    await with_rig(body)


async def test_closing_fails_every_gated_request(autojump_clock: trio.testing.MockClock) -> None:
    async def body(rig: Rig) -> None:
        old, new = version((1,), 1), version((2,), 2)
        rig.load(old)
        rig.begin(1.0)
        await trio.sleep(0.1)
        rig.load(new)
        _, gated = rig.begin(2.0)
        rig.serving.close()
        assert gated.settled
        with pytest.raises(Unavailable, match="shutting down"):
            gated.result()
        assert rig.versions.outstanding(new) == 0
        with pytest.raises(Unavailable, match="shutting down"):
            rig.begin(3.0)  # closed: nothing more is admitted

    await with_rig(body)


#: One client output of every datatype (each [-1, 2], BYTES [-1]), behind hooks.
EVERY_DATATYPE = [
    TensorSpec(f"o_{d.lower()}", d, (-1,) if d == "BYTES" else (-1, 2))
    for d in (
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BF16",
        "BYTES",
    )
]


def _refuse(*_: Any) -> Any:
    raise AssertionError("a hook ran for a request of zero rows")


def hooked_version(outputs: Sequence[TensorSpec]) -> ServedModel:
    # (A bundle is immutable: the stand-in is made with these outputs and hooks.)
    return version((1, 4), 1, outputs, SimpleNamespace(preprocess=_refuse, postprocess=_refuse))


async def test_a_request_of_zero_rows_is_answered_at_once_with_zero_rows_of_every_output(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Zero rows in, zero rows of every output out (its declared datatype), from begin
    itself: no queue, no device, no hook, no served row. Before issue 42 the request was
    queued as one row and answered with the padding row's result."""

    async def body(rig: Rig) -> None:
        rig.load(hooked_version(EVERY_DATATYPE))
        answer = Answer(lambda: None)
        x = np.zeros((0, 4), np.float32)
        rig.serving.begin("m", {"x": x}, [], math.inf, answer)
        assert answer.settled  # answered within begin
        result = answer.result()
        assert list(result) == [s.name for s in EVERY_DATATYPE]
        for spec in EVERY_DATATYPE:
            assert result[spec.name].shape == spec.with_batch(0), spec
            assert result[spec.name].dtype == spec.numpy_dtype, spec
        # Only what was asked for, when outputs are named.
        named = Answer(lambda: None)
        rig.serving.begin("m", {"x": x}, ["o_bytes", "o_bf16"], math.inf, named)
        assert sorted(named.result()) == ["o_bf16", "o_bytes"]
        await trio.testing.wait_all_tasks_blocked()
        assert rig.executor.batches == []
        stats = rig.scheduler.policy.statistics(trio.current_time())
        assert (stats.requests, stats.rows, stats.dispatches) == (0, 0, 0)
        assert rig.scheduler.admitted == 0
        assert rig.versions.outstanding(rig.versions.current["m"]) == 0

    await with_rig(body)


async def test_zero_rows_of_an_output_with_a_variable_extent_are_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An output whose other extents only a run can tell: INVALID_ARGUMENT naming it,
    and nothing queued."""

    async def body(rig: Rig) -> None:
        rig.load(hooked_version([Y, TensorSpec("tokens", "INT32", (-1, -1))]))
        x = np.zeros((0, 4), np.float32)
        with pytest.raises(InvalidArgument, match=r"output 'tokens' has shape \[-1, -1\]"):
            rig.serving.begin("m", {"x": x}, [], math.inf, Answer(lambda: None))
        # Asking only for the fixed one is answered.
        answer = Answer(lambda: None)
        rig.serving.begin("m", {"x": x}, ["y"], math.inf, answer)
        assert answer.result()["y"].shape == (0, 4)
        assert rig.scheduler.admitted == 0
        assert rig.versions.outstanding(rig.versions.current["m"]) == 0

    await with_rig(body)

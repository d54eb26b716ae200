"""A fake ``ModelHost`` for the gRPC surface tests (test_grpc_surface, test_grpcurl).

It implements the seam of ``reactantserver.host`` with a handful of tiny models, each
chosen to drive one path through the transport:

* ``double``  FP32 x [-1, 16] -> y = 2x and z = x + 1, max batch 8 (compiled 1, 4, 8);
* ``echo``    BYTES s [-1] -> t = s with b"!" appended, max batch 4;
* ``slow``    waits on ``FakeHost.release`` (never set unless a test sets it): deadlines,
  in-flight caps, client cancellation, graceful shutdown (``slow`` and ``nap`` run in
  tasks of :meth:`FakeHost.run`, which a test starts next to the server);
* ``broken``  raises ``RuntimeError`` (a bug): INTERNAL with the fixed message;
* ``cold``    loaded but not ready ("still compiling"): UNAVAILABLE;
* ``busy``    its queue is full (``QueueFull``): RESOURCE_EXHAUSTED;
* ``nap``     sleeps :data:`NAP_SECONDS` (Trio time) and answers ``y = x``: a call that
  stays in flight for a while without a test's help (a server in a subprocess). Its
  device counters record exactly :data:`NAP_SECONDS` per call -- the program's time, as
  a device reports it -- not the wall time of the sleep that stands for it, which a
  loaded machine stretches.

The repository also lists ``spare`` (not loaded; ``load`` loads it) and ``badbundle``
(loading it raises ``BundleError``). Device statistics are counted for real: rows,
executions, and a per-batch-size record at the smallest compiled size that fits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config.schema import Residency
from reactantserver.errors import (
    BundleError,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    QueueFull,
)
from reactantserver.load_config import Override
from reactantserver.records import (
    Answer,
    BatchStatistics,
    CompactResult,
    ControlStatus,
    Duration,
    ExecutionStatistics,
    IndexEntry,
    ModelControlInfo,
)

X16 = TensorSpec("x", "FP32", (-1, 16))
#: How long a ``nap`` request sleeps.
NAP_SECONDS = 0.2


@attrs.define
class FakeModel:
    name: str
    inputs: tuple[TensorSpec, ...] = (X16,)
    outputs: tuple[TensorSpec, ...] = (TensorSpec("y", "FP32", (-1, 16)),)
    compiled_batch_sizes: tuple[int, ...] = (1, 4, 8)
    version: str = ""
    platform: str = "jax_cpu"
    max_queue_depth: int = 16
    parameters: Mapping[str, str] = attrs.field(factory=lambda: {"weight": "1.0"})
    not_ready: str = ""
    # Device-side counters, as a real host would keep them.
    rows: int = 0
    executions: int = 0
    infer_time: Duration = attrs.field(factory=Duration)
    batches: dict[int, Duration] = attrs.field(factory=dict)

    @property
    def max_batch_size(self) -> int:
        return max(self.compiled_batch_sizes, default=0)

    def ready(self) -> tuple[bool, str]:
        return (not self.not_ready, self.not_ready)

    def statistics(self) -> ExecutionStatistics:
        return ExecutionStatistics(
            compute_infer=self.infer_time,
            inference_count=self.rows,
            execution_count=self.executions,
            batches=tuple(
                BatchStatistics(size, compute_infer=d) for size, d in sorted(self.batches.items())
            ),
        )

    def count(self, rows: int, seconds: float) -> None:
        self.rows += rows
        self.executions += 1
        self.infer_time = self.infer_time.plus(seconds)
        size = min((s for s in self.compiled_batch_sizes if s >= rows), default=rows)
        self.batches[size] = self.batches.get(size, Duration()).plus(seconds)


def _models() -> dict[str, FakeModel]:
    return {
        "double": FakeModel(
            "double", outputs=(TensorSpec("y", "FP32", (-1, 16)), TensorSpec("z", "FP32", (-1, 16)))
        ),
        "echo": FakeModel(
            "echo",
            inputs=(TensorSpec("s", "BYTES", (-1,)),),
            outputs=(TensorSpec("t", "BYTES", (-1,)),),
            compiled_batch_sizes=(4,),
        ),
        "slow": FakeModel("slow"),
        "broken": FakeModel("broken"),
        "cold": FakeModel("cold", not_ready="still compiling"),
        "busy": FakeModel("busy"),
        "nap": FakeModel("nap"),
    }


@attrs.define
class FakeHost:
    """The seam, faked; attributes record what the service asked for."""

    backend: str = "cpu"
    device_ordinal: int = 0
    models: dict[str, FakeModel] = attrs.field(factory=_models)
    #: Set by a test to let ``slow`` requests finish.
    release: trio.Event = attrs.field(factory=trio.Event)
    #: (model, deadline) of every infer call, in order.
    calls: list[tuple[str, float]] = attrs.field(factory=list)
    #: Models whose infer call was cancelled while running.
    cancelled: list[str] = attrs.field(factory=list)
    #: ``slow`` and ``nap`` fail at their deadline, as queued requests do; set False by a
    #: test to make them run on past it, as a batch already executing does.
    honour_deadlines: bool = True
    residency: dict[str, Residency] = attrs.field(factory=dict)
    weights: dict[str, float] = attrs.field(factory=dict)
    externally_managed: bool = False
    _nursery: trio.Nursery | None = None
    #: What ModelControlStatus reports (lpt_packing wants fifo or edf).
    discipline: str = "fair"
    weight_cache_max_bytes: int = 1 << 20
    #: Report each model's infer time as ModelControlStatus ``total_compute_seconds``
    #: (lpt_packing's repack clock); off by default, so the other tests learn no costs.
    report_compute: bool = False
    #: The reload list of every CompactMemory call, in order.
    compactions: list[tuple[str, ...]] = attrs.field(factory=list)
    #: The ``config`` override of the last load of each name (None: loaded without).
    overrides: dict[str, Override | None] = attrs.field(factory=dict)

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def get(self, name: str) -> FakeModel:
        try:
            return self.models[name]
        except KeyError:
            raise NotFound(f"model {name!r} is not loaded on this worker") from None

    def index(self) -> Sequence[IndexEntry]:
        entries = [
            IndexEntry(m.name, state="READY" if m.ready()[0] else "UNAVAILABLE", reason=m.not_ready)
            for m in self.models.values()
        ]
        for name in ("spare", "badbundle"):
            if name not in self.models:
                entries.append(IndexEntry(name, state="UNAVAILABLE", reason="unloaded"))
        return sorted(entries, key=lambda e: e.name)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the tasks of the models that take time (``slow``, ``nap``)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
    ) -> object:
        """Instant models are answered before this returns; ``slow`` and ``nap`` in a
        task of :meth:`run` (which fails them at ``deadline``, as the worker's dispatch
        loop would)."""
        self.calls.append((model, deadline))
        m = self.get(model)
        if model == "busy":
            raise QueueFull(model, m.max_queue_depth)
        if model == "broken":
            raise RuntimeError("secret internal detail")
        if model in ("slow", "nap"):
            if self._nursery is None:
                raise RuntimeError("FakeHost.run is not running (start it in the test)")
            scope = trio.CancelScope(deadline=deadline if self.honour_deadlines else math.inf)
            self._nursery.start_soon(self._wait, model, inputs, answer, scope)
            return scope
        answer.resolve(self._compute(model, inputs, 0.0))
        return None

    def withdraw(self, handle: object) -> None:
        if isinstance(handle, trio.CancelScope):
            handle.cancel()

    async def _wait(
        self, model: str, inputs: Mapping[str, np.ndarray], answer: Answer, scope: trio.CancelScope
    ) -> None:
        started = trio.current_time()
        with scope:
            if model == "slow":
                await self.release.wait()
            else:
                await trio.sleep(
                    NAP_SECONDS
                )  # real-clock: stands for device work (counted as NAP_SECONDS)
        if scope.cancelled_caught:
            self.cancelled.append(model)
            if trio.current_time() >= scope.deadline:  # else withdrawn: nobody waits
                answer.fail(
                    DeadlineExceeded(
                        f"model {model!r}: deadline passed after "
                        f"{trio.current_time() - started:.3f} s"
                    )
                )
            return
        # The device's time: a nap's program is NAP_SECONDS long however late the sleep
        # that stands for it ends; slow's lasts until the test releases it.
        seconds = NAP_SECONDS if model == "nap" else trio.current_time() - started
        answer.resolve(self._compute(model, inputs, seconds))

    def _compute(self, model: str, inputs: Mapping[str, np.ndarray], seconds: float) -> Any:
        m = self.get(model)
        if model in ("slow", "nap"):
            result: dict[str, Any] = {"y": inputs["x"]}
        elif model == "echo":
            s = inputs["s"]
            result = {"t": np.array([v + b"!" for v in s.ravel()], dtype=object).reshape(s.shape)}
        else:
            x = inputs["x"]
            result = {"y": x * 2, "z": x + 1}
        first = next(iter(inputs.values()))
        m.count(first.shape[0], seconds)
        return result

    async def load(self, name: str, override: Override | None = None) -> None:
        self.overrides[name] = override
        if name == "badbundle":
            raise BundleError(name, "manifest.yaml: format_version: required key is missing")
        if name == "spare":
            self.models[name] = FakeModel("spare")
        elif name not in self.models:
            raise NotFound(f"model {name!r} is not in the repository")

    async def unload(self, name: str) -> None:
        if self.models.pop(name, None) is None:
            raise NotFound(f"model {name!r} is not loaded on this worker")

    def control_status(self) -> ControlStatus:
        return ControlStatus(
            residency_mode="externally_managed" if self.externally_managed else "self_managed",
            discipline=self.discipline,
            models=tuple(
                ModelControlInfo(
                    name=m.name,
                    residency=self.residency.get(m.name, "system"),
                    device_resident=True,
                    host_resident=True,
                    weight_nbytes=1024,
                    weight=self.weights.get(m.name, 1.0),
                    requests_served=m.executions,
                    dispatch_count=m.executions,
                    max_batch_size=m.max_batch_size,
                    batch_input_name=m.inputs[0].name,
                    batch_axis=1,
                    rows_served=m.rows,
                    total_compute_seconds=m.infer_time.ns / 1e9 if self.report_compute else 0.0,
                )
                for m in reversed(self.models.values())
            ),
            weight_cache_max_bytes=self.weight_cache_max_bytes,
        )

    async def set_residency(self, name: str, target: Residency) -> Residency:
        self.get(name)
        if not self.externally_managed:
            raise FailedPrecondition(
                "residency is self-managed (model_control_mode is dynamic); "
                "SetModelResidency needs model_control_mode: explicit"
            )
        self.residency[name] = target
        return target

    async def set_policy(self, name: str, weight: float) -> None:
        self.get(name)
        self.weights[name] = weight

    async def compact(self, reload: Sequence[str]) -> CompactResult:
        for name in reload:
            self.get(name)
        self.compactions.append(tuple(reload))
        return CompactResult(reloaded_models=len(reload), resident_bytes_after=2048)

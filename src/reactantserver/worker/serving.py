"""The request side of the model host: lookup, the repository index, and one request's path.

Theory of operation
-------------------
Every request -- a client's, a pre/post-processed one, a meta model's, each of a meta
model's sub-calls, one admitted behind a version gate -- takes the same path, in three
steps, and no step needs a task of the request's own on the plain path:

1. **begin** (:meth:`Serving.begin`, synchronous; the gRPC handler calls it on the
   asyncio side): **admission** (``ModelVersions.admit``: the name's serving version,
   which from now on counts the request as outstanding -- the request runs on it,
   whatever swaps happen meanwhile -- or the refusal), the rows of the request, then the
   request enters a table, by stage:

   * *queued*: no hook, no gate -- ``Scheduler.enqueue`` with the version as the batch
     group, its rows and its deadline. This is the whole plain path.
   * *gated*: its version batches differently from an older one still draining; the
     request waits in this module's gate table, not in a task, until the lifecycle
     driver switches the scheduler entry (``open_gate``), and then continues as below.
   * *in a task*: a ``preprocess`` hook (a hook thread, then queued), or a meta model's
     glue (``reactantserver.meta.MetaRunner``, under the request's deadline; each
     ``ctx.infer`` comes back to step 1 as a *committed* request). These run as tasks
     of this module's nursery.

   * *answered at once*: a request of **zero rows** (a batched model, batch extent 0)
     has nothing to compute: ``begin`` answers it with every output at zero rows
     (``[0, ...]``, the declared datatype), without the scheduler, the device, the
     hooks (a hook keeps the row count: zero in, zero out) or any served-row counter.
     Where an output's non-batch extent is variable only a run would know it, so such a
     request is refused (INVALID_ARGUMENT, saying to send a row). A meta model's
     request is not rows: its glue runs, and a sub-call of zero rows is answered so.

   Refusals (NOT_FOUND, UNAVAILABLE, RESOURCE_EXHAUSTED for a full queue, ...) are
   raised by ``begin`` itself, with the version's admission undone.
2. **wait**: the caller waits for its :class:`~reactantserver.records.Answer` (the
   transport: an asyncio future; Trio callers, :meth:`Serving.infer`: an event). The
   dispatch loop answers a queued request when its batch comes back (or fails it: its
   deadline passed while queued, its batch failed, shutdown).
3. **finish**, on the loop, synchronous, whatever the outcome: ``ModelVersions.finish``
   (the actions that became due -- retire a drained version, switch a gate -- go to the
   lifecycle driver), then ``postprocess`` if there is one (a task, a hook thread), and
   the answer is settled.

A caller that gives up (client cancel, server closing) calls :meth:`Serving.withdraw`,
synchronously: a queued request never runs (or its result is dropped if its batch
runs), a gated one leaves the gate table, a task is cancelled; the version is finished
at once. Nothing settles a withdrawn request.

Invariants: every admitted request is finished on its version exactly once; it is
owned by exactly one table (the scheduler's, the gate table, or this nursery's tasks)
until it is answered or withdrawn; shutdown fails whatever is gated or in a task with
UNAVAILABLE (the scheduler fails what it holds).

Hooks run in worker threads of their own limiter, never on the event loop and never
queued behind the device thread, so a slow hook delays only its own request.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import trio

from .. import hooks as hooks_mod
from ..errors import DeadlineExceeded, ExecutionFailed, InvalidArgument, Unavailable
from ..host import HostedModel
from ..lifecycle import ModelVersions, index_view
from ..meta import MetaModel, MetaRunner
from ..models import ServedModel
from ..records import Answer, IndexEntry
from ..runtime.assemble import request_rows
from ..scheduling import Request, Scheduler
from ..scheduling.dispatch import SHUTTING_DOWN
from ..threads import ThreadRunner
from .build import Version
from .lifecycle import LifecycleDriver

__all__ = ["Admitted", "Serving"]

log = logging.getLogger(__package__)


class _Stage(enum.Enum):
    QUEUED = "queued"  # in the scheduler's table
    GATED = "gated"  # in the gate table
    TASK = "task"  # a hook or meta task owns it
    DONE = "done"  # answered or withdrawn


class Admitted:
    """One admitted request, as the worker holds it from ``begin`` to its answer."""

    __slots__ = (
        "answer",
        "committed",
        "deadline",
        "finished",
        "inputs",
        "model",
        "request",
        "rows",
        "scope",
        "stage",
        "version",
    )

    def __init__(
        self,
        version: Version,
        model: str,
        inputs: Mapping[str, np.ndarray],
        deadline: float,
        answer: Answer,
        committed: bool,
    ) -> None:
        self.version = version
        self.model = model
        self.inputs = inputs
        self.deadline = deadline
        self.answer = answer
        self.committed = committed
        self.rows: int | None = None
        self.stage = _Stage.TASK
        #: The scheduler's request while queued.
        self.request: Request | None = None
        #: The cancel scope of the hook or meta task that owns it.
        self.scope: trio.CancelScope | None = None
        #: ``ModelVersions.finish`` was called for it.
        self.finished = False


class Serving:
    """Lookup, index and the request path over the model versions (module docstring).

    Start :meth:`run` in the worker's nursery before requests arrive: hook and meta
    tasks run in its nursery.
    """

    def __init__(
        self,
        versions: ModelVersions[Version],
        scheduler: Scheduler,
        lifecycle: LifecycleDriver,
        *,
        meta_concurrency: int,
        hook_thread: ThreadRunner,
    ) -> None:
        self._versions = versions
        self._scheduler = scheduler
        self._lifecycle = lifecycle
        self._hook_thread = hook_thread
        #: version -> the requests held at its gate, in admission order.
        self._gated: dict[Version, dict[Admitted, None]] = {}
        self._nursery: trio.Nursery | None = None
        self._closed = False
        lifecycle.gate_opened = self.open_gate
        #: Runs meta requests under the ``meta_concurrency`` gate; its host is this path.
        self.meta_runner = MetaRunner(self, concurrency=meta_concurrency)

    # ------------------------------------------------------------------ reads

    def get(self, name: str) -> HostedModel:
        """The version serving ``name`` (nothing is admitted); the refusal otherwise."""
        return self._versions.serving(name)

    def index(self) -> list[IndexEntry]:
        entries = []
        current = self._versions.current
        for name, record in sorted(self._versions.states.records.items()):
            state, reason = index_view(record)
            meta = current.get(name)
            if isinstance(meta, MetaModel) and state == "READY":
                # Loaded, but callable only once every callee serves: say which is missing.
                ready, why = meta.ready()
                if not ready:
                    state, reason = "UNAVAILABLE", f"loaded, not ready: {why}"
            # The version of a loaded model, as every other RPC reports it; none for a
            # name with no version (not loaded, failed, unloaded).
            entries.append(IndexEntry(name, meta.version if meta else "", state, reason))
        return entries

    @property
    def gated(self) -> int:
        """Requests waiting at a version gate now."""
        return sum(len(held) for held in self._gated.values())

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the hook and meta tasks; on cancellation fail what is still gated."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Refuse new requests; fail every gated one with UNAVAILABLE."""
        self._closed = True
        held = [entry for entries in self._gated.values() for entry in entries]
        self._gated.clear()
        for entry in held:
            self._end(entry, error=Unavailable(SHUTTING_DOWN))

    # ------------------------------------------------------------------ begin

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
        *,
        committed: bool = False,
    ) -> Admitted:
        """Admit one validated request and hand it to its table (module docstring).

        ``deadline`` is absolute ``trio.current_time()`` (``inf``: none). ``committed``:
        a meta model's sub-call, dispatched ahead of the discipline's choice and never
        shed for EDF laxity. Raises the refusal; otherwise ``answer`` is settled later,
        exactly once, unless the caller withdraws first.
        """
        if self._closed:
            raise Unavailable(SHUTTING_DOWN)
        versions = self._versions
        version = versions.admit(model)
        entry = Admitted(version, model, inputs, deadline, answer, committed)
        try:
            if isinstance(version, MetaModel):
                if committed:  # the meta context refuses this first; never nest glue
                    raise ExecutionFailed(
                        f"model {model!r} is a meta model; it cannot be a sub-call"
                    )
                self._start(entry, self._run_meta)
            else:
                if version.batched:
                    try:
                        entry.rows = request_rows(inputs)
                    except ValueError as exc:
                        raise InvalidArgument(f"model {model!r}: {exc}") from None
                if entry.rows == 0:
                    self._end(entry, value=_no_rows(version, outputs))
                elif versions.gated(version):
                    entry.stage = _Stage.GATED
                    self._gated.setdefault(version, {})[entry] = None
                else:
                    self._proceed(entry)
        except BaseException:
            entry.stage = _Stage.DONE
            self._finish_version(entry)
            raise
        return entry

    def _proceed(self, entry: Admitted) -> None:
        """Past admission and the gate: preprocess in a task, or straight to the queue."""
        hooks = entry.version.bundle.hooks
        if hooks is not None and hooks.preprocess is not None:
            self._start(entry, self._run_preprocess)
        else:
            self._enqueue(entry, entry.inputs)

    def _enqueue(self, entry: Admitted, inputs: Mapping[str, np.ndarray]) -> None:
        served = entry.version
        entry.request = self._scheduler.enqueue(
            served.name,
            inputs,
            answer=partial(self._executed, entry),
            rows=entry.rows if entry.rows is not None else 1,
            deadline=None if math.isinf(entry.deadline) else entry.deadline,
            group=served,
            committed=entry.committed,
        )
        entry.stage = _Stage.QUEUED

    def open_gate(self, version: Version) -> None:
        """The lifecycle driver switched the scheduler to ``version``'s batching: its
        held requests continue, in admission order."""
        for entry in self._gated.pop(version, {}):
            try:
                self._proceed(entry)
            except Exception as exc:  # a refusal now (queue full, deadline passed)
                self._end(entry, error=exc)

    # ------------------------------------------------------------------ finish

    def _executed(self, entry: Admitted, value: Any, error: BaseException | None) -> None:
        """The dispatch loop's answer for a queued request."""
        entry.request = None
        self._finish_version(entry)
        hooks = entry.version.bundle.hooks
        if error is None and hooks is not None and hooks.postprocess is not None:
            self._start(entry, self._run_postprocess, value)
        elif error is not None:
            self._end(entry, error=error)
        else:
            self._end(entry, value=value)

    def _end(
        self, entry: Admitted, *, value: Any = None, error: BaseException | None = None
    ) -> None:
        if entry.stage is _Stage.DONE:
            return  # withdrawn meanwhile
        entry.stage = _Stage.DONE
        self._finish_version(entry)
        if error is not None:
            entry.answer.fail(error)
        else:
            entry.answer.resolve(value)

    def _finish_version(self, entry: Admitted) -> None:
        if not entry.finished:
            entry.finished = True
            actions = self._versions.finish(entry.version)
            if actions:
                self._lifecycle.carry_out(actions)

    def withdraw(self, entry: object) -> None:
        """The caller gave up on what :meth:`begin` returned (module docstring); nothing
        will settle its answer."""
        assert isinstance(entry, Admitted)
        stage = entry.stage
        entry.stage = _Stage.DONE
        if stage is _Stage.QUEUED and entry.request is not None:
            self._scheduler.withdraw(entry.request)
            entry.request = None
        elif stage is _Stage.GATED:
            self._gated.get(entry.version, {}).pop(entry, None)
        elif stage is _Stage.TASK and entry.scope is not None:
            entry.scope.cancel()
        self._finish_version(entry)

    # ------------------------------------------------------------------ tasks

    def _start(self, entry: Admitted, body: Any, *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError("Serving.run is not running: hooks and meta models need it")
        entry.stage = _Stage.TASK
        self._nursery.start_soon(self._task, entry, body, *args)

    async def _task(self, entry: Admitted, body: Any, *args: Any) -> None:
        """Run one hook or meta step of ``entry`` under its deadline; settle its answer
        unless it was withdrawn. Nothing escapes to the nursery but cancellation."""
        if entry.stage is not _Stage.TASK:
            return  # withdrawn before the task started
        with trio.CancelScope(deadline=entry.deadline) as scope:
            entry.scope = scope
            started = trio.current_time()
            try:
                await body(entry, *args)
            except trio.Cancelled:
                if entry.stage is _Stage.TASK and not scope.cancel_called:
                    # Cancelled from outside: the worker is shutting down.
                    self._end(entry, error=Unavailable(SHUTTING_DOWN))
                raise
            except Exception as exc:
                self._end(entry, error=exc)
        entry.scope = None
        if scope.cancelled_caught and entry.stage is _Stage.TASK:
            self._end(
                entry,
                error=DeadlineExceeded(
                    f"model {entry.model!r}: deadline passed after "
                    f"{trio.current_time() - started:.3f} s"
                ),
            )

    async def _run_meta(self, entry: Admitted) -> None:
        meta = entry.version
        assert isinstance(meta, MetaModel)
        result = await self.meta_runner.run(meta, entry.inputs, entry.deadline)
        self._end(entry, value=result)

    async def _run_preprocess(self, entry: Admitted) -> None:
        served = entry.version
        assert isinstance(served, ServedModel)
        bundle = served.bundle
        inputs = await self._hook_thread(
            hooks_mod.run_preprocess,
            entry.model,
            bundle.hooks,
            dict(entry.inputs),
            bundle.inputs,
            entry.rows,
        )
        if entry.stage is _Stage.TASK:
            entry.scope = None
            self._enqueue(entry, inputs)

    async def _run_postprocess(self, entry: Admitted, result: Mapping[str, Any]) -> None:
        served = entry.version
        assert isinstance(served, ServedModel)
        bundle = served.bundle
        result = await self._hook_thread(
            hooks_mod.run_postprocess,
            entry.model,
            bundle.hooks,
            dict(result),
            bundle.client_outputs,
            entry.rows,
        )
        self._end(entry, value=result)

    # ------------------------------------------------------------------ Trio callers

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        """begin -> wait -> finish for a Trio caller (a meta model's ``ctx.infer``,
        tests): the result, or raise the error. Cancelling the caller withdraws it."""
        done = trio.Event()
        answer = Answer(done.set)
        entry = self.begin(model, inputs, outputs, deadline, answer, committed=committed)
        try:
            await done.wait()
        except BaseException:
            if not answer.settled:
                self.withdraw(entry)
            raise
        result: Mapping[str, Any] = answer.result()
        return result


def _no_rows(version: ServedModel, requested: Sequence[str]) -> dict[str, np.ndarray]:
    """The answer to a request of zero rows: each requested output (all when none is
    named) at zero rows, or the refusal when an output's other extents are variable."""
    outputs = [s for s in version.outputs if not requested or s.name in requested]
    for spec in outputs:
        if any(d < 0 for d in spec.shape[1:]):
            raise InvalidArgument(
                f"model {version.name!r}: a request of zero rows cannot be answered without "
                f"running the model: output {spec.name!r} has shape {list(spec.shape)}, and "
                "only a run says its variable extents; send at least one row"
            )
    return {s.name: np.empty(s.with_batch(0), dtype=s.numpy_dtype) for s in outputs}

"""Meta models: Python glue between compiled stages, each stage re-entering the scheduler.

Theory of operation
-------------------
A ``kind: meta`` bundle is a ``manifest.yaml`` (the client-facing tensors and the
``calls`` it may make) and a ``model.py`` defining ``async def run(inputs, ctx)``. It
has no artifact, no weights and no queue of its own. A request for it runs like this:

1. **Gate.** The request waits for one of ``scheduler.meta_concurrency`` slots
   (:class:`MetaRunner`), at most until its deadline. A meta with an empty ``calls``
   list never touches the device and skips the gate.
2. **Glue.** ``run(inputs, ctx)`` is awaited *on the request's own Trio task* (the
   RPC's), never on the dispatch loop, so the device keeps executing other models'
   batches while the glue runs. Blocking work belongs in ``await ctx.run_sync(fn,
   ...)``, which runs ``fn`` in a worker thread and leaves the event loop free.
3. **Sub-calls.** ``await ctx.infer(model, inputs, outputs=None)`` goes through the
   worker's normal model path (the callee's model.py hooks, its batching, its
   statistics) as a *committed* request: it is dispatched ahead of whatever the
   discipline would pick next and is never shed for EDF laxity, only for a deadline
   that has really passed. It inherits the meta request's deadline. A meta request
   has at most one sub-call in the scheduler at a time (concurrent ``ctx.infer``
   calls of one request take turns), which is what bounds the committed work in the
   queues by ``meta_concurrency`` and keeps the queue-cap bypass of committed work
   sound. To run many inputs through a stage, send them as one batched sub-call.
4. **Answer.** ``run`` returns a mapping holding every client output; it is checked
   against the manifest like a postprocess hook's result.

Cancellation is structural: the client going away or the deadline passing cancels
the request's task, which cancels ``run`` at its next ``await``, which withdraws a
queued sub-call (it never executes). Errors (see :func:`_sub_call_error`):

* calling a model that is not in ``calls``, a callee that is itself a meta model,
  malformed sub-call inputs or an unknown requested output are the bundle's bugs:
  ``ExecutionFailed`` (INTERNAL) naming the meta model and the callee;
* a callee that is not loaded or not ready: ``Unavailable`` naming it;
* the callee's own failures keep their category (deadline, queue full, execution
  failed), prefixed with the meta model and the callee;
* any other exception raised by ``run`` becomes ``ExecutionFailed`` (INTERNAL) and is
  logged with its traceback and the model's name. It ends that request only.

Readiness of a meta model is computed when asked (:meth:`MetaModel.ready`) from the
host's current table: every callee must be a loaded, ready, compiled model. Models
coming and going therefore change it without any bookkeeping. The worker refuses at
load a meta whose ``calls`` name a meta model (loaded, or on disk).

JAX-free.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import trio

from . import tensors
from .bundle import MANIFEST_FILE, Bundle, TensorSpec
from .bundle.manifest import load_yaml
from .config.schema import Residency
from .errors import (
    BundleError,
    DeadlineExceeded,
    ExecutionFailed,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    ResourceExhausted,
    Unavailable,
)

# The same result check the postprocess hook gets; run's outputs are client tensors too.
from .hooks import check_result
from .host import HostedModel
from .records import Duration, ExecutionStatistics, ModelControlInfo

log = logging.getLogger(__name__)

#: ``platform``/``backend`` reported for meta models (ModelMetadata, ModelConfig).
META_PLATFORM = "meta"


class MetaHost(Protocol):
    """What the runner needs from the worker: its model table and its model path."""

    def get(self, name: str) -> HostedModel:
        """The loaded model ``name``; raises ``NotFound`` (or ``Unavailable``) otherwise."""
        ...

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        """Run one validated request on a compiled model (hooks, scheduler, statistics)."""
        ...


# ------------------------------------------------------------------------------ the model


class MetaModel:
    """A loaded ``kind: meta`` bundle, as clients see it (implements ``HostedModel``).

    ``callee_problem(name)`` is asked at ``ready()`` time for each declared callee and
    returns why it cannot be called now (``None`` when it can).
    """

    def __init__(
        self,
        bundle: Bundle,
        *,
        generation: int,
        callee_problem: Callable[[str], str | None],
    ) -> None:
        if not bundle.is_meta or bundle.hooks is None or bundle.hooks.run is None:
            raise BundleError(bundle.name, "not a kind: meta bundle with a model.py run()")
        self.bundle = bundle
        self.generation = generation
        self.run_fn: Callable[..., Any] = bundle.hooks.run
        self._callee_problem = callee_problem
        self._queue = Duration()
        self._infer = Duration()
        #: Completed sub-calls and the time spent inside them (queueing included).
        self.sub_calls = Duration()

    # -------------------------------------------------------------- HostedModel

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def version(self) -> str:
        return ""

    @property
    def platform(self) -> str:
        return META_PLATFORM

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self.bundle.client_inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self.bundle.client_outputs

    @property
    def max_batch_size(self) -> int:
        # One request is one run of the glue: nothing is coalesced across requests.
        return 0

    @property
    def compiled_batch_sizes(self) -> Sequence[int]:
        return ()

    @property
    def max_queue_depth(self) -> int:
        return 0

    @property
    def calls(self) -> tuple[str, ...]:
        return self.bundle.manifest.calls

    @property
    def parameters(self) -> Mapping[str, str]:
        return {
            "kind": "meta",
            "calls": ",".join(self.calls),
            "generation": str(self.generation),
        }

    def ready(self) -> tuple[bool, str]:
        for callee in self.calls:
            problem = self._callee_problem(callee)
            if problem is not None:
                return False, problem
        return True, ""

    def statistics(self) -> ExecutionStatistics:
        """Gate waits as ``queue``, successful runs of the glue as ``compute_infer``.

        A meta request is one "row" and one "execution": it has no batch. The device
        time of its sub-calls is in the callees' own statistics.
        """
        return ExecutionStatistics(
            queue=self._queue,
            compute_infer=self._infer,
            inference_count=self._infer.count,
            execution_count=self._infer.count,
        )

    def record_sub_call(self, seconds: float) -> None:
        self.sub_calls = self.sub_calls.plus(seconds)

    def record_run(self, gate_seconds: float, run_seconds: float) -> None:
        """Account one successful request: its wait at the gate and its run time."""
        self._queue = self._queue.plus(gate_seconds)
        self._infer = self._infer.plus(run_seconds)

    def __repr__(self) -> str:
        return f"<MetaModel {self.name!r} generation={self.generation}>"


#: Residency floors from the least to the most resident.
_RESIDENCY_ORDER: tuple[Residency, ...] = ("unpinned", "system", "device")


def weakest_residency(floors: Sequence[Residency]) -> Residency:
    """The least resident of ``floors``: a pipeline is as resident as its weakest stage."""
    return min(floors, key=_RESIDENCY_ORDER.index) if floors else "unpinned"


def meta_control_info(meta: MetaModel, subs: Sequence[ModelControlInfo]) -> ModelControlInfo:
    """A meta model as ModelControlStatus lists it, from its loaded callees' entries.

    Footprint and residency are those of the callees (weights summed, the weakest
    residency, resident only when all are); compute is the time inside its sub-calls;
    a meta request is one row and has no batch axis (docs/protocol.md).
    """
    served = meta.statistics().execution_count
    return ModelControlInfo(
        name=meta.name,
        residency=weakest_residency([s.residency for s in subs]),
        device_resident=bool(subs) and all(s.device_resident for s in subs),
        host_resident=bool(subs) and all(s.host_resident for s in subs),
        weight_nbytes=sum(s.weight_nbytes for s in subs),
        weight=max((s.weight for s in subs), default=1.0),
        queue_depth=sum(s.queue_depth for s in subs),
        total_compute_seconds=meta.sub_calls.ns / 1e9,
        requests_served=served,
        dispatch_count=meta.sub_calls.count,
        max_batch_size=0,
        rows_served=served,
    )


def declared_kind(path: Path) -> str | None:
    """The ``kind`` a bundle directory's manifest declares (None if unreadable).

    Cheap on purpose (no validation, no model.py import): the worker uses it to refuse
    a meta model that calls a meta bundle which is on disk but not loaded yet.
    """
    try:
        text = (path / MANIFEST_FILE).read_text(encoding="utf-8")
        data = load_yaml(path.name, text)
    except (OSError, UnicodeDecodeError, BundleError):
        return None
    if not isinstance(data, Mapping):
        return None
    kind = data.get("kind", "model")
    return kind if isinstance(kind, str) else None


# ------------------------------------------------------------------------------ the context


class MetaContext:
    """The ``ctx`` a meta model's ``run(inputs, ctx)`` receives, one per request."""

    def __init__(
        self, meta: MetaModel, host: MetaHost, *, deadline: float, threads: trio.CapacityLimiter
    ) -> None:
        self._meta = meta
        self._host = host
        self._threads = threads
        self._turn = trio.Lock()
        #: Absolute ``trio.current_time()`` by which the request must be answered
        #: (``inf``: none). Every sub-call carries it.
        self.deadline = deadline

    @property
    def model(self) -> str:
        """The meta model's name."""
        return self._meta.name

    @property
    def calls(self) -> tuple[str, ...]:
        """The models this meta model may call (its manifest's ``calls``)."""
        return self._meta.calls

    def remaining(self) -> float:
        """Seconds left until the deadline (``inf`` without one)."""
        return self.deadline - trio.current_time()

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` through the compiled model ``model``; its outputs by name.

        ``outputs`` selects outputs (all of them, in declaration order, by default).
        See the module docstring for scheduling, deadline and error semantics.
        """
        meta = self._meta.name
        where = f"model {meta!r}: model.py run: ctx.infer({model!r})"
        if model not in self._meta.calls:
            declared = ", ".join(self._meta.calls) or "none"
            raise ExecutionFailed(
                f"{where}: {model!r} is not in the manifest's calls (declared: {declared}); "
                "add it there"
            )
        try:
            callee = self._host.get(model)
        except (NotFound, Unavailable) as exc:
            raise Unavailable(
                f"model {meta!r}: its callee {model!r} is unavailable: {exc}"
            ) from None
        if isinstance(callee, MetaModel):
            raise ExecutionFailed(
                f"{where}: {model!r} is itself a meta model; meta models call compiled models only"
            )
        ready, reason = callee.ready()
        if not ready:
            raise Unavailable(f"model {meta!r}: its callee {model!r} is not ready: {reason}")
        checked = check_sub_call_inputs(where, callee.inputs, inputs)
        wanted = _wanted_outputs(where, callee.outputs, outputs)
        async with self._turn:
            # Checked here, after waiting for the turn, so a sub-call never starts
            # with its time already up.
            if trio.current_time() >= self.deadline:
                raise DeadlineExceeded(
                    f"model {meta!r}: the deadline passed before the sub-call to {model!r}"
                )
            started = trio.current_time()
            try:
                result = await self._host.infer(
                    model, checked, wanted, self.deadline, committed=True
                )
            except RequestError as exc:
                raise _sub_call_error(meta, model, exc) from exc
            self._meta.record_sub_call(trio.current_time() - started)
        return {name: np.asarray(result[name]) for name in wanted}

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread: blocking glue without stalling the server.

        Like ``trio.to_thread.run_sync``: cancelling the request waits for ``fn`` to
        return (a thread cannot be interrupted), then raises.
        """
        return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)


def check_sub_call_inputs(
    where: str, specs: Sequence[TensorSpec], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Validate glue-made inputs against the callee's client inputs; C-contiguous arrays.

    Anything wrong is the meta bundle's bug, hence ``ExecutionFailed`` (INTERNAL).
    """
    if not isinstance(inputs, Mapping):
        raise ExecutionFailed(
            f"{where}: inputs must be a dict of numpy arrays, got {type(inputs).__name__}"
        )
    names = [s.name for s in specs]
    unknown = sorted(set(map(str, inputs)) - set(names))
    if unknown:
        raise ExecutionFailed(
            f"{where}: unknown input(s) {', '.join(map(repr, unknown))}; the model takes "
            f"{', '.join(names)}"
        )
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name not in inputs:
            raise ExecutionFailed(f"{where}: input {spec.name!r} is missing")
        arr = np.asarray(inputs[spec.name])
        if spec.datatype == "BYTES":
            ok = arr.dtype.kind in "OSU"
            arr = arr.astype(object) if ok else arr
        else:
            ok = arr.dtype == spec.numpy_dtype
        if not ok:
            raise ExecutionFailed(
                f"{where}: input {spec.name!r} is {arr.dtype}, expected {spec.datatype}"
                + ("" if spec.datatype == "BYTES" else f" ({np.dtype(spec.numpy_dtype)})")
            )
        if not tensors.shape_matches(spec.shape, arr.shape):
            raise ExecutionFailed(
                f"{where}: input {spec.name!r} has shape {list(arr.shape)}, expected "
                f"{list(spec.shape)} (-1: any extent)"
            )
        out[spec.name] = np.ascontiguousarray(arr)
    return out


def _wanted_outputs(
    where: str, specs: Sequence[TensorSpec], outputs: Sequence[str] | None
) -> list[str]:
    names = [s.name for s in specs]
    if outputs is None:
        return names
    if isinstance(outputs, str):
        raise ExecutionFailed(
            f"{where}: outputs must be a list of names, got the string {outputs!r}"
        )
    unknown = [o for o in outputs if o not in names]
    if unknown:
        raise ExecutionFailed(
            f"{where}: unknown output(s) {', '.join(map(repr, unknown))}; the model has "
            f"{', '.join(names)}"
        )
    return list(dict.fromkeys(outputs))


def _sub_call_error(meta: str, callee: str, exc: RequestError) -> RequestError:
    """The error the meta request fails with when a sub-call fails with ``exc``."""
    prefix = f"model {meta!r}: sub-call to {callee!r}"
    if isinstance(exc, InvalidArgument):
        # The callee refused what the glue made of the client's request.
        return ExecutionFailed(f"{prefix} was refused: {exc}")
    if isinstance(exc, NotFound):
        return Unavailable(f"{prefix}: the model is no longer loaded ({exc})")
    for category in (DeadlineExceeded, Unavailable, ResourceExhausted, FailedPrecondition):
        if isinstance(exc, category):
            return category(f"{prefix}: {exc}")
    return ExecutionFailed(f"{prefix} failed: {exc}")


# ------------------------------------------------------------------------------ the runner


@attrs.frozen
class MetaStatistics:
    """The gate of meta requests, for metrics and tests."""

    #: ``scheduler.meta_concurrency``.
    limit: int
    #: Meta requests running their glue now (gate holders).
    running: int
    #: Meta requests waiting for a slot.
    waiting: int
    #: Meta requests that failed because ``run`` raised (not counting sub-call errors).
    run_errors: int


class MetaRunner:
    """Runs meta requests under the ``meta_concurrency`` gate (see the module docstring)."""

    def __init__(self, host: MetaHost, *, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("meta_concurrency must be >= 1")
        self._host = host
        self._limit = concurrency
        self._gate = trio.Semaphore(concurrency)
        # Threads for ctx.run_sync: as many as requests that may run glue at once, so
        # one meta request's blocking glue never waits for another's.
        self._threads = trio.CapacityLimiter(concurrency)
        self._waiting = 0
        self._running = 0
        self._run_errors = 0

    def statistics(self) -> MetaStatistics:
        return MetaStatistics(
            limit=self._limit,
            running=self._running,
            waiting=self._waiting,
            run_errors=self._run_errors,
        )

    async def run(
        self,
        meta: MetaModel,
        inputs: Mapping[str, np.ndarray],
        deadline: float = math.inf,
    ) -> Mapping[str, Any]:
        """Answer one meta request (inputs already validated against ``meta.inputs``)."""
        arrived = trio.current_time()
        if not meta.calls:
            # Compute-only glue never reaches the device: nothing for the gate to protect.
            return await self._run(meta, inputs, deadline, arrived)
        self._waiting += 1
        try:
            with trio.move_on_at(deadline) as waited:
                await self._gate.acquire()
        finally:
            self._waiting -= 1
        if waited.cancelled_caught:
            raise DeadlineExceeded(
                f"model {meta.name!r}: deadline passed after {trio.current_time() - arrived:.3f} s "
                f"waiting for one of scheduler.meta_concurrency={self._limit} meta slots"
            )
        try:
            return await self._run(meta, inputs, deadline, arrived)
        finally:
            self._gate.release()

    async def _run(
        self,
        meta: MetaModel,
        inputs: Mapping[str, np.ndarray],
        deadline: float,
        arrived: float,
    ) -> Mapping[str, Any]:
        started = trio.current_time()
        ctx = MetaContext(meta, self._host, deadline=deadline, threads=self._threads)
        self._running += 1
        try:
            try:
                result = await meta.run_fn(dict(inputs), ctx)
            except RequestError:
                raise  # ours: from a sub-call, or raised on purpose by the glue
            except Exception as exc:
                self._run_errors += 1
                log.error(
                    "meta model %r: model.py run raised %s (request failed; the model stays "
                    "loaded)",
                    meta.name,
                    type(exc).__name__,
                    exc_info=exc,
                )
                raise ExecutionFailed(
                    f"model {meta.name!r}: model.py run raised {type(exc).__name__}: {exc}"
                ) from exc
        finally:
            self._running -= 1
        outputs = check_result(meta.name, "run", result, meta.outputs, None)
        meta.record_run(started - arrived, trio.current_time() - started)
        return outputs

"""The ``ctx`` a meta model's glue receives: sub-calls into the worker's model path.

:meth:`MetaContext.infer` checks what the glue made (the callee is declared, compiled and
ready; the inputs match its client inputs; the outputs exist), takes the request's turn
-- one sub-call of a meta request in the scheduler at a time -- and re-enters the
worker's model path as a *committed* request carrying the meta request's deadline. A
sub-call's failure becomes the meta request's, prefixed with both names
(:func:`_sub_call_error`). See the package docstring for the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import trio

from .. import tensors
from ..bundle import TensorSpec
from ..errors import (
    DeadlineExceeded,
    ExecutionFailed,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RequestError,
    ResourceExhausted,
    Unavailable,
)
from ..host import HostedModel
from .model import MetaModel

__all__ = ["MetaContext", "MetaHost", "check_sub_call_inputs"]


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

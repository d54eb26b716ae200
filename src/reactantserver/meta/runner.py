"""Running meta requests under the ``scheduler.meta_concurrency`` gate.

:class:`MetaRunner` admits a meta request to one of ``meta_concurrency`` slots (at most
until its deadline; a meta model that calls nothing skips the gate), runs its glue with a
fresh :class:`~reactantserver.meta.context.MetaContext`, checks the outputs like a
postprocess hook's, and counts what happened (:class:`MetaStatistics`). An exception the
glue raises that is not one of ours fails that request only, logged with its traceback.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import trio

from ..errors import DeadlineExceeded, ExecutionFailed, RequestError

# The same result check the postprocess hook gets; run's outputs are client tensors too.
from ..hooks import check_result
from .context import MetaContext, MetaHost
from .model import MetaModel

__all__ = ["MetaRunner", "MetaStatistics"]

# One logger for meta models (operators filter on "reactantserver.meta").
log = logging.getLogger(__package__)


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

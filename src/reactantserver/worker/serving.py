"""The request side of the model host: lookup, the repository index, and one request's path.

Theory of operation
-------------------
:meth:`Serving.infer` is the worker's half of ModelInfer, after the service has found the
model and validated the request. Every request -- a client's, a pre/post-processed one, a
meta model's, and each of a meta model's sub-calls -- goes through the same path:

1. **Admission** (``ModelVersions.admit``, synchronous): the name's serving version, which
   from now on counts the request as outstanding, or the refusal (NOT_FOUND while it is
   unloaded or failed, UNAVAILABLE while it loads). The version is what the request
   runs on, whatever swaps happen meanwhile.
2. A meta model's request runs its glue (``reactantserver.meta.MetaRunner``); each
   sub-call comes back to step 1 as a *committed* request.
3. **The gate**: a request admitted to a version that batches differently from an older
   one still draining waits until the scheduler has switched (``until_open``).
4. ``preprocess`` (in a hook thread), then the scheduler (``Scheduler.submit``, with the
   version as the batch group and the request's rows and deadline).
5. **Finish** (``ModelVersions.finish``, synchronous, whatever the outcome): the actions
   that became due -- retire a drained version, switch a gate -- go to the lifecycle
   driver. Then ``postprocess`` (in a hook thread).

Steps 1, 3's check and 5 are synchronous calls on the policy, so a future request path
that admits and submits without awaiting (issue 16) keeps exactly these semantics.

Hooks run in worker threads of their own limiter, never on the event loop and never
queued behind the device thread, so a slow hook delays only its own request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import hooks as hooks_mod
from ..errors import ExecutionFailed, InvalidArgument
from ..host import HostedModel
from ..lifecycle import ModelVersions, index_view
from ..meta import MetaModel, MetaRunner
from ..models import ServedModel
from ..records import IndexEntry
from ..runtime.assemble import request_rows
from ..scheduling import Scheduler
from ..threads import ThreadRunner
from .build import Version
from .lifecycle import LifecycleDriver

__all__ = ["Serving"]


class Serving:
    """Lookup, index and the request path over the model versions (module docstring)."""

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
        #: Runs meta requests under the ``meta_concurrency`` gate; its host is this path.
        self.meta_runner = MetaRunner(self, concurrency=meta_concurrency)

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
            entries.append(IndexEntry(name, "", state, reason))
        return entries

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        *,
        committed: bool = False,
    ) -> Mapping[str, Any]:
        """One validated request (see the module docstring). ``committed``: a meta model's
        sub-call, dispatched ahead of the discipline's choice and never shed for EDF
        laxity."""
        versions = self._versions
        version = versions.admit(model)
        try:
            if isinstance(version, MetaModel):
                if committed:  # the meta context refuses this first; never nest glue
                    raise ExecutionFailed(
                        f"model {model!r} is a meta model; it cannot be a sub-call"
                    )
                return await self.meta_runner.run(version, inputs, deadline)
            rows: int | None = None
            if version.batched:
                try:
                    rows = request_rows(inputs)
                except ValueError as exc:
                    raise InvalidArgument(f"model {model!r}: {exc}") from None
            if versions.gated(version):
                await self._lifecycle.until_open(version)  # the previous version drains
            result = await self._submit(version, inputs, rows, deadline, committed=committed)
        finally:
            actions = versions.finish(version)
            if actions:
                self._lifecycle.carry_out(actions)
        hooks = version.bundle.hooks
        if hooks is not None and hooks.postprocess is not None:
            result = await self._hook_thread(
                hooks_mod.run_postprocess,
                model,
                hooks,
                dict(result),
                version.bundle.client_outputs,
                rows,
            )
        return result

    async def _submit(
        self,
        served: ServedModel,
        inputs: Mapping[str, np.ndarray],
        rows: int | None,
        deadline: float,
        *,
        committed: bool,
    ) -> Mapping[str, Any]:
        """Preprocess (a hook thread) and queue one request on ``served``; its raw outputs."""
        model = served.name
        bundle = served.bundle
        hooks = bundle.hooks
        exe_inputs: Mapping[str, np.ndarray] = inputs
        if hooks is not None and hooks.preprocess is not None:
            exe_inputs = await self._hook_thread(
                hooks_mod.run_preprocess, model, hooks, dict(inputs), bundle.inputs, rows
            )
        result: Mapping[str, Any] = await self._scheduler.submit(
            model,
            exe_inputs,
            rows=rows or 1,
            deadline=None if math.isinf(deadline) else deadline,
            group=served,
            committed=committed,
        )
        return result

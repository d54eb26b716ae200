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
queued sub-call (it never executes). Errors (see :func:`.context._sub_call_error`):

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

Modules: ``model`` (:class:`MetaModel`, how a meta model is listed and how ready it
is), ``context`` (the ``ctx`` its glue receives: sub-calls, their checks and errors),
``runner`` (:class:`MetaRunner`, the ``meta_concurrency`` gate and the run). JAX-free.
"""

from .context import MetaContext, MetaHost, check_sub_call_inputs
from .model import META_PLATFORM, MetaModel, declared_kind, meta_control_info, weakest_residency
from .runner import MetaRunner, MetaStatistics

__all__ = [
    "META_PLATFORM",
    "MetaContext",
    "MetaHost",
    "MetaModel",
    "MetaRunner",
    "MetaStatistics",
    "check_sub_call_inputs",
    "declared_kind",
    "meta_control_info",
    "weakest_residency",
]

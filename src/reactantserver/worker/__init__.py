"""The worker: one process, one device, every service under one Trio nursery.

Wiring and thin drivers over the sans-IO policies, one concern per module:

* ``core``       -- :class:`Worker` builds and connects the parts, runs them under one
  nursery (:meth:`Worker.run`), answers readiness and :meth:`Worker.statistics`;
  :func:`serve` adds signal handling.
* ``serving``    -- lookup, the repository index and one request's path: admission,
  the version gate, hooks, submission to the scheduler, finish.
* ``lifecycle``  -- the driver of ``lifecycle.ModelVersions``: load / unload commands one
  at a time, the version actions (scheduler entries, retirement), the retirement loop.
* ``build``      -- a checked bundle becomes a version: compile (or reuse), weights,
  warm-up.
* ``repository`` -- the startup load and dynamic mode's watcher over
  ``lifecycle.RepositoryWatch``.
* ``control``    -- RepositoryModelLoad / Unload and the control service's RPCs.
* ``grpc``       -- :func:`~reactantserver.worker.grpc.serve_grpc`, the worker's listener:
  a ``GuardedServer`` on the asyncio loop hosting Trio as its guest; ModelInfer queued and
  answered without a Trio task per call.
* ``metas``      -- the worker's side of meta models (what they may call, how they are
  listed, what the model RPCs act on).

See docs/architecture.md for the map of the whole server.
"""

from .core import Worker, WorkerAddress, hook_threads, serve

__all__ = ["Worker", "WorkerAddress", "hook_threads", "serve"]

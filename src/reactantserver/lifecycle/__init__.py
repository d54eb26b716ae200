"""The model lifecycle, sans-IO: states, the repository diff and the versions of each model.

Three policies, one concern each; none touches a file, a clock, a device or an event loop:

* ``states``   -- :class:`ModelTable`, every name's state and the table of legal
  transitions (:data:`TRANSITIONS`);
* ``watch``    -- :class:`RepositoryWatch`, successive repository polls in, debounced
  add / replace / remove :class:`Action` s out;
* ``versions`` -- :class:`ModelVersions`, which version of each name admits requests,
  what each has outstanding, gates and drains, and when a version may be freed; it
  drives the state table and returns the :data:`VersionAction` s the driver carries out.

The drivers are in ``reactantserver.worker`` (the repository watcher and the lifecycle
driver). See docs/lifecycle.md.
"""

from .states import (
    TRANSITIONS,
    LifecycleEvent,
    ModelRecord,
    ModelState,
    ModelTable,
    admits_requests,
    index_view,
)
from .versions import (
    AddToScheduler,
    ModelVersions,
    Rebatch,
    RemoveFromScheduler,
    Retire,
    SeedCosts,
    VersionAction,
)
from .watch import Action, RepositoryWatch, changed_files

__all__ = [
    "TRANSITIONS",
    "Action",
    "AddToScheduler",
    "LifecycleEvent",
    "ModelRecord",
    "ModelState",
    "ModelTable",
    "ModelVersions",
    "Rebatch",
    "RemoveFromScheduler",
    "RepositoryWatch",
    "Retire",
    "SeedCosts",
    "VersionAction",
    "admits_requests",
    "changed_files",
    "index_view",
]

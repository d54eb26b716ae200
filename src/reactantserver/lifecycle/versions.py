"""Model versions, sans-IO: which version of each name admits requests, what each one
has outstanding, and when a replaced or unloaded version may be freed.

This module decides; it never touches a device, a file, a clock or an event loop. The
worker's lifecycle driver (``reactantserver.worker.lifecycle``) builds versions and
carries out what :class:`ModelVersions` returns; the request path asks it to admit and
tells it when a request is answered.

Theory of operation
-------------------
A *version* is one built bundle (the worker's ``ServedModel`` or ``MetaModel``); the
policy only needs it hashable. Per name there is at most one **serving** version, the
one :meth:`ModelVersions.admit` hands out, and any number of **retiring** versions that
were replaced or unloaded and still have requests **outstanding** (counted from
``admit`` to :meth:`ModelVersions.finish`, whatever the outcome). The events::

    begin_load(name)                     the state table's LOAD (a build starts)
    load_failed(name, reason)            the build failed: nothing that serves changes
    loaded(name, version, batching=...)  the build succeeded: swap it in   -> actions
    unload(name)                         stop admitting, drain, free       -> actions
    admit(name)                          a request arrives                 -> version
    gated(version)                       must it wait before it is queued?  -> bool
    finish(version)                      that request was answered         -> actions
    rebatched(version)                   the driver switched the batching  -> actions
    retired(version)                     the driver freed a version        -> ()

The actions are records the driver carries out in order: :class:`AddToScheduler`,
:class:`SeedCosts`, :class:`Rebatch` and :class:`RemoveFromScheduler` are synchronous
calls on the scheduler, done at once by whoever received them (``Rebatch`` is answered
with :meth:`~ModelVersions.rebatched`); :class:`Retire` frees memory in the background
and is answered with :meth:`~ModelVersions.retired`.

The swap rules (``loaded``), by how the new version batches compared with the serving one
(``batching`` is an opaque key: the compiled batch sizes and whether the model has a
batch axis; ``None`` marks a version that has no scheduler entry and holds no device
memory, a ``kind: meta`` model):

* **no serving version**: ``AddToScheduler``; the version admits at once; READY.
* **same batching**: the scheduler entry (queue, weight, learned costs) carries over, so
  queued requests keep running on the version that admitted them; ``SeedCosts``; the new
  version admits at once; READY; the old one is retired when it drains.
* **different batching**: the old version's queued requests must run at the old sizes.
  The new version admits at once, but its requests are **gated**
  (:meth:`~ModelVersions.gated` of the version they were admitted to): the caller waits,
  without being queued, until every older compiled version has drained (not only the one
  it replaced: one replaced before it by a version that batches the same way may still
  have requests to queue at the old sizes; a meta version, whose requests never queue, is
  not waited for);
  then ``Rebatch`` switches the scheduler entry, ``rebatched`` opens the gate, the swap
  completes (READY) and the old version is retired. While gated the name stays RELOADING,
  so no other lifecycle operation on it can start.
* **nothing to schedule** (``None``): nothing waits; a replaced meta version is simply
  forgotten when its last request finishes.

Unloading (``unload``) stops admission at once (DRAINING); when every compiled version
of the name has drained the scheduler entry is removed, and once the driver has freed the
last of them the name is UNLOADED. A ``None`` version holds nothing, so its name is UNLOADED
at once (requests already running keep their version and finish).

Refusals: ``admit`` and :meth:`~ModelVersions.serving` of a name with no serving version
raise ``Unavailable`` while it loads and ``NotFound`` otherwise, saying why (failed, being
unloaded, not loaded).

Invariants (``tests/lifecycle/test_lifecycle_versions.py`` checks each after every step):

1. A request admitted to a version is answered by that version: a version is never
   freed while it has requests outstanding, and a gated request is released only once
   the scheduler entry batches the way its version does.
2. No version is freed while it has outstanding requests, and none is freed twice.
3. At most one version of a name admits new requests; a retiring version never does.
4. A failed build never replaces a serving version.
5. Every replaced or unloaded version is eventually retired: once nothing is
   outstanding and the driver has carried out every action, the only versions left are
   the serving ones.

Hot path: ``admit``, ``gated`` and ``finish`` are a dictionary lookup and an integer
update each; ``finish`` allocates nothing unless the version is retiring and drained.

Why one module of this size: one class holds every rule of the version table, and the
invariants are about its fields together; the states have their own module.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeAlias, TypeVar

import attrs

from ..errors import BundleError, LifecycleError, NotFound, ReactantError, Unavailable, quoted
from ..names import did_you_mean
from .states import LifecycleEvent, ModelRecord, ModelState, ModelTable, admits_requests

__all__ = [
    "AddToScheduler",
    "ModelVersions",
    "Rebatch",
    "RemoveFromScheduler",
    "Retire",
    "SeedCosts",
    "VersionAction",
]

V = TypeVar("V", bound=Hashable)

_E = LifecycleEvent

#: Why a bundle cannot replace a model of the other kind under the same name.
_KIND_CHANGE = (
    "kind: {new} cannot replace the kind: {old} model serving under this name; unload it "
    "(or remove its directory and wait for the unload) first"
)


# ------------------------------------------------------------------------------ actions


@attrs.frozen
class AddToScheduler(Generic[V]):
    """The first version of its name: add the scheduler entry with the version's batching
    and seed its costs. Carried out before anything else can run (the version admits)."""

    version: V


@attrs.frozen
class SeedCosts(Generic[V]):
    """A replacement batching like the serving version: the scheduler entry carries over;
    seed it with the new version's warm-up costs."""

    version: V


@attrs.frozen
class Rebatch(Generic[V]):
    """The old version drained: switch the name's scheduler entry to this version's batching
    and seed its costs, then report :meth:`ModelVersions.rebatched` (it opens the gate)."""

    version: V


@attrs.frozen
class RemoveFromScheduler:
    """Every version of an unloading name drained: drop the name's scheduler entry."""

    name: str


@attrs.frozen
class Retire(Generic[V]):
    """The version admits nothing and has nothing outstanding: free its memory, then report
    :meth:`ModelVersions.retired`."""

    version: V


VersionAction: TypeAlias = (
    AddToScheduler[V] | SeedCosts[V] | Rebatch[V] | RemoveFromScheduler | Retire[V]
)

#: The usual answer: nothing to do (one shared empty tuple, no allocation).
_NONE: tuple[Any, ...] = ()


# ------------------------------------------------------------------------------ the table


class _Version(Generic[V]):
    """What the policy knows of one live version (serving or retiring)."""

    __slots__ = ("batching", "name", "outstanding", "retiring", "version")

    def __init__(self, name: str, version: V, batching: Hashable | None) -> None:
        self.name = name
        self.version = version
        #: Opaque batching key; ``None``: no scheduler entry, no device memory.
        self.batching = batching
        self.outstanding = 0
        #: Replaced or unloaded: admits nothing; retired once drained.
        self.retiring = False


class ModelVersions(Generic[V]):
    """The versions of every model name and their lifecycle (see the module docstring)."""

    def __init__(self) -> None:
        self._states = ModelTable()
        #: name -> the serving version (only names in READY or RELOADING have one).
        self._serving: dict[str, _Version[V]] = {}
        #: name -> serving version object, kept in step with ``_serving``, and its view.
        self._current: dict[str, V] = {}
        self._current_view = MappingProxyType(self._current)
        #: Every live version (serving or retiring) -> its record.
        self._versions: dict[V, _Version[V]] = {}
        #: name -> its live versions, oldest first.
        self._by_name: dict[str, list[_Version[V]]] = {}
        #: name -> the old version whose drain gates the serving one (different batching).
        self._gates: dict[str, _Version[V]] = {}
        #: name -> whether its scheduler entry is already removed (names being unloaded).
        self._unloading: dict[str, bool] = {}

    # ------------------------------------------------------------------ queries

    @property
    def states(self) -> ModelTable:
        """The lifecycle state of every name (read it; only this class changes it)."""
        return self._states

    @property
    def current(self) -> Mapping[str, V]:
        """name -> its serving version (a read-only view that follows every change)."""
        return self._current_view

    def state(self, name: str) -> ModelState:
        return self._states.state(name)

    def record(self, name: str) -> ModelRecord:
        return self._states.get(name)

    def serving(self, name: str) -> V:
        """The version serving ``name`` (nothing is admitted); the refusal otherwise."""
        entry = self._serving.get(name)
        if entry is None:
            raise self._refusal(name)
        return entry.version

    def gated(self, version: V) -> bool:
        """Whether a request admitted to ``version`` must wait before it is queued: the
        version serves its name, and an older one that batches differently still drains.

        A request waits only for the gate of its own version: once that version has been
        replaced in turn, its requests run at the batch sizes it was built for, which the
        scheduler keeps until it has drained.
        """
        if not self._gates:  # the usual case: no swap to other batch sizes anywhere
            return False
        entry = self._versions.get(version)
        return (
            entry is not None
            and entry.name in self._gates
            and self._serving.get(entry.name) is entry
        )

    def gate_open(self, name: str) -> bool:
        """Whether no swap of ``name`` to other batch sizes is waiting for a drain."""
        return name not in self._gates

    def outstanding(self, version: V) -> int:
        """Requests admitted to ``version`` and not finished yet (0 once it is gone)."""
        entry = self._versions.get(version)
        return entry.outstanding if entry is not None else 0

    def versions(self, name: str) -> tuple[V, ...]:
        """Every live version of ``name`` (serving and retiring), oldest first."""
        return tuple(e.version for e in self._by_name.get(name, ()))

    def settled(self, name: str) -> bool:
        """Whether the last lifecycle operation on ``name`` is complete: no build started,
        no gated swap and no unload waiting for a drain or for memory to be freed."""
        return self.state(name) not in (
            ModelState.LOADING,
            ModelState.RELOADING,
            ModelState.DRAINING,
        )

    # ------------------------------------------------------------------ requests

    def admit(self, name: str) -> V:
        """Admit one request to the serving version of ``name``; ``finish`` must follow.

        Raises the refusal (``NotFound``, ``Unavailable``) when nothing serves the name.
        When :meth:`gated` is true for the version, the caller waits until it is not before
        it queues the request (the request already counts as outstanding, so nothing that
        would free its version can happen meanwhile).
        """
        entry = self._serving.get(name)
        if entry is None:
            raise self._refusal(name)
        entry.outstanding += 1
        return entry.version

    def finish(self, version: V) -> tuple[VersionAction[V], ...]:
        """One request admitted to ``version`` was answered (or failed, or was cancelled).

        Returns the actions that became due: none unless ``version`` was retiring and this
        was its last outstanding request.
        """
        entry = self._versions[version]
        left = entry.outstanding - 1
        if left < 0:
            raise LifecycleError(f"model {entry.name!r}: finish() without an admission")
        entry.outstanding = left
        if left or not entry.retiring:
            return _NONE
        return self._drained(entry)

    # ---------------------------------------------------------------- lifecycle

    def declare(self, name: str) -> None:
        """List ``name`` as known but not loaded (explicit mode's repository entries)."""
        self._states.declare(name)

    def forget(self, name: str) -> None:
        """Drop an ``UNLOADED`` name (its directory is gone from the repository)."""
        self._states.forget(name)

    def begin_load(self, name: str) -> None:
        """A build of a new version of ``name`` starts (LOADING, or RELOADING while the
        current version serves)."""
        self._states.apply(name, _E.LOAD)

    def check_replaceable(self, name: str, *, meta: bool) -> None:
        """``BundleError`` when a bundle of the other kind would replace the serving version
        (a compiled model and a meta model never swap in place)."""
        entry = self._serving.get(name)
        if entry is None or (entry.batching is None) == meta:
            return
        old, new = ("model", "meta") if meta else ("meta", "model")
        raise BundleError(name, _KIND_CHANGE.format(old=old, new=new))

    def load_failed(self, name: str, reason: str) -> None:
        """The build failed: whatever serves ``name`` keeps serving; the reason is kept."""
        self._states.apply(name, _E.LOAD_FAILED, reason or "unknown error")

    def loaded(
        self, name: str, version: V, *, batching: Hashable | None
    ) -> tuple[VersionAction[V], ...]:
        """``version`` of ``name`` was built and warmed up: it becomes the serving version.

        Returns the actions to carry out now, in order (the swap rules are in the module
        docstring). ``batching`` is ``None`` for a version that has no scheduler entry
        and holds no device memory.
        """
        if self.state(name) not in (ModelState.LOADING, ModelState.RELOADING):
            raise LifecycleError(f"model {name!r}: loaded() without begin_load()")
        if version in self._versions:
            raise LifecycleError(f"model {name!r}: this version was loaded already")
        old = self._serving.get(name)
        if old is not None and (old.batching is None) != (batching is None):
            raise LifecycleError(f"model {name!r}: a version of the other kind serves it")
        entry = _Version(name, version, batching)
        self._versions[version] = entry
        self._by_name.setdefault(name, []).append(entry)
        self._serving[name] = entry
        self._current[name] = version
        if old is None:
            self._states.apply(name, _E.LOADED)
            return (AddToScheduler(version),) if batching is not None else _NONE
        old.retiring = True
        if batching is None:
            self._states.apply(name, _E.LOADED)
            return self._drained(old) if not old.outstanding else _NONE
        if batching == old.batching:
            self._states.apply(name, _E.LOADED)
            actions: tuple[VersionAction[V], ...] = (SeedCosts(version),)
            return actions + self._drained(old) if not old.outstanding else actions
        # Different batching: gated until every older version drains (RELOADING meanwhile).
        self._gates[name] = old
        return _NONE if self._still_draining(name) else self._drained(old)

    def rebatched(self, version: V) -> tuple[VersionAction[V], ...]:
        """The driver switched the scheduler entry to ``version``'s batching (``Rebatch``):
        the gate opens, the swap is complete, and the drained old version is retired."""
        entry = self._versions[version]
        old = self._gates.pop(entry.name, None)
        if (
            old is None
            or self._serving.get(entry.name) is not entry
            or self._still_draining(entry.name)
        ):
            raise LifecycleError(f"model {entry.name!r}: rebatched() without a drained gate")
        self._states.apply(entry.name, _E.LOADED)
        return (Retire(old.version),)

    def unload(self, name: str) -> tuple[VersionAction[V], ...]:
        """Stop admitting ``name``; its versions drain, then are freed (module docstring).

        ``NotFound`` when nothing serves it; a name whose last load failed is forgotten
        (UNLOADED) at once.
        """
        state = self.state(name)
        if state is ModelState.FAILED:
            self._states.apply(name, _E.UNLOAD)
            return _NONE
        entry = self._serving.get(name)
        if entry is None:
            raise NotFound(f"model {quoted(name)} is not loaded")
        self._states.apply(name, _E.UNLOAD)  # refused (LifecycleError) unless READY
        del self._serving[name]
        del self._current[name]
        entry.retiring = True
        if entry.batching is None:
            # Holds nothing: nothing waits for its drain (running requests keep it).
            if not entry.outstanding:
                self._forget_version(entry)
            self._states.apply(name, _E.DRAINED)
            return _NONE
        self._unloading[name] = False
        return self._drained(entry) if not entry.outstanding else _NONE

    def retired(self, version: V) -> tuple[VersionAction[V], ...]:
        """The driver freed ``version`` (``Retire``). An unloading name whose versions are
        all freed becomes UNLOADED."""
        entry = self._versions[version]
        if not entry.retiring or entry.outstanding:
            raise LifecycleError(f"model {entry.name!r}: retired() before the version drained")
        self._forget_version(entry)
        name = entry.name
        if self._unloading.get(name) and not any(
            v.batching is not None for v in self._by_name.get(name, ())
        ):
            # The scheduler entry is gone and so is the last compiled version (a meta one
            # still answering holds nothing): unloaded.
            del self._unloading[name]
            self._states.apply(name, _E.DRAINED)
        return _NONE

    # ----------------------------------------------------------------- internals

    def _drained(self, entry: _Version[V]) -> tuple[VersionAction[V], ...]:
        """``entry`` no longer admits and has nothing outstanding: what is due now."""
        name = entry.name
        if entry.batching is None:
            self._forget_version(entry)
            return _NONE
        gate = self._gates.get(name)
        if gate is not None:
            # A swap to other batch sizes waits for *every* older version, not only the
            # one it replaced: a version replaced earlier by one that batches the same
            # way may still have requests to queue at the old sizes. Once none is left,
            # switch the batching; rebatched() retires the gate's own version.
            retire: tuple[VersionAction[V], ...] = () if entry is gate else (Retire(entry.version),)
            if self._still_draining(name):
                return retire
            return (*retire, Rebatch(self._serving[name].version))
        actions: tuple[VersionAction[V], ...] = (Retire(entry.version),)
        if self._unloading.get(name) is False and not self._compiled_busy(name):
            self._unloading[name] = True
            actions = (RemoveFromScheduler(name), *actions)
        return actions

    def _still_draining(self, name: str) -> bool:
        """Whether a retiring compiled version of ``name`` still has requests outstanding
        (a meta version's requests run its glue, never at the name's batch sizes)."""
        return any(
            v.retiring and v.outstanding and v.batching is not None for v in self._by_name[name]
        )

    def _compiled_busy(self, name: str) -> bool:
        """Whether a compiled version of ``name`` has requests outstanding: they need the
        name's scheduler entry (a meta version's do not)."""
        return any(v.outstanding and v.batching is not None for v in self._by_name[name])

    def _forget_version(self, entry: _Version[V]) -> None:
        del self._versions[entry.version]
        versions = self._by_name[entry.name]
        versions.remove(entry)
        if not versions:
            del self._by_name[entry.name]

    def _refusal(self, name: str) -> ReactantError:
        """Why ``name`` admits nothing now (its serving version is missing)."""
        record = self._states.get(name)
        if admits_requests(record.state):  # a serving state without a serving version
            return LifecycleError(f"model {name!r} is {record.state.value} but nothing serves it")
        if record.state is ModelState.LOADING:
            return Unavailable(f"model {quoted(name)} is still loading")
        if record.state is ModelState.FAILED:
            return NotFound(f"model {quoted(name)} failed to load: {record.error}")
        if record.state is ModelState.DRAINING:
            return NotFound(f"model {quoted(name)} is being unloaded")
        # A name this worker never had is most often a typo: name the closest it has.
        known = self._states.records
        hint = "" if name in known else did_you_mean(name, {*known, *self._by_name})
        return NotFound(f"model {quoted(name)} is not loaded{hint}")

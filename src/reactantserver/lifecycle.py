"""Model lifecycle rules, sans-IO: the state table and the repository diff.

This module decides; it never touches a file, a clock, a device or an event loop. The
worker (``reactantserver.worker``) owns the I/O: it scans the repository, compiles,
swaps and drains, and reports each step here.

The state table
---------------
Every model name the worker knows has one :class:`ModelState`. All rules are in
:data:`TRANSITIONS`, one row per legal ``(state, event)`` pair::

    state       event          next        meaning
    ---------   ------------   ---------   ------------------------------------------
    UNLOADED    LOAD           LOADING     compile a first version
    FAILED      LOAD           LOADING     files changed (or load asked again): retry
    LOADING     LOADED         READY       compiled and warmed up: admitted
    LOADING     LOAD_FAILED    FAILED      nothing serves; the reason is kept
    READY       LOAD           RELOADING   a new version compiles; the old one serves
    RELOADING   LOADED         READY       swapped: later requests get the new version
    RELOADING   LOAD_FAILED    READY       the old version keeps serving; reason kept
    READY       UNLOAD         DRAINING    no new requests; queued ones are answered
    DRAINING    DRAINED        UNLOADED    memory released
    FAILED      UNLOAD         UNLOADED    the failure is forgotten

A name nobody has mentioned yet is ``UNLOADED``. Any other pair is a bug in the caller
(the worker serialises lifecycle operations under one lock, so e.g. an unload can never
meet a model in ``LOADING``) and raises :class:`~reactantserver.errors.LifecycleError`
without changing anything. Only ``READY`` and ``RELOADING`` admit requests
(:func:`admits_requests`).

The repository diff
-------------------
:class:`RepositoryWatch` is given, at each poll, the signature of every bundle
directory it can see (``reactantserver.bundle.signature``: name, size and mtime of
each visible top-level file, so the manifest, the artifact, the weights, ``model.py``
and anything else in the bundle). It remembers the signature it last *acted on* per
name and returns :class:`Action` s:

* a signature that differs from the acted one is acted on only when the very same
  signature was also seen on the previous poll. A bundle being copied or rewritten
  changes between polls and is left alone until it settles; a change that is undone
  before the second poll is never acted on;
* absence works the same way: a directory missing on two consecutive polls is removed;
* the acted signature is recorded when the action is returned, whatever its outcome:
  a version that fails to load is not retried at every poll, only once its files
  change again (touching any file of the bundle is enough to ask for a retry).

Invariants (checked by ``tests/test_lifecycle.py``): an action for ``(name, sig)`` at
poll *k* means polls *k-1* and *k* both saw ``sig`` (both saw no directory for a
removal); no action repeats the acted signature; after two identical consecutive polls
the acted view equals the polled view.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from .bundle import Signature
from .errors import LifecycleError

__all__ = [
    "TRANSITIONS",
    "Action",
    "LifecycleEvent",
    "ModelRecord",
    "ModelState",
    "ModelTable",
    "RepositoryWatch",
    "admits_requests",
    "changed_files",
    "index_view",
]


class ModelState(enum.Enum):
    """Where one model name is in its lifecycle (see the module docstring)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    RELOADING = "reloading"
    DRAINING = "draining"
    FAILED = "failed"


class LifecycleEvent(enum.Enum):
    """What the worker reports about one model name."""

    LOAD = "load"
    LOADED = "loaded"
    LOAD_FAILED = "load_failed"
    UNLOAD = "unload"
    DRAINED = "drained"


_S = ModelState
_E = LifecycleEvent

#: Every legal transition: ``(state, event) -> next state``. Nothing else is allowed.
TRANSITIONS: Mapping[tuple[ModelState, LifecycleEvent], ModelState] = MappingProxyType(
    {
        (_S.UNLOADED, _E.LOAD): _S.LOADING,
        (_S.FAILED, _E.LOAD): _S.LOADING,
        (_S.LOADING, _E.LOADED): _S.READY,
        (_S.LOADING, _E.LOAD_FAILED): _S.FAILED,
        (_S.READY, _E.LOAD): _S.RELOADING,
        (_S.RELOADING, _E.LOADED): _S.READY,
        (_S.RELOADING, _E.LOAD_FAILED): _S.READY,
        (_S.READY, _E.UNLOAD): _S.DRAINING,
        (_S.DRAINING, _E.DRAINED): _S.UNLOADED,
        (_S.FAILED, _E.UNLOAD): _S.UNLOADED,
    }
)

_ADMITTING = frozenset({ModelState.READY, ModelState.RELOADING})


def admits_requests(state: ModelState) -> bool:
    """True in the states where a version serves new requests."""
    return state in _ADMITTING


@attrs.frozen
class ModelRecord:
    """One model name's lifecycle state."""

    state: ModelState = ModelState.UNLOADED
    #: Why the last load of this name failed; cleared by a successful load or an unload.
    #: In ``READY`` it describes a *new* version that failed while the old one serves.
    error: str = ""


class ModelTable:
    """The lifecycle state of every model name, changed only through :data:`TRANSITIONS`."""

    def __init__(self) -> None:
        self._records: dict[str, ModelRecord] = {}
        self._failures: Counter[str] = Counter()

    def get(self, name: str) -> ModelRecord:
        """The record of ``name`` (``UNLOADED`` for a name never mentioned)."""
        return self._records.get(name, ModelRecord())

    def state(self, name: str) -> ModelState:
        return self.get(name).state

    @property
    def records(self) -> Mapping[str, ModelRecord]:
        """Every known name's record (a read-only view)."""
        return MappingProxyType(self._records)

    @property
    def load_failures(self) -> Mapping[str, int]:
        """Failed loads per name since the worker started (kept after a name is forgotten)."""
        return MappingProxyType(self._failures)

    def in_state(self, *states: ModelState) -> list[str]:
        """Names in any of ``states``, sorted."""
        return sorted(n for n, r in self._records.items() if r.state in states)

    def declare(self, name: str) -> None:
        """List ``name`` as known but not loaded (an explicit-mode repository entry)."""
        self._records.setdefault(name, ModelRecord())

    def apply(self, name: str, event: LifecycleEvent, error: str = "") -> ModelRecord:
        """Move ``name`` along ``event``; ``LifecycleError`` (and no change) if illegal.

        ``error`` is the reason of a ``LOAD_FAILED`` and must be given with it only.
        """
        current = self.get(name)
        after = TRANSITIONS.get((current.state, event))
        if after is None:
            allowed = sorted(e.value for (s, e) in TRANSITIONS if s is current.state)
            raise LifecycleError(
                f"model {name!r}: event {event.value!r} is not allowed in state "
                f"{current.state.value!r} (allowed there: {', '.join(allowed) or 'none'})"
            )
        if (event is LifecycleEvent.LOAD_FAILED) != bool(error):
            raise LifecycleError(
                f"model {name!r}: a reason is required with load_failed and only with it"
            )
        if event is LifecycleEvent.LOAD_FAILED:
            self._failures[name] += 1
            message = error
        elif event is LifecycleEvent.LOAD:
            # Keep the last failure visible while the retry compiles.
            message = current.error
        else:
            message = ""
        record = ModelRecord(after, message)
        self._records[name] = record
        return record

    def forget(self, name: str) -> None:
        """Drop an ``UNLOADED`` name entirely (its directory is gone from the repository)."""
        state = self.state(name)
        if state is not ModelState.UNLOADED:
            raise LifecycleError(
                f"model {name!r}: only an unloaded model can be forgotten; it is {state.value!r}"
            )
        self._records.pop(name, None)


def index_view(record: ModelRecord) -> tuple[str, str]:
    """``(state, reason)`` of a record in RepositoryIndex's (Triton's) vocabulary."""
    s = record.state
    if s is ModelState.READY:
        if record.error:
            return "READY", f"serving the previous version; the new one failed: {record.error}"
        return "READY", ""
    if s is ModelState.RELOADING:
        return "READY", "a new version is compiling; this one serves until it is ready"
    if s is ModelState.LOADING:
        if record.error:
            return "LOADING", f"compiling again after a failure: {record.error}"
        return "LOADING", "compiling"
    if s is ModelState.DRAINING:
        return "UNLOADING", "answering the queued requests; no new ones are admitted"
    if s is ModelState.FAILED:
        return "UNAVAILABLE", record.error
    return "UNAVAILABLE", "not loaded"


# ----------------------------------------------------------------------------- the diff


@attrs.frozen
class Action:
    """What the repository diff asks the worker to do with one bundle."""

    kind: Literal["add", "replace", "remove"]
    name: str
    #: The signature to load (empty for ``remove``).
    signature: Signature
    #: The signature acted on before (empty for ``add``).
    previous: Signature = ()


def changed_files(old: Signature, new: Signature) -> list[str]:
    """Names of the files that differ between two signatures (added, removed or changed)."""
    before = {name: (size, mtime) for name, size, mtime in old}
    after = {name: (size, mtime) for name, size, mtime in new}
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


class RepositoryWatch:
    """Turns successive repository polls into debounced add/replace/remove actions."""

    def __init__(self, acted: Mapping[str, Signature] | None = None) -> None:
        #: name -> the signature last acted on (what the worker loaded or tried to load).
        self._acted: dict[str, Signature] = dict(acted or {})
        #: name -> the differing signature seen on the last poll (``None``: no directory).
        self._pending: dict[str, Signature | None] = {}

    @property
    def acted(self) -> Mapping[str, Signature]:
        return MappingProxyType(self._acted)

    @property
    def pending(self) -> Mapping[str, Signature | None]:
        """Changes seen once, waiting for a second identical poll."""
        return MappingProxyType(self._pending)

    def observe(self, scan: Mapping[str, Signature]) -> list[Action]:
        """One poll's view (name -> signature); the actions due now, sorted by name.

        Removals come first, so a bundle renamed on disk frees its old name's memory
        before the new name compiles.
        """
        actions: list[Action] = []
        # Pending names too: a change that vanished again must be forgotten.
        for name in sorted(self._acted.keys() | scan.keys() | self._pending.keys()):
            now = scan.get(name)
            before = self._acted.get(name)
            if now == before:
                self._pending.pop(name, None)
                continue
            if name not in self._pending or self._pending[name] != now:
                self._pending[name] = now  # first sighting: wait for the next poll
                continue
            del self._pending[name]
            if now is None:
                assert before is not None
                del self._acted[name]
                actions.append(Action("remove", name, (), before))
            else:
                self._acted[name] = now
                kind: Literal["add", "replace"] = "add" if before is None else "replace"
                actions.append(Action(kind, name, now, before or ()))
        actions.sort(key=lambda a: (a.kind != "remove", a.name))
        return actions

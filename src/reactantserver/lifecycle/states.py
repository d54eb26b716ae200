"""The lifecycle state of every model name, sans-IO: one table of legal transitions.

This module decides; it never touches a file, a clock, a device or an event loop.
:class:`~reactantserver.lifecycle.versions.ModelVersions` drives it (each load, swap and
unload it is told about moves the name along this table), and RepositoryIndex, ModelReady
and the metrics read it.

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
(lifecycle operations are serialised, so e.g. an unload can never meet a model in
``LOADING``) and raises :class:`~reactantserver.errors.LifecycleError` without changing
anything. Only ``READY`` and ``RELOADING`` admit requests (:func:`admits_requests`):
``ModelVersions`` keeps a serving version exactly for the names in those states.

Invariants (checked by ``tests/lifecycle/test_lifecycle.py``): the table moves only along
:data:`TRANSITIONS`; ``FAILED`` always carries a reason, ``DRAINING`` and ``UNLOADED``
never do; failed loads are counted per name, also for names forgotten since.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from ..errors import LifecycleError

__all__ = [
    "INDEX_VIEW",
    "TRANSITIONS",
    "LifecycleEvent",
    "ModelRecord",
    "ModelState",
    "ModelTable",
    "admits_requests",
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


_RELOADING = "a new version is compiling; this one serves until it is ready"
_DRAINING = "answering the queued requests; no new ones are admitted"

#: State -> RepositoryIndex's (Triton's) state, the reason, and the reason when the
#: record carries an error (``{error}``: the error).
INDEX_VIEW: Mapping[ModelState, tuple[str, str, str]] = MappingProxyType({
    ModelState.UNLOADED: ("UNAVAILABLE", "not loaded", "not loaded"),
    ModelState.LOADING: ("LOADING", "compiling", "compiling again after a failure: {error}"),
    ModelState.READY: ("READY", "", "serving the previous version; the new one failed: {error}"),
    ModelState.RELOADING: ("READY", _RELOADING, _RELOADING),
    ModelState.DRAINING: ("UNLOADING", _DRAINING, _DRAINING),
    ModelState.FAILED: ("UNAVAILABLE", "", "{error}"),
})  # fmt: skip


def index_view(record: ModelRecord) -> tuple[str, str]:
    """``(state, reason)`` of a record in RepositoryIndex's (Triton's) vocabulary
    (:data:`INDEX_VIEW`)."""
    state, reason, failed = INDEX_VIEW[record.state]
    return state, failed.format(error=record.error) if record.error else reason

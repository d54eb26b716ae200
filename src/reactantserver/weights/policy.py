"""The on-demand weight cache policy: sans-IO, every rule of device residency in one place.

This class decides; it never touches a device, a file or a clock. Its driver
(``reactantserver.runtime.weight_cache``) calls it from several Trio tasks of one event
loop -- the dispatch loop (acquire, release, prefetch), the lifecycle (register,
remove) and the control RPCs (compact, set_floor) -- carries out the :class:`CachePlan`
each call returns, and reports how the I/O went (:meth:`loaded`, :meth:`load_failed`,
:meth:`done`). It is the only place that knows what is resident, loading, pinned, in use
or being removed: the driver keeps device and host handles, never state. Because it is a
plain synchronous object, ``reactantserver.Scheduler`` simulations and the Hypothesis
state machine in ``tests/weights/test_weights_policy_state.py`` run it without JAX.

Why one module of this size: every residency rule and every invariant below is about
the same few fields of the same entries; split across files they could no longer be
checked against each other by reading.

Per model, the policy tracks a *floor* and two residencies::

    floor    unpinned | system | device        (configured; SetModelResidency changes it)
    device   absent -> loading -> resident -> absent
    host     True while a host copy exists

Floors
    ``device``  loaded at registration and never evicted; off the on-demand budget (its
                bytes are *pinned*).
    ``system``  a host copy is kept for the model's whole life; device loads are pure
                host->device transfers. The default when the cache is on.
    ``unpinned`` no host copy between loads: each load maps the weights file, transfers,
                and drops the map.

The decisions and statistics it returns are the frozen records of ``records.py``. There
is no "cache off" mode: with the cache off the worker uses ``ResidentWeights`` instead
(``reactantserver.runtime.weight_provider``), and this class is never built.

Transitions (``P`` = the plan returned; the driver runs ``evict`` -> ``host_drop`` ->
``host_load`` -> ``load``, then reports each load with :meth:`loaded` or :meth:`load_failed`)

    =====================  =====================================================
    event                  effect
    =====================  =====================================================
    ``register``           system: host copy (P.host_load); device: load
    ``acquire`` resident   :class:`Hit`, moved to most recently used
    ``acquire`` loading    :class:`Wait` (reason ``loading``)
    ``acquire`` absent     explicit mode: ``NotResident``; else evict LRU idle models
                           until it fits and load it (P), or :class:`Wait` (reason
                           ``in_use``) when only models in use/loading could make room
    ``loaded``             loading -> resident; a non-system host copy is dropped
    ``load_failed``        loading -> absent; a non-system host copy is dropped
    ``pin_in_use``/unpin   bracket an execution; a pinned-in-use model is never evicted
    ``prefetch_plan``      like an early ``acquire``, but only when nothing in use,
                           loading or pinned would have to go (else ``None``)
    ``compact``            every non-pinned device copy freed, LRU reset, missing
                           device-floor models and the named models reloaded
    ``set_floor``          move between floors (control RPC SetModelResidency)
    ``set_budget``         re-size after the probe or a hot load; evicts LRU idle
    ``evict_idle``         free every idle on-demand copy (the probe runs alone)
    ``begin_remove``       the model is going: acquires refuse it, prefetch skips it;
                           ``unregister`` once :meth:`removable` (idle)
    =====================  =====================================================

Control commands (compact, set_floor, re-sizing, the probe) run between batches. The
driver asks with :meth:`want_command`, which closes a gate: from then on ``acquire``
answers :class:`Wait` (reason ``command``) and ``prefetch_plan`` ``None``;
:meth:`try_start_command` succeeds once nothing is pinned in use, no plan is being
carried out (every plan handed out is reported back with :meth:`done`) and no other
command runs; :meth:`end_command` opens the gate again.

Invariants (the state machine checks each after every step)

1. ``resident_bytes`` (non-pinned models loading or resident) never exceeds the budget,
   except when exactly one model is loading or resident and it alone is larger than the
   budget (the *oversize* model, loaded alone with a warning).
2. A ``device``-floor model is never evicted: only ``compact``, ``set_floor`` and
   ``unregister`` ever release it, and ``compact`` does not.
3. A model pinned in use is never evicted, and a control command that would release it
   is refused (``LifecycleError``): control commands run between batches.
4. Eviction follows LRU: the victims of a load are the least recently used evictable
   models, oldest first, and no more of them than needed.
5. A ``system`` model always has its host copy; an ``unpinned`` one has one only while
   it is loading.
6. Loading models count against the budget from the moment the load is planned, so two
   transfers in flight (a prefetch and a demand load) can never overcommit it. A load the
   driver carries out within one step (queued on the device and not waited for, issue
   40) is ``loading`` only within that step and then counts as resident while its
   transfer may still be in flight on the device: every load in flight, in a thread or
   on the device, is in ``resident_bytes``.
7. A control command runs alone: while it runs nothing is pinned in use and no other
   plan is being carried out, and a model being removed is never handed out again.

LRU order is by use: :meth:`acquire` (hit or load) and :meth:`prefetch_plan` move a
model to the most-recently-used end. Only non-pinned models are in the LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from types import MappingProxyType
from typing import Literal

import attrs

from ..config.schema import RESIDENCIES, Residency
from ..errors import LifecycleError, NotFound, NotResident
from .records import (
    AcquireDecision,
    CachePlan,
    CacheStatistics,
    DeviceState,
    Hit,
    ModelResidency,
    Wait,
)

# The records are re-exported: a driver imports everything it speaks from here.
__all__ = [
    "AcquireDecision",
    "CachePlan",
    "CacheStatistics",
    "DeviceState",
    "Hit",
    "ModelResidency",
    "Wait",
    "WeightCachePolicy",
]


@attrs.define
class _Entry:
    nbytes: int
    floor: Residency
    device: DeviceState = "absent"
    host: bool = False
    in_use: int = 0
    prefetched: bool = False
    #: ``begin_remove`` was called: never handed out again.
    removing: bool = False


class WeightCachePolicy:
    """The residency rules of one worker's weights (see the module docstring).

    ``budget`` is the on-demand budget in bytes (``budget.WeightBudget.on_demand``).
    ``explicit`` is ``model_control_mode: explicit``: the worker never loads on its own;
    an absent model raises ``NotResident`` until the control plane sets it to
    ``device``. ``compaction_interval`` is ``scheduler.compaction_interval``.
    """

    def __init__(
        self, budget: int, *, explicit: bool = False, compaction_interval: int = 0
    ) -> None:
        if budget < 0:
            raise ValueError(f"weight cache budget must be >= 0 bytes; got {budget}")
        if compaction_interval < 0:
            raise ValueError(f"compaction_interval must be >= 0; got {compaction_interval}")
        self._budget = budget
        self._explicit = explicit
        self._interval = compaction_interval
        self._entries: dict[str, _Entry] = {}
        # Non-pinned models loading or resident, least recently used first.
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._resident_bytes = 0
        self._loading = 0
        self._hits = 0
        self._misses = 0
        self._loads = 0
        self._pinned_loads = 0
        self._load_failures = 0
        self._load_seconds = 0.0
        self._evictions = 0
        self._oversize_loads = 0
        self._compactions = 0
        self._compaction_mark = 0
        self._prefetches = 0
        self._prefetch_hits = 0
        self._prefetch_wasted = 0
        # Control commands: how many want to run, whether one runs, and what must reach
        # zero first (executions pinned in use, plans handed out and not yet done).
        self._commands = 0
        self._command_running = False
        self._in_use = 0
        self._plans = 0

    # ------------------------------------------------------------------ queries

    @property
    def budget(self) -> int:
        return self._budget

    @property
    def explicit(self) -> bool:
        return self._explicit

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes

    @property
    def lru(self) -> tuple[str, ...]:
        """Non-pinned models loading or resident, least recently used first."""
        return tuple(self._lru)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    @property
    def device_bytes(self) -> int:
        """Bytes of every weight on the device now, pinned and on demand (loads in flight
        not counted)."""
        return sum(e.nbytes for e in self._entries.values() if e.device == "resident")

    @property
    def pinned_bytes(self) -> int:
        """Bytes of every ``device``-floor model's weights (what the budget formula
        reserves off the top of the pool)."""
        return sum(e.nbytes for e in self._entries.values() if e.floor == "device")

    def floor(self, name: str) -> Residency:
        return self._get(name).floor

    def is_resident(self, name: str) -> bool:
        """Whether the model's weights are on the device now (ModelReady in explicit mode)."""
        return self._get(name).device == "resident"

    def residency(self, name: str) -> ModelResidency:
        return self._record(name, self._get(name))

    def should_compact(self) -> bool:
        """Whether ``compaction_interval`` on-demand loads happened since the last compaction."""
        return self._interval > 0 and self._loads - self._compaction_mark >= self._interval

    def statistics(self) -> CacheStatistics:
        pinned = sum(e.nbytes for e in self._entries.values() if e.floor == "device")
        host = sum(e.nbytes for e in self._entries.values() if e.host)
        return CacheStatistics(
            residency_mode="externally_managed" if self._explicit else "self_managed",
            budget=self._budget,
            resident_bytes=self._resident_bytes,
            pinned_bytes=pinned,
            host_bytes=host,
            hits=self._hits,
            misses=self._misses,
            loads=self._loads,
            pinned_loads=self._pinned_loads,
            load_failures=self._load_failures,
            load_seconds=self._load_seconds,
            evictions=self._evictions,
            oversize_loads=self._oversize_loads,
            compactions=self._compactions,
            prefetches=self._prefetches,
            prefetch_hits=self._prefetch_hits,
            prefetch_wasted=self._prefetch_wasted,
            lru=tuple(self._lru),
            models=MappingProxyType(
                {n: self._record(n, e) for n, e in sorted(self._entries.items())}
            ),
        )

    # ------------------------------------------------------------- registration

    def register(self, name: str, nbytes: int, floor: Residency | None = None) -> CachePlan:
        """Add a model. ``floor=None`` takes the default, ``system``.

        A ``system`` model's host copy is made now; a ``device`` model is loaded now.
        """
        if name in self._entries:
            raise LifecycleError(f"weight cache: model {name!r} is already registered")
        if nbytes < 0:
            raise ValueError(f"weight cache: model {name!r} has a negative size {nbytes}")
        _check_floor(floor, allow_none=True)
        if floor is None:
            floor = "system"
        entry = _Entry(nbytes=nbytes, floor=floor)
        self._entries[name] = entry
        host_load: list[str] = []
        load: list[str] = []
        if floor == "system":
            entry.host = True
            host_load.append(name)
        elif floor == "device":
            self._start_load(name, entry, host_load)
            load.append(name)
        return self._plan(host_load=tuple(host_load), load=tuple(load))

    def begin_remove(self, name: str) -> None:
        """The model is going: it is never handed out again (``acquire`` refuses it,
        ``prefetch_plan`` skips it); :meth:`unregister` it once :meth:`removable`."""
        self._get(name).removing = True

    def removable(self, name: str) -> bool:
        """Whether ``name`` is idle (nothing pinned in use, no load in flight)."""
        entry = self._get(name)
        return entry.in_use == 0 and entry.device != "loading"

    def unregister(self, name: str) -> CachePlan:
        """Remove a model, releasing its device and host copies. It must be idle."""
        entry = self._get(name)
        self._require_idle(name, entry, "unregister")
        evict = (name,) if entry.device == "resident" else ()
        host_drop = (name,) if entry.host else ()
        if name in self._lru:
            self._uncount(name, entry)
        del self._entries[name]
        return self._plan(evict=evict, host_drop=host_drop)

    # --------------------------------------------------------------- hot path

    def hits_now(self, name: str) -> bool:
        """Whether :meth:`acquire` of ``name`` would be a :class:`Hit` now (its weights
        resident, no command waiting or running); asks only, changes nothing."""
        entry = self._entries.get(name)
        return (
            entry is not None
            and entry.device == "resident"
            and not entry.removing
            and not self._commands
        )

    def acquire(self, name: str, *, command: bool = False) -> AcquireDecision:
        """Make ``name`` runnable: :class:`Hit`, a load :class:`CachePlan`, or :class:`Wait`.

        Raises ``NotResident`` in explicit mode when the model is not on the device, and
        ``LifecycleError`` for a model being removed. While a control command waits or
        runs the answer is :class:`Wait` (reason ``command``), except for the command's
        own acquires (``command=True``: the startup probe's runs).
        """
        entry = self._get(name)
        if entry.removing:
            raise LifecycleError(f"weight cache: {name} is being removed")
        if self._commands and not command:
            return Wait(name=name, blockers=(), reason="command")
        if entry.device == "resident":
            self._hits += 1
            if entry.prefetched:
                self._prefetch_hits += 1
                entry.prefetched = False
            if name in self._lru:
                self._lru.move_to_end(name)
            return Hit(name)
        if entry.device == "loading":
            return Wait(name=name, blockers=(name,), reason="loading")
        if self._explicit:
            raise NotResident(
                f"model {name!r}: its weights are not on the device; in explicit mode the "
                "control plane must set its residency to device (SetModelResidency) first"
            )
        host_load: list[str] = []
        if entry.floor == "device":
            # A pinned model is absent only after a failed load: retry it, off budget.
            self._misses += 1
            self._start_load(name, entry, host_load)
            return self._plan(host_load=tuple(host_load), load=(name,))
        budget = self._budget
        oversize = entry.nbytes > budget
        # An oversize model needs every other on-demand model gone (room -1: nothing left).
        victims, fits, blockers = self._victims(-1 if oversize else budget - entry.nbytes)
        if not fits:
            reason: Literal["in_use", "loading"] = (
                "in_use" if any(self._entries[b].in_use for b in blockers) else "loading"
            )
            return Wait(name=name, blockers=blockers, reason=reason)
        self._misses += 1
        for v in victims:
            self._evict(v)
        self._start_load(name, entry, host_load)
        warnings: tuple[str, ...] = ()
        if oversize:
            self._oversize_loads += 1
            warnings = (
                f"weight cache: model {name!r} ({entry.nbytes} bytes) is larger than the whole "
                f"on-demand budget ({budget} bytes); evicted every other on-demand model and "
                "loading it alone. Raise the budget or pin it (residency: device)",
            )
        return self._plan(
            evict=tuple(victims),
            host_load=tuple(host_load),
            load=(name,),
            oversize=name if oversize else None,
            warnings=warnings,
        )

    def loaded(self, name: str, seconds: float) -> CachePlan:
        """A planned load finished. Returns the transient host copy to drop, if any."""
        entry = self._get(name)
        if entry.device != "loading":
            raise LifecycleError(f"weight cache: loaded({name!r}) but it was not loading")
        entry.device = "resident"
        self._loading -= 1
        if entry.floor == "device":
            self._pinned_loads += 1
        else:
            self._loads += 1
            self._load_seconds += seconds
        return CachePlan(host_drop=self._drop_transient_host(name, entry))

    def load_failed(self, name: str) -> CachePlan:
        """A planned load failed: the model is absent again (the next acquire retries)."""
        entry = self._get(name)
        if entry.device != "loading":
            raise LifecycleError(f"weight cache: load_failed({name!r}) but it was not loading")
        self._load_failures += 1
        self._loading -= 1
        entry.device = "absent"
        entry.prefetched = False
        if name in self._lru:
            self._uncount(name, entry)
        return CachePlan(host_drop=self._drop_transient_host(name, entry))

    def pin_in_use(self, name: str) -> None:
        """An execution is about to read the model's device weights: never evict them."""
        entry = self._get(name)
        if entry.device != "resident":
            raise LifecycleError(
                f"weight cache: pin_in_use({name!r}) but its weights are {entry.device}"
            )
        entry.in_use += 1
        self._in_use += 1

    def unpin_in_use(self, name: str) -> None:
        """The execution that pinned the model finished."""
        entry = self._get(name)
        if entry.in_use == 0:
            raise LifecycleError(f"weight cache: unpin_in_use({name!r}) without a pin")
        entry.in_use -= 1
        self._in_use -= 1

    def done(self, plan: CachePlan) -> None:
        """The driver finished carrying out ``plan`` (one this policy handed out; the
        follow-ups of ``loaded`` and ``load_failed`` are part of their plan)."""
        if self._plans <= 0:
            raise LifecycleError("weight cache: done() for a plan that was never handed out")
        self._plans -= 1

    def prefetch_plan(self, name: str) -> CachePlan | None:
        """Start loading ``name`` ahead of its dispatch, if that is free of risk.

        A prefetch is an early demand load with stricter rules, so a wrong guess can cost
        at most what the demand load would have cost anyway: it evicts exactly the least
        recently used idle models that a demand load of ``name`` would evict now, never a
        model in use, loading or pinned, never through the oversize path, only while no
        other load is in flight, never while a control command waits or runs, and never
        in explicit mode. ``None`` means "not now" (unknown names and models being removed
        included: prefetch is a hint).
        """
        entry = self._entries.get(name)
        budget = self._budget
        if (
            entry is None
            or entry.removing
            or self._commands
            or self._explicit
            or entry.floor == "device"
            or entry.device != "absent"
            or self._loading
            or entry.nbytes > budget
        ):
            return None
        victims, fits, _ = self._victims(budget - entry.nbytes)
        if not fits:
            return None
        for v in victims:
            self._evict(v)
        host_load: list[str] = []
        self._start_load(name, entry, host_load)
        entry.prefetched = True
        self._prefetches += 1
        return self._plan(evict=tuple(victims), host_load=tuple(host_load), load=(name,))

    # ---------------------------------------------------------- control commands

    def compact(self, reload: Iterable[str] = ()) -> CachePlan:
        """Free every non-pinned device copy, reset the LRU, then reload.

        Reloaded: every ``device``-floor model not on the device (pinned ones that are
        stay in place, never freed), then each model named in ``reload``, in order, while
        it fits in the budget (self-managed mode only: in explicit mode the control plane
        loads what it wants). ``CachePlan.load`` lists what will be reloaded. Must run while
        no execution or load is in flight.
        """
        names = list(dict.fromkeys(reload))
        for n in names:
            self._get(n)
        busy = sorted(n for n, e in self._entries.items() if e.in_use or e.device == "loading")
        if busy:
            raise LifecycleError(
                f"weight cache: cannot compact while {busy} are in use or loading; "
                "compaction runs between batches"
            )
        evict = tuple(self._lru)
        for n in evict:
            self._entries[n].device = "absent"
            self._entries[n].prefetched = False
        self._lru.clear()
        self._resident_bytes = 0
        self._compactions += 1
        self._compaction_mark = self._loads
        host_load: list[str] = []
        load: list[str] = []
        for n, e in sorted(self._entries.items()):
            if e.floor == "device" and e.device == "absent":
                self._start_load(n, e, host_load)
                load.append(n)
        if not self._explicit:
            budget = self._budget
            for n in names:
                e = self._entries[n]
                if e.floor == "device" or e.removing or self._resident_bytes + e.nbytes > budget:
                    continue
                self._start_load(n, e, host_load)
                load.append(n)
        return self._plan(evict=evict, host_load=tuple(host_load), load=tuple(load))

    def set_floor(self, name: str, floor: Residency) -> CachePlan:
        """Move a model to another floor (SetModelResidency). The model must be idle.

        To ``device``: loaded if absent, and taken off the budget. From ``device``: in
        explicit mode the device copy is freed (there is no evictor to reclaim it); in
        self-managed mode it stays as the most recently used on-demand model if it fits
        the free budget, and is freed otherwise. To ``system`` the host copy is made; to
        ``unpinned`` it is dropped.

        Pinned bytes change with the ``device`` set, and the budget formula subtracts them:
        the driver re-solves it (``budget.weight_budget`` with ``statistics().pinned_bytes``)
        and applies the result with :meth:`set_budget`.
        """
        entry = self._get(name)
        _check_floor(floor, allow_none=False)
        self._require_idle(name, entry, "change the residency of")
        old = entry.floor
        if floor == old and not (floor == "device" and entry.device == "absent"):
            return self._plan()  # (a device-floor model absent after a failed load is retried)
        evict: list[str] = []
        host_drop: list[str] = []
        host_load: list[str] = []
        load: list[str] = []
        if floor == "device":
            if entry.device == "resident":
                self._uncount(name, entry)  # now off budget
            entry.floor = "device"
            if entry.device == "absent":
                self._start_load(name, entry, host_load)
                load.append(name)
            elif entry.host:
                entry.host = False  # resident already: the host copy has no use left
                host_drop.append(name)
            return self._plan(
                host_drop=tuple(host_drop), host_load=tuple(host_load), load=tuple(load)
            )
        if old == "device" and entry.device == "resident":
            budget = self._budget
            if not self._explicit and self._resident_bytes + entry.nbytes <= budget:
                self._lru[name] = None
                self._resident_bytes += entry.nbytes
            else:
                entry.device = "absent"
                evict.append(name)
        entry.floor = floor
        if floor == "system" and not entry.host:
            entry.host = True
            host_load.append(name)
        elif floor == "unpinned" and entry.host:
            entry.host = False
            host_drop.append(name)
        return self._plan(
            evict=tuple(evict), host_drop=tuple(host_drop), host_load=tuple(host_load)
        )

    def set_budget(self, budget: int) -> CachePlan:
        """Change the on-demand budget (after the probe, or when a hot load re-sizes it).

        Evicts least recently used idle models until the rest fits; refused, with nothing
        changed, if models in use or loading alone exceed the new budget (unless that is a
        single model, the oversize case).
        """
        if budget < 0:
            raise ValueError(f"weight cache budget must be >= 0 bytes; got {budget}")
        # When it does not fit, every idle model is a victim already; a lone busy model
        # then stays as the oversize one (invariant 1), more than one cannot.
        victims, fits, blockers = self._victims(budget)
        if not fits and len(blockers) > 1:
            raise LifecycleError(
                f"weight cache: cannot shrink the budget to {budget} bytes while {blockers} "
                "are in use or loading"
            )
        for v in victims:
            self._evict(v)
        self._budget = budget
        return self._plan(evict=tuple(victims))

    def evict_idle(self) -> CachePlan:
        """Free every idle on-demand copy; the budget stays (the startup probe runs each
        model alone, and it must not count another model's weights as its scratch)."""
        victims, _, _ = self._victims(-1)  # -1: every idle one, 0-byte models included
        for v in victims:
            self._evict(v)
        return self._plan(evict=tuple(victims))

    # ------------------------------------------------------------- command gate

    def want_command(self) -> None:
        """A control command waits to run: close the gate (see the module docstring)."""
        self._commands += 1

    def try_start_command(self) -> bool:
        """Start a waiting command if it can run alone now (module docstring, invariant 7)."""
        if self._commands == 0:
            raise LifecycleError("weight cache: try_start_command() without want_command()")
        if self._command_running or self._in_use or self._plans:
            return False
        self._command_running = True
        return True

    def end_command(self, *, started: bool) -> None:
        """The command finished (``started``), or gave up waiting: open the gate."""
        if self._commands == 0 or (started and not self._command_running):
            raise LifecycleError("weight cache: end_command() without a command")
        self._commands -= 1
        if started:
            self._command_running = False

    # ------------------------------------------------------------------ internals

    def _plan(
        self,
        *,
        evict: tuple[str, ...] = (),
        host_drop: tuple[str, ...] = (),
        host_load: tuple[str, ...] = (),
        load: tuple[str, ...] = (),
        oversize: str | None = None,
        warnings: tuple[str, ...] = (),
    ) -> CachePlan:
        """A plan handed out to the driver: counted until :meth:`done`."""
        self._plans += 1
        return CachePlan(
            evict=evict,
            host_drop=host_drop,
            host_load=host_load,
            load=load,
            oversize=oversize,
            warnings=warnings,
        )

    def _get(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            raise NotFound(f"model {name!r} is not loaded on this worker")
        return entry

    def _record(self, name: str, e: _Entry) -> ModelResidency:
        return ModelResidency(
            name=name,
            nbytes=e.nbytes,
            floor=e.floor,
            device=e.device,
            host=e.host,
            in_use=e.in_use,
            prefetched=e.prefetched,
        )

    def _require_idle(self, name: str, entry: _Entry, what: str) -> None:
        if entry.in_use or entry.device == "loading":
            state = "in use" if entry.in_use else "loading"
            raise LifecycleError(
                f"weight cache: cannot {what} model {name!r} while it is {state}; "
                "control commands run between batches"
            )

    def _victims(self, room: int) -> tuple[list[str], bool, tuple[str, ...]]:
        """LRU idle models to evict so that ``resident_bytes <= room``.

        Returns (victims oldest first, whether that suffices, the busy models in the LRU).
        Nothing is changed. ``room`` -1 asks for every other model to go.
        """
        victims: list[str] = []
        busy: list[str] = []
        projected = self._resident_bytes
        for n in self._lru:
            e = self._entries[n]
            if e.in_use or e.device == "loading":
                busy.append(n)
                continue
            if projected <= room:
                break
            victims.append(n)
            projected -= e.nbytes
        # room -1 is the oversize load: it needs every other model gone, even 0-byte ones,
        # so "alone" is literal (every idle one is a victim; a busy one makes it wait).
        fits = projected <= room if room >= 0 else not busy
        return victims, fits, tuple(busy)

    def _start_load(self, name: str, entry: _Entry, host_load: list[str]) -> None:
        entry.device = "loading"
        self._loading += 1
        if entry.floor != "device":
            self._lru[name] = None
            self._lru.move_to_end(name)
            self._resident_bytes += entry.nbytes
        if not entry.host:
            entry.host = True  # the transfer reads a host copy: a map unless system
            host_load.append(name)

    def _drop_transient_host(self, name: str, entry: _Entry) -> tuple[str, ...]:
        if entry.host and entry.floor != "system":
            entry.host = False
            return (name,)
        return ()

    def _evict(self, name: str) -> None:
        entry = self._entries[name]
        entry.device = "absent"
        if entry.prefetched:
            self._prefetch_wasted += 1
            entry.prefetched = False
        self._uncount(name, entry)
        self._evictions += 1

    def _uncount(self, name: str, entry: _Entry) -> None:
        del self._lru[name]
        self._resident_bytes -= entry.nbytes


def _check_floor(floor: str | None, *, allow_none: bool) -> None:
    if floor is None and allow_none:
        return
    if floor not in RESIDENCIES:
        raise ValueError(f"residency must be one of {', '.join(RESIDENCIES)}; got {floor!r}")

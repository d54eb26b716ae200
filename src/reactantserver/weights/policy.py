"""The on-demand weight cache policy: sans-IO, every rule of device residency in one place.

This class decides; it never touches a device, a file or a clock. The driver (one Trio
task on the dispatch loop, in ``reactantserver.runtime``) calls it with events and
carries out the :class:`Plan` it gets back, then reports how the I/O went. Because it is
a plain synchronous object, ``reactantserver.Scheduler`` simulations and the Hypothesis
state machine in ``tests/test_weights_policy_state.py`` run it without JAX.

Per model, the policy tracks a *floor* and two residencies::

    floor    unpinned | system | device        (configured; SetModelResidency changes it)
    device   absent -> loading -> resident -> absent
    host     True while a host copy exists

Floors
    ``device``  loaded at registration and never evicted; off the on-demand budget (its
                bytes are *pinned*). With the cache off every model is ``device``.
    ``system``  a host copy is kept for the model's whole life; device loads are pure
                host->device transfers. The default when the cache is on.
    ``unpinned`` no host copy between loads: each load maps the weights file, transfers,
                and drops the map.

The decisions and statistics it returns are the frozen records of ``records.py``.

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
    =====================  =====================================================

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
   transfers in flight (a prefetch and a demand load) can never overcommit it.

LRU order is by use: :meth:`acquire` (hit or load) and :meth:`prefetch_plan` move a
model to the most-recently-used end. Only non-pinned models are in the LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from types import MappingProxyType
from typing import Literal

import attrs

from ..config.schema import RESIDENCIES, Residency, ServerConfig
from ..errors import FailedPrecondition, LifecycleError, NotFound, NotResident
from .records import CacheStatistics, Decision, DeviceState, Hit, ModelResidency, Plan, Wait

# The records are re-exported: a driver imports everything it speaks from here.
__all__ = [
    "CacheStatistics",
    "Decision",
    "DeviceState",
    "Hit",
    "ModelResidency",
    "Plan",
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


class WeightCachePolicy:
    """The residency rules of one worker's weights (see the module docstring).

    ``budget`` is the on-demand budget in bytes (``budget.WeightBudget.on_demand``), or
    ``None`` for "cache off": then every model is ``device``-floor, loaded at registration
    and never released. ``explicit`` is ``model_control_mode: explicit``: the worker never
    loads on its own; an absent model raises ``NotResident`` until the control plane sets
    it to ``device``. ``compaction_interval`` is ``scheduler.compaction_interval``.
    """

    def __init__(
        self, budget: int | None, *, explicit: bool = False, compaction_interval: int = 0
    ) -> None:
        if budget is not None and budget < 0:
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

    @classmethod
    def from_config(cls, config: ServerConfig, budget: int | None) -> WeightCachePolicy:
        """The policy for one resolved worker, given the budget resolved by ``budget``."""
        return cls(
            budget,
            explicit=config.model_control_mode == "explicit",
            compaction_interval=config.scheduler.compaction_interval,
        )

    # ------------------------------------------------------------------ queries

    @property
    def enabled(self) -> bool:
        """Whether the on-demand cache runs (``False``: everything stays on the device)."""
        return self._budget is not None

    @property
    def budget(self) -> int | None:
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

    def floor(self, name: str) -> Residency:
        return self._get(name).floor

    def is_resident(self, name: str) -> bool:
        """Whether the model's weights are on the device now (ModelReady in explicit mode)."""
        return self._get(name).device == "resident"

    def residency(self, name: str) -> ModelResidency:
        return self._record(name, self._get(name))

    def should_compact(self) -> bool:
        """Whether ``compaction_interval`` on-demand loads happened since the last compaction."""
        return (
            self.enabled
            and self._interval > 0
            and self._loads - self._compaction_mark >= self._interval
        )

    def statistics(self) -> CacheStatistics:
        pinned = sum(e.nbytes for e in self._entries.values() if e.floor == "device")
        host = sum(e.nbytes for e in self._entries.values() if e.host)
        return CacheStatistics(
            enabled=self.enabled,
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

    def register(self, name: str, nbytes: int, floor: Residency | None = None) -> Plan:
        """Add a model. ``floor=None`` takes the default (``system`` with the cache on).

        A ``system`` model's host copy is made now; a ``device`` model is loaded now.
        """
        if name in self._entries:
            raise LifecycleError(f"weight cache: model {name!r} is already registered")
        if nbytes < 0:
            raise ValueError(f"weight cache: model {name!r} has a negative size {nbytes}")
        _check_floor(floor, allow_none=True)
        if not self.enabled:
            floor = "device"  # cache off: everything stays on the device
        elif floor is None:
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
        return Plan(host_load=tuple(host_load), load=tuple(load))

    def unregister(self, name: str) -> Plan:
        """Remove a model, releasing its device and host copies. It must be idle."""
        entry = self._get(name)
        self._require_idle(name, entry, "unregister")
        evict = (name,) if entry.device == "resident" else ()
        host_drop = (name,) if entry.host else ()
        if name in self._lru:
            self._uncount(name, entry)
        del self._entries[name]
        return Plan(evict=evict, host_drop=host_drop)

    def rename(self, old: str, new: str) -> None:
        """Rekey a model (a repository rename); its residency and LRU position are kept."""
        self._get(old)
        if new in self._entries:
            raise LifecycleError(f"weight cache: cannot rename {old!r} to {new!r}: name taken")
        self._entries = {(new if n == old else n): e for n, e in self._entries.items()}
        self._lru = OrderedDict(((new if n == old else n), None) for n in self._lru)

    # --------------------------------------------------------------- hot path

    def acquire(self, name: str) -> Decision:
        """Make ``name`` runnable: :class:`Hit`, a load :class:`Plan`, or :class:`Wait`.

        Raises ``NotResident`` in explicit mode when the model is not on the device.
        """
        entry = self._get(name)
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
            return Plan(host_load=tuple(host_load), load=(name,))
        budget = self._budget
        assert budget is not None  # cache off makes every model device-floor
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
        return Plan(
            evict=tuple(victims),
            host_load=tuple(host_load),
            load=(name,),
            oversize=name if oversize else None,
            warnings=warnings,
        )

    def loaded(self, name: str, seconds: float) -> Plan:
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
        return Plan(host_drop=self._drop_transient_host(name, entry))

    def load_failed(self, name: str) -> Plan:
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
        return Plan(host_drop=self._drop_transient_host(name, entry))

    def pin_in_use(self, name: str) -> None:
        """An execution is about to read the model's device weights: never evict them."""
        entry = self._get(name)
        if entry.device != "resident":
            raise LifecycleError(
                f"weight cache: pin_in_use({name!r}) but its weights are {entry.device}"
            )
        entry.in_use += 1

    def unpin_in_use(self, name: str) -> None:
        """The execution that pinned the model finished."""
        entry = self._get(name)
        if entry.in_use == 0:
            raise LifecycleError(f"weight cache: unpin_in_use({name!r}) without a pin")
        entry.in_use -= 1

    def prefetch_plan(self, name: str) -> Plan | None:
        """Start loading ``name`` ahead of its dispatch, if that is free of risk.

        A prefetch is an early demand load with stricter rules, so a wrong guess can cost
        at most what the demand load would have cost anyway: it evicts exactly the least
        recently used idle models that a demand load of ``name`` would evict now, never a
        model in use, loading or pinned, never through the oversize path, only while no
        other load is in flight, and never in explicit mode. ``None`` means "not now"
        (unknown names included: prefetch is a hint).
        """
        entry = self._entries.get(name)
        budget = self._budget
        if (
            entry is None
            or budget is None
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
        return Plan(evict=tuple(victims), host_load=tuple(host_load), load=(name,))

    # ---------------------------------------------------------- control commands

    def compact(self, reload: Iterable[str] = ()) -> Plan:
        """Free every non-pinned device copy, reset the LRU, then reload.

        Reloaded: every ``device``-floor model not on the device (pinned ones that are
        stay in place, never freed), then each model named in ``reload``, in order, while
        it fits in the budget (self-managed mode only: in explicit mode the control plane
        loads what it wants). ``Plan.load`` lists what will be reloaded. A no-op with the
        cache off. Must run while no execution or load is in flight.
        """
        names = list(dict.fromkeys(reload))
        for n in names:
            self._get(n)
        if not self.enabled:
            return Plan()
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
            assert budget is not None
            for n in names:
                e = self._entries[n]
                if e.floor == "device" or self._resident_bytes + e.nbytes > budget:
                    continue
                self._start_load(n, e, host_load)
                load.append(n)
        return Plan(evict=evict, host_load=tuple(host_load), load=tuple(load))

    def set_floor(self, name: str, floor: Residency) -> Plan:
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
        if not self.enabled:
            raise FailedPrecondition(
                f"model {name!r}: the on-demand weight cache is off (weight_cache_fraction=0 "
                "or no arena), so every model's weights stay on the device"
            )
        self._require_idle(name, entry, "change the residency of")
        old = entry.floor
        if floor == old and not (floor == "device" and entry.device == "absent"):
            return Plan()  # (a device-floor model absent after a failed load is retried)
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
            return Plan(host_drop=tuple(host_drop), host_load=tuple(host_load), load=tuple(load))
        if old == "device" and entry.device == "resident":
            budget = self._budget
            assert budget is not None
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
        return Plan(evict=tuple(evict), host_drop=tuple(host_drop), host_load=tuple(host_load))

    def set_budget(self, budget: int) -> Plan:
        """Change the on-demand budget (after the probe, or when a hot load re-sizes it).

        Evicts least recently used idle models until the rest fits; refused, with nothing
        changed, if models in use or loading alone exceed the new budget (unless that is a
        single model, the oversize case).
        """
        if self._budget is None:
            raise LifecycleError("weight cache: set_budget with the cache off")
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
        return Plan(evict=tuple(victims))

    # ------------------------------------------------------------------ internals

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

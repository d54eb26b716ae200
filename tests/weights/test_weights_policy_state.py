"""The weight-cache policy as an executable spec: a Hypothesis state machine.

The machine plays the driver. It registers, removes and unregisters models, acquires
them, finishes or fails their loads, brackets executions with pin/unpin, asks for
prefetches, compacts, moves floors, re-sizes the budget and opens and closes the gate of
control commands, in any order Hypothesis finds. It carries out every plan against its own
picture of the device and the host (so a plan that frees something absent, or loads
without a host copy, fails), reports each plan ``done`` once its loads have finished, as
the driver does, and keeps its own LRU order to check the policy's victims against. The
invariants are the ``@invariant`` methods below and the checks in the command rules; each
docstring states one in words.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from strategies import WEIGHT_MODEL_NAMES, weight_budgets, weight_floors, weight_sizes

from reactantserver.config.schema import Residency
from reactantserver.errors import LifecycleError, NotResident
from reactantserver.weights import CachePlan, Hit, Wait, WeightCachePolicy

_PICK = st.integers(min_value=0, max_value=1_000)


def _pick(names: list[str], i: int) -> str:
    return sorted(names)[i % len(names)]


class WeightCacheMachine(RuleBasedStateMachine):
    """Drives :class:`WeightCachePolicy` like the dispatch loop would, checking every plan."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = WeightCachePolicy(0)
        self.explicit = False
        self.nbytes: dict[str, int] = {}
        self.floor: dict[str, Residency] = {}
        # The driver's picture of the world, changed only by carrying out plans.
        self.device: set[str] = set()
        self.loading: set[str] = set()
        self.host: set[str] = set()
        self.in_use: dict[str, int] = {}
        # Expected LRU order (least recent first) of non-pinned models loading or resident.
        self.order: list[str] = []
        # device-floor models whose load completed: must stay on the device.
        self.pinned_resident: set[str] = set()
        # Models being removed (begin_remove): never handed out again.
        self.removing: set[str] = set()
        # Control commands waiting for the gate, and whether one runs.
        self.waiting = 0
        self.running = False
        # Plans handed out whose loads have not all finished (the driver's _run in flight).
        self.pending: list[tuple[CachePlan, set[str]]] = []

    @initialize(
        budget=weight_budgets(),
        explicit=st.booleans(),
        interval=st.integers(0, 3),
        catalog=st.lists(st.tuples(weight_sizes(), weight_floors()), min_size=2, max_size=4),
    )
    def start(
        self,
        budget: int,
        explicit: bool,
        interval: int,
        catalog: list[tuple[int, Residency | None]],
    ) -> None:
        """A worker starting with a few models, so churn begins at the first step."""
        self.policy = WeightCachePolicy(budget, explicit=explicit, compaction_interval=interval)
        self.explicit = explicit
        for nbytes, floor in catalog:
            self.register(0, nbytes, floor)

    # ------------------------------------------------------------------ helpers

    @property
    def budget(self) -> int:
        return self.policy.budget

    @property
    def gated(self) -> bool:
        return bool(self.waiting) or self.running

    def busy(self, name: str) -> bool:
        return self.in_use.get(name, 0) > 0 or name in self.loading

    def idle_registered(self) -> list[str]:
        return [n for n in self.nbytes if not self.busy(n)]

    def resident_bytes(self) -> int:
        return sum(self.nbytes[n] for n in self.order)

    def expected_victims(self, room: int) -> tuple[list[str], bool]:
        """Oldest idle models first, until ``resident <= room`` (room -1: all of them)."""
        victims: list[str] = []
        projected = self.resident_bytes()
        for n in self.order:
            if self.busy(n):
                continue
            if room >= 0 and projected <= room:
                break
            victims.append(n)
            projected -= self.nbytes[n]
        if room < 0:  # alone means alone: no other model, not even a 0-byte one, may stay
            return victims, not any(self.busy(n) for n in self.order)
        return victims, projected <= room

    def carry_out(self, plan: CachePlan, *, pinned_may_go: bool = False) -> None:
        """Execute a plan the way the driver does, refusing impossible steps."""
        for n in plan.evict:
            assert n in self.device, f"plan evicts {n!r}, which is not on the device"
            assert self.in_use.get(n, 0) == 0, f"plan evicts {n!r} while it is in use"
            if not pinned_may_go:
                assert self.floor.get(n) != "device", f"plan evicts device-floor {n!r}"
            self.device.discard(n)
            self.pinned_resident.discard(n)
        for n in plan.host_drop:
            assert n in self.host, f"plan drops a host copy of {n!r} that does not exist"
            self.host.discard(n)
        for n in plan.host_load:
            assert n not in self.host, f"plan makes a second host copy of {n!r}"
            self.host.add(n)
        for n in plan.load:
            assert n not in self.device and n not in self.loading, f"{n!r} loaded twice"
            assert n in self.host, f"plan loads {n!r} with no host copy to transfer from"
            self.loading.add(n)

    def hand_out(self, plan: CachePlan) -> None:
        """A plan the policy counts: ``done`` once its loads have finished (at once when it
        loads nothing), as the driver's ``_run`` reports it."""
        if plan.load:
            self.pending.append((plan, set(plan.load)))
        else:
            self.policy.done(plan)

    def take_load(self, name: str, plan: CachePlan) -> None:
        """Bookkeeping for a plan that loads ``name`` after evicting LRU victims."""
        for v in plan.evict:
            self.order.remove(v)
        if self.floor[name] != "device":
            self.order.append(name)

    # -------------------------------------------------------------------- rules

    @rule(i=_PICK, nbytes=weight_sizes(), floor=weight_floors())
    def register(self, i: int, nbytes: int, floor: Residency | None) -> None:
        free = [n for n in WEIGHT_MODEL_NAMES if n not in self.nbytes]
        if not free:
            return
        name = _pick(free, i)
        plan = self.policy.register(name, nbytes, floor)
        self.nbytes[name] = nbytes
        self.floor[name] = floor or "system"
        self.carry_out(plan)
        self.hand_out(plan)
        if self.floor[name] == "device":
            assert plan.load == (name,)

    @precondition(lambda self: bool(self.idle_registered()))
    @rule(i=_PICK)
    def unregister(self, i: int) -> None:
        name = _pick(self.idle_registered(), i)
        assert self.policy.removable(name)
        plan = self.policy.unregister(name)
        self.carry_out(plan, pinned_may_go=True)
        self.hand_out(plan)
        assert name not in self.device and name not in self.host
        if name in self.order:
            self.order.remove(name)
        del self.nbytes[name], self.floor[name]
        self.in_use.pop(name, None)
        self.removing.discard(name)

    @precondition(lambda self: bool(self.nbytes))
    @rule(i=_PICK)
    def begin_remove(self, i: int) -> None:
        """A model being removed is removable exactly when it is idle."""
        name = _pick(list(self.nbytes), i)
        self.policy.begin_remove(name)
        self.removing.add(name)
        assert self.policy.removable(name) == (not self.busy(name))

    @precondition(lambda self: bool(self.nbytes))
    @rule(i=_PICK)
    def acquire(self, i: int) -> None:
        name = _pick(list(self.nbytes), i)
        absent = name not in self.device and name not in self.loading
        if name in self.removing:
            try:
                self.policy.acquire(name)
            except LifecycleError:
                return
            raise AssertionError("a model being removed was handed out")
        if self.gated:
            decision = self.policy.acquire(name)
            assert isinstance(decision, Wait) and decision.reason == "command"
            return
        if self.explicit and absent:
            try:
                self.policy.acquire(name)
            except NotResident:
                return
            raise AssertionError("explicit mode loaded a model on its own")
        nbytes, budget = self.nbytes[name], self.budget
        oversize = nbytes > budget and self.floor[name] != "device"
        expected, fits = self.expected_victims(-1 if oversize else budget - nbytes)
        decision = self.policy.acquire(name)
        if isinstance(decision, Hit):
            assert name in self.device
            if name in self.order:
                self.order.remove(name)
                self.order.append(name)
        elif isinstance(decision, Wait):
            assert decision.blockers, "a Wait must name what it waits for"
            assert all(self.busy(b) for b in decision.blockers)
            if name in self.loading:
                assert decision.reason == "loading"
            else:
                assert not fits, "waited although idle LRU models could make room"
        else:
            assert absent and decision.load == (name,)
            if self.floor[name] == "device":
                assert decision.evict == ()
            else:
                assert list(decision.evict) == expected, "eviction is not in LRU order"
                assert (decision.oversize == name) == oversize
                assert bool(decision.warnings) == oversize
            self.carry_out(decision)
            self.hand_out(decision)
            self.take_load(name, decision)

    @precondition(lambda self: bool(self.nbytes) and not self.gated)
    @rule(i=_PICK)
    def run_batch(self, i: int) -> None:
        """One whole dispatch-loop step: acquire, load if told to, run (pin/unpin)."""
        name = _pick(list(self.nbytes), i)
        if (self.explicit and name not in self.device) or name in self.removing:
            return
        self.acquire(i)
        if name in self.loading:
            self.finish_load(sorted(self.loading).index(name), ok=True, seconds=0.01)
        if name in self.device:
            self.policy.pin_in_use(name)
            self.policy.unpin_in_use(name)

    @precondition(lambda self: bool(self.loading))
    @rule(i=_PICK, ok=st.booleans(), seconds=st.floats(0.0, 2.0))
    def finish_load(self, i: int, ok: bool, seconds: float) -> None:
        name = _pick(list(self.loading), i)
        self.loading.discard(name)
        if ok:
            plan = self.policy.loaded(name, seconds)
            self.device.add(name)
            if self.floor[name] == "device":
                self.pinned_resident.add(name)
        else:
            plan = self.policy.load_failed(name)
            if name in self.order:
                self.order.remove(name)
        self.carry_out(plan)
        for handed, loads in list(self.pending):
            loads.discard(name)
            if not loads:
                self.pending.remove((handed, loads))
                self.policy.done(handed)

    # An execution pins only what an acquire handed out: never while the gate is closed,
    # never a model being removed.
    @precondition(lambda self: bool(set(self.device) - self.removing) and not self.gated)
    @rule(i=_PICK)
    def pin(self, i: int) -> None:
        name = _pick(list(self.device - self.removing), i)
        self.policy.pin_in_use(name)
        self.in_use[name] = self.in_use.get(name, 0) + 1

    @precondition(lambda self: any(self.in_use.values()))
    @rule(i=_PICK)
    def unpin(self, i: int) -> None:
        name = _pick([n for n, c in self.in_use.items() if c], i)
        self.policy.unpin_in_use(name)
        self.in_use[name] -= 1

    @precondition(lambda self: bool(self.nbytes))
    @rule(i=_PICK)
    def prefetch(self, i: int) -> None:
        name = _pick(list(self.nbytes), i)
        nbytes = self.nbytes[name]
        expected, fits = self.expected_victims(self.budget - nbytes)
        allowed = (
            not self.explicit
            and not self.gated
            and name not in self.removing
            and self.floor[name] != "device"
            and name not in self.device
            and name not in self.loading
            and not self.loading
            and nbytes <= self.budget
            and fits
        )
        plan = self.policy.prefetch_plan(name)
        assert (plan is not None) == allowed, f"prefetch {plan} but allowed={allowed}"
        if plan is not None:
            assert list(plan.evict) == expected, "prefetch evicted outside LRU order"
            assert plan.oversize is None
            self.carry_out(plan)
            self.hand_out(plan)
            self.take_load(name, plan)

    @rule(reload=st.lists(st.sampled_from(WEIGHT_MODEL_NAMES), max_size=4))
    def compact(self, reload: list[str]) -> None:
        reload = [n for n in reload if n in self.nbytes]
        if self.loading or any(self.in_use.values()):
            try:
                self.policy.compact(reload)
            except LifecycleError:
                return
            raise AssertionError("compacted while a model was in use or loading")
        before = set(self.order)
        plan = self.policy.compact(reload)
        assert set(plan.evict) == before, "compaction must free every non-pinned device copy"
        self.carry_out(plan)
        self.hand_out(plan)
        self.order = []
        budget, total = self.budget, 0
        expected_loads = sorted(
            n for n in self.nbytes if self.floor[n] == "device" and n not in self.device
        )
        if not self.explicit:
            for n in dict.fromkeys(reload):
                if n in self.removing:
                    continue
                if self.floor[n] != "device" and total + self.nbytes[n] <= budget:
                    expected_loads.append(n)
                    self.order.append(n)
                    total += self.nbytes[n]
        assert list(plan.load) == expected_loads
        assert not self.policy.should_compact()

    @precondition(lambda self: bool(self.idle_registered()))
    @rule(i=_PICK, floor=st.sampled_from(["unpinned", "system", "device"]))
    def set_floor(self, i: int, floor: Residency) -> None:
        name = _pick(self.idle_registered(), i)
        old = self.floor[name]
        resident = name in self.device
        plan = self.policy.set_floor(name, floor)
        self.floor[name] = floor
        self.carry_out(plan, pinned_may_go=True)
        self.hand_out(plan)
        if floor == "device":
            if name in self.order:
                self.order.remove(name)
            if resident:
                self.pinned_resident.add(name)
        elif old == "device" and resident:
            self.pinned_resident.discard(name)
            if name in self.device:
                assert not self.explicit, "explicit mode must free a demoted device copy"
                self.order.append(name)

    @rule(budget=weight_budgets())
    def set_budget(self, budget: int) -> None:
        victims, fits = self.expected_victims(budget)
        busy = [n for n in self.order if self.busy(n)]
        try:
            plan = self.policy.set_budget(budget)
        except LifecycleError:
            assert not fits and len(busy) > 1
            return
        assert list(plan.evict) == victims
        self.carry_out(plan)
        self.hand_out(plan)
        for v in plan.evict:
            self.order.remove(v)

    @rule()
    def evict_idle(self) -> None:
        """Every idle on-demand copy goes, oldest first; the budget stays."""
        budget = self.budget
        victims = [n for n in self.order if not self.busy(n)]
        plan = self.policy.evict_idle()
        assert list(plan.evict) == victims and self.policy.budget == budget
        self.carry_out(plan)
        self.hand_out(plan)
        for v in plan.evict:
            self.order.remove(v)

    # --------------------------------------------------------- control commands

    @rule()
    def want_command(self) -> None:
        self.policy.want_command()
        self.waiting += 1

    @precondition(lambda self: self.waiting > 0)
    @rule()
    def try_start_command(self) -> None:
        """A command starts exactly when it can run alone: no other command runs, nothing
        is pinned in use, and every plan handed out has been reported done."""
        alone = not self.running and not any(self.in_use.values()) and not self.pending
        assert self.policy.try_start_command() == alone
        event("command: started" if alone else "command: waits")
        if alone:
            self.waiting -= 1
            self.running = True

    @precondition(lambda self: self.running)
    @rule()
    def end_running_command(self) -> None:
        self.policy.end_command(started=True)
        self.running = False

    @precondition(lambda self: self.waiting > 0)
    @rule()
    def give_up_waiting_command(self) -> None:
        self.policy.end_command(started=False)
        self.waiting -= 1

    # --------------------------------------------------------------- invariants

    @invariant()
    def budget_is_never_exceeded(self) -> None:
        """Resident on-demand bytes never exceed the budget, except for one model larger
        than the whole budget, which is then the only one loading or resident."""
        stats = self.policy.statistics()
        if stats.resident_bytes > self.budget:
            assert len(stats.lru) == 1, f"over budget with {stats.lru}"
            assert self.nbytes[stats.lru[0]] > self.budget

    @invariant()
    def accounting_matches_the_device(self) -> None:
        """The policy's residency is exactly what the driver's plans produced, and
        ``resident_bytes`` is the sum of the non-pinned models loading or resident."""
        stats = self.policy.statistics()
        for n, r in stats.models.items():
            assert (r.device == "resident") == (n in self.device), n
            assert (r.device == "loading") == (n in self.loading), n
            assert r.host == (n in self.host), n
            assert r.in_use == self.in_use.get(n, 0), n
        assert stats.resident_bytes == self.resident_bytes()
        assert stats.pinned_bytes == sum(
            b for n, b in self.nbytes.items() if self.floor[n] == "device"
        )

    @invariant()
    def device_floor_is_never_evicted(self) -> None:
        """Once a ``device``-floor model is loaded it stays on the device until it is
        unregistered or moved off the floor; nothing else releases it."""
        assert self.pinned_resident <= self.device

    @invariant()
    def in_use_is_never_evicted(self) -> None:
        """A model pinned by a running execution is on the device."""
        for n, c in self.in_use.items():
            if c:
                assert n in self.device, f"{n!r} is in use but not on the device"

    @invariant()
    def lru_follows_use(self) -> None:
        """The LRU is the order of use: least recently acquired (or prefetched) first."""
        assert self.policy.lru == tuple(self.order)

    @invariant()
    def host_copies_follow_floors(self) -> None:
        """A ``system`` model always has its host copy; an ``unpinned`` one has one only
        while it is loading (the transient map); so does a ``device`` one."""
        for n, floor in self.floor.items():
            if floor == "system":
                assert n in self.host, f"system model {n!r} lost its host copy"
            else:
                assert (n in self.host) == (n in self.loading), f"{floor} {n!r} host copy"

    @invariant()
    def explicit_mode_never_loads_on_demand(self) -> None:
        """In explicit mode only ``device``-floor models are ever on the device."""
        if self.explicit:
            for n in self.device | self.loading:
                assert self.floor[n] == "device", n


WeightCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWeightCache = WeightCacheMachine.TestCase

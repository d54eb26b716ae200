"""The model versions policy, sans-IO: ``ModelVersions`` driven by a Hypothesis machine.

No JAX, no Trio: the machine plays the worker's lifecycle driver (builds that succeed or
fail, unloads, the scheduler entry it keeps per name, the retirement loop that frees
versions later) and its request path (admit, wait at the gate, submit, finish), in any
interleaving. Lifecycle operations run one at a time and each waits until the policy
says it is settled, as the driver does; requests come and go freely meanwhile.

The end-to-end counterparts (a real worker swapping and unloading under load) are in
``tests/lifecycle/test_lifecycle_worker.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from strategies import lifecycle_names, version_batchings

from reactantserver.errors import BundleError, LifecycleError, NotFound, Unavailable
from reactantserver.lifecycle import (
    AddToScheduler,
    ModelState,
    ModelVersions,
    Rebatch,
    RemoveFromScheduler,
    Retire,
    SeedCosts,
    VersionAction,
    admits_requests,
)

S = ModelState


class Version:
    """A built version as the policy sees it: any hashable object (identity)."""

    def __init__(self, name: str, batching: Hashable | None, number: int) -> None:
        self.name = name
        self.batching = batching
        self.number = number

    def __repr__(self) -> str:
        return f"<{self.name} v{self.number} {self.batching}>"


class Token:
    """One admitted request: its version, and whether it was submitted."""

    def __init__(self, version: Version) -> None:
        self.version = version
        self.submitted = False


# ----------------------------------------------------------------------------- examples


def _drive(versions: ModelVersions[Version], actions: Sequence[VersionAction[Version]]) -> list:
    """Carry out scheduler actions at once (answering Rebatch); collect the Retires."""
    retires = []
    for action in actions:
        if isinstance(action, Rebatch):
            retires += _drive(versions, versions.rebatched(action.version))
        elif isinstance(action, Retire):
            retires.append(action.version)
    return retires


def test_a_swap_with_the_same_batching_retires_the_old_version_when_it_drains() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    old, new = Version("m", "b1", 1), Version("m", "b1", 2)
    versions.begin_load("m")
    assert versions.loaded("m", old, batching="b1") == (AddToScheduler(old),)
    assert versions.admit("m") is old
    versions.begin_load("m")
    assert versions.state("m") is S.RELOADING and versions.admit("m") is old
    assert versions.loaded("m", new, batching="b1") == (SeedCosts(new),)
    assert versions.state("m") is S.READY and not versions.gated(new)
    assert versions.admit("m") is new  # later requests get the new version
    assert versions.finish(new) == ()
    assert versions.finish(old) == ()  # the first admission to old...
    assert versions.finish(old) == (Retire(old),)  # ...and the second: drained
    assert versions.versions("m") == (old, new)
    assert versions.retired(old) == ()
    assert versions.versions("m") == (new,)


def test_a_swap_with_other_batching_gates_until_the_old_version_drains() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    old, new = Version("m", "b1", 1), Version("m", "b2", 2)
    versions.begin_load("m")
    versions.loaded("m", old, batching="b1")
    versions.admit("m")
    versions.begin_load("m")
    assert versions.loaded("m", new, batching="b2") == ()
    assert versions.gated(new) and versions.state("m") is S.RELOADING
    assert not versions.settled("m")
    assert versions.admit("m") is new  # admitted, but it must wait before it is submitted
    assert versions.finish(old) == (Rebatch(new),)
    assert versions.gated(new)  # until the driver has switched the scheduler entry
    assert versions.rebatched(new) == (Retire(old),)
    assert not versions.gated(new) and versions.state("m") is S.READY
    assert versions.settled("m")


def test_a_request_waits_only_for_the_gate_of_its_own_version() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    v1, v2, v3 = Version("m", "b1", 1), Version("m", "b2", 2), Version("m", "b1", 3)
    versions.begin_load("m")
    versions.loaded("m", v1, batching="b1")
    versions.admit("m")
    versions.begin_load("m")
    versions.loaded("m", v2, batching="b2")
    assert versions.admit("m") is v2 and versions.gated(v2)  # r2 waits for v1's drain
    assert versions.finish(v1) == (Rebatch(v2),)
    assert versions.rebatched(v2) == (Retire(v1),)
    # Before r2 is queued, v3 (other sizes again) replaces v2: r2 still runs on v2, at
    # v2's sizes, which the scheduler keeps until v2 drains -- it must not wait for v3.
    versions.begin_load("m")
    assert versions.loaded("m", v3, batching="b1") == ()
    assert versions.gated(v3) and not versions.gated(v2)
    assert not versions.gate_open("m")
    assert versions.finish(v2) == (Rebatch(v3),)


def test_a_swap_to_other_sizes_waits_for_every_older_version() -> None:
    """Found by the state machine below: v1 (sizes b1) has requests admitted, not yet
    queued; v2 (b1 too) replaces it, so v1 keeps draining at b1; then v3 (b2) replaces v2,
    which has nothing outstanding. The batching must not switch to b2 while v1's requests
    can still be queued at b1: the gate waits for v1 as well."""
    versions: ModelVersions[Version] = ModelVersions()
    v1, v2, v3 = Version("m", "b1", 1), Version("m", "b1", 2), Version("m", "b2", 3)
    versions.begin_load("m")
    versions.loaded("m", v1, batching="b1")
    versions.admit("m")
    versions.begin_load("m")
    assert versions.loaded("m", v2, batching="b1") == (SeedCosts(v2),)
    versions.begin_load("m")
    assert versions.loaded("m", v3, batching="b2") == ()  # v2 is drained, v1 is not
    assert versions.gated(v3) and not versions.gated(v1)
    assert versions.finish(v1) == (Retire(v1), Rebatch(v3))
    assert versions.rebatched(v3) == (Retire(v2),)
    assert versions.state("m") is S.READY and not versions.gated(v3)


def test_unload_drains_then_removes_the_entry_then_frees() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    v = Version("m", "b1", 1)
    versions.begin_load("m")
    versions.loaded("m", v, batching="b1")
    versions.admit("m")
    assert versions.unload("m") == ()
    with pytest.raises(NotFound, match="model 'm' is being unloaded"):
        versions.admit("m")
    assert versions.finish(v) == (RemoveFromScheduler("m"), Retire(v))
    assert versions.state("m") is S.DRAINING  # until the memory is freed
    versions.retired(v)
    assert versions.state("m") is S.UNLOADED
    with pytest.raises(NotFound, match="model 'm' is not loaded"):
        versions.admit("m")


def test_refusals_say_why() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    versions.begin_load("m")
    with pytest.raises(Unavailable, match="model 'm' is still loading"):
        versions.admit("m")
    versions.load_failed("m", "weights.safetensors: truncated")
    with pytest.raises(NotFound, match=r"model 'm' failed to load: weights\.safetensors"):
        versions.serving("m")


def test_a_kind_change_is_refused_before_anything_is_built() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    versions.begin_load("m")
    versions.loaded("m", Version("m", "b1", 1), batching="b1")
    versions.begin_load("m")
    with pytest.raises(BundleError, match="kind: meta cannot replace the kind: model"):
        versions.check_replaceable("m", meta=True)


def test_a_meta_version_holds_nothing_so_its_unload_is_immediate() -> None:
    versions: ModelVersions[Version] = ModelVersions()
    meta = Version("glue", None, 1)
    versions.begin_load("glue")
    assert versions.loaded("glue", meta, batching=None) == ()
    assert versions.admit("glue") is meta
    assert versions.unload("glue") == ()
    assert versions.state("glue") is S.UNLOADED  # the running request keeps its version
    assert versions.finish(meta) == ()
    assert versions.versions("glue") == ()


def test_a_meta_version_still_answering_holds_back_no_compiled_swap_or_unload() -> None:
    """Found by the state machine below: a meta version of "m" is unloaded with a request
    still running, then compiled versions of "m" are loaded. The meta request never queues
    at the name's batch sizes nor needs its scheduler entry, so a swap to other sizes does
    not wait for it (it waited for ever: the meta version's drain opened no gate), and an
    unload removes the entry and ends without it."""
    versions: ModelVersions[Version] = ModelVersions()
    meta, v2, v3 = Version("m", None, 1), Version("m", "b1", 2), Version("m", "b2", 3)
    versions.begin_load("m")
    versions.loaded("m", meta, batching=None)
    versions.admit("m")
    versions.unload("m")
    versions.begin_load("m")
    assert versions.loaded("m", v2, batching="b1") == (AddToScheduler(v2),)
    versions.begin_load("m")
    assert versions.loaded("m", v3, batching="b2") == (Rebatch(v3),)
    assert versions.rebatched(v3) == (Retire(v2),)
    assert versions.settled("m")
    assert versions.unload("m") == (RemoveFromScheduler("m"), Retire(v3))
    versions.retired(v2)
    versions.retired(v3)
    assert versions.state("m") is S.UNLOADED
    assert versions.finish(meta) == ()
    assert versions.versions("m") == ()


# ------------------------------------------------------------------------- the machine


class VersionsMachine(RuleBasedStateMachine):
    """Every event the policy accepts, in any order, against a model of the driver.

    The machine keeps what the driver would: the scheduler's batching per name (changed
    only by the actions), the versions freed (only by carrying out ``Retire``, later,
    in any order) and every admitted request. Its invariants, each stated on its method:
    requests run on their own version at its batching; nothing is freed while it has
    requests outstanding, nor twice; at most one version of a name admits; a failed
    build never replaces a serving version; and every replaced or unloaded version is
    eventually freed (``teardown`` answers every request and frees everything due,
    then checks that only serving versions are left).
    """

    def __init__(self) -> None:
        super().__init__()
        self.versions: ModelVersions[Version] = ModelVersions()
        self.sched: dict[str, Hashable] = {}
        self.freed: list[Version] = []
        self.tokens: list[Token] = []
        self.retire_queue: list[Version] = []
        #: The lifecycle operation in progress: ("build", name, batching) or ("settle", name).
        self.op: tuple[Any, ...] | None = None
        self.built = 0
        self.ever: list[Version] = []

    # ----------------------------------------------------------------- the driver

    def carry_out(self, actions: Sequence[VersionAction[Version]]) -> None:
        """What the driver does with actions: scheduler calls at once, Retire later."""
        for action in actions:
            event(f"action: {type(action).__name__}")
            if isinstance(action, AddToScheduler):
                v = action.version
                assert v.batching is not None and v.name not in self.sched
                self.sched[v.name] = v.batching
            elif isinstance(action, SeedCosts):
                v = action.version
                assert self.sched[v.name] == v.batching
            elif isinstance(action, Rebatch):
                v = action.version
                assert v.name in self.sched
                self.sched[v.name] = v.batching
                self.carry_out(self.versions.rebatched(v))
            elif isinstance(action, RemoveFromScheduler):
                # A meta version's requests run its glue, never in the name's entry.
                assert not any(
                    t.version.name == action.name and t.version.batching is not None
                    for t in self.tokens
                ), "the scheduler entry was removed while requests of the name are out"
                del self.sched[action.name]
            else:
                assert isinstance(action, Retire)
                assert action.version not in self.retire_queue, "retired twice"
                assert self.held(action.version) == 0
                self.retire_queue.append(action.version)

    def held(self, version: Version) -> int:
        return sum(1 for t in self.tokens if t.version is version)

    def progress(self) -> None:
        """A lifecycle operation ends once the policy says its name is settled."""
        if self.op is not None and self.op[0] == "settle" and self.versions.settled(self.op[1]):
            self.op = None

    # ------------------------------------------------------------- lifecycle rules

    @precondition(lambda self: self.op is None)
    @rule(name=lifecycle_names, batching=version_batchings)
    def begin_build(self, name: str, batching: Hashable | None) -> None:
        """A build starts; a kind change is refused at once and counts as a failed load."""
        before = self.versions.current.get(name)
        self.versions.begin_load(name)
        try:
            self.versions.check_replaceable(name, meta=batching is None)
        except BundleError as exc:
            event("build: kind change refused")
            self.versions.load_failed(name, exc.detail)
            assert self.versions.current.get(name) is before
            return
        self.op = ("build", name, batching)

    @precondition(lambda self: self.op is not None and self.op[0] == "build")
    @rule()
    def build_fails(self) -> None:
        """A failed build never replaces a serving version (invariant 4)."""
        assert self.op is not None
        _, name, _ = self.op
        before = self.versions.current.get(name)
        self.versions.load_failed(name, "compile error")
        assert self.versions.current.get(name) is before
        assert self.versions.state(name) is (S.READY if before is not None else S.FAILED)
        self.op = None

    @precondition(lambda self: self.op is not None and self.op[0] == "build")
    @rule()
    def build_succeeds(self) -> None:
        assert self.op is not None
        _, name, batching = self.op
        self.built += 1
        version = Version(name, batching, self.built)
        self.ever.append(version)
        self.carry_out(self.versions.loaded(name, version, batching=batching))
        assert self.versions.current[name] is version
        event("swap: gated" if self.versions.gated(version) else "swap: immediate")
        self.op = ("settle", name)
        self.progress()

    @precondition(lambda self: self.op is None)
    @rule(name=lifecycle_names)
    def unload(self, name: str) -> None:
        state = self.versions.state(name)
        if state is S.FAILED or name in self.versions.current:
            self.carry_out(self.versions.unload(name))
            self.op = ("settle", name)
            self.progress()
        else:
            with pytest.raises(NotFound):
                self.versions.unload(name)

    @precondition(lambda self: self.op is None)
    @rule(name=lifecycle_names)
    def forget(self, name: str) -> None:
        if self.versions.state(name) is S.UNLOADED:
            self.versions.forget(name)
        else:
            with pytest.raises(LifecycleError):
                self.versions.forget(name)

    # --------------------------------------------------------------- request rules

    @rule(name=lifecycle_names)
    def admit(self, name: str) -> None:
        """Only the serving version is ever handed out (invariant 3)."""
        state = self.versions.state(name)
        serving = self.versions.current.get(name)
        if serving is None:
            expected = Unavailable if state is S.LOADING else NotFound
            with pytest.raises(expected):
                self.versions.admit(name)
            return
        version = self.versions.admit(name)
        assert version is serving
        self.tokens.append(Token(version))

    @precondition(lambda self: any(not t.submitted for t in self.tokens))
    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        """A request reaches the scheduler only past its gate, and then the name's entry
        batches as its version does: it runs on the version that admitted it (1)."""
        token = data.draw(st.sampled_from([t for t in self.tokens if not t.submitted]))
        v = token.version
        if self.versions.gated(v):
            event("submit: waits at the gate")
            return
        assert v not in self.freed
        if v.batching is not None:  # (a meta model's request runs its glue, not a batch)
            assert self.sched.get(v.name) == v.batching
        token.submitted = True

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """Answered, failed or cancelled (submitted or not): the admission ends."""
        token = data.draw(st.sampled_from(self.tokens))
        self.tokens.remove(token)
        self.carry_out(self.versions.finish(token.version))
        self.progress()

    @precondition(lambda self: self.retire_queue)
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        """The retirement loop frees one due version, in any order."""
        version = data.draw(st.sampled_from(self.retire_queue))
        self.retire_queue.remove(version)
        self.freed.append(version)
        self.carry_out(self.versions.retired(version))
        self.progress()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def outstanding_counts_every_admission(self) -> None:
        """The policy's outstanding count of each version is its unfinished admissions."""
        counts = Counter(t.version for t in self.tokens)
        for version in self.ever:
            assert self.versions.outstanding(version) == counts[version]

    @invariant()
    def nothing_freed_while_outstanding_or_twice(self) -> None:
        """No version is freed while it has outstanding requests, and none twice (2)."""
        assert len(set(self.freed)) == len(self.freed)
        for version in self.freed:
            assert self.held(version) == 0
            assert version not in self.versions.versions(version.name)

    @invariant()
    def one_admitting_version_per_name(self) -> None:
        """A name admits exactly while its state admits, through one version; every other
        live version of the name is retiring (3)."""
        for name in ("a", "b", "c"):
            state = self.versions.state(name)
            serving = self.versions.current.get(name)
            assert (serving is not None) == admits_requests(state)
            live = self.versions.versions(name)
            assert serving is None or serving in live

    @invariant()
    def the_scheduler_entry_follows_the_serving_version(self) -> None:
        """A compiled serving version has the name's scheduler entry, batching its way
        unless a gate holds its requests back while the old version drains."""
        for name, version in self.versions.current.items():
            if version.batching is not None:
                assert name in self.sched
                assert self.sched[name] == version.batching or self.versions.gated(version)

    def teardown(self) -> None:
        """Eventually every replaced or unloaded version is freed (5): answer every
        request, free everything due, and only the serving versions are left."""
        for token in list(self.tokens):
            self.tokens.remove(token)
            self.carry_out(self.versions.finish(token.version))
        while self.retire_queue:
            version = self.retire_queue.pop(0)
            self.freed.append(version)
            self.carry_out(self.versions.retired(version))
        self.progress()
        building = self.op[1] if self.op is not None and self.op[0] == "build" else None
        assert self.op is None or building is not None
        for name in ("a", "b", "c"):
            serving = self.versions.current.get(name)
            assert self.versions.versions(name) == ((serving,) if serving else ())
            assert self.versions.settled(name) or name == building
        for version in self.ever:
            gone = version not in self.versions.versions(version.name)
            # A compiled version leaves only by being freed; a meta one holds nothing.
            assert gone == (version in self.freed) or version.batching is None


TestVersionsMachine = VersionsMachine.TestCase
TestVersionsMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


def test_an_unknown_name_is_answered_with_the_closest_known_ones() -> None:
    """``NOT_FOUND: model 'irsi' is not loaded; did you mean 'iris'?`` -- a hint only for
    a name the worker never had, and only when a known name is close."""
    versions: ModelVersions[Version] = ModelVersions()
    for name in ("iris", "mlp", "double"):
        versions.begin_load(name)
        versions.loaded(name, Version(name, "b1", 1), batching="b1")
    with pytest.raises(NotFound) as typo:
        versions.admit("irsi")
    assert str(typo.value) == "model 'irsi' is not loaded; did you mean 'iris'?"
    with pytest.raises(NotFound) as unrelated:
        versions.admit("resnet50")
    assert str(unrelated.value) == "model 'resnet50' is not loaded"

"""The sans-IO lifecycle rules: the state table and the debounced repository diff.

No JAX, no Trio, no files: ``ModelTable`` and ``RepositoryWatch`` are plain objects fed
events and polls. The end-to-end behaviour (a real worker swapping, draining and
refusing under load) is in ``tests/lifecycle/test_lifecycle_worker.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from strategies import lifecycle_names, repository_polls

from reactantserver.errors import LifecycleError
from reactantserver.lifecycle import (
    TRANSITIONS,
    Action,
    LifecycleEvent,
    ModelRecord,
    ModelState,
    ModelTable,
    RepositoryWatch,
    admits_requests,
    changed_files,
    index_view,
)
from reactantserver.lifecycle.states import INDEX_VIEW

S = ModelState
E = LifecycleEvent

#: The lifecycle written out once more, by hand, as the specification the table must match.
EXPECTED = {
    (S.UNLOADED, E.LOAD): S.LOADING,
    (S.FAILED, E.LOAD): S.LOADING,
    (S.LOADING, E.LOADED): S.READY,
    (S.LOADING, E.LOAD_FAILED): S.FAILED,
    (S.READY, E.LOAD): S.RELOADING,
    (S.RELOADING, E.LOADED): S.READY,
    (S.RELOADING, E.LOAD_FAILED): S.READY,
    (S.READY, E.UNLOAD): S.DRAINING,
    (S.DRAINING, E.DRAINED): S.UNLOADED,
    (S.FAILED, E.UNLOAD): S.UNLOADED,
}

#: A legal path from a fresh name to each state.
PATHS = {
    S.UNLOADED: [],
    S.LOADING: [E.LOAD],
    S.READY: [E.LOAD, E.LOADED],
    S.RELOADING: [E.LOAD, E.LOADED, E.LOAD],
    S.DRAINING: [E.LOAD, E.LOADED, E.UNLOAD],
    S.FAILED: [E.LOAD, E.LOAD_FAILED],
}


def _apply(table: ModelTable, name: str, event: LifecycleEvent) -> ModelRecord:
    return table.apply(name, event, "boom" if event is E.LOAD_FAILED else "")


def table_in(state: ModelState, name: str = "m") -> ModelTable:
    table = ModelTable()
    for event in PATHS[state]:
        _apply(table, name, event)
    assert table.state(name) is state
    return table


def test_the_table_is_exactly_the_specification() -> None:
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("state", list(ModelState))
@pytest.mark.parametrize("event", list(LifecycleEvent))
def test_every_pair_is_either_a_transition_or_an_error(
    state: ModelState, event: LifecycleEvent
) -> None:
    table = table_in(state)
    before = table.get("m")
    if (state, event) in EXPECTED:
        assert _apply(table, "m", event).state is EXPECTED[state, event]
        assert table.state("m") is EXPECTED[state, event]
    else:
        with pytest.raises(LifecycleError, match=f"'{event.value}' is not allowed in state"):
            _apply(table, "m", event)
        assert table.get("m") == before  # an illegal event changes nothing


def test_only_ready_and_reloading_admit_requests() -> None:
    assert {s for s in ModelState if admits_requests(s)} == {S.READY, S.RELOADING}


def test_a_failed_reload_keeps_the_old_version_ready_with_the_reason() -> None:
    table = table_in(S.READY)
    table.apply("m", E.LOAD)
    assert index_view(table.get("m")) == (
        "READY",
        "a new version is compiling; this one serves until it is ready",
    )
    record = table.apply("m", E.LOAD_FAILED, "weights.safetensors: truncated")
    assert record == ModelRecord(S.READY, "weights.safetensors: truncated")
    state, reason = index_view(record)
    assert state == "READY"
    assert reason == (
        "serving the previous version; the new one failed: weights.safetensors: truncated"
    )
    # The retry keeps the reason visible while it compiles; success clears it.
    assert table.apply("m", E.LOAD).error == "weights.safetensors: truncated"
    assert table.apply("m", E.LOADED) == ModelRecord(S.READY, "")
    assert table.load_failures == {"m": 1}


def test_index_view_speaks_tritons_vocabulary() -> None:
    assert index_view(ModelRecord(S.LOADING)) == ("LOADING", "compiling")
    assert index_view(ModelRecord(S.LOADING, "bad")) == (
        "LOADING",
        "compiling again after a failure: bad",
    )
    assert index_view(ModelRecord(S.DRAINING))[0] == "UNLOADING"
    assert index_view(ModelRecord(S.FAILED, "bad manifest")) == ("UNAVAILABLE", "bad manifest")
    assert index_view(ModelRecord(S.UNLOADED)) == ("UNAVAILABLE", "not loaded")
    assert index_view(ModelRecord(S.READY)) == ("READY", "")


def test_index_view_has_a_row_for_every_state() -> None:
    """Every state has its RepositoryIndex row, and only a reason with ``{error}`` shows
    the record's error (verbatim, braces included)."""
    assert set(INDEX_VIEW) == set(ModelState)
    for state, (_, reason, failed) in INDEX_VIEW.items():
        shown = index_view(ModelRecord(state, "x {y}"))[1]
        assert shown == (failed.replace("{error}", "x {y}") if "{error}" in failed else reason)


def test_a_reason_comes_with_load_failed_and_only_with_it() -> None:
    table = table_in(S.LOADING)
    with pytest.raises(LifecycleError, match="reason is required"):
        table.apply("m", E.LOAD_FAILED)
    with pytest.raises(LifecycleError, match="reason is required"):
        table.apply("m", E.LOADED, "why")
    assert table.state("m") is S.LOADING


def test_forget_and_declare() -> None:
    table = table_in(S.READY)
    with pytest.raises(LifecycleError, match="only an unloaded model can be forgotten"):
        table.forget("m")
    table.apply("m", E.UNLOAD)
    table.apply("m", E.DRAINED)
    table.forget("m")
    assert "m" not in table.records
    table.declare("x")
    assert table.records == {"x": ModelRecord(S.UNLOADED)}
    table.declare("x")  # idempotent
    table_failed = table_in(S.FAILED)
    table_failed.declare("m")  # never resets a known name
    assert table_failed.state("m") is S.FAILED
    assert table_failed.in_state(S.FAILED) == ["m"]


class ModelTableMachine(RuleBasedStateMachine):
    """Random events on a few names: the table only ever moves along its transitions.

    Invariants: an accepted event moves exactly as ``EXPECTED`` says and a refused one
    raises ``LifecycleError`` and changes nothing; ``FAILED`` always has a reason and
    ``DRAINING``/``UNLOADED`` never do; ``load_failures`` counts the accepted
    ``LOAD_FAILED`` events per name, also for names forgotten since.
    """

    def __init__(self) -> None:
        super().__init__()
        self.table = ModelTable()
        self.failures: Counter[str] = Counter()

    @rule(name=lifecycle_names, event=st.sampled_from(list(LifecycleEvent)))
    def event(self, name: str, event: LifecycleEvent) -> None:
        before = self.table.get(name)
        expected = EXPECTED.get((before.state, event))
        if expected is None:
            with pytest.raises(LifecycleError):
                _apply(self.table, name, event)
            assert self.table.get(name) == before
            return
        assert _apply(self.table, name, event).state is expected
        if event is E.LOAD_FAILED:
            self.failures[name] += 1

    @rule(name=lifecycle_names)
    def forget(self, name: str) -> None:
        if self.table.state(name) is S.UNLOADED:
            self.table.forget(name)
            assert name not in self.table.records
        else:
            with pytest.raises(LifecycleError):
                self.table.forget(name)

    @invariant()
    def reasons_match_states(self) -> None:
        for record in self.table.records.values():
            if record.state is S.FAILED:
                assert record.error
            if record.state in (S.DRAINING, S.UNLOADED):
                assert not record.error

    @invariant()
    def failures_are_counted(self) -> None:
        assert dict(self.table.load_failures) == dict(self.failures)


TestModelTableMachine = ModelTableMachine.TestCase
TestModelTableMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# ------------------------------------------------------------------------- the repository diff

V1 = (("manifest.yaml", 10, 1), ("weights.safetensors", 64, 1))
V2 = (("manifest.yaml", 10, 1), ("weights.safetensors", 64, 2))
V3 = (("manifest.yaml", 10, 1), ("weights.safetensors", 32, 3))


def test_a_new_bundle_is_added_on_the_second_identical_poll() -> None:
    watch = RepositoryWatch()
    assert watch.observe({"a": V1}) == []
    assert watch.pending == {"a": V1}
    assert watch.observe({"a": V1}) == [Action("add", "a", V1, ())]
    assert watch.acted == {"a": V1}
    assert watch.observe({"a": V1}) == []  # nothing changes any more


def test_a_bundle_being_written_is_left_alone_until_it_settles() -> None:
    watch = RepositoryWatch({"a": V1})
    assert watch.observe({"a": V2}) == []
    assert watch.observe({"a": V3}) == []  # still changing
    assert watch.observe({"a": V3}) == [Action("replace", "a", V3, V1)]


def test_a_change_undone_before_the_second_poll_is_never_acted_on() -> None:
    watch = RepositoryWatch({"a": V1})
    assert watch.observe({"a": V2}) == []
    assert watch.observe({"a": V1}) == []
    assert watch.pending == {}
    assert watch.observe({"a": V1}) == []


def test_a_directory_that_flickers_in_and_out_is_not_added() -> None:
    # Found by the property below: a pending name absent from both the poll and the
    # acted view must still be forgotten, or its third sighting would count as second.
    watch = RepositoryWatch()
    assert watch.observe({"a": V1}) == []
    assert watch.observe({}) == []
    assert watch.pending == {}
    assert watch.observe({"a": V1}) == []
    assert watch.observe({"a": V1}) == [Action("add", "a", V1, ())]


def test_removal_needs_two_polls_and_comes_first() -> None:
    watch = RepositoryWatch({"a": V1, "z": V1})
    assert watch.observe({"b": V2}) == []  # a and z gone once, b new once
    assert watch.observe({"b": V2}) == [
        Action("remove", "a", (), V1),
        Action("remove", "z", (), V1),
        Action("add", "b", V2, ()),
    ]
    assert watch.acted == {"b": V2}


def test_a_failed_version_is_retried_only_when_its_files_change_again() -> None:
    # The watch records what it acted on whatever the outcome: polls that keep seeing
    # the failed signature do nothing; touching a file asks for a retry.
    watch = RepositoryWatch({"a": V1})
    watch.observe({"a": V2})
    assert watch.observe({"a": V2}) == [Action("replace", "a", V2, V1)]  # ... and it fails
    for _ in range(3):
        assert watch.observe({"a": V2}) == []
    watch.observe({"a": V3})
    assert watch.observe({"a": V3}) == [Action("replace", "a", V3, V2)]


def test_changed_files_names_what_differs() -> None:
    assert changed_files(V1, V2) == ["weights.safetensors"]
    assert changed_files((), V1) == ["manifest.yaml", "weights.safetensors"]
    assert changed_files((*V1, ("model.py", 5, 5)), V1) == ["model.py"]
    assert changed_files(V1, V1) == []


@settings(max_examples=300, deadline=None)
@given(polls=repository_polls(), start_empty=st.booleans())
def test_actions_follow_two_identical_polls_and_converge(
    polls: list[dict[str, tuple[tuple[str, int, int], ...]]], start_empty: bool
) -> None:
    """Every action for (name, sig) was seen on this poll and the previous one (absence
    for a removal); an action never repeats what was acted on; replaying the actions
    gives the watch's acted view; two identical consecutive polls leave acted == poll."""
    baseline = {} if start_empty else dict(polls[0])
    watch = RepositoryWatch(baseline)
    replay = dict(baseline)
    previous: dict[str, tuple[tuple[str, int, int], ...]] | None = None
    for poll in polls:
        actions = watch.observe(poll)
        kinds = [a.kind for a in actions]
        assert kinds == sorted(kinds, key=lambda k: k != "remove")  # removals first
        for action in actions:
            assert previous is not None, "nothing is acted on after a single poll"
            now = poll.get(action.name)
            assert previous.get(action.name) == now
            assert action.previous == replay.get(action.name, ())
            if action.kind == "remove":
                assert now is None and action.name in replay
                del replay[action.name]
            else:
                assert action.signature == now
                assert action.signature != replay.get(action.name)
                assert (action.kind == "add") == (action.name not in replay)
                replay[action.name] = action.signature
        assert dict(watch.acted) == replay
        if previous is not None and previous == poll:
            assert dict(watch.acted) == poll
        previous = poll

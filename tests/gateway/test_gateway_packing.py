"""The LPT packer: REFERENCE section 10's worked examples and Hypothesis properties."""

from __future__ import annotations

import random

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from strategies import pack_problems

from reactantserver.gateway.core.packing import (
    ModelDemand,
    PackPolicy,
    Placement,
    WorkerCapacity,
    lpt_order,
    pack,
)


def _demand(name: str, load: float, nbytes: int = 0) -> ModelDemand:
    return ModelDemand(name=name, rate=1.0, cost=load, nbytes=nbytes)


W2 = [WorkerCapacity(address="w0"), WorkerCapacity(address="w1")]


# ---------------------------------------------------------------- worked examples


def test_lpt_worked_example() -> None:
    """a .5 -> w0 (tie, by address); b .4 -> w1 (w0 would be .9); c .1 -> w1 (.5 < .6)."""
    result = pack([_demand("c", 0.1), _demand("a", 0.5), _demand("b", 0.4)], W2)
    assert dict(result.placement.models) == {"a": ("w0",), "b": ("w1",), "c": ("w1",)}
    assert result.workers["w0"].compute == 0.5
    assert result.workers["w1"].compute == 0.5
    assert result.warnings == ()


def test_replicas_put_a_model_on_k_distinct_workers() -> None:
    workers = [WorkerCapacity(address=f"w{i}") for i in range(3)]
    policy = PackPolicy(replicas={"hot": 2, "every": "all"})
    result = pack(
        [_demand("hot", 0.8), _demand("every", 0.3), _demand("cold", 0.1)], workers, None, policy
    )
    models = result.placement.models
    assert models["hot"] == ("w0", "w1")  # 0.4 each
    assert models["every"] == ("w0", "w1", "w2")
    assert models["cold"] == ("w2",)  # w2 carries 0.1 against 0.5 on the others
    assert result.placement.weight("hot", "w1") == 0.5
    assert result.placement.weight("hot", "w2") == 0.0
    # A count above the fleet is clamped to the fleet.
    big = pack([_demand("hot", 0.8)], workers, None, PackPolicy(default_replicas=9))
    assert big.placement.models["hot"] == ("w0", "w1", "w2")


def test_memory_spreads_idle_models_by_bytes() -> None:
    """With no traffic, pressure is the memory share: models spread so each worker fits."""
    workers = [WorkerCapacity(address="w0", budget=1000), WorkerCapacity(address="w1", budget=1000)]
    demands = [_demand(n, 0.0, b) for n, b in (("a", 600), ("b", 500), ("c", 400), ("d", 300))]
    result = pack(demands, workers)
    assert dict(result.placement.models) == {
        "a": ("w0",),
        "b": ("w1",),
        "c": ("w1",),  # 900/1000 on w1 beats 1000/1000 on w0
        "d": ("w0",),
    }
    assert [w.assigned_bytes for w in result.workers.values()] == [900, 900]
    assert result.warnings == ()


def test_hysteresis_keeps_a_placement_within_the_factor() -> None:
    """a .5 stays on w0, b .45 on w1; c .1 was on w0, where it would cost .60 against .55 on
    w1: it moves without hysteresis, and stays once .60 <= .55 x (1 + h), i.e. h >= 1/11."""
    previous = Placement.of({"a": ["w0"], "b": ["w1"], "c": ["w0"]})
    demands = [_demand("a", 0.5), _demand("b", 0.45), _demand("c", 0.1)]
    moved = pack(demands, W2, previous, PackPolicy(hysteresis=0.0))
    assert dict(moved.placement.models) == {"a": ("w0",), "b": ("w1",), "c": ("w1",)}
    assert moved.moved == ("c",)
    assert pack(demands, W2, previous, PackPolicy(hysteresis=0.05)).placement.models["c"] == ("w1",)
    kept = pack(demands, W2, previous, PackPolicy(hysteresis=0.1))
    assert dict(kept.placement.models) == {"a": ("w0",), "b": ("w1",), "c": ("w0",)}
    assert kept.moved == ()
    # A tie keeps the previous worker even without hysteresis (a: .5 on either).
    assert pack([_demand("a", 0.5)], W2, Placement.of({"a": ["w1"]})).placement.models["a"] == (
        "w1",
    )


def test_forbid_places_only_where_weights_fit() -> None:
    workers = [WorkerCapacity(address="w0", budget=1000), WorkerCapacity(address="w1", budget=500)]
    # hot (an overloaded model, u = 1.5) takes w0; big (600 B) fits only on w0. Without forbid
    # the pressures are max(1.55, .7) on w0 against max(.05, 1.2) on w1, so it oversubscribes
    # w1; with forbid it goes where it fits.
    demands = [_demand("hot", 1.5, 100), _demand("big", 0.05, 600)]
    forbid = pack(demands, workers, None, PackPolicy(forbid_memory_oversubscription=True))
    assert forbid.placement.models["big"] == ("w0",)
    assert forbid.warnings == ()
    allow = pack(demands, workers, None, PackPolicy(forbid_memory_oversubscription=False))
    assert allow.placement.models["big"] == ("w1",)
    assert allow.oversubscribed == ("w1",)
    (warning,) = allow.warnings
    assert "worker w1" in warning and "600 bytes" in warning and "500 bytes" in warning


def test_a_model_that_fits_nowhere_is_placed_and_warned_about() -> None:
    workers = [WorkerCapacity(address="w0", budget=100), WorkerCapacity(address="w1", budget=100)]
    result = pack([_demand("huge", 0.1, 500)], workers)
    assert result.placement.models["huge"] == ("w0",)
    assert result.oversubscribed == ("w0",)


def test_lpt_order_is_load_then_bytes_then_name() -> None:
    demands = [_demand("b", 0.1, 5), _demand("a", 0.1, 5), _demand("c", 0.1, 9), _demand("d", 0.2)]
    assert [d.name for d in lpt_order(demands)] == ["d", "c", "a", "b"]


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(problem=pack_problems())
def test_every_model_on_min_k_n_distinct_workers(problem: tuple) -> None:  # type: ignore[type-arg]
    """Each model is placed on exactly min(k, n) distinct workers, all of them real."""
    demands, workers, policy = problem
    result = pack(demands, workers, None, policy)
    addresses = {w.address for w in workers}
    assert set(result.placement.models) == {d.name for d in demands}
    for d in demands:
        placed = result.placement.models[d.name]
        assert len(placed) == len(set(placed)) == policy.replicas_of(d.name, len(workers))
        assert set(placed) <= addresses


#: Hypothesis's find: no arrangement of these fits (any two of the four large models
#: exceed 600 B), and the repair used to flip w1 and w2's models at every repack, because
#: only a previous placement that *fits* could be kept.
_NOTHING_FITS = (
    [
        ModelDemand(name="m0", rate=1.0, cost=0.001, nbytes=2),
        ModelDemand(name="m1", rate=0.0, cost=0.001, nbytes=234),
        ModelDemand(name="m2", rate=0.0, cost=0.001, nbytes=367),
        ModelDemand(name="m3", rate=1.0, cost=0.001, nbytes=368),
        ModelDemand(name="m4", rate=0.0, cost=0.001, nbytes=234),
    ],
    [
        WorkerCapacity(address="w0", budget=300),
        WorkerCapacity(address="w1", budget=600),
        WorkerCapacity(address="w2", budget=600),
    ],
    PackPolicy(default_replicas=1, hysteresis=0.0, forbid_memory_oversubscription=True),
)

#: Nothing fits here either (w1 and w2 must hold one copy of each model). The second repack
#: puts 2 B over w1's budget instead of 3 B over w2's: fewer bytes over at a higher pressure
#: (302/300 > 603/600) -- a move, then no more.
_LESS_OVER_AT_A_HIGHER_PRESSURE = (
    [
        ModelDemand(name="m0", rate=0.0, cost=0.001, nbytes=56),
        ModelDemand(name="m1", rate=0.0, cost=0.001, nbytes=193),
        ModelDemand(name="m2", rate=0.0, cost=0.001, nbytes=246),
        ModelDemand(name="m3", rate=1.0, cost=0.001, nbytes=164),
        ModelDemand(name="m4", rate=1.0, cost=0.001, nbytes=193),
    ],
    [
        WorkerCapacity(address="w0", budget=0),
        WorkerCapacity(address="w1", budget=300),
        WorkerCapacity(address="w2", budget=600),
    ],
    PackPolicy(default_replicas=2, hysteresis=0.1, forbid_memory_oversubscription=True),
)
#: Found by Hypothesis: the second repack's greedy pass needed no repair and undid the
#: first one's, at a higher highest pressure (1.0 against 0.907).
_GREEDY_UNDOES_A_REPAIR = (
    [
        ModelDemand(name="m0", rate=1.0, cost=0.001, nbytes=155),
        ModelDemand(name="m1", rate=0.0, cost=0.001, nbytes=0),
        ModelDemand(name="m2", rate=0.0, cost=0.001, nbytes=329),
        ModelDemand(name="m3", rate=1.0, cost=0.001, nbytes=1),
        ModelDemand(name="m4", rate=1.0, cost=0.001, nbytes=116),
        ModelDemand(name="m5", rate=1.0, cost=0.001, nbytes=272),
        ModelDemand(name="m6", rate=0.0, cost=0.001, nbytes=0),
    ],
    [WorkerCapacity(address="w0:80", budget=600), WorkerCapacity(address="w1:80", budget=600)],
    PackPolicy(default_replicas=1, hysteresis=0.1, forbid_memory_oversubscription=True),
)


#: Found by Hypothesis: m1 fits nowhere, and the repair's two mirror-image arrangements
#: (w0 and w1 swapped) have the same excess and the same highest pressure -- summed in
#: another order, so one last bit apart. Compared without a rounding tolerance the
#: previous placement lost to its mirror image at every repack, for ever.
_MIRRORS_EQUAL_BUT_FOR_ROUNDING = (
    [
        ModelDemand(name="m0", rate=0.0, cost=0.001, nbytes=188),
        ModelDemand(name="m1", rate=40.0, cost=0.03, nbytes=13),
        ModelDemand(name="m2", rate=0.0, cost=0.001, nbytes=0),
        ModelDemand(name="m3", rate=1.0, cost=0.001, nbytes=187),
        ModelDemand(name="m4", rate=1.0, cost=0.001, nbytes=400),
        ModelDemand(name="m5", rate=2.5, cost=0.03, nbytes=0),
        ModelDemand(name="m6", rate=0.0, cost=0.001, nbytes=213),
    ],
    [
        WorkerCapacity(address="w0:80", budget=600),
        WorkerCapacity(address="w1:80", budget=600),
        WorkerCapacity(address="w2:80", budget=600),
        WorkerCapacity(address="w3:80", budget=1000),
    ],
    PackPolicy(
        default_replicas=2,
        replicas={"m1": 1, "m4": 4},
        hysteresis=0.0,
        forbid_memory_oversubscription=True,
    ),
)


@settings(max_examples=300, deadline=None)
@given(problem=pack_problems(), rnd=st.randoms(use_true_random=False))
@example(problem=_NOTHING_FITS, rnd=random.Random(0))
@example(problem=_MIRRORS_EQUAL_BUT_FOR_ROUNDING, rnd=random.Random(0))
@example(problem=_LESS_OVER_AT_A_HIGHER_PRESSURE, rnd=random.Random(0))
@example(problem=_GREEDY_UNDOES_A_REPAIR, rnd=random.Random(0))
def test_packing_is_deterministic(problem: tuple, rnd: random.Random) -> None:  # type: ignore[type-arg]
    """The result depends only on the input: the same input in any order gives the same
    placement. Packing again from the result changes nothing, unless a repair was needed;
    then every repeated repack that moves something lowers the placement's (bytes over
    budgets, highest pressure) -- fewer bytes over, or as many and a highest pressure no
    higher; fitting comes first, as forbid_memory_oversubscription says -- and they settle."""
    demands, workers, policy = problem
    first = pack(demands, workers, None, policy)
    shuffled = pack(
        rnd.sample(demands, len(demands)), rnd.sample(workers, len(workers)), None, policy
    )
    assert first == shuffled
    current = first
    for _ in range(8):
        again = pack(demands, workers, current.placement, policy)
        if again.placement == current.placement:
            assert again.moved == ()
            break
        assert current.repaired or again.repaired, "moved without a repair"
        assert _excess(again) < _excess(current) or (
            _excess(again) == _excess(current) and _highest(again) <= _highest(current) + 1e-12
        )
        current = again
    else:
        raise AssertionError("repacking did not settle")


def _excess(result: object) -> int:
    return sum(
        max(0, w.assigned_bytes - w.budget) if w.budget > 0 else 0
        for w in result.workers.values()  # type: ignore[attr-defined]
    )


def _highest(result: object) -> float:
    return max((w.pressure for w in result.workers.values()), default=0.0)  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(problem=pack_problems(), data=st.data())
def test_a_move_needs_more_than_the_hysteresis(problem: tuple, data: st.DataObject) -> None:  # type: ignore[type-arg]
    """With hysteresis h, a model leaves a previous worker for a new one only if the
    previous worker's pressure exceeds the newcomer's by more than the factor 1 + h
    (pressures as the packer saw them when it placed the model, replayed here in LPT order
    from the result). With forbid on, only workers in the same fits/does-not-fit class
    are compared (forbid may move a model off a worker where it no longer fits)."""
    demands, workers, policy = problem
    addresses = [w.address for w in workers]
    previous = Placement.of(
        {
            d.name: data.draw(st.lists(st.sampled_from(addresses), unique=True, max_size=3))
            for d in demands
        }
    )
    result = pack(demands, workers, previous, policy)
    assume(not result.repaired)  # repairs put fitting first, whatever the pressure
    budget = {w.address: w.budget for w in workers}
    compute = dict.fromkeys(addresses, 0.0)
    memory = dict.fromkeys(addresses, 0)
    for d in lpt_order(demands):
        placed = result.placement.models[d.name]
        load = d.load / len(placed)

        def pressure(w: str, d: ModelDemand = d, load: float = load) -> float:
            share = (memory[w] + d.nbytes) / budget[w] if budget[w] else 0.0
            return max(compute[w] + load, share)

        def fits(w: str, d: ModelDemand = d) -> bool:
            return budget[w] == 0 or memory[w] + d.nbytes <= budget[w]

        dropped = [w for w in previous.workers_of(d.name) if w not in placed]
        newcomers = [w for w in placed if w not in previous.workers_of(d.name)]
        for p in dropped:
            for n in newcomers:
                if policy.forbid_memory_oversubscription and fits(p) != fits(n):
                    continue
                assert pressure(p) > pressure(n) * (1 + policy.hysteresis), (d.name, p, n)
        for w in placed:
            compute[w] += load
            memory[w] += d.nbytes


@settings(max_examples=300, deadline=None)
@given(problem=pack_problems())
def test_forbid_leaves_no_oversubscription_one_step_could_undo(problem: tuple) -> None:  # type: ignore[type-arg]
    """With forbid on, an oversubscribed worker remains only if none of its replicas could
    move to a worker where it fits, nor swap with a smaller replica of a worker that would
    still fit afterwards (checked here by brute force on the result)."""
    demands, workers, policy = problem
    policy = PackPolicy(
        default_replicas=policy.default_replicas,
        replicas=policy.replicas,
        hysteresis=policy.hysteresis,
        forbid_memory_oversubscription=True,
    )
    result = pack(demands, workers, None, policy)
    size = {d.name: d.nbytes for d in demands}
    plans = result.workers
    for over in (p for p in plans.values() if p.oversubscribed):
        for model in over.models:
            if size[model] == 0:
                continue
            for t in plans.values():
                if t.address == over.address or model in t.models:
                    continue
                assert t.budget > 0 and t.assigned_bytes + size[model] > t.budget, (
                    f"{model} could move from {over.address} to {t.address}"
                )
                for other in t.models:
                    if size[other] < size[model] and other not in over.models:
                        after = t.assigned_bytes - size[other] + size[model]
                        assert after > t.budget, f"{model} could swap with {other}"


def test_repair_fits_what_the_greedy_could_not() -> None:
    """Loads place the small hot models first and spread them; the big idle one comes last
    and fits nowhere, though a fitting arrangement exists: the repair finds it."""
    workers = [WorkerCapacity(address="w0", budget=1000), WorkerCapacity(address="w1", budget=1000)]
    demands = [
        _demand("hot1", 0.4, 300),
        _demand("hot2", 0.3, 300),
        _demand("warm", 0.2, 300),
        _demand("big", 0.0, 900),
    ]
    greedy = pack(demands, workers, None, PackPolicy(forbid_memory_oversubscription=False))
    assert greedy.oversubscribed  # what the greedy alone does
    result = pack(demands, workers, None, PackPolicy())
    assert result.warnings == ()
    assert result.repaired
    assert max(w.assigned_bytes for w in result.workers.values()) <= 1000
    assert result.placement.models["big"] == ("w1",) or result.placement.models["big"] == ("w0",)
    # Repacking from it keeps it (the previous placement fits and is as good).
    again = pack(demands, workers, result.placement, PackPolicy())
    assert again.placement == result.placement and again.moved == ()


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.integers(1, 100),
    units=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    loads=st.lists(st.sampled_from((0.0, 0.1, 0.3, 0.7)), min_size=1, max_size=10),
)
def test_forbid_finds_a_fitting_placement_when_one_exists(
    sizes: int, units: list[int], loads: list[float]
) -> None:
    """Equal-size models, one replica each, and enough total room: with forbid on, no
    worker's assigned bytes exceed its budget (a fitting placement exists, and the greedy
    finds it because any worker with room fits any model)."""
    workers = [WorkerCapacity(address=f"w{i}", budget=u * sizes) for i, u in enumerate(units) if u]
    if not workers or sum(units) < len(loads):
        return
    demands = [_demand(f"m{i}", load, sizes) for i, load in enumerate(loads)]
    result = pack(demands, workers, None, PackPolicy(forbid_memory_oversubscription=True))
    for plan in result.workers.values():
        assert plan.assigned_bytes <= plan.budget
    assert result.warnings == ()

"""The lpt_packing controller: startup checks, repacks, control-RPC semantics, status."""

from __future__ import annotations

import pytest

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.errors import FailedPrecondition, InvalidArgument, NotFound
from reactantserver.gateway.core.control import LptController
from reactantserver.gateway.core.policy import check_repack_wait, not_lpt
from reactantserver.gateway.core.table import ModelSnapshot, RouteTable, WorkerSnapshot, build_table

MB = 1_000_000


def _fleet(
    counters: dict[str, tuple[float, int]] | None = None,
    *,
    residency_mode: str = "self_managed",
    discipline: str = "fifo",
    budget: int = 1000 * MB,
    previous: RouteTable | None = None,
) -> RouteTable:
    """Three workers serving models a..d (sizes 600/500/400/300 MB); ``counters`` gives each
    model's (compute seconds, requests) as served by w0 alone."""
    counters = counters or {}
    sizes = {"a": 600, "b": 500, "c": 400, "d": 300}
    snaps = []
    for i in range(3):
        address = f"10.0.0.{i}:8080"
        models = tuple(
            ModelSnapshot(
                name=m,
                weight_nbytes=s * MB,
                max_batch_size=8,
                batch_input_name="x",
                batch_axis=1,
                total_compute_seconds=counters.get(m, (0.0, 0))[0] if i == 0 else 0.0,
                requests_served=counters.get(m, (0.0, 0))[1] if i == 0 else 0,
                rows_served=counters.get(m, (0.0, 0))[1] if i == 0 else 0,
            )
            for m, s in sizes.items()
        )
        snaps.append(
            WorkerSnapshot(
                address=address,
                name=f"worker{i}",
                discipline=discipline,
                residency_mode=residency_mode,
                weight_cache_max_bytes=budget,
                models=models,
            )
        )
    return build_table(previous, snaps)


def _controller(**kw: object) -> LptController:
    config = GatewaySchedulingConfig(mode="lpt_packing", **kw)  # type: ignore[arg-type]
    return LptController(config, _fleet())


def test_startup_preconditions_name_the_offending_worker() -> None:
    controller = _controller()
    controller.check_fleet(_fleet())
    with pytest.raises(FailedPrecondition, match=r"worker worker0 \(10.0.0.0:8080\) runs the fair"):
        controller.check_fleet(_fleet(discipline="fair"))
    odd = build_table(
        None,
        [
            WorkerSnapshot(
                address="w0:1", name="w0", discipline="fifo", models=(ModelSnapshot(name="a"),)
            ),
            WorkerSnapshot(
                address="w1:1",
                name="w1",
                discipline="edf",
                models=(ModelSnapshot(name="a"), ModelSnapshot(name="z")),
            ),
        ],
    )
    with pytest.raises(
        FailedPrecondition, match=r"worker w1 \(w1:1\) serves a different model set.*\['z'\]"
    ):
        controller.check_fleet(odd)
    with pytest.raises(FailedPrecondition, match="no worker answered"):
        controller.check_fleet(RouteTable())
    with pytest.raises(ValueError):
        LptController(GatewaySchedulingConfig(mode="round_robin"))


def test_startup_repack_places_by_memory_and_routes_there() -> None:
    controller = _controller()
    assert controller.due() == "startup"
    outcome = controller.repack(0.0, {}, "startup")
    models = outcome.placement.models
    assert all(len(ws) == 1 for ws in models.values())
    # Weights 1.8 GB over three 1 GB budgets: no worker is oversubscribed.
    assert outcome.warnings == ()
    assert controller.due() is None
    # Compaction: the first placement-changing repack compacts the workers that changed
    # (eager: reload nothing).
    assert {c.worker for c in outcome.compactions} == set(outcome.changes)
    assert all(c.reload == () for c in outcome.compactions)
    assert outcome.residency == ()
    # Routing follows the placement at once.
    ticket = controller.router.choose("a", 1, now=0.0)
    assert ticket.worker == models["a"][0]


def test_compute_repack_uses_measured_load() -> None:
    controller = _controller(first_rebalance_compute_seconds=10.0, hysteresis=0.0)
    controller.repack(0.0, {}, "startup")
    # 60 s later: model a took 30 GPU-s over 3000 requests (u = 50/s x 0.01 s = 0.5),
    # b 15 GPU-s (u = .25), c and d idle.
    table = _fleet({"a": (30.0, 3000), "b": (15.0, 1500)}, previous=controller.table)
    controller.update(table)
    assert controller.due() == "compute"
    outcome = controller.repack(60.0, {"a": 3000, "b": 1500}, "compute")
    status = controller.status()
    by_name = {m.name: m for m in status.models}
    assert by_name["a"].rate == pytest.approx(50.0)
    assert by_name["a"].cost == pytest.approx(0.01)
    assert by_name["a"].load == pytest.approx(0.5)
    assert outcome.placement.models["a"] != outcome.placement.models["b"]
    assert dict(status.repacks) == {"startup": 1, "compute": 1, "operator": 0, "fleet": 0}
    assert status.generation == controller.generation == 2


def test_explicit_workers_get_residency_changes_not_compaction() -> None:
    config = GatewaySchedulingConfig(mode="lpt_packing")
    controller = LptController(config, _fleet(residency_mode="externally_managed"))
    outcome = controller.repack(0.0, {}, "startup")
    assert outcome.compactions == ()
    targets = {(r.worker, r.model): r.target for r in outcome.residency}
    for model, workers in outcome.placement.models.items():
        assert targets[(workers[0], model)] == "device"
    assert set(targets.values()) == {"device"}


def test_compaction_interval_and_modes() -> None:
    controller = _controller(compaction_mode="scheduled", compaction_interval=2)
    first = controller.repack(0.0, {}, "startup")
    assert first.compactions == ()  # 1 repack < interval 2
    second = controller.set_model_placement("a", replicas=-1, now=1.0, arrivals={})
    # The operator repack is the second: a is added on two more workers, which are
    # compacted with a reload of the models newly placed there (scheduled).
    assert second.compactions
    assert {c.worker for c in second.compactions} == set(second.changes)
    assert all(c.reload == second.changes[c.worker][0] for c in second.compactions)
    assert sum("a" in c.reload for c in second.compactions) == 2
    last = controller.repack(2.0, {}, "operator")
    assert last.changes == {} and last.compactions == ()  # nothing changed since
    off = _controller(compaction_mode="off")
    assert off.repack(0.0, {}, "startup").compactions == ()


def test_set_model_placement_changes_routing_within_the_call() -> None:
    controller = _controller()
    controller.repack(0.0, {}, "startup")
    outcome = controller.set_model_placement("a", replicas=-1, now=1.0, arrivals={})
    assert outcome.trigger == "operator"
    assert len(outcome.placement.models["a"]) == 3
    firsts = {controller.router.choose("a", 8, now=1.0).worker for _ in range(3)}
    assert len(firsts) == 3  # each 8-item request fills a quantum (8): the next opens elsewhere
    cleared = controller.set_model_placement("a", replicas=0, now=2.0, arrivals={})
    assert len(cleared.placement.models["a"]) == 1
    controller.set_model_placement("a", fill_mode="spread", fill_factor=0.5, now=3.0, arrivals={})
    assert controller.router.policy_of("a").mode == "spread"
    assert controller.router.policy_of("a").factor == 0.5
    controller.set_model_placement("a", fill_mode="inherit", fill_factor=0.0, now=4.0, arrivals={})
    assert controller.router.policy_of("a").mode == "run"
    assert controller.router.policy_of("a").factor == 1.0


def test_set_model_placement_refusals() -> None:
    controller = _controller()
    with pytest.raises(NotFound, match="allow_unknown_model"):
        controller.set_model_placement("zz", replicas=1, now=0.0, arrivals={})
    controller.set_model_placement("zz", replicas=2, allow_unknown_model=True, now=0.0, arrivals={})
    with pytest.raises(InvalidArgument, match="replicas: expected > 0, -1"):
        controller.set_model_placement("a", replicas=-2, now=0.0, arrivals={})
    with pytest.raises(InvalidArgument, match="inflight fill mode was removed"):
        controller.set_model_placement("a", fill_mode="inflight", now=0.0, arrivals={})
    with pytest.raises(InvalidArgument, match="name"):
        controller.set_model_placement("", now=0.0, arrivals={})


def test_set_policy_is_all_or_nothing() -> None:
    controller = _controller()
    before = controller.config
    generation = controller.generation
    with pytest.raises(InvalidArgument) as caught:
        controller.set_policy(
            {
                "hysteresis": 0.2,
                "routing_fill_factor": -1.0,
                "routing_fill_mode": "inflight",
                "generation": 3,
            }
        )
    message = str(caught.value)
    assert "routing_fill_factor: expected a number > 0; got -1.0" in message
    assert "inflight fill mode was removed" in message
    assert "generation: read-only" in message
    assert "nothing was changed" in message
    assert controller.config == before and controller.generation == generation
    with pytest.raises(InvalidArgument, match="hysteresis: expected a number in"):
        controller.set_policy({"hysteresis": 1.0})
    with pytest.raises(InvalidArgument, match="not a SchedulingPolicy field"):
        controller.set_policy({"mode": "round_robin"})
    config = controller.set_policy(
        {
            "hysteresis": 0.2,
            "default_replicas": -1,
            "routing_policy": "fill_rr",
            "work_basis": "items",
            "rebalance_compute_seconds": 30.0,
            "compaction_interval": 3,
            "forbid_memory_oversubscription": False,
        }
    )
    assert config.default_replicas == "all" and config.hysteresis == 0.2
    assert controller.router.work_basis == "items"
    assert controller.cadence.rebalance == 30.0
    assert controller.generation == generation + 1


def test_status_reports_placement_budgets_and_generation() -> None:
    controller = _controller()
    controller.repack(0.0, {}, "startup")
    status = controller.status()
    assert status.generation == 1
    assert [w.weight_budget for w in status.workers] == [1000 * MB] * 3
    assert sum(w.assigned_bytes for w in status.workers) == 1800 * MB
    assert {m.name: len(m.replicas) for m in status.models} == {"a": 1, "b": 1, "c": 1, "d": 1}
    quanta = {m.name: dict(m.fill_quantum) for m in status.models}
    assert all(list(q.values()) == [8] for q in quanta.values())


def test_oversubscription_warning_once_per_repack() -> None:
    controller = _controller(default_replicas="all")
    outcome = controller.repack(0.0, {}, "startup")
    assert len(outcome.warnings) == 3  # every worker holds 1.8 GB against 1 GB
    assert all("exceed its weight budget" in w for w in outcome.warnings)
    assert [w.oversubscribed for w in controller.status().workers] == [True] * 3


def test_helpers() -> None:
    assert check_repack_wait(120.0) == 120.0
    with pytest.raises(InvalidArgument, match="wait_seconds"):
        check_repack_wait(121.0)
    assert "lpt_packing" in str(not_lpt("round_robin"))


def test_a_worker_leaving_or_joining_triggers_a_fleet_repack() -> None:
    """replicas: all follows the fleet, and models placed on a worker that left are placed
    again; until then routing falls back to the replicas that still serve the model."""
    controller = _controller(default_replicas="all")
    controller.repack(0.0, {}, "startup")
    assert controller.due() is None
    full = controller.table
    gone = "10.0.0.2:8080"
    snaps = [
        WorkerSnapshot(
            address=w.address,
            name=w.name,
            ready=w.address != gone,
            discipline="fifo",
            weight_cache_max_bytes=w.weight_cache_max_bytes,
            models=tuple(ModelSnapshot(name=m, max_batch_size=8) for m in w.models),
        )
        for w in full.workers.values()
    ]
    controller.update(build_table(full, snaps))
    assert gone not in {controller.router.choose("a", 1, now=0.0).worker for _ in range(4)}
    assert controller.due() == "fleet"
    outcome = controller.repack(1.0, {}, "fleet")
    assert all(len(ws) == 2 and gone not in ws for ws in outcome.placement.models.values())
    assert controller.due() is None
    controller.update(_fleet(previous=controller.table))
    assert controller.due() == "fleet"
    back = controller.repack(2.0, {}, "fleet")
    assert all(len(ws) == 3 for ws in back.placement.models.values())


def test_set_model_placement_of_a_misspelt_model_names_the_closest() -> None:
    table = build_table(
        None,
        [
            WorkerSnapshot(
                address="w0:1",
                name="w0",
                discipline="fifo",
                models=(ModelSnapshot(name="iris"), ModelSnapshot(name="resnet50")),
            )
        ],
    )
    controller = LptController(GatewaySchedulingConfig(mode="lpt_packing"), table)
    with pytest.raises(NotFound) as typo:
        controller.set_model_placement("irsi", replicas=1, now=0.0, arrivals={})
    assert str(typo.value).endswith(
        "(set allow_unknown_model to place it ahead of its loading); did you mean 'iris'?"
    )

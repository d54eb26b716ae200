"""Route-table learning, the fleet-compute EWMAs and the repack cadence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.gateway.core.estimates import LoadEstimator, RepackCadence, ewma
from reactantserver.gateway.core.table import (
    ModelSnapshot,
    ModelTotals,
    Replica,
    WorkerSnapshot,
    build_table,
    items_of,
)


def _snap(address: str, *models: ModelSnapshot, ready: bool = True) -> WorkerSnapshot:
    return WorkerSnapshot(address=address, ready=ready, discipline="fifo", models=models)


def _m(
    name: str, compute: float = 0.0, requests: int = 0, rows: int = 0, **kw: object
) -> ModelSnapshot:
    return ModelSnapshot(
        name=name,
        total_compute_seconds=compute,
        requests_served=requests,
        rows_served=rows,
        **kw,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------- the EWMA


def test_ewma_reference_value() -> None:
    """REFERENCE: _ewma(0, 1, 300, 300) = 0.5 -- one half-life of fleet compute moves half-way."""
    assert ewma(0.0, 1.0, 300.0, 300.0) == 0.5
    assert ewma(1.0, 1.0, 50.0, 300.0) == 1.0
    assert ewma(0.0, 1.0, 0.0, 300.0) == 0.0  # no fleet work, no change
    assert ewma(0.0, 1.0, 600.0, 300.0) == pytest.approx(0.75)


@settings(max_examples=200, deadline=None)
@given(
    old=st.floats(-1e6, 1e6),
    sample=st.floats(-1e6, 1e6),
    d1=st.floats(0, 1e4),
    d2=st.floats(0, 1e4),
    h=st.floats(1e-3, 1e4),
)
def test_ewma_composes_over_fleet_compute(
    old: float, sample: float, d1: float, d2: float, h: float
) -> None:
    """The clock is fleet compute: two steps towards the same sample equal one step over the
    summed compute, and the result always lies between old and sample."""
    two = ewma(ewma(old, sample, d1, h), sample, d2, h)
    assert two == pytest.approx(ewma(old, sample, d1 + d2, h), rel=1e-9, abs=1e-6)
    one = ewma(old, sample, d1, h)
    assert min(old, sample) - 1e-6 <= one <= max(old, sample) + 1e-6


def test_estimator_seeds_then_smooths() -> None:
    est = LoadEstimator(halflife=100.0)
    totals0 = {"a": ModelTotals()}
    est.update(0.0, ["a", "b"], {}, totals0, 0.0)
    # 10 s, 100 arrivals of a, 50 served at 0.02 s each = 1 GPU-s of fleet compute.
    first = est.update(
        10.0, ["a", "b"], {"a": 100}, {"a": ModelTotals(compute_seconds=1.0, requests=50)}, 1.0
    )
    assert first["a"].rate == 10.0 and first["a"].cost == pytest.approx(0.02)
    assert first["a"].measured and not first["b"].measured
    assert first["b"].rate == 0.0 and first["b"].cost == pytest.approx(0.02)  # the mean fallback
    # The next window: 100 GPU-s of fleet compute (one half-life), rate 30/s, cost 0.04.
    second = est.update(
        20.0,
        ["a", "b"],
        {"a": 400},
        {"a": ModelTotals(compute_seconds=101.0, requests=2550)},
        101.0,
    )
    assert second["a"].rate == pytest.approx(20.0)  # half-way from 10 to 30
    assert second["a"].cost == pytest.approx(0.03)  # half-way from 0.02 to 0.04
    assert math.isclose(second["a"].load, 20.0 * 0.03)


# ---------------------------------------------------------------- the cadence


def test_repack_cadence() -> None:
    """startup first; then first_rebalance of fleet compute; then every rebalance; operator
    requests go first; any repack restarts the count."""
    cadence = RepackCadence(300.0, 60.0)
    assert cadence.due(0.0) == "startup"
    cadence.done("startup", 0.0)
    assert cadence.due(59.9) is None
    assert cadence.due(60.0) == "compute"
    cadence.done("compute", 60.0)
    assert cadence.due(359.0) is None
    cadence.request()
    assert cadence.due(100.0) == "operator"
    cadence.done("operator", 100.0)
    assert cadence.due(399.0) is None
    assert cadence.due(400.0) == "compute"
    stats = cadence.statistics()
    assert dict(stats.repacks) == {"startup": 1, "compute": 1, "operator": 1, "fleet": 0}
    assert stats.next_due == 400.0
    # first_rebalance 0 means "use rebalance".
    zero = RepackCadence(300.0, 0.0)
    zero.done("startup", 0.0)
    assert zero.due(299.0) is None and zero.due(300.0) == "compute"


# ---------------------------------------------------------------- the route table


def test_table_learns_cost_per_item_and_survives_restarts() -> None:
    t1 = build_table(None, [_snap("w0", _m("a", 0.0, 0, 0, max_batch_size=8, batch_axis=1))])
    assert t1.cost_per_item("a", "w0") == 1.0  # nothing learned, no fleet mean
    t2 = build_table(t1, [_snap("w0", _m("a", 2.0, 10, 100))])
    assert t2.cost_per_item("a", "w0") == pytest.approx(0.02)
    assert t2.totals["a"] == ModelTotals(compute_seconds=2.0, requests=10, rows=100)
    t3 = build_table(t2, [_snap("w0", _m("a", 6.0, 20, 200))], alpha=0.5)
    assert t3.cost_per_item("a", "w0") == pytest.approx(0.5 * 0.02 + 0.5 * 0.04)
    assert t3.fleet_compute_seconds == pytest.approx(6.0)
    # The worker restarted: counters went back; no sample, new baseline, totals kept.
    t4 = build_table(t3, [_snap("w0", _m("a", 1.0, 5, 50))])
    assert t4.cost_per_item("a", "w0") == t3.cost_per_item("a", "w0")
    assert t4.fleet_compute_seconds == pytest.approx(6.0)
    t5 = build_table(t4, [_snap("w0", _m("a", 2.0, 15, 100))])
    assert t5.fleet_compute_seconds == pytest.approx(7.0)
    assert t5.totals["a"].requests == 30
    # The fleet mean is the fallback for a pair with no sample.
    t6 = build_table(t5, [_snap("w0", _m("a", 2.0, 15, 100)), _snap("w1", _m("a"))])
    assert t6.cost_per_item("a", "w1") == pytest.approx(t6.cost_per_item("a", "w0"))


def test_table_serves_only_ready_workers_and_ready_models() -> None:
    table = build_table(
        None,
        [
            _snap("w1", _m("a"), _m("b", ready=False)),
            _snap("w0", _m("a"), _m("b")),
            _snap("w2", _m("a"), ready=False),
        ],
    )
    assert [r.worker for r in table.replicas("a")] == ["w0", "w1"]
    assert [r.worker for r in table.replicas("b")] == ["w0"]
    assert table.ready_workers == ("w0", "w1")
    assert table.workers["w1"].models == ("a", "b")
    assert not table.serves("c")
    with pytest.raises(ValueError, match="two snapshots"):
        build_table(None, [_snap("w0"), _snap("w0")])


def test_items_of_reads_the_wire_batch_axis() -> None:
    replica = Replica(
        worker="w", max_batch_size=8, batch_input_name="x", batch_axis=1, weight_nbytes=0
    )
    assert items_of(replica, (4, 16)) == 4
    assert (
        items_of(
            Replica(
                worker="w", max_batch_size=8, batch_input_name="x", batch_axis=2, weight_nbytes=0
            ),
            (3, 5),
        )
        == 5
    )
    assert items_of(replica, None) == 1
    assert items_of(replica, ()) == 1
    assert items_of(replica, (0, 16)) == 1
    assert items_of(None, (4, 16)) == 1

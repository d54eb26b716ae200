"""The energy benchmark's runs (``benchmarks/bench_energy.py``) book what they measure: the
metered loop charges every batch to its model, the ledger's runs close their intervals.
No timing is asserted: the benchmark itself (``nox -s bench -- energy``) is where numbers
live."""

from __future__ import annotations

import trio
from conftest import ROOT, load_file

be = load_file("reactantserver_bench_energy", ROOT / "benchmarks" / "bench_energy.py")


def test_the_metered_loop_charges_its_batches() -> None:
    reader = be.FakeReader()

    async def run() -> tuple[float, dict[str, float]]:
        meter = be.EnergyMeter(reader, trio.current_time)
        seconds = await be.loop_run(meter, 50)
        meter.sample_at_scrape(executing=False)
        return seconds, dict(meter.statistics().model_joules)

    seconds, joules = trio.run(run)
    assert seconds > 0
    assert reader.reads >= 2  # the baseline, and the scrape
    assert joules["m"] > 0


def test_the_rounds_alternate_and_every_meter_reads_its_baseline() -> None:
    without, with_meter, reads = trio.run(be.loop_rounds, 2, 20)
    assert len(without) == len(with_meter) == 2
    assert min(without + with_meter) > 0
    assert reads >= 2


def test_the_hook_and_ledger_figures_are_positive() -> None:
    per_call, per_read = trio.run(be.hook_alone, 100)
    assert per_call > 0 and per_read > 0
    assert be.ledger_sample(3, 5) > 0

"""Energy per model: the attribution rules, the counters' readers, the meter on the loop.

The attribution (``EnergyLedger``) is sans-IO and checked as Hypothesis properties over
an honest fake device (``fake_energy.FakeGpu``: its counter is the integral of the power
its executions and idle gaps draw, read through a fake NVML in whole millijoules). The
RAPL reader is checked against a fake sysfs tree, wrap-around included. The meter runs
under the real dispatch loop on virtual time.
"""

from __future__ import annotations

import http.server
import math
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from fake_energy import FakeGpu, FakeNvml, one_gpu, powercap_tree, set_energy
from hypothesis import given
from strategies import ENERGY_MODELS, energy_schedules

from reactantserver.config import SchedulerConfig
from reactantserver.energy import (
    EnergyLedger,
    EnergyMeter,
    EnergyReading,
    Interval,
    NvmlReader,
    RaplReader,
    open_reader,
)
from reactantserver.energy.readers import NvmlTarget, nvml_target, unwrap
from reactantserver.energy.report import build, parse, render
from reactantserver.scheduling import Batch, Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replay(
    schedule: Sequence[tuple[str, str, float]],
) -> tuple[EnergyLedger, list[Interval], list[dict[str, float]], list[float]]:
    """Run ``schedule`` on a fake GPU (each model draws its own power), feeding the
    ledger as the worker's meter would; the closed intervals, the device seconds each
    model really ran in each of them, and every counter reading."""
    clock = Clock()
    gpu, nvml = one_gpu(clock, idle_watts=55.0, watts={"a": 310.0, "b": 180.0, "c": 420.0})
    reader = NvmlReader.open("0", nvml=nvml, env={})
    assert isinstance(reader, NvmlReader)
    ledger = EnergyLedger("nvml", min_interval=1.0)
    intervals: list[Interval] = []
    ran: list[dict[str, float]] = []
    readings: list[float] = []
    since: dict[str, float] = {}
    for kind, model, seconds in schedule:
        if kind == "run":
            gpu.start(model)
            clock.now += seconds
            gpu.stop()
            ledger.ran(model, seconds)
            since[model] = since.get(model, 0.0) + seconds
        elif kind == "idle":
            clock.now += seconds
        else:
            reading = reader.read()
            assert reading is not None
            readings.append(reading.joules)
            interval = ledger.sample(clock.now, reading)
            if interval is not None:
                intervals.append(interval)
                ran.append(since)
            since = {}
    return ledger, intervals, ran, readings


@given(energy_schedules())
def test_attributed_plus_idle_is_the_counters_advance(
    schedule: list[tuple[str, str, float]],
) -> None:
    """Every joule the counter advanced is accounted once: in each interval, the energy
    attributed to models plus the idle energy equals the counter's advance over it, and
    so the totals equal the advance from the first reading to the last."""
    ledger, intervals, _, readings = replay(schedule)
    for interval in intervals:
        assert interval.idle_joules >= 0
        assert sum(interval.attributed.values()) + interval.idle_joules == pytest.approx(
            interval.joules, rel=1e-9, abs=1e-9
        )
    stats = ledger.statistics()
    total = sum(stats.model_joules.values()) + stats.idle_joules
    assert total == pytest.approx(readings[-1] - readings[0], rel=1e-9, abs=1e-9)


@given(energy_schedules())
def test_a_model_that_did_not_run_gets_nothing(schedule: list[tuple[str, str, float]]) -> None:
    """A model is charged in an interval only if it ran in it: each interval's attributed
    models are exactly those that ran since the previous reading, and a model that never
    ran has no energy at all."""
    ledger, intervals, ran, _ = replay(schedule)
    for interval, really in zip(intervals, ran, strict=True):
        assert set(interval.attributed) == set(really)
    ever = {m for kind, m, _ in schedule if kind == "run"}
    assert set(ledger.statistics().model_joules) <= ever <= set(ENERGY_MODELS)
    assert "never" not in ledger.statistics().model_joules


@given(energy_schedules())
def test_shares_follow_device_time(schedule: list[tuple[str, str, float]]) -> None:
    """Within an interval, each model's share of the attributed energy is its share of
    the device seconds charged in it, and the attributed energy is the advance times the
    busy fraction of the interval (all of it when the device never idled)."""
    _, intervals, ran, _ = replay(schedule)
    for interval, really in zip(intervals, ran, strict=True):
        assert dict(interval.device_seconds) == pytest.approx(really)
        busy = sum(really.values())
        attributed = sum(interval.attributed.values())
        if busy == 0:
            assert attributed == 0
            continue
        for model, t in really.items():
            assert interval.attributed[model] == pytest.approx(
                attributed * t / busy, rel=1e-9, abs=1e-9
            )
        fraction = min(1.0, busy / interval.seconds)
        assert attributed == pytest.approx(interval.joules * fraction, rel=1e-6, abs=1e-9)


def test_one_model_busy_the_whole_interval_gets_all_of_it() -> None:
    ledger = EnergyLedger("nvml", min_interval=1.0)
    assert ledger.sample(0.0, EnergyReading(100.0)) is None  # the baseline
    ledger.ran("a", 0.75)
    ledger.ran("a", 0.5)  # charged more than the interval: began before it opened
    interval = ledger.sample(1.0, EnergyReading(400.0, watts=290.0))
    assert interval is not None
    assert interval.attributed == {"a": pytest.approx(300.0)}
    assert interval.idle_joules == 0.0
    assert ledger.statistics().watts == 290.0


def test_a_counter_reset_drops_the_interval_and_keeps_totals() -> None:
    """A reading below the previous one (driver reloaded) is a new baseline: the energy
    of that interval is unknown and is not guessed; totals never go down."""
    ledger = EnergyLedger("nvml", min_interval=1.0)
    ledger.sample(0.0, EnergyReading(1000.0))
    ledger.ran("a", 1.0)
    ledger.sample(2.0, EnergyReading(1200.0))
    ledger.ran("a", 1.0)
    assert ledger.sample(4.0, EnergyReading(50.0)) is None
    ledger.ran("b", 1.0)
    ledger.sample(5.0, EnergyReading(150.0))
    stats = ledger.statistics()
    assert stats.resets == 1
    assert stats.model_joules == {"a": pytest.approx(100.0), "b": pytest.approx(100.0)}
    assert stats.idle_joules == pytest.approx(100.0)
    assert stats.measured_seconds == pytest.approx(3.0)


def test_device_time_before_the_first_reading_is_dropped() -> None:
    ledger = EnergyLedger("rapl", min_interval=1.0)
    ledger.ran("a", 5.0)
    assert ledger.due(0.0)
    ledger.sample(10.0, EnergyReading(0.0))
    assert not ledger.due(10.5)
    interval = ledger.sample(12.0, EnergyReading(20.0))
    assert interval is not None
    assert interval.attributed == {}
    assert interval.idle_joules == 20.0
    assert ledger.statistics().watts == 10.0  # no device figure: the interval's mean


# ----------------------------------------------------------------------------- RAPL


def test_rapl_sums_the_packages_and_unwraps_energy_uj(tmp_path: Path) -> None:
    """Package zones only (not psys, which contains them, nor sub-zones); each zone's
    energy_uj wraps to 0 past max_energy_range_uj and is unwrapped read by read."""
    root = powercap_tree(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", 262_143_000_000, 262_143_328_850),
            "intel-rapl:1": ("package-1", 5_000_000, 262_143_328_850),
            "intel-rapl:2": ("psys", 70_000_000, 262_143_328_850),
            "intel-rapl:0:0": ("dram", 9_000_000, 65_712_999_613),
        },
    )
    reader = RaplReader.open(root)
    assert isinstance(reader, RaplReader)
    assert reader.description == "package-0, package-1"
    assert reader.read() == EnergyReading(0.0)
    # package-0 wraps: 328_850 uJ to the top, then 1_000_000 past 0; package-1 +2 J.
    set_energy(root, "intel-rapl:0", 1_000_000)
    set_energy(root, "intel-rapl:1", 7_000_000)
    set_energy(root, "intel-rapl:2", 99_000_000)
    set_energy(root, "intel-rapl:0:0", 99_000_000)
    reading = reader.read()
    assert reading is not None
    assert reading.joules == pytest.approx(1.328850 + 2.0)
    assert reading.watts is None
    set_energy(root, "intel-rapl:0", 4_000_000)
    reading = reader.read()
    assert reading is not None
    assert reading.joules == pytest.approx(1.328850 + 2.0 + 3.0)


def test_unwrap() -> None:
    assert unwrap(10, 25, 100) == 15
    assert unwrap(90, 5, 100) == 15
    assert unwrap(0, 0, 100) == 0


def test_rapl_not_readable_says_why(tmp_path: Path) -> None:
    missing = open_reader("cpu", "0", env={}, powercap=tmp_path / "nowhere")
    assert missing == f"{tmp_path / 'nowhere'} does not exist: no RAPL on this machine or kernel"
    root = powercap_tree(tmp_path / "pc", {"intel-rapl:0": ("package-0", 1, 100)})
    (root / "intel-rapl:0" / "energy_uj").unlink()
    (root / "intel-rapl:0" / "energy_uj").mkdir()  # unreadable, as for non-root since 2020
    reason = RaplReader.open(root)
    assert isinstance(reason, str)
    assert reason.startswith(f"no readable RAPL package zone under {root} (intel-rapl:0: ")
    only_psys = powercap_tree(tmp_path / "psys", {"intel-rapl:0": ("psys", 1, 100)})
    assert RaplReader.open(only_psys) == (
        f"no readable RAPL package zone under {only_psys} (no package zone)"
    )


def test_this_machine_says_not_measured_or_reads_rapl() -> None:
    """On the CPU a worker reads RAPL where the kernel lets it, else says why not."""
    reader = open_reader("cpu", "0", env={})
    if isinstance(reader, str):
        assert "RAPL" in reader or "powercap" in reader
    else:
        assert reader.source == "rapl"
        assert reader.read() is not None


# ----------------------------------------------------------------------------- NVML


def test_nvml_target_rules() -> None:
    """A UUID is exact; an index only where NVML's order is CUDA's."""
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
    assert nvml_target("GPU-8a1c", [h100, a100], None) == NvmlTarget(uuid="GPU-8a1c")
    assert nvml_target("1", [h100, h100], None) == NvmlTarget(index=1)
    assert nvml_target("0", [h100], None) == NvmlTarget(index=0)
    assert nvml_target("1", [h100, a100], "PCI_BUS_ID") == NvmlTarget(index=1)
    mixed = nvml_target("1", [h100, a100], None)
    assert isinstance(mixed, str)
    assert "CUDA_VISIBLE_DEVICES=GPU-" in mixed and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in mixed
    assert nvml_target("3", [h100], None) == "CUDA device 3 is not among NVML's 1 GPU(s)"
    assert "neither an ordinal" in str(nvml_target("cuda:0", [h100], None))


def test_nvml_reader_reads_millijoules_and_milliwatts() -> None:
    clock = Clock()
    _, nvml = one_gpu(clock, idle_watts=70.0)
    reader = open_reader("cuda", "GPU-0000-fake", env={}, nvml=nvml)
    assert isinstance(reader, NvmlReader)
    assert reader.source == "nvml"
    assert reader.description == "NVIDIA H100 80GB HBM3 GPU-0000-fake"
    first = reader.read()
    clock.now += 2.0
    second = reader.read()
    assert first is not None and second is not None
    assert second.joules - first.joules == pytest.approx(140.0)
    assert second.watts == 70.0


def test_nvml_not_readable_says_why() -> None:
    clock = Clock()
    nvml = FakeNvml(
        [("Tesla P100", "GPU-old", FakeGpu(clock)), ("Tesla P100", "GPU-old2", None)],
        **{"GPU-old": True},
    )
    reason = NvmlReader.open("GPU-old", nvml=nvml, env={})
    assert reason == "NVML cannot read the energy counter of CUDA device 'GPU-old': Not Supported"
    assert "Not Found" in str(NvmlReader.open("GPU-gone", nvml=nvml, env={}))


def test_without_nvidia_ml_py_the_reason_says_what_to_install() -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert NvmlReader.open("0", env={}) == (
            "nvidia-ml-py is not installed (pip install 'reactantserver[cuda]')"
        )
    else:
        pytest.skip("nvidia-ml-py is installed here")


# ----------------------------------------------------------------------------- the meter


class PoweredExecutor:
    """Sleeps a scripted cost per batch with the fake GPU drawing that model's power."""

    def __init__(self, gpu: FakeGpu, cost: dict[str, float]) -> None:
        self.gpu = gpu
        self.cost = cost

    async def prepare(self, batch: Batch) -> None:
        pass

    async def execute(self, batch: Batch) -> Sequence[Any]:
        self.gpu.start(batch.model)
        try:
            await trio.sleep(self.cost[batch.model])  # virtual-clock: its tests run on autojump
        finally:
            self.gpu.stop()
        return [r.payload for r in batch.requests]


async def test_the_meter_under_the_dispatch_loop(autojump_clock: trio.testing.MockClock) -> None:
    """Batches charge their models, idle time is idle, a scrape during a batch waits for
    it, and every joule of the counter's advance is accounted (exact numbers: whole
    intervals of one model or of idle)."""
    gpu, nvml = one_gpu(trio.current_time, idle_watts=50.0, watts={"a": 300.0, "b": 200.0})
    reader = NvmlReader.open("0", nvml=nvml, env={})
    assert isinstance(reader, NvmlReader)
    start_mj = gpu.millijoules
    meter = EnergyMeter(reader, trio.current_time, min_interval=1.0)
    scheduler = Scheduler(
        SchedulerConfig(discipline="fifo"),
        PoweredExecutor(gpu, {"a": 1.0, "b": 0.5}),
        on_batch=meter.on_batch,
    )
    for name in ("a", "b", "c"):
        scheduler.add_model(name, [1])
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        await scheduler.submit("a", 1)  # [0, 1]: a, 300 J
        await trio.sleep(10.0)
        meter.sample_at_scrape(executing=False)  # [1, 11]: idle, 500 J
        await scheduler.submit("b", 1)  # 11.5: not due yet
        reads = meter.reads
        nursery.start_soon(scheduler.submit, "b", 2)
        await trio.sleep(0.25)
        meter.sample_at_scrape(executing=scheduler.statistics().executing is not None)
        assert meter.reads == reads  # a batch was on the device: no read
        await trio.sleep(0.25)  # 12.0: due; [11, 12]: b, 200 J
        await scheduler.aclose()
    stats = meter.statistics()
    assert stats.source == "nvml"
    assert stats.model_joules == {"a": pytest.approx(300.0), "b": pytest.approx(200.0)}
    assert stats.idle_joules == pytest.approx(500.0)
    assert stats.measured_seconds == pytest.approx(12.0)
    advance = (gpu.millijoules - start_mj) / 1000
    assert sum(stats.model_joules.values()) + stats.idle_joules == pytest.approx(advance)


async def test_reads_per_batch_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    """A thousand 1 ms batches read the counter about once a second, not a thousand times."""
    gpu, nvml = one_gpu(trio.current_time)
    reader = NvmlReader.open("0", nvml=nvml, env={})
    assert isinstance(reader, NvmlReader)
    meter = EnergyMeter(reader, trio.current_time, min_interval=1.0)
    scheduler = Scheduler(
        SchedulerConfig(), PoweredExecutor(gpu, {"a": 0.001}), on_batch=meter.on_batch
    )
    scheduler.add_model("a", [1])
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        t0 = trio.current_time()
        for i in range(1000):
            await scheduler.submit("a", i)
        elapsed = trio.current_time() - t0
        await scheduler.aclose()
    assert meter.reads <= 2 + math.ceil(elapsed / 1.0)
    # Busy the whole second at 300 W (the fake's default draw): all of it is a's.
    assert elapsed == pytest.approx(1.0)
    assert meter.statistics().model_joules["a"] == pytest.approx(300.0 * elapsed)


# ----------------------------------------------------------------------------- the report


def exposition(
    worker: str, rows: dict[str, tuple[float, float, float, float]], **extra: float
) -> str:
    """A worker's exposition: model -> (requests, dispatches, compute seconds, joules)."""
    lines = [f'worker_info{{worker="{worker}"}} 1']
    for model, (req, disp, compute, joules) in rows.items():
        lab = f'model="{model}",worker="{worker}"'
        lines += [
            f"worker_requests_served_total{{{lab}}} {req}",
            f"worker_rows_served_total{{{lab}}} {req * 2}",
            f"worker_dispatch_total{{{lab}}} {disp}",
            f"worker_compute_seconds_total{{{lab}}} {compute}",
        ]
        if "idle" in extra:
            lines.append(f"worker_energy_joules_total{{{lab}}} {joules}")
    if "idle" in extra:
        lines.append(f'worker_energy_measured{{source="nvml",worker="{worker}"}} 1')
        lines.append(f'worker_idle_energy_joules_total{{worker="{worker}"}} {extra["idle"]}')
        lines.append(f'worker_device_power_watts{{worker="{worker}"}} {extra.get("watts", 100)}')
    else:
        lines.append(f'worker_energy_measured{{source="none",worker="{worker}"}} 0')
    if "price" in extra:
        lines.append(f'worker_cost_device_hour{{worker="{worker}"}} {extra["price"]}')
    return "\n".join(lines) + "\n"


def test_report_splits_each_workers_price_by_device_time() -> None:
    """Two workers, 100 s: w0 ($3.6/h: $0.1 in the window) ran a 30 s and b 10 s; w1
    ($7.2/h: $0.2) ran b 20 s. a: 0.1*30/40 = 0.075 for 75 requests -> $1000 per million;
    b: 0.1*10/40 + 0.2 = 0.225 for 150 requests -> $1500 per million."""
    before = parse(
        exposition("w0", {"a": (0, 0, 0, 0), "b": (0, 0, 0, 0)}, idle=0.0, price=3.6)
        + exposition("w1", {"b": (0, 0, 0, 0)}, idle=0.0, price=7.2)
    )
    after = parse(
        exposition("w0", {"a": (75, 25, 30, 6000), "b": (50, 50, 10, 2000)}, idle=1000.0, price=3.6)
        + exposition("w1", {"b": (100, 50, 20, 4000)}, idle=500.0, price=7.2, watts=50)
    )
    report = build(before, after, 100.0, "gw:8002")
    a, b = report.models
    assert a.cost_per_million_requests == pytest.approx(1000.0)
    assert b.cost_per_million_requests == pytest.approx(1500.0)
    assert a.joules_per_inference == pytest.approx(80.0)
    assert b.joules_per_inference == pytest.approx(40.0)
    assert a.requests_per_second == pytest.approx(0.75)
    assert a.rows_per_execution == pytest.approx(6.0)
    assert b.device_seconds_per_request == pytest.approx(0.2)
    assert report.idle_share == pytest.approx(1 - 60 / 200)
    assert report.idle_joules == pytest.approx(1500.0)
    assert report.watts == pytest.approx(150.0)
    assert report.unallocated_cost == 0
    table = render(report)
    assert "energy: 13500.0 J in the window, 1500.0 J of it idle (11.1%)" in table
    assert "idle share: 70.0% of 200.0 device-seconds" in table


def test_report_counts_a_restarted_worker_from_zero_and_says_not_measured() -> None:
    before = parse(exposition("w0", {"a": (500, 500, 50, 0)}))
    after = parse(exposition("w0", {"a": (20, 10, 2, 0)}))  # restarted: counters fell
    report = build(before, after, 10.0, "w0:8002")
    (a,) = report.models
    assert a.requests_per_second == 2.0
    assert a.joules_per_inference is None and a.cost_per_million_requests is None
    assert report.energy_sources == {}
    table = render(report)
    assert "energy: not measured" in table
    assert "cost: not set (cost.device_hour)" in table


def test_report_into_a_pipe_closed_early_ends_quietly() -> None:
    """``reactantserver report ADDRESS | head``: the reader leaves before the table is
    written; the command ends with 141 (128 + SIGPIPE, as a shell shows for ``yes`` in
    ``yes | head``) and no traceback, no 'Exception ignored' at exit."""
    body = exposition("w0", {"a": (10, 5, 1, 0)}).encode()
    closed = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            closed.wait(30)  # answer only once the reader is gone
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", "report", address, "--interval", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        closed.set()
        err = child.stderr.read().decode()
        assert child.wait(timeout=60) == 141, err
    finally:
        server.shutdown()
        server.server_close()
    assert err == ""

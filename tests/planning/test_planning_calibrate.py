"""``planning.calibrate``'s arithmetic, without a worker: the width an execution's stretch
beside spinning processes says, the order of the rounds in turn, the models that fit."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from reactantserver.fleet.host import HostModel
from reactantserver.planning.calibrate import (
    ModelProbe,
    _fitting,
    in_turn_order,
    width_from_stretch,
)


@pytest.mark.parametrize(
    ("stretch", "cores", "spinners", "width"),
    [
        # Two cores beside two spinners: a job wider than the share (2/3) gets 2/3 of a
        # core, so it takes 1.5 x its width as long.
        (1.5, 2, 2, 1.0),
        (2.46, 2, 2, 1.64),
        (3.0, 2, 2, 2.0),
        # Not stretched: it fits in the share; the widest that does.
        (1.0, 2, 2, 2 / 3),
        (0.9, 2, 2, 2 / 3),
        # Beyond what the model reaches (wider than the machine): the machine.
        (5.0, 2, 2, 2.0),
        # Four cores beside four spinners: the share is 4/5.
        (2.0, 4, 4, 1.6),
    ],
)
def test_the_width_is_what_the_stretch_says(
    stretch: float, cores: int, spinners: int, width: float
) -> None:
    assert width_from_stretch(stretch, cores, spinners) == pytest.approx(width, rel=1e-6)


@pytest.mark.parametrize("stretch", [1.2, 1.5, 2.46, 2.9])
def test_the_host_model_reproduces_the_stretch_it_was_learned_from(stretch: float) -> None:
    """An execution of that width, its idle time's work at that width, beside the spinners
    on the host model takes ``stretch`` times its idle time."""
    width = width_from_stretch(stretch, 2, 2)
    idle = 0.001
    host = HostModel("h", cores=2.0, background=2.0)
    host.submit(0.0, "device", idle * width, width, "x")
    assert host.next_completion() == pytest.approx(stretch * idle, rel=1e-6)


def _probe(name: str) -> ModelProbe:
    return ModelProbe(
        name=name, batch_sizes=(1,), inputs=lambda rows: {"x": np.zeros((rows, 2), np.float32)}
    )


def test_every_round_in_turn_visits_each_model_once_in_an_order_of_its_own() -> None:
    probes = [_probe(f"m{i:02d}") for i in range(12)]
    rng = random.Random(0)
    rounds = [[p.name for p in in_turn_order(probes, rng)] for _ in range(6)]
    assert all(sorted(r) == [p.name for p in probes] for r in rounds)
    assert len({tuple(r) for r in rounds}) == 6  # no fixed cycle
    # Seeded: the same calibration makes the same rounds.
    again = random.Random(0)
    assert rounds == [[p.name for p in in_turn_order(probes, again)] for _ in range(6)]


def test_the_stretch_is_measured_on_the_cheapest_models_that_fit_together() -> None:
    probes = [_probe(n) for n in ("a", "b", "c", "d")]
    fastest = {"a": {1: 0.003}, "b": {1: 0.001}, "c": {1: 0.002}, "d": {1: 0.0005}}
    nbytes = {"a": 10, "b": 30, "c": 20, "d": 25}
    # d (25) then b (30) would pass 50: d, then c (20) fits, then a (10) does not.
    assert [p.name for p in _fitting(probes, fastest, nbytes, 50)] == ["d", "c"]
    assert [p.name for p in _fitting(probes, fastest, nbytes, 0)] == ["d", "b", "c", "a"]
    # None fits alone: the cheapest anyway.
    assert [p.name for p in _fitting(probes, fastest, nbytes, 5)] == ["d"]


class _FakeWorker:
    """A worker whose executions take ``seconds[model]`` each, ``slower`` times as long
    while spinners run: its counters as ``calibrate._counters`` reads them."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.slower = 1.0
        self.models = {name: [0.0, 0] for name in seconds}

    async def infer(self, name: str, inputs: object) -> None:
        entry = self.models[name]
        entry[0] += self.seconds[name] * self.slower
        entry[1] += 1
        await asyncio.sleep(0)


def test_the_stretch_is_the_mean_execution_beside_spinners_over_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every execution 2.5x as long while the spinners run (whatever the model's cost):
    the stretch is 2.5, from the worker's own compute counters, and every spinner the
    step started is waited for."""
    from reactantserver.planning import calibrate

    worker = _FakeWorker({"a": 0.001, "b": 0.003})

    async def counters(client: _FakeWorker, url: str) -> calibrate._Counters:
        return calibrate._Counters(
            loads=0.0, load_seconds=0.0, inline=0.0,
            models={n: (c, d, d) for n, (c, d) in client.models.items()}, fastest={},
        )  # fmt: skip

    started: list[_Spinner] = []

    def spinners(k: int, seconds: float) -> list[_Spinner]:
        worker.slower = 2.5
        started.extend(_Spinner(worker) for _ in range(k))
        return started[-k:]

    monkeypatch.setattr(calibrate, "_counters", counters)
    monkeypatch.setattr(calibrate.cpu, "start_spinners", spinners)
    stretch = asyncio.run(
        calibrate._stretch(worker, "", [_probe("a"), _probe("b")], spinners=1, seconds=0.02)
    )
    assert stretch == pytest.approx(2.5)
    # Five pairs by default, a spinner each, each waited for.
    assert len(started) == 5 and all(s.waited for s in started)
    assert width_from_stretch(stretch, 2, 1) == pytest.approx(2.0)  # capped at the machine


class _Spinner:
    def __init__(self, worker: _FakeWorker) -> None:
        self.worker = worker
        self.waited = False

    def communicate(self) -> tuple[str, str]:
        self.waited = True
        self.worker.slower = 1.0
        return "", ""


def test_the_stretch_is_the_median_of_its_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pair in five stretched 1.9x, the others 1.2x: the step says 1.2."""
    from reactantserver.planning import calibrate

    worker = _FakeWorker({"a": 0.001})
    slow = iter([1.2, 1.9, 1.2, 1.2, 1.2])

    async def counters(client: _FakeWorker, url: str) -> calibrate._Counters:
        return calibrate._Counters(
            loads=0.0, load_seconds=0.0, inline=0.0,
            models={n: (c, d, d) for n, (c, d) in client.models.items()}, fastest={},
        )  # fmt: skip

    def spinners(k: int, seconds: float) -> list[_Spinner]:
        worker.slower = next(slow)
        return [_Spinner(worker) for _ in range(k)]

    monkeypatch.setattr(calibrate, "_counters", counters)
    monkeypatch.setattr(calibrate.cpu, "start_spinners", spinners)
    stretch = asyncio.run(calibrate._stretch(worker, "", [_probe("a")], spinners=1, seconds=0.02))
    assert stretch == pytest.approx(1.2)

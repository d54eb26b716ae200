"""The rate-limited client-error log, on a fake clock."""

from __future__ import annotations

import itertools
import logging
import re

import pytest
from hypothesis import given
from strategies import fault_reports

from reactantserver.transport.core.faultlog import FaultLog
from reactantserver.transport.core.limits import Fault


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(interval: float = 30.0) -> tuple[FaultLog, Clock, list[str]]:
    clock, lines = Clock(), []
    return FaultLog(interval=interval, clock=clock, emit=lines.append), clock, lines


def test_first_line_at_once_then_one_per_interval_with_a_count() -> None:
    faults, clock, lines = make()
    faults.report(Fault.BAD_TIMEOUT, "10.0.0.1:5000", "malformed grpc-timeout 'x'")
    assert lines == ["client error [bad_timeout] from 10.0.0.1:5000: malformed grpc-timeout 'x'"]
    for i in range(99):
        clock.now += 0.1
        faults.report(Fault.BAD_TIMEOUT, f"10.0.0.2:{i}", "malformed grpc-timeout 'y'")
    assert len(lines) == 1 and faults.pending()
    faults.flush()  # the interval is not over
    assert len(lines) == 1
    clock.now += 30
    faults.report(Fault.BAD_TIMEOUT, "10.0.0.3:1", "malformed grpc-timeout 'z'")
    assert lines[-1] == (
        "client error [bad_timeout] from 10.0.0.3:1: malformed grpc-timeout 'z' "
        "(99 more since the last line)"
    )
    assert not faults.pending()


def test_flush_reports_a_burst_that_stopped() -> None:
    faults, clock, lines = make(interval=10)
    for _ in range(5):
        faults.report(Fault.MESSAGE_TOO_LARGE, "p:1", "too big")
    clock.now += 10
    faults.flush()
    assert lines == [
        "client error [message_too_large] from p:1: too big",
        "client error [message_too_large]: 4 more in the last 10 s (latest from p:1: too big)",
    ]
    faults.flush()
    assert len(lines) == 2


def test_kinds_are_limited_independently() -> None:
    faults, _, lines = make()
    faults.report(Fault.BAD_TIMEOUT, "", "a")
    faults.report(Fault.PROTOCOL_ERROR, "", "b")
    faults.report(Fault.BAD_TIMEOUT, "", "c")
    assert lines == ["client error [bad_timeout]: a", "client error [protocol_error]: b"]


def test_lines_go_to_the_clients_logger_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    faults = FaultLog()
    with caplog.at_level(logging.INFO, logger="reactantserver.transport.clients"):
        faults.report(Fault.FRAME_TOO_LARGE, "1.2.3.4:5", "a frame of 16777215 bytes")
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert (
        record.getMessage()
        == "client error [frame_too_large] from 1.2.3.4:5: a frame of 16777215 bytes"
    )


@given(reports=fault_reports())
def test_every_report_is_accounted_for_and_lines_are_spaced(
    reports: list[tuple[Fault, float]],
) -> None:
    """At most one line per kind per interval, and once the interval after the last
    report is over and the log is flushed, the lines account for every report exactly
    once (a line stands for itself plus the count it carries)."""
    clock = Clock()
    emitted: list[tuple[float, str]] = []
    faults = FaultLog(interval=10, clock=clock, emit=lambda line: emitted.append((clock.now, line)))
    for kind, delay in reports:
        clock.now += delay
        faults.report(kind, "peer", "detail")
    clock.now += 10
    faults.flush()
    lines = [line for _, line in emitted]
    when: dict[str, list[float]] = {}
    for at, line in emitted:
        kind = re.match(r"client error \[(\w+)\]", line)
        assert kind is not None
        when.setdefault(kind.group(1), []).append(at)
    total = 0
    for line in lines:
        held = re.search(r"\((\d+) more since", line) or re.search(
            r": (\d+) more in the last", line
        )
        total += int(held.group(1)) if held else 0
        total += 0 if re.search(r": \d+ more in the last", line) else 1
    assert total == len(reports)
    for times in when.values():
        assert all(b - a >= 10 - 1e-9 for a, b in itertools.pairwise(times))


# ------------------------------------------------------------------ memory reclaim policy


def test_reclaim_after_a_burst_of_streams_ends() -> None:
    from reactantserver.transport.core.reclaim import ReclaimPolicy

    policy = ReclaimPolicy(stream_drop=100, fault_burst=10)
    assert not policy.due(open_streams=50, peak_streams=80, faults_total=0)  # normal load
    assert not policy.due(open_streams=450, peak_streams=500, faults_total=0)  # the burst
    assert policy.due(open_streams=3, peak_streams=450, faults_total=0)  # ... ended
    assert not policy.due(open_streams=0, peak_streams=3, faults_total=0)  # once


def test_reclaim_after_a_burst_of_faults_ends() -> None:
    from reactantserver.transport.core.reclaim import ReclaimPolicy

    policy = ReclaimPolicy(stream_drop=100, fault_burst=10)
    assert not policy.due(0, 0, faults_total=5)
    assert not policy.due(0, 0, faults_total=30)  # still rising: the attack goes on
    assert not policy.due(0, 0, faults_total=60)
    assert policy.due(0, 0, faults_total=60)  # a quiet tick: the burst is over
    assert not policy.due(0, 0, faults_total=60)
    assert not policy.due(0, 0, faults_total=65)
    assert not policy.due(0, 0, faults_total=65)  # too few since the last reclaim


def test_release_memory_runs() -> None:
    from reactantserver.transport.core.reclaim import release_memory

    release_memory()

"""The gateway benchmark's core layouts (``benchmarks/bench_gateway.py``): which cores each
process is given, and that pinning reaches every thread of a process; its client shapes
(``--shapes CxS,...``): parsed, and each load generator (``--load``) opening C connections
with S requests in flight on each, against a fake KServe server; and its comparison
with a baseline tree (``--baseline REV``): the tree extracted, its gateway started from
it, the ratio reported. No timing is asserted: the benchmark itself (``nox -s bench --
gateway``) is where numbers live."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from clocks import wait_until
from conftest import ROOT, load_file
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

bg = load_file("reactantserver_bench_gateway", ROOT / "benchmarks" / "bench_gateway.py")


def test_two_cores_give_the_worker_one_and_the_rest_the_other() -> None:
    shared, pinned = bg.layouts(["shared", "pinned"], {0, 1})
    assert (shared.load, shared.gateway, shared.worker) == ({0, 1}, {0, 1}, {0, 1})
    assert (pinned.load, pinned.gateway, pinned.worker) == ({0}, {0}, {1})
    assert "worker on cores [1]" in pinned.describe()


def test_one_core_has_no_pinned_layout() -> None:
    assert [layout.name for layout in bg.layouts(["shared", "pinned"], {3})] == ["shared"]


@given(st.sets(st.integers(0, 63), min_size=3, max_size=16))
def test_pinned_gives_worker_and_gateway_a_core_each_from_three_cores(cores: set[int]) -> None:
    """With three or more cores the pinned layout gives the worker a core of its own (the
    highest), the gateway another (the next), and the load generator all the others: the
    three sets are disjoint, non-empty and together exactly the cores given."""
    (pinned,) = bg.layouts(["pinned"], cores)
    ordered = sorted(cores)
    assert pinned.worker == {ordered[-1]}
    assert pinned.gateway == {ordered[-2]}
    assert pinned.load == set(ordered[:-2])
    assert pinned.load | pinned.gateway | pinned.worker == cores


_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.readline()  # pinned now: a thread started after it inherits the affinity
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("started", flush=True)
    time.sleep(60)
    """
)


def test_pin_moves_every_thread_and_the_threads_started_later() -> None:
    cores = os.sched_getaffinity(0)
    target = frozenset({min(cores)})
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        bg.pin(child.pid, target)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "started"
        wait_until(lambda: len(os.listdir(f"/proc/{child.pid}/task")) >= 3, 60, "3 threads")
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert {tid: os.sched_getaffinity(int(tid)) for tid in tids} == dict.fromkeys(tids, target)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("names", [["shared"], ["pinned"], ["shared", "pinned"]])
def test_layouts_are_within_the_cores_given(names: list[str]) -> None:
    cores = os.sched_getaffinity(0)
    for layout in bg.layouts(names, cores):
        for part in (layout.load, layout.gateway, layout.worker):
            assert part and part <= cores


def test_the_baseline_tree_is_the_revision_extracted(tmp_path: Path) -> None:
    """``--baseline REV`` runs the gateway of the tree at REV: ``git archive`` of src/ and
    tests/, here of HEAD, whose files are the committed ones."""
    tree = bg.baseline_tree("HEAD", tmp_path)
    if tree is None:
        pytest.skip("not a git checkout")
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:src/reactantserver/gateway/forward.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert (tree / "src" / "reactantserver" / "gateway" / "forward.py").read_bytes() == committed


def test_a_gateway_started_from_another_tree_runs_that_trees_package(tmp_path: Path) -> None:
    """``start_gateway(src=...)`` puts that tree's package first on the gateway's path, so
    the baseline's gateway is the baseline's code, not this tree's."""
    package = tmp_path / "src" / "reactantserver"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "import pathlib, sys\n"
        "pathlib.Path(sys.argv[-1]).with_suffix('.ran').write_text(' '.join(sys.argv[1:]))\n"
    )
    worker = bg.Server("worker", None, 1, tmp_path / "w.log")
    gateway = bg.start_gateway(worker, tmp_path, src=tmp_path / "src")
    assert gateway.proc.wait(60) == 0
    (ran,) = tmp_path.glob("gateway_*.ran")
    assert ran.read_text().startswith("gateway ")


def test_the_comparison_reports_the_ratio_to_the_baseline() -> None:
    base = bg.Side("abc1234", [80e-6, 70e-6, 75e-6], [150e-6] * 3, [3e-3] * 3)
    this = bg.Side("this tree", [60e-6, 57e-6, 63e-6], [150e-6] * 3, [2.9e-3] * 3)
    row = this.row(base)
    assert " 60.0 " in row and "0.400" in row and "x0.800" in row
    assert "x" not in base.row().split("|")[-1]


def test_the_comparison_gives_each_pair_of_processes_its_own_ratio() -> None:
    """Windows are grouped by the pair of processes that measured them: each pair's ratio
    is printed after the overall one, so an offset one pair carries shows as such."""
    base = bg.Side("abc1234", [100e-6, 100e-6, 80e-6, 80e-6], [150e-6] * 4, [3e-3] * 4, [2, 2])
    this = bg.Side("this tree", [90e-6, 90e-6, 80e-6, 80e-6], [150e-6] * 4, [3e-3] * 4, [2, 2])
    assert bg.pair_ratios(base, this) == [0.9, 1.0]
    assert this.row(base).endswith("by pair of processes x0.900 x1.000")
    one = bg.Side("this tree", [90e-6, 90e-6], [150e-6] * 2, [3e-3] * 2, [2])
    assert "by pair" not in one.row(bg.Side("abc1234", [100e-6] * 2, [150e-6] * 2, [3e-3] * 2, [2]))


# ------------------------------------------------------------------ client shapes


def test_shapes_are_parsed_in_order_each_once() -> None:
    shapes = bg.parse_shapes("1x16, 4X16,16x4,1x16")
    assert [(s.connections, s.streams) for s in shapes] == [(1, 16), (4, 16), (16, 4)]
    assert [str(s) for s in shapes] == ["1x16", "4x16", "16x4"]
    assert [s.in_flight for s in shapes] == [16, 64, 64]


@pytest.mark.parametrize("text", ["4y16", "0x16", "4x0", "4x", "x16", "4x16,", "-1x4"])
def test_a_bad_shape_is_refused_saying_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"CONNECTIONSxSTREAMS.*e\.g\. 1x16"):
        bg.parse_shapes(text)


def test_the_command_line_refuses_a_bad_shape(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bg.main(["--shapes", "1x16,4by16"])
    assert exited.value.code == 2
    assert "'4by16' is not a client shape" in capsys.readouterr().err


@given(st.lists(st.tuples(st.integers(1, 256), st.integers(1, 256)), min_size=1, max_size=8))
def test_shapes_written_out_read_back_the_same(pairs: list[tuple[int, int]]) -> None:
    """Any list of shapes written as ``CxS`` joined by commas parses back to the same
    shapes in the same order, a repeated one kept at its first place only."""
    text = ",".join(f"{c}x{s}" for c, s in pairs)
    assert [(s.connections, s.streams) for s in bg.parse_shapes(text)] == list(dict.fromkeys(pairs))


def test_h2load_latencies_are_those_that_ended_inside_the_window() -> None:
    """Columns: start (us since the epoch), HTTP status, us until the answer ended."""
    log = "\n".join(
        [
            "999000000\t200\t500000",  # ended at 999.5: before the window
            "999900000\t200\t300000",  # started before, ended at 1000.2: counted
            "1000500000\t200\t1000",  # counted
            "1001000000\t200\t2000",  # ended at 1001.002: after the window
            "1000600000\t200\t400",  # counted (rows come in end order, not start order)
        ]
    )
    assert bg.h2load_latencies(log, 1000.0, 1001.0) == [0.0004, 0.001, 0.3]


def test_h2load_latencies_refuse_any_answer_but_200() -> None:
    log = "1000000000\t200\t1000\n1000100000\t-1\t1000\n999000000\t503\t10"
    with pytest.raises(AssertionError, match=r"other than 200: \{'-1': 1, '503': 1\}"):
        bg.h2load_latencies(log, 1000.0, 1001.0)


_SUMMARY = """finished in 2.50s, 8000.00 req/s, 1.10MB/s
requests: {total} total, {started} started, {done} done, {ok} succeeded, {failed} failed, 0 errored, 0 timeout
status codes: {ok} 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 2.75MB (2883200) total, 156.25KB (160000) headers (space savings 95.06%), {data_h} ({data}) data
"""


def test_the_h2load_summary_must_show_a_whole_ok_answer_per_request() -> None:
    """A gRPC error is trailers-only (no DATA): every request done must have carried the
    OK answer's bytes, none failed."""
    ok = dict(total=20000, started=20016, done=20000, ok=20000, failed=0, data_h="2MB")
    bg.check_h2load_summary(_SUMMARY.format(**ok, data=20000 * 97), 97)
    with pytest.raises(
        AssertionError, match="1939903 DATA bytes where 20000 OK answers carry 1940000"
    ):
        bg.check_h2load_summary(_SUMMARY.format(**ok, data=19999 * 97), 97)
    failed = {**ok, "ok": 19990, "failed": 10}
    with pytest.raises(AssertionError, match="10 failed"):
        bg.check_h2load_summary(_SUMMARY.format(**failed, data=19990 * 97), 97)
    with pytest.raises(AssertionError, match="not understood"):
        bg.check_h2load_summary("h2load: connection refused", 97)


def test_h2load_is_given_the_shape() -> None:
    load = bg.H2Load("/usr/bin/h2load", Path("/w/request.bin"), 97)
    argv = load.command("127.0.0.1:8001", bg.Shape(4, 16), 4.5, Path("/w/log.tsv"))
    assert argv[:7] == ["/usr/bin/h2load", "-c", "4", "-m", "16", "-D", "4500ms"]
    assert argv[-1] == "http://127.0.0.1:8001/inference.GRPCInferenceService/ModelInfer"
    assert "--log-file=/w/log.tsv" in argv and "content-type: application/grpc" in argv


class _FakeInfer:
    """A KServe ModelInfer server (``y = 2 * x``, grpc.aio) that notes each caller's
    address: one per HTTP/2 connection."""

    def __init__(self) -> None:
        self.peers: Counter[str] = Counter()

    async def infer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        self.peers[context.peer()] += 1
        x = np.frombuffer(request.raw_input_contents[0], np.float32)
        out = pb.ModelInferResponse.InferOutputTensor(
            name="y", datatype="FP32", shape=request.inputs[0].shape
        )
        return pb.ModelInferResponse(
            model_name=request.model_name, outputs=[out], raw_output_contents=[(2 * x).tobytes()]
        )

    async def serve(self) -> tuple[grpc.aio.Server, str]:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(
            self.infer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService", {"ModelInfer": handler}
            )]
        )  # fmt: skip
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, f"127.0.0.1:{port}"


def _window_against_fake(
    load_of: Callable[[str], Awaitable[Any]], shape: Any
) -> tuple[Any, Counter[str]]:
    """One window of the load generator ``load_of(url)`` in ``shape`` against a fake."""
    fake = _FakeInfer()

    async def main() -> Any:
        server, url = await fake.serve()
        try:
            load = await load_of(url)
            fake.peers.clear()  # the h2load request's check
            return await load.window(url, shape, seconds=0.4, warmup=0.2, pids=[os.getpid()])
        finally:
            await server.stop(None)

    return asyncio.run(main()), fake.peers


def test_the_python_load_opens_a_connection_per_client() -> None:
    """``tritonclient`` with C connections: C channels, each its own HTTP/2 connection (grpc
    shares one among channels to the same address unless told not to)."""

    async def triton(url: str) -> Any:
        return bg.TritonLoad()

    result, peers = _window_against_fake(triton, bg.Shape(3, 2))
    assert len(peers) == 3
    assert result.concurrency == 6 and result.requests > 0
    assert len(result.cpu_seconds) == 2  # the pid given, then this process (the load)


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load not installed (nghttp2-client)")
def test_h2load_drives_the_shape_and_its_answers_are_checked(tmp_path: Path) -> None:
    """``--load h2load``: its request answers ``2 * x`` (checked once, its answer's length
    learnt), then h2load opens C connections, and the window counts its requests from
    h2load's own log with every answer checked whole."""

    async def load_of(url: str) -> Any:
        return await bg.load_generator("h2load", tmp_path, [url])

    result, peers = _window_against_fake(load_of, bg.Shape(2, 4))
    assert len(peers) == 2
    assert result.concurrency == 8 and result.requests > 0
    assert (
        list(result.latencies) == sorted(result.latencies)
        and len(result.latencies) == result.requests
    )
    assert len(result.cpu_seconds) == 2  # the pid given, then h2load's


def test_the_profile_has_a_column_per_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """Each shape's samples as percentages of its own total, a row per bucket (the largest
    overall first); a shape py-spy could not profile says why instead of a column."""
    one, four = bg.Shape(1, 16), bg.Shape(4, 16)
    bg.print_profiles(
        {
            one: Counter({"wire": 30, "event loop": 10}),
            four: Counter({"wire": 60, "event loop": 20, "slots": 20}),
            bg.Shape(16, 4): "py-spy not found (pip install py-spy): no profile",
        }
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "16x4: py-spy not found (pip install py-spy): no profile"
    assert lines[2].split() == ["1x16", "4x16"]
    assert [line.split() for line in lines[3:]] == [
        ["75.0", "60.0", "wire"],
        ["25.0", "20.0", "event", "loop"],
        ["0.0", "20.0", "slots"],
    ]

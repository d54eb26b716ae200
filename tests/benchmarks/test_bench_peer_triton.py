"""The Triton comparison's pieces (``benchmarks/peer/bench_peer.py --peer triton``,
``benchmarks/peer/triton_peer.py``) and the stage profile's attribution
(``benchmarks/bench_profile.py``): the model repository Triton is given, the servers'
environment (the wheel's facts), the core layout, the arguments, the table's ratios, and
which stage a sampled stack counts for. No server is started and no timing asserted:
``nox -s bench_peer -- --peer triton,pytriton`` and ``nox -s bench -- profile`` are
where the numbers live (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, load_file

bp = load_file("reactantserver_bench_peer", ROOT / "benchmarks" / "peer" / "bench_peer.py")
tp = sys.modules["triton_peer"]
prof = load_file("reactantserver_bench_profile", ROOT / "benchmarks" / "bench_profile.py")
noxfile = load_file("reactantserver_noxfile", ROOT / "noxfile.py")


def fake_wheel(tmp_path: Path, versions: tuple[str, ...] = ("3.11",)) -> Any:
    """A site-packages laid out as nvidia-pytriton's (empty files where binaries are)."""
    site = tmp_path / "site"
    server = site / "pytriton" / "tritonserver"
    (server / "backends" / "python").mkdir(parents=True)
    (server / "backends" / "python" / "libtriton_python.so").write_bytes(b"")
    (server / "bin").mkdir()
    for version in versions:
        stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
        stub.parent.mkdir(parents=True)
        stub.write_bytes(b"stub " + version.encode())
    return tp.PeerPython(
        str(tmp_path / "venv" / "bin" / "python"), site, tmp_path / "lib", "3.11", "0.7.0"
    )


def test_triton_gets_a_python_backend_repository_with_dynamic_batching(tmp_path: Path) -> None:
    peer = fake_wheel(tmp_path)
    repo, backends = tp.write_repository(tmp_path / "work", peer)
    config = (repo / "double" / "config.pbtxt").read_text()
    for line in ('backend: "python"', "max_batch_size: 64", "dynamic_batching { }"):
        assert line in config
    assert 'name: "x" data_type: TYPE_FP32 dims: [ 16 ]' in config
    assert (backends / "python" / "triton_python_backend_stub").read_bytes() == b"stub 3.11"
    assert (backends / "python" / "libtriton_python.so").exists()
    argv = tp.triton_command(peer, repo, backends, 8123)
    assert f"--model-repository={repo}" in argv and "--grpc-port=8123" in argv


def test_the_model_answers_twice_each_request_it_is_given(tmp_path: Path) -> None:
    """``model.py`` run against a stand-in of the backend's utility module."""
    utils = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

        def as_numpy(self) -> np.ndarray:
            return self.array

    utils.Tensor = Tensor  # type: ignore[attr-defined]
    utils.InferenceResponse = lambda tensors: tensors  # type: ignore[attr-defined]
    utils.get_input_tensor_by_name = lambda request, name: request[name]  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {}
    sys.modules["triton_python_backend_utils"] = utils
    try:
        exec(compile(tp.MODEL_PY, "model.py", "exec"), namespace)
    finally:
        del sys.modules["triton_python_backend_utils"]
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    requests = [{"x": Tensor("x", x[:1])}, {"x": Tensor("x", x[1:])}]
    responses = namespace["TritonPythonModel"]().execute(requests)
    assert [r[0].name for r in responses] == ["y", "y"]
    np.testing.assert_array_equal(np.concatenate([r[0].array for r in responses]), 2 * x)


def test_a_missing_stub_is_said_and_the_environment_holds_the_wheels_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peer = fake_wheel(tmp_path, versions=("3.12",))
    with pytest.raises(SystemExit, match=r"no Python backend stub for Python 3\.11"):
        tp.write_repository(tmp_path / "work", peer)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    env = peer.env()
    assert env["LD_LIBRARY_PATH"].split(":") == [
        str(tmp_path / "lib"),  # the interpreter's libpython first
        str(peer.site / "nvidia_pytriton.libs"),
        "/elsewhere",
    ]
    assert env["PATH"].split(":")[0] == str(tmp_path / "venv" / "bin")  # its python3 first


def test_the_servers_get_the_last_core_and_the_load_the_others() -> None:
    assert bp.core_layout([0, 1]) == ({1}, {0})
    assert bp.core_layout([0, 1, 2, 3]) == ({3}, {0, 1, 2})
    assert bp.core_layout([5]) == ({5}, {5})


def test_the_peers_and_loads_are_parsed_and_wrong_ones_said() -> None:
    assert bp.peer_list("triton, pytriton") == ["triton", "pytriton"]
    assert bp.load_list("tritonclient") == ["tritonclient"]
    for bad in ("mlserver,triton", "tensorrt", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bp.peer_list(bad)
    assert noxfile.wants_triton(["--runs", "1", "--peer", "pytriton"])
    assert noxfile.wants_triton(["--peer=triton,pytriton"])
    assert not noxfile.wants_triton(["--runs", "3"])


def test_paced_rows_send_one_request_in_flight_at_the_given_rate() -> None:
    """``--paced R`` asks h2load for ``R`` requests/s on its one connection (``--rps``),
    the rest of the command as the closed loop's; the rates are whole numbers >= 1, and
    the option belongs to the Triton comparison."""
    assert bp.rate_list("600, 1100,600") == [600, 1100]
    for bad in ("", "0", "fast", "600,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bp.rate_list(bad)
    load = bp.bg.H2Load("/usr/bin/h2load", Path("/w/request.bin"), 97, 600)
    argv = load.command("127.0.0.1:8001", bp.bg.Shape(1, 1), 4.5, Path("/w/log.tsv"))
    assert argv[:6] == ["/usr/bin/h2load", "-c", "1", "-m", "1", "--rps=600"]
    closed = bp.bg.H2Load("/usr/bin/h2load", Path("/w/request.bin"), 97)
    assert not any(
        a.startswith("--rps") for a in closed.command("h:1", bp.bg.Shape(1, 1), 1, Path("l"))
    )
    with pytest.raises(SystemExit):
        bp.main(["--paced", "600"])  # MLServer's tables have no paced rows


def test_the_table_gives_medians_and_each_pairs_ratio_range() -> None:
    def window(rps: float, cpu_us: float) -> Any:
        requests = int(rps)
        latencies = tuple(sorted([0.001] * requests))
        return bp.Window(bs_result(requests, latencies, cpu_us * 1e-6 * requests))

    def bs_result(requests: int, latencies: tuple[float, ...], cpu: float) -> Any:
        return bp.bs.LoadResult(1, requests, 1.0, latencies, cpu)

    ours = [window(1000, 200), window(1200, 180), window(900, 210)]
    triton = [window(500, 400), window(600, 300), window(450, 420)]
    lines = bp.triton_table([("h2load", 1, [ours, triton])], ["ours", "Triton"])
    (row,) = [line for line in lines if line.startswith("h2load") and "vs" not in line]
    assert row.split()[2:4] == ["1000", "500"]  # the medians of requests/s
    (ratios,) = [line for line in lines if "vs Triton" in line]
    assert "req/s 2.00 (2.00-2.00)" in ratios
    assert "CPU 0.50 (0.50-0.60)" in ratios


@pytest.mark.parametrize(
    ("leaf", "stage"),
    [
        ("Connection.receive_data (reactantserver/h2/core.py:548)", "HTTP/2 in"),
        ("_SelectorSocketTransport.write (asyncio/selector_events.py:1057)", "HTTP/2 out"),
        ("ServerConnection.send_answer (reactantserver/h2/server.py:110)", "HTTP/2 out"),
        ("decode_infer_request (reactantserver/protocol/codec.py:265)", "decode"),
        ("encode_infer_response_parts (reactantserver/protocol/codec.py:400)", "encode"),
        ("Compiled.__call__ (jax/_src/stages.py:890)", "XLA"),
        ("scatter (reactantserver/runtime/assemble.py:60)", "executor"),
        ("Scheduler._pass (reactantserver/scheduling/dispatch.py:760)", "scheduling"),
        ("start_thread_soon (trio/_core/_thread_cache.py:320)", "the loop's wake-ups"),
        ("DeviceThread.submit (reactantserver/threads.py:80)", "device thread"),
        ("EpollSelector.select (selectors.py:468)", "event loop"),
        ("property.__get__ (enum.py:211)", "event loop"),  # counts for its caller
    ],
)
def test_a_sample_counts_for_the_stage_of_its_innermost_known_frame(leaf: str, stage: str) -> None:
    root = "run (reactantserver/transport/guest.py:76);_run_once (asyncio/base_events.py:1922)"
    assert prof.stage_of(f"{root};{leaf}").startswith(stage)
    assert prof.stage_of("property.__get__ (enum.py:211)") == prof.OTHER


def test_a_stage_table_splits_user_cpu_by_samples_and_adds_the_kernels() -> None:
    counts = prof.samples_by_stage(
        "a (reactantserver/h2/core.py:1) 3\nb (jax/_src/stages.py:2) 1\n"
    )
    run = prof.Run(100, 1.0, user=0.02, system=0.01, samples=counts)
    us = run.stage_us()
    assert us["HTTP/2 in: read, frames, HPACK, guard"] == pytest.approx(150)
    assert us["XLA: the tiny program's dispatch"] == pytest.approx(50)
    assert us[prof.KERNEL] == pytest.approx(100)
    lines = prof.table([("this tree", [run])])
    assert lines[-2].split()[-1] == "300"  # total: user + system per request

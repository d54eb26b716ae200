"""Issue 41, items 4-8: what a hostile client (or repository writer) did, and what it gets.

Real sockets throughout. The worker's wire is the real ``serve_grpc`` over the real
``Service`` and the fake host in a subprocess (``tests/wire_server.py``: its memory can be
measured, and a crash would show); the gateway is the real ``serve_gateway`` in front of
fake workers (``tests/gateway_harness.py``); the cases that need bundles on disk run a real
worker with JAX over a dynamic repository. Clients are hand-written HTTP/2
(``tests/h2_client.py``) and ``tritonclient``.

Each case names what it did before: a loop stalled for seconds and a gateway that exited
(item 4), a worker killed by SIGBUS (5), a YAML bomb (6), connections and memory held by
clients that never finish or never read (7), client input and file contents echoed (8).
No timed assertion: the bounded paths are shown by what comes back (the work budget's
refusal, a status, a closed connection); ``benchmarks/bench_loop_stall.py`` measures the
time.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from gateway_harness import FakeWorker, GatewayRun, fake_workers, running_gateway
from h2_client import INFER, LIVE, H2Client, RawClient, grpc_message, request_headers
from tritonclient.utils import InferenceServerException
from wire_server import WireServer, running_wire_server
from worker_harness import free_port

from reactantserver.config.schema import GatewayConfig, GatewayGrpcConfig, ListenConfig
from reactantserver.protocol import inference as pb
from reactantserver.protocol.screen import MAX_FIELDS as SMALL_FIELDS
from reactantserver.protocol.wire_reader import MAX_FIELDS

pytestmark = pytest.mark.slow

OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, RESOURCE_EXHAUSTED = 0, 3, 4, 5, 8
SHM = Path("/dev/shm")
REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
#: Three-byte unknown fields (field 10, one byte long): a million in 3 MB.
UNKNOWN = b"\x52\x01\x00"

LIMITS = {
    "body_timeout_seconds": 1.0,
    "send_timeout_seconds": 1.0,
    "max_unsent_bytes": 4 << 20,
}


def infer_message(model: str = "double", rows: int = 1, extra: bytes = b"") -> bytes:
    x = np.ones((rows, 16), dtype=np.float32)
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[rows, 16])],
        raw_input_contents=[x.tobytes()],
    )
    return bytes(request) + extra


def budget_refusal(what: str, limit: int, *, tensors: bool) -> str:
    hint = "; send tensors in raw_input_contents or shared memory" if tensors else ""
    return (
        f"{what} has more than {limit} protobuf fields (nested ones and the elements of packed "
        "integer lists counted): no client sends one so intricate, and decoding it would hold "
        f"up every other call{hint}"
    )


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireServer]:
    with running_wire_server(tmp_path_factory.mktemp("hostile"), **LIMITS) as server:
        yield server


def live(port: int) -> int | None:
    with H2Client(port) as client:
        return client.call(LIVE, b"").grpc_status


# ------------------------------------------------------------------ 4. decoding, bounded


@pytest.mark.parametrize(
    ("path", "message", "what", "limit"),
    [
        # 300 KB ServerLive: betterproto held the loop 0.6-6 s (quadratic in unknown fields)
        (LIVE, UNKNOWN * 100_000, "ServerLiveRequest", SMALL_FIELDS),
        # ModelInfer with 3 MB and 30 MB of unknown fields: 0.4-3.8 s and 32 s
        (INFER, infer_message(extra=UNKNOWN * 1_000_000), "ModelInferRequest", MAX_FIELDS),
        (INFER, infer_message(extra=UNKNOWN * 10_000_000), "ModelInferRequest", MAX_FIELDS),
    ],
    ids=["ServerLive 300 KB", "ModelInfer 3 MB", "ModelInfer 30 MB"],
)
def test_a_message_of_millions_of_fields_is_refused_by_the_work_budget(
    worker: WireServer, path: str, message: bytes, what: str, limit: int
) -> None:
    """The worker refuses it after its budget of fields (a millisecond of decoding), with
    INVALID_ARGUMENT saying why, and answers everyone else as before."""
    with H2Client(worker.port) as hostile:
        result = hostile.call(path, message, wait=60)
    assert (result.grpc_status, result.grpc_message) == (
        INVALID_ARGUMENT,
        budget_refusal(what, limit, tensors=path == INFER),
    )
    assert live(worker.port) == OK
    assert worker.process.poll() is None


def test_a_shared_memory_input_is_checked_for_rows_before_it_is_read(worker: WireServer) -> None:
    """Four requests naming a sparse 256 MiB region with more rows than any compiled batch
    size: refused for their rows at once, the region never read (before: +1 GiB RSS and a
    2.7 s stall on the loop, then the same refusal)."""
    size = 256 << 20
    name = f"reactantserver-hostile-{uuid.uuid4().hex[:8]}"
    path = SHM / name
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no page is resident until read
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{worker.port}") as client:
            client.register_system_shared_memory(name, "/" + name, size)
            before = rss(worker.process.pid)
            rows = size // 64  # FP32 x 16 per row
            for _ in range(4):
                x = grpcclient.InferInput("x", [rows, 16], "FP32")
                x.set_shared_memory(name, size)
                with pytest.raises(InferenceServerException) as refused:
                    client.infer("double", [x])
                assert str(refused.value.status()) == "StatusCode.INVALID_ARGUMENT"
                assert f"request has {rows} rows but the largest compiled batch size is 8" in (
                    refused.value.message() or ""
                )
            grown = rss(worker.process.pid) - before
            client.unregister_system_shared_memory(name)
        assert grown < 64 << 20, f"RSS grew {grown / 2**20:.0f} MiB"
    finally:
        path.unlink()


# ---------------------------------------------------------- 7. held calls, unread answers


def unread_answers(port: int) -> RawClient:
    """Sixteen ModelInfer calls of 1 MiB (answered with two 1 MiB outputs) from a client
    that grants no stream window, read until the server closes the connection."""
    rows = (1 << 20) // 64
    message = grpc_message(infer_message(rows=rows))
    client = RawClient(port)
    client.handshake()
    for sid in range(1, 33, 2):
        client.send(client.headers(sid, request_headers(INFER)))
        for at in range(0, len(message), 1 << 20):
            piece = message[at : at + (1 << 20)]
            client.send(client.data(sid, piece, end_stream=at + len(piece) == len(message)))
    assert client.wait_closed(60).closed
    return client


def test_answers_a_client_never_reads_are_bounded_per_connection(worker: WireServer) -> None:
    """Sixteen ModelInfer calls whose 2 MiB answers the client never reads (it grants no
    stream window): before, every answer was held whole (+32 MiB here, +256 MiB in the
    issue). Now what waits on the connection is bounded by max_unsent_bytes -- the calls
    past it fail RESOURCE_EXHAUSTED -- and after send_timeout_seconds with nothing read the
    connection is closed, freeing the rest."""
    client = unread_answers(worker.port)
    sids = sorted(client.results)
    statuses = [client.results[sid].grpc_status for sid in sids]
    refused = [r for r in (client.results[s] for s in sids) if r.grpc_status == RESOURCE_EXHAUSTED]
    assert len(refused) >= 8, statuses  # at most ~4 MiB of answers were let wait
    assert "the client has not read the" in refused[0].grpc_message
    assert "endpoints.max_unsent_bytes" in refused[0].grpc_message
    metrics = worker.metrics()
    assert metrics['worker_grpc_client_errors_total{kind="send_timeout"}'] >= 1
    assert metrics['worker_grpc_client_errors_total{kind="unread_answers"}'] >= len(refused)
    assert live(worker.port) == OK


def test_streams_pin_a_connection_only_while_they_owe_answers(tmp_path: Path) -> None:
    """ModelStreamInfer: a stream open with nothing asked keeps its connection no more
    than a held unary call does -- the idle timeout closes it -- while a stream owing an
    answer (the fake host's slow model, at work until the server stops) keeps its own."""
    stream = "/inference.GRPCInferenceService/ModelStreamInfer"
    slow = grpc_message(infer_message(model="slow"))
    with (
        running_wire_server(tmp_path, idle_timeout_seconds=0.5) as server,
        H2Client(server.port) as empty,
        H2Client(server.port) as owing,
    ):
        empty.start(stream)  # a stream, and nothing on it
        sid = owing.start(stream)
        owing.send(sid, slow)  # one request owed, the stream left open
        outcome = empty.wait_closed(30)
        assert outcome.closed and outcome.goaway is not None
        time.sleep(
            1.0
        )  # real-clock: twice the idle timeout: the owing connection must still be open
        assert owing.pump(0.1) and owing.connection.goaway is None


# --------------------------------------------------------------------------- the gateway


def gateway_config(workers: list[FakeWorker], **grpc: Any) -> GatewayConfig:
    return GatewayConfig(
        listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
        endpoints=tuple(w.address for w in workers),
        worker_names=tuple(f"w{i}" for i in range(len(workers))),
        health_interval_seconds=0.5,
        wedge_exit_rounds=3,  # exits after 1.5 s without an answer: a stall would show
        grpc=GatewayGrpcConfig(**grpc),
    )


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayRun]:
    with fake_workers(1) as workers, running_gateway(gateway_config(workers, **LIMITS)) as run:
        yield run


def gateway_port(run: GatewayRun) -> int:
    return run.address.grpc_port


def test_the_gateways_own_decoding_is_bounded_and_it_stays_up(
    gateway: GatewayRun, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway decodes SystemSharedMemoryRegister itself: 300 KB of unknown fields
    held its loop 2.5 s, its prober saw no worker answer, and it exited ("no worker
    answered for 6.0 s", six runs in nine). A malformed one was INTERNAL with a
    UnicodeDecodeError traceback in its log. Both are INVALID_ARGUMENT now, the gateway
    keeps routing, and nothing is logged as an error."""
    port = gateway_port(gateway)
    hostile = bytes(pb.SystemSharedMemoryRegisterRequest(name="r", key="/k", byte_size=64))
    with H2Client(port) as client:
        for _ in range(3):
            result = client.call(REGISTER, hostile + UNKNOWN * 100_000, wait=60)
            assert (result.grpc_status, result.grpc_message) == (
                INVALID_ARGUMENT,
                budget_refusal("SystemSharedMemoryRegisterRequest", SMALL_FIELDS, tensors=False),
            )
        malformed = client.call(REGISTER, b"\x0a\x02\xff\xfe", wait=60)
        assert (malformed.grpc_status, malformed.grpc_message) == (
            INVALID_ARGUMENT,
            "malformed SystemSharedMemoryRegisterRequest: name is not valid UTF-8",
        )
        infer = client.call(INFER, infer_message(extra=UNKNOWN * 1_000_000), wait=60)
        assert (infer.grpc_status, infer.grpc_message) == (
            INVALID_ARGUMENT,
            budget_refusal("ModelInferRequest", MAX_FIELDS, tensors=True),
        )
        assert client.call(INFER, infer_message()).grpc_status == OK
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert gateway.gateway.prober.ready()[0]


def test_answers_never_read_through_the_gateway_are_bounded(gateway: GatewayRun) -> None:
    """The same client against the gateway: it buffers the workers' answers for the
    client, under its own grpc.max_unsent_bytes and grpc.send_timeout_seconds."""
    client = unread_answers(gateway_port(gateway))
    refused = [r for r in client.results.values() if r.grpc_status == RESOURCE_EXHAUSTED]
    assert client.connection.closed and len(refused) >= 8
    assert "grpc.max_unsent_bytes" in refused[0].grpc_message
    assert live(gateway_port(gateway)) == OK


def test_a_held_call_at_the_gateway_ends_at_the_body_timeout(gateway: GatewayRun) -> None:
    with H2Client(gateway_port(gateway)) as client:
        sid = client.start(INFER)  # headers; the message never comes
        result = client.wait(sid, 30)
    assert (result.grpc_status, result.grpc_message) == (
        DEADLINE_EXCEEDED,
        "the request message did not arrive within 1 s of the call's headers "
        "(grpc.body_timeout_seconds)",
    )


@pytest.mark.parametrize("through", ["worker", "gateway"])
def test_a_megabyte_model_name_is_echoed_bounded(
    worker: WireServer, gateway: GatewayRun, through: str
) -> None:
    """A 1 MiB model name: its NOT_FOUND echoed it whole, past the client's metadata
    limit, so tritonclient saw a transport error instead of the reason."""
    port = worker.port if through == "worker" else gateway_port(gateway)
    name = "m" * (1 << 20)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(name, [x])
    assert str(refused.value.status()) == "StatusCode.NOT_FOUND"
    message = refused.value.message() or ""
    assert message.startswith("model 'mmmm") and len(message) < 1200
    # The gateway quotes the name bounded itself (errors.quoted); the fake host behind the
    # worker's wire does not, and the transport's bound on grpc-message cuts it instead.
    cut = f"... ({1 << 20} characters)" if through == "gateway" else "more characters)"
    assert cut in message


# -------------------------------------------------- a real worker, a dynamic repository

POLL = 0.2


@pytest.fixture(scope="module")
def live_repo(
    zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """A dynamic repository served by a real worker (JAX); yields (repo, gRPC address)."""
    import attrs
    from worker_harness import running_worker, worker_config

    repo = tmp_path_factory.mktemp("live") / "repo"
    repo.mkdir()
    shutil.copytree(zoo_repo / "double", repo / "double")
    config = attrs.evolve(
        worker_config(repo, mode="dynamic"), model_poll_seconds=POLL, follow_symlinks=False
    )
    with running_worker(config) as address:
        yield repo, f"127.0.0.1:{address.grpc_port}"


def index(address: str) -> dict[str, tuple[str, str]]:
    with grpcclient.InferenceServerClient(address) as client:
        reply = client.get_model_repository_index(as_json=True)
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in reply.get("models", [])}


def serves_double(address: str) -> bool:
    with grpcclient.InferenceServerClient(address) as client:
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        result = client.infer("double", [x])
    return result.as_numpy("y") is not None


def add_bundle(zoo_repo: Path, repo: Path, name: str, source: str = "mlp") -> Path:
    """Copy a zoo bundle next to the repository, then rename it in (one atomic step)."""
    staged = repo.parent / f"staged-{name}"
    shutil.copytree(zoo_repo / source, staged)
    return staged


def test_weights_truncated_mid_load_are_a_load_error_not_a_dead_worker(
    live_repo: tuple[Path, str], zoo_repo: Path
) -> None:
    """A bundle renamed into the dynamic repository, its weights file truncated while the
    worker loads it: the weights were memory-mapped, and a truncation under the transfer
    killed the worker with SIGBUS. The weights are read now (never mapped): the load
    fails with a reason naming the file, and the worker serves on. (The SIGBUS itself, in
    a deterministic order, is ``tests/weights/test_weights_host.py``'s
    ``test_a_file_truncated_under_a_load_does_not_kill_the_process``.)"""
    repo, address = live_repo
    staged = add_bundle(zoo_repo, repo, "late")
    os.rename(staged, repo / "late")
    weights = repo / "late" / "weights.safetensors"
    wait_until(lambda: "late" in index(address), 120, what=lambda: "the watcher never took it up")
    os.truncate(weights, weights.stat().st_size // 2)
    wait_until(
        lambda: "weights.safetensors" in index(address)["late"][1], 120, what=lambda: index(address)
    )
    assert serves_double(address)


def test_a_live_manifest_alias_bomb_is_refused(live_repo: tuple[Path, str], zoo_repo: Path) -> None:
    """A 640-byte provenance of 10^6 aliases dropped into a live repository took 69 s and
    1.3 GiB, never freed; it is refused at once, with the line, and the worker serves on."""
    repo, address = live_repo
    staged = add_bundle(zoo_repo, repo, "bomb", source="double")
    lines = ["provenance:", "  l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 6)]
    manifest = staged / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "\n".join(lines) + "\n")
    os.rename(staged, repo / "bomb")
    wait_until(lambda: "refused" in index(address).get("bomb", ("", ""))[1], 120)
    _, reason = index(address)["bomb"]
    assert "manifest.yaml:" in reason and "aliases make the file stand for more than" in reason
    assert serves_double(address)


def test_reasons_quote_no_file_and_links_out_of_the_repository_are_refused(
    live_repo: tuple[Path, str], zoo_repo: Path, tmp_path: Path
) -> None:
    """The load error and the index's reason are readable by any client: a manifest
    linked to /etc/passwd showed its first line there. A link out of the repository is
    now refused (``follow_symlinks`` is off), naming the link; and a manifest's own
    problems are reported by line only -- its values stay in the worker's log."""
    repo, address = live_repo
    outside = tmp_path / "secret.yaml"
    outside.write_text("password: hunter2\n")
    staged = add_bundle(zoo_repo, repo, "linked", source="double")
    (staged / "manifest.yaml").unlink()
    (staged / "manifest.yaml").symlink_to(outside)
    os.rename(staged, repo / "linked")
    staged = add_bundle(zoo_repo, repo, "leaky", source="double")
    (staged / "manifest.yaml").write_text("format_version: 1\nkind: model\nsecret: hunter2\n")
    os.rename(staged, repo / "leaky")
    wait_until(lambda: {"linked", "leaky"} <= set(index(address)), 120)
    wait_until(lambda: all(index(address)[n][1] for n in ("linked", "leaky")), 120)
    entries = index(address)
    assert entries["linked"][1] == (
        "manifest.yaml: a symbolic link out of the model repository; set follow_symlinks: "
        "true to follow links out of it"
    )
    assert entries["leaky"][1].startswith("manifest.yaml is not a valid manifest: ")
    assert "the worker's log says what is wrong" in entries["leaky"][1]
    assert all("hunter2" not in reason and "secret" not in reason for _, reason in entries.values())
    with grpcclient.InferenceServerClient(address) as client:
        name = "m" * (1 << 20)  # the real worker quotes a client's model name bounded
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(name, [x])
    assert str(refused.value.status()) == "StatusCode.NOT_FOUND"
    assert f"... ({1 << 20} characters)" in (refused.value.message() or "")
    assert serves_double(address)

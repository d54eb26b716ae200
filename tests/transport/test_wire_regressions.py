"""Issue 13, bullet by bullet: what a hostile client did to the worker, and what it gets now.

Every test here reproduces one bullet of the issue against a real server -- the real
``serve_grpc`` over the real ``Service`` and the fake host, in a subprocess started by
``tests/wire_server.py`` -- driven by hand-written HTTP/2 clients (``tests/h2_client.py``),
``tritonclient`` and real files under ``/dev/shm``. A server in a subprocess is what makes
the crash bullets testable at all: before the fix, an unknown frame type or a truncated
shared-memory file killed the server process, and the test saw it die.

Each test failed on the code before the fix (the failure is named in its docstring) and
passes after it. The properties over *generated* hostile traffic are in
``tests/transport/test_wire_fuzz.py``.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hpack
import numpy as np
import pytest
import tritonclient.grpc as tc
from clocks import wait_until
from h2_client import (
    INFER,
    LIVE,
    PREFACE,
    H2Client,
    RawClient,
    frame,
    grpc_message,
    request_headers,
    server_live,
)
from hyperframe.frame import HeadersFrame, PingFrame
from tritonclient.utils import InferenceServerException
from wire_server import WireServer, running_wire_server

from reactantserver.protocol import inference as pb

SHM = Path("/dev/shm")

# gRPC status codes and HTTP/2 error codes used below, by name.
OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 0, 3, 4, 8
FAILED_PRECONDITION, UNIMPLEMENTED = 9, 12
NO_ERROR, PROTOCOL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM = 0x0, 0x1, 0x6, 0x7
MAX_CONCURRENT_STREAMS, MAX_FRAME_SIZE = 0x3, 0x5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireServer]:
    """One server with the default limits, shared by the tests that cannot kill it."""
    with running_wire_server(tmp_path_factory.mktemp("wire")) as s:
        yield s


@pytest.fixture
def shm_files() -> Iterator[Callable[[int], tuple[str, Path]]]:
    """``make(size) -> (key, path)``: fresh /dev/shm files, removed afterwards."""
    made: list[Path] = []

    def make(size: int) -> tuple[str, Path]:
        name = f"reactantserver-wire_{uuid.uuid4().hex[:12]}"
        path = SHM / name
        path.write_bytes(bytes(size))
        made.append(path)
        return "/" + name, path

    yield make
    for path in made:
        if path.is_symlink() or path.exists():
            path.unlink()


def infer_request(model: str = "double", rows: int = 1) -> bytes:
    x = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    return bytes(
        pb.ModelInferRequest(
            model_name=model,
            inputs=[
                pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[rows, 16])
            ],
            raw_input_contents=[x.tobytes()],
        )
    )


def x_input(rows: int = 1) -> tc.InferInput:
    inp = tc.InferInput("x", [rows, 16], "FP32")
    inp.set_data_from_numpy(np.arange(rows * 16, dtype=np.float32).reshape(rows, 16))
    return inp


def shm_input(region: str, nbytes: int = 64) -> tc.InferInput:
    inp = tc.InferInput("x", [nbytes // 64, 16], "FP32")
    inp.set_shared_memory(region, nbytes)
    return inp


def shm_output(region: str, nbytes: int = 64, name: str = "y") -> tc.InferRequestedOutput:
    out = tc.InferRequestedOutput(name)
    out.set_shared_memory(region, nbytes)
    return out


def error_of(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except InferenceServerException as exc:
        return str(exc.status()), str(exc.message())
    raise AssertionError("the call succeeded, an error was expected")


# --------------------------------------------------------------------- unknown frame types


def test_unknown_frame_types_are_ignored(tmp_path: Path) -> None:
    """Bullet 1. Before: one 12-byte frame of type 0xFA ended the server process (exit 1),
    because grpclib has no handler for h2's ``UnknownFrameReceived`` and the event loop
    then re-raised what escaped the protocol callback into the server's run. RFC 9113 §4.1/§5.5: ignore them."""
    with running_wire_server(tmp_path) as server:
        for kind in (0xFA, 0x10, 0x0C):  # unassigned, PRIORITY_UPDATE, ORIGIN
            with H2Client(server.port) as client:
                client.wait_settings()
                sid = client.start(LIVE)
                # 12 bytes: a 9-byte header and 3 bytes of payload, on the connection
                # and on an open stream.
                assert client.send_raw(frame(kind, 0, 0, b"abc"))
                assert client.send_raw(frame(kind, 0xFF, sid, b"abc"))
                client.send(sid, grpc_message(b""), end_stream=True)
                result = client.wait(sid)
                assert result.grpc_status == OK, (hex(kind), result, server.log())
            assert server.alive(), server.log()
        assert server_live(server.port)


def test_a_header_that_is_not_ascii_is_a_connection_error(tmp_path: Path) -> None:
    """Found on the way (bullet 1's family): a header value with a byte >= 0x80 made h2
    raise ``UnicodeDecodeError`` -- not a protocol error, so grpclib did not catch it --
    and the server process ended. Now: GOAWAY PROTOCOL_ERROR, this connection only."""
    with running_wire_server(tmp_path) as server, RawClient(server.port) as client:
        client.handshake()
        headers = HeadersFrame(1)
        headers.data = hpack.Encoder().encode(
            [(k.encode(), v.encode()) for k, v in request_headers(LIVE)]
            + [(b"x-evil", b"\xff\xfe")]
        )
        headers.flags.add("END_HEADERS")
        client.send(headers.serialize())
        outcome = client.wait_closed(10)
        assert outcome.closed
        assert outcome.goaway is not None and outcome.goaway[0] == PROTOCOL_ERROR, outcome
        assert server.alive(), server.log()
        assert server_live(server.port)


# -------------------------------------------------------------------------- shared memory


def test_truncated_region_is_failed_precondition_not_sigbus(
    tmp_path: Path, shm_files: Callable[[int], tuple[str, Path]]
) -> None:
    """Bullet 2. Before: truncating a registered /dev/shm file killed the server with
    SIGBUS as soon as a request read its input from (or wrote its output to) it; the
    client saw "Socket closed" and the log said nothing."""
    with running_wire_server(tmp_path) as server:
        client = tc.InferenceServerClient(server.url)
        in_key, in_path = shm_files(128)
        out_key, out_path = shm_files(128)
        in_path.write_bytes(np.ones((2, 16), np.float32).tobytes())
        client.register_system_shared_memory("in", in_key, 128)
        client.register_system_shared_memory("out", out_key, 128)
        result = client.infer("double", [shm_input("in", 128)], outputs=[shm_output("out", 128)])
        assert result.get_output("y") is not None
        assert np.array_equal(np.frombuffer(out_path.read_bytes(), np.float32), np.full(32, 2.0))

        os.truncate(in_path, 0)
        status, message = error_of(lambda: client.infer("double", [shm_input("in", 128)]))
        assert status == "StatusCode.FAILED_PRECONDITION", message
        assert "'in'" in message

        os.truncate(out_path, 16)  # shrunk below the registered window
        status, message = error_of(
            lambda: client.infer("double", [x_input(2)], outputs=[shm_output("out", 128)])
        )
        assert status == "StatusCode.FAILED_PRECONDITION", message
        assert "'out'" in message
        assert server.alive(), server.log()
        assert server_live(server.port)
        client.close()


def test_symlinked_key_is_refused(
    server: WireServer, tmp_path: Path, shm_files: Callable[[int], tuple[str, Path]]
) -> None:
    """Bullet 3. Before: a key that is a symlink under /dev/shm was followed, and a
    model's output was then written into whatever file the link points to."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 16)
    key, path = shm_files(0)
    path.unlink()
    path.symlink_to(victim)
    client = tc.InferenceServerClient(server.url)
    status, message = error_of(lambda: client.register_system_shared_memory("out", key, 64))
    assert status == "StatusCode.INVALID_ARGUMENT", message
    assert "symbolic link" in message
    status, message = error_of(
        lambda: client.infer("double", [x_input()], outputs=[shm_output("out")])
    )
    assert status == "StatusCode.FAILED_PRECONDITION", message
    assert victim.read_bytes() == b"precious" * 16
    client.close()


def test_unregister_during_calls_releases_every_fd_and_mapping(
    server: WireServer, shm_files: Callable[[int], tuple[str, Path]]
) -> None:
    """Bullet 4. Before: unregistering a region while calls used it leaked its mapping
    and its file descriptor every time (20 rounds: 20 stale mappings, fds 13 -> 33)."""
    client = tc.InferenceServerClient(server.url)
    assert client.is_server_live()  # the connection's own fd is part of the baseline
    baseline = server.open_fds()
    for _ in range(20):
        in_key, in_path = shm_files(64)
        out_key, _ = shm_files(64)
        in_path.write_bytes(np.ones((1, 16), np.float32).tobytes())
        client.register_system_shared_memory("in", in_key, 64)
        client.register_system_shared_memory("out", out_key, 64)
        outcomes: list[str] = []

        def call(outcomes: list[str] = outcomes) -> None:
            try:
                client.infer("nap", [shm_input("in")], outputs=[shm_output("out")])
                outcomes.append("OK")
            except InferenceServerException as exc:
                outcomes.append(str(exc.status()))

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: server.metrics().get("worker_inflight_requests", 0) >= 1)
        client.unregister_system_shared_memory("in")
        client.unregister_system_shared_memory("out")
        for t in threads:
            t.join(30)
        assert set(outcomes) <= {"OK", "StatusCode.FAILED_PRECONDITION"}, outcomes
        for path in (in_path, SHM / out_key[1:]):
            path.unlink()
    wait_until(lambda: server.open_fds() == baseline, what=lambda: (server.open_fds(), baseline))
    assert server.shm_mappings() == []
    client.close()


def test_bad_keys_are_invalid_argument(
    server: WireServer, shm_files: Callable[[int], tuple[str, Path]]
) -> None:
    """Bullet 5. Before: a 300-character key or a key naming a directory answered
    ``INTERNAL: internal error`` (an OSError escaped shm.py)."""
    client = tc.InferenceServerClient(server.url)
    directory = SHM / f"reactantserver-wire_dir_{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        for key, expected in (
            ("/" + "k" * 300, "longer than 255"),
            ("/" + directory.name, "not a regular file"),
            ("/a/b", "POSIX shared memory name"),
            ("/bad name", "POSIX shared memory name"),
            ("", "POSIX shared memory name"),
        ):
            status, message = error_of(
                lambda key=key: client.register_system_shared_memory("r", key, 8)
            )
            assert status == "StatusCode.INVALID_ARGUMENT", (key, message)
            assert expected in message, (key, message)
    finally:
        directory.rmdir()
    client.close()


def test_a_fifo_key_neither_hangs_nor_registers(
    tmp_path: Path, shm_files: Callable[[int], tuple[str, Path]]
) -> None:
    """Found on the way (bullet 5's family): IsSameIPCNamespace opened the key with
    ``O_RDONLY``, which blocks forever on a FIFO -- the whole event loop with it."""
    with running_wire_server(tmp_path) as server:
        key, path = shm_files(0)
        path.unlink()
        os.mkfifo(path)
        with H2Client(server.port) as client:
            probe = client.call(
                "/inference.GRPCInferenceService/IsSameIPCNamespace",
                bytes(pb.IsSameIpcNamespaceRequest(name=key)),
                wait=10,
            )
            assert probe.grpc_status == OK, (probe, server.log())
            assert pb.IsSameIpcNamespaceResponse().parse(probe.data[5:]).same is False
        client2 = tc.InferenceServerClient(server.url)
        status, message = error_of(lambda: client2.register_system_shared_memory("r", key, 8))
        assert status == "StatusCode.INVALID_ARGUMENT", message
        assert "not a regular file" in message
        client2.close()


# ------------------------------------------------------------------------- message size


def test_oversized_prefix_is_refused_before_the_body(server: WireServer) -> None:
    """Bullet 6. Before: a 5-byte prefix claiming 4 GiB was accepted and the body kept
    being buffered (the window kept being granted) until the whole message arrived."""
    with H2Client(server.port) as client:
        client.wait_settings()
        sid = client.start(INFER)
        client.send(sid, struct.pack(">BI", 0, 2**32 - 1) + bytes(65536))
        result = client.wait(sid, 10)
        assert result.grpc_status == RESOURCE_EXHAUSTED, result
        assert "4294967295 bytes exceeds the limit" in result.grpc_message
        assert "endpoints.max_message_bytes" in result.grpc_message
        assert result.reset == NO_ERROR  # "stop sending", after a complete answer
        # No more window for it: sending 64 MiB more stops at once.
        assert not client.send(sid, bytes(64 << 20))
        assert client.call(LIVE, b"").grpc_status == OK


def test_data_frame_larger_than_advertised_is_a_connection_error(server: WireServer) -> None:
    """Bullet 6, frames. Before: DATA frames declaring up to 16 MiB were buffered whole
    (then refused) although the server advertises a 1 MiB SETTINGS_MAX_FRAME_SIZE."""
    with RawClient(server.port) as client:
        client.handshake()
        deadline = time.monotonic() + 10
        while MAX_FRAME_SIZE not in client.connection.settings and time.monotonic() < deadline:
            client.pump(0.2)
        advertised = client.connection.settings[MAX_FRAME_SIZE]
        assert advertised == 1 << 20
        client.send(client.headers(1, request_headers()))
        # The header declares 16 MiB - 1; only 1 KiB follows.
        client.send(frame(0x0, 0, 1, bytes(1024), length=(1 << 24) - 1))
        outcome = client.wait_closed(10)
        assert outcome.goaway is not None and outcome.goaway[0] == FRAME_SIZE_ERROR, outcome
        assert outcome.closed
    assert server_live(server.port)


def test_a_connection_error_closes_in_stages_so_its_goaway_arrives(server: WireServer) -> None:
    """Found in CI (2026-12-04, ``test_wire_fuzz.py::test_raw_frames``, once in a full run):
    DATA on a stream never opened, one frame behind it, and the client saw the connection
    close without a GOAWAY. Before: the server closed its socket right after writing the
    GOAWAY, with the client's next bytes still unread; the kernel answers such a close
    with RST, which drops whatever of ours it has not yet put on the wire, and the
    client's read ends in ECONNRESET. Here the bytes behind the bad frame are 1 MiB in one
    write, so they are unread when the server fails on its first read: before, the client
    saw a reset every time. Now: GOAWAY, then the server's FIN, and it reads on (dropping
    what it reads) until the client closes: the GOAWAY, then a clean end of stream.

    A call is in flight when the error comes (its HEADERS read, its message not sent):
    ending it after the FIN must write nothing (a first version of the staged close reset
    its stream on the closed connection and logged the traceback of that)."""
    with RawClient(server.port) as client:
        client.handshake()
        deadline = time.monotonic() + 10
        while MAX_FRAME_SIZE not in client.connection.settings and time.monotonic() < deadline:
            client.pump(0.2)
        client.send(client.headers(1, request_headers()))
        client.send(frame(0x6, 0, 0, b"in-order"))  # its ACK: the HEADERS were read
        while time.monotonic() < deadline and not any(
            isinstance(f, PingFrame) and "ACK" in f.flags for f in client.frames
        ):
            client.pump(0.2)
        bad = frame(0x0, 0x1, 3, grpc_message(b"\x01"))  # DATA on idle stream 3
        behind = b"".join(frame(0x6, 0, 0, bytes(8)) for _ in range((1 << 20) // 17))  # PINGs
        assert client.send(bad + behind), "the server reset the connection while it was read"
        outcome = client.wait_closed(10)
        assert outcome.goaway is not None and outcome.goaway[0] == PROTOCOL_ERROR, outcome
        assert outcome.closed and not outcome.reset, outcome
    assert server_live(server.port)
    assert "Traceback" not in server.log(), server.log()[-3000:]


# ---------------------------------------------------------------- streams and connections


@pytest.mark.parametrize("configured", [None, 8])
def test_streams_past_the_advertised_limit_are_refused(
    tmp_path: Path, configured: int | None
) -> None:
    """Bullet 7, streams. Before: h2 treated one stream past its (fixed, 100) limit as
    a connection error and grpclib dropped the whole connection; the limit is now
    configured, advertised, and enforced per stream with REFUSED_STREAM."""
    limits = {} if configured is None else {"max_concurrent_streams": configured}
    with running_wire_server(tmp_path, **limits) as server, RawClient(server.port) as client:
        client.handshake()
        deadline = time.monotonic() + 10
        while MAX_CONCURRENT_STREAMS not in client.connection.settings:
            assert time.monotonic() < deadline, "no SETTINGS_MAX_CONCURRENT_STREAMS"
            client.pump(0.2)
        limit = client.connection.settings[MAX_CONCURRENT_STREAMS]
        if configured is not None:
            assert limit == configured
        sids = [1 + 2 * i for i in range(limit + 1)]
        client.send(b"".join(client.headers(sid, request_headers(LIVE)) for sid in sids))
        extra = client.wait(sids[-1], 10)
        assert extra.reset == REFUSED_STREAM, extra
        assert client.connection.goaway is None
        # The open streams still work: finish the first one.
        client.send(client.data(sids[0], grpc_message(b""), end_stream=True))
        assert client.wait(sids[0], 10).grpc_status == OK
        # ... and its slot is free again.
        again = sids[-1] + 2
        client.send(client.headers(again, request_headers(LIVE)))
        client.send(client.data(again, grpc_message(b""), end_stream=True))
        assert client.wait(again, 10).grpc_status == OK, server.log()
        assert client.connection.goaway is None


ENHANCE_YOUR_CALM = 0xB


def rst_stream(sid: int, code: int = 0x8) -> bytes:
    """RST_STREAM (CANCEL by default): what a client sends when it gives up on a call."""
    return frame(0x3, 0, sid, struct.pack(">I", code))


def test_rapid_reset_is_refused_with_enhance_your_calm(server: WireServer) -> None:
    """HTTP/2 rapid reset (CVE-2023-44487): open calls and reset them at once, for ever.
    (HEADERS and RST_STREAM in one read start nothing: the call is skipped unseen; here
    the resets follow a moment later, after the calls started.)
    The stream limit alone does not bound it (each reset frees a slot); once most of a
    connection's calls were reset right after they started, the connection gets GOAWAY
    ENHANCE_YOUR_CALM and is closed, and the server keeps serving everyone else."""
    with RawClient(server.port) as client:
        client.handshake()
        sid = 1
        for _ in range(8):  # waves: the calls start, then their resets arrive
            wave = range(sid, sid + 2 * 100, 2)
            sid += 2 * 100
            if not client.send(b"".join(client.headers(s, request_headers(LIVE)) for s in wave)):
                break
            client.pump(0.05)
            if not client.send(b"".join(rst_stream(s) for s in wave)):
                break
            client.pump(0.05)
            if client.connection.goaway is not None:
                break
        outcome = client.wait_closed(20)
        assert outcome.goaway is not None and outcome.goaway[0] == ENHANCE_YOUR_CALM, outcome
        assert outcome.closed
    assert server_live(server.port)
    assert "rapid_reset" in server.log() or "reset by the peer" in server.log()


def test_headers_and_reset_in_one_read_start_nothing(server: WireServer) -> None:
    """Found while adding the rapid-reset rule: HEADERS and RST_STREAM arriving in one
    read, past the stream limit, made the server reset an already closed stream, log a
    traceback and drop the connection. Such a call is now skipped unseen."""
    with RawClient(server.port) as client:
        client.handshake()
        batch = b"".join(
            client.headers(sid, request_headers(LIVE)) + rst_stream(sid)
            for sid in range(1, 2 * 400, 2)
        )
        client.send(batch)
        last = 2 * 400 + 1
        client.send(client.headers(last, request_headers(LIVE)))
        client.send(client.data(last, grpc_message(b""), end_stream=True))
        assert client.wait(last, 10).grpc_status == OK
        assert client.connection.goaway is None
    assert "Traceback" not in server.log()


def test_a_client_that_cancels_some_calls_keeps_its_connection(server: WireServer) -> None:
    """The other side of the rule: a client (or a gateway whose deadlines expire under load)
    cancelling a third of its calls is not mistaken for an attack."""
    with RawClient(server.port) as client:
        client.handshake()
        sids = list(range(1, 2 * 300, 2))
        for chunk in range(0, len(sids), 30):
            batch = b""
            for i, sid in enumerate(sids[chunk : chunk + 30]):
                batch += client.headers(sid, request_headers(LIVE))
                if i % 3 == 0:
                    batch += rst_stream(sid)
                else:
                    batch += client.data(sid, grpc_message(b""), end_stream=True)
            client.send(batch)
            for i, sid in enumerate(sids[chunk : chunk + 30]):
                if i % 3:
                    assert client.wait(sid, 10).grpc_status == OK
        assert client.connection.goaway is None
        last = sids[-1] + 2
        client.send(client.headers(last, request_headers(LIVE)))
        client.send(client.data(last, grpc_message(b""), end_stream=True))
        assert client.wait(last, 10).grpc_status == OK
        assert client.connection.goaway is None


def test_handshake_timeout_closes_silent_connections(tmp_path: Path) -> None:
    """Bullet 7, handshake. Before: 300 connections that never finished the preface
    were held forever."""
    with running_wire_server(tmp_path, handshake_timeout_seconds=0.5) as server:
        silent = RawClient(server.port)
        partial = RawClient(server.port)
        partial.send(PREFACE[:10])
        polite = H2Client(server.port)
        assert polite.call(LIVE, b"").grpc_status == OK
        assert silent.wait_closed(20).closed
        assert partial.wait_closed(20).closed
        # A connection that finished its handshake is not affected.
        assert polite.call(LIVE, b"").grpc_status == OK
        for c in (silent, partial, polite):
            c.close()


def test_idle_timeout_sends_goaway_then_closes(tmp_path: Path) -> None:
    """Bullet 7, idle. Before: a connection with no open stream was held forever. Since
    issue 41 a call still waiting for its request message does not keep a connection
    open either (such calls kept it open forever); a call at work does."""
    slow = grpc_message(
        bytes(
            pb.ModelInferRequest(
                model_name="slow",
                inputs=[
                    pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])
                ],
                raw_input_contents=[bytes(64)],
            )
        )
    )
    with (
        running_wire_server(tmp_path, idle_timeout_seconds=0.5) as server,
        H2Client(server.port) as busy,
        H2Client(server.port) as idle,
        H2Client(server.port) as held,
    ):
        assert idle.call(LIVE, b"").grpc_status == OK
        held.start(LIVE)  # headers, and never the message
        working = busy.start(INFER)
        busy.send(working, slow, end_stream=True)  # at work until the server stops
        for client in (idle, held):
            outcome = client.wait_closed(20)
            assert outcome.goaway is not None and outcome.goaway[0] == NO_ERROR, outcome
            assert outcome.closed
        time.sleep(1.0)  # real-clock: past the idle timeout: the busy connection stays open
        assert busy.pump(0.1) and busy.connection.goaway is None


def _slow_infer() -> bytes:
    """A ModelInfer of the fake host's ``slow`` model: at work until the server stops."""
    return grpc_message(
        bytes(
            pb.ModelInferRequest(
                model_name="slow",
                inputs=[
                    pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])
                ],
                raw_input_contents=[bytes(64)],
            )
        )
    )


def test_max_connections(tmp_path: Path) -> None:
    """Bullet 7, connections. Before: no bound on connections at all. Since issue 41 a
    connection without a call at work makes room too; only when every connection has
    one is a new one refused."""
    with running_wire_server(tmp_path, max_connections=4) as server:
        # Stalled connections (no preface) make room for one that talks HTTP/2.
        stalled = [RawClient(server.port) for _ in range(4)]
        wait_until(lambda: server.metrics()["worker_grpc_connections_open"] == 4)
        with H2Client(server.port) as polite:
            assert polite.call(LIVE, b"").grpc_status == OK
            wait_until(lambda: any(s.pump(0.05) is False or s.connection.closed for s in stalled))
            # Four live connections, each with a call at work: the fifth is refused at
            # once, with a GOAWAY saying why.
            others = [H2Client(server.port) for _ in range(3)]
            for client in (polite, *others):
                client.send(client.start(INFER), _slow_infer(), end_stream=True)
            wait_until(lambda: all(not s.pump(0.05) or s.connection.closed for s in stalled))
            wait_until(lambda: server.metrics()["worker_inflight_requests"] == 4)
            with H2Client(server.port) as extra:
                outcome = extra.wait_closed(20)
                assert outcome.closed
                assert outcome.goaway is not None and outcome.goaway[1] == 0, outcome
                assert b"max_connections" in outcome.goaway_data
            assert polite.call(LIVE, b"").grpc_status == OK
            for other in others:
                other.close()
        for s in stalled:
            s.close()
        metrics = server.metrics()
        assert metrics["worker_grpc_connections_refused_total"] == 1
        assert metrics["worker_grpc_connections_evicted_total"] >= 1


def test_connections_that_only_hold_calls_cannot_lock_clients_out(tmp_path: Path) -> None:
    """Issue 41: max_connections connections each holding a call whose request message
    never comes locked out every new client. Now a new client's connection closes the
    one idle the longest, and the held calls end DEADLINE_EXCEEDED at body_timeout."""
    with running_wire_server(tmp_path, max_connections=4, body_timeout_seconds=1.0) as server:
        holders = [H2Client(server.port) for _ in range(4)]
        held = [h.start(LIVE) for h in holders]  # headers, never a message
        wait_until(lambda: server.metrics()["worker_grpc_streams_open"] == 4)
        with H2Client(server.port) as polite:
            assert polite.call(LIVE, b"").grpc_status == OK  # one holder made room
        assert sum(h.wait_closed(20).closed for h in holders[:1]) == 1
        answered = [h.wait(sid, 20) for h, sid in zip(holders[1:], held[1:], strict=True)]
        assert {(r.grpc_status, r.grpc_message) for r in answered} == {
            (4, "the request message did not arrive within 1 s of the call's headers "
                "(endpoints.body_timeout_seconds)")
        }  # fmt: skip
        for h in holders:
            h.close()
        metrics = server.metrics()
        assert metrics["worker_grpc_connections_evicted_total"] == 1
        assert metrics['worker_grpc_client_errors_total{kind="body_timeout"}'] == 3


# --------------------------------------------------------------------------- statuses


@pytest.mark.parametrize("timeout", ["0n", "1n", "0S"])
def test_deadline_passed_on_arrival_is_deadline_exceeded(server: WireServer, timeout: str) -> None:
    """Bullet 8. Before: UNKNOWN "Internal Server Error", and an ERROR with a traceback
    ("grpclib.server: Timeout occurred") in the log for every such request."""
    with H2Client(server.port) as client:
        result = client.call(INFER, infer_request(), timeout=timeout)
    assert result.grpc_status == DEADLINE_EXCEEDED, result
    assert "deadline" in result.grpc_message
    assert "Traceback" not in server.log()
    assert "Timeout occurred" not in server.log()


@pytest.mark.parametrize("value", ["soon", "1x", "123456789S", "-1S", "1.5S", "1 S"])
def test_malformed_grpc_timeout_is_invalid_argument(server: WireServer, value: str) -> None:
    """Bullet 8. Before: UNKNOWN "Invalid grpc-timeout header" (and 9-digit values, which
    the gRPC spec forbids, were accepted)."""
    with H2Client(server.port) as client:
        result = client.call(INFER, infer_request(), timeout=value)
    assert result.grpc_status == INVALID_ARGUMENT, result
    assert "grpc-timeout" in result.grpc_message


def test_client_mistakes_are_logged_once_per_kind_per_interval(tmp_path: Path) -> None:
    """Bullet 8's log flood: 200 requests with a malformed grpc-timeout and 200 cut
    short make one INFO line per kind (the first, with the peer), not 400 lines and
    400 tracebacks; the metrics count every one."""
    with running_wire_server(tmp_path) as server, H2Client(server.port) as client:
        for _ in range(200):
            assert client.call(INFER, infer_request(), timeout="soon").grpc_status == 3
            sid = client.start(INFER)
            client.send(sid, grpc_message(bytes(3), length=9), end_stream=True)
            assert client.wait(sid).grpc_status == 3
        log = server.log()
        assert log.count("client error [bad_timeout]") == 1, log
        assert log.count("client error [malformed_message]") == 1, log
        assert "Traceback" not in log
        metrics = server.metrics()
        assert metrics['worker_grpc_client_errors_total{kind="bad_timeout"}'] == 200
        assert metrics['worker_grpc_client_errors_total{kind="malformed_message"}'] == 200


def test_compressed_flag_without_encoding_is_invalid_argument(server: WireServer) -> None:
    """Bullet 8. Before: UNKNOWN (grpclib raised NotImplementedError)."""
    with H2Client(server.port) as client:
        sid = client.start(INFER)
        client.send(sid, grpc_message(infer_request(), flag=1), end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == INVALID_ARGUMENT, result
    assert "compressed" in result.grpc_message and "grpc-encoding" in result.grpc_message


def test_unsupported_encoding_is_unimplemented(server: WireServer) -> None:
    """The gRPC spec: a message encoding the server does not support is UNIMPLEMENTED,
    with ``grpc-accept-encoding`` saying what it takes."""
    with H2Client(server.port) as client:
        sid = client.start(INFER, extra=(("grpc-encoding", "snappy"),))
        client.send(sid, grpc_message(b"\x1f\x8b", flag=1), end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == UNIMPLEMENTED, result
    assert "snappy" in result.grpc_message
    accepted = {**result.headers, **result.trailers}.get("grpc-accept-encoding", "")
    assert accepted == "identity,deflate,gzip"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (grpc_message(bytes(10), length=100), "10 of the 100"),
        (b"\x00\x00\x00", "inside a message's 5-byte prefix"),
        (b"", "without a request message"),
    ],
)
def test_message_cut_short_by_end_stream_is_invalid_argument(
    server: WireServer, body: bytes, expected: str
) -> None:
    """Bullet 8. Before: UNKNOWN (an AssertionError inside grpclib's reader)."""
    with H2Client(server.port) as client:
        sid = client.start(INFER, end_stream=not body)
        if body:
            client.send(sid, body, end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == INVALID_ARGUMENT, result
    assert expected in result.grpc_message


@pytest.mark.parametrize("rpc", ["ModelConfig", "ModelInfer"])
def test_an_empty_data_frame_inside_a_message_is_not_its_end(server: WireServer, rpc: str) -> None:
    """HTTP/2 allows a DATA frame without payload anywhere in a stream. Before: grpclib's
    buffer read one as the end of the stream (its end mark is an entry of no
    flow-controlled bytes), so a call on the task path whose message straddled one read
    it short -- INTERNAL, and "Received less data than expected" in the server's log
    (seen once in ``test_wire_fuzz.py``). ModelInfer (no grpclib buffer) checked alike."""
    message = grpc_message(
        infer_request() if rpc == "ModelInfer" else bytes(pb.ModelConfigRequest(name="double"))
    )
    with H2Client(server.port) as client:
        sid = client.start(f"/inference.GRPCInferenceService/{rpc}")
        client.send(sid, message[:3])
        client.send(sid, b"")
        client.send(sid, message[3:8])
        client.send(sid, b"")
        client.send(sid, message[8:], end_stream=True)
        result = client.wait(sid)
    assert result.grpc_status == OK, result


def test_tritonclient_1ms_timeouts_under_load_never_see_unknown(server: WireServer) -> None:
    """Bullet 8: 1 of 300 tritonclient calls with a 1 ms timeout got UNKNOWN under load
    (its deadline had passed by the time grpclib looked at it: the same cause as
    ``0n``). Every call now ends OK or DEADLINE_EXCEEDED."""
    client = tc.InferenceServerClient(server.url)
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            sum(range(1000))

    burners = [threading.Thread(target=burn) for _ in range(2)]
    for t in burners:
        t.start()
    statuses: dict[str, int] = {}
    try:
        for _ in range(300):
            try:
                client.infer("double", [x_input()], client_timeout=0.001)
                key = "OK"
            except InferenceServerException as exc:
                key = str(exc.status())
            statuses[key] = statuses.get(key, 0) + 1
    finally:
        stop.set()
        for t in burners:
            t.join()
    assert set(statuses) <= {"OK", "StatusCode.DEADLINE_EXCEEDED"}, statuses
    client.close()
    assert "Traceback" not in server.log()


# ------------------------------------------------------------------- against a real worker


def test_hostile_traffic_leaves_a_real_worker_at_rest(zoo_repo: Path) -> None:
    """The whole issue against the real worker (JAX model, scheduler, queue): expired
    deadlines, cut-short and oversized messages, half-sent streams dropped with their
    connection, 1 ms client timeouts while the queue is busy. Afterwards nothing is in
    flight, the model's queue is empty, no stream or connection is left open, and the
    client errors are counted by kind on /metrics."""
    from worker_harness import running_worker, worker_config

    config = worker_config(zoo_repo, include=("double",), max_concurrent_streams=32)
    with running_worker(config) as address:
        port = address.grpc_port
        client = tc.InferenceServerClient(f"127.0.0.1:{port}")
        with H2Client(port) as h2:
            assert h2.call(INFER, infer_request(), timeout="1n").grpc_status == DEADLINE_EXCEEDED
            assert h2.call(INFER, infer_request(), timeout="later").grpc_status == INVALID_ARGUMENT
            sid = h2.start(INFER)
            h2.send(sid, grpc_message(bytes(10), length=100), end_stream=True)
            assert h2.wait(sid).grpc_status == INVALID_ARGUMENT
            sid = h2.start(INFER)
            h2.send(sid, struct.pack(">BI", 0, 2**31))
            assert h2.wait(sid).grpc_status == RESOURCE_EXHAUSTED
        half = H2Client(port)
        for _ in range(20):
            sid = half.start(INFER)
            half.send(sid, infer_request()[:-3])
        half.close()  # twenty half-sent calls, dropped with their connection

        statuses: set[str] = set()

        def burst() -> None:
            for _ in range(50):
                try:
                    client.infer("double", [x_input(8)], client_timeout=0.001)
                    statuses.add("OK")
                except InferenceServerException as exc:
                    statuses.add(str(exc.status()))

        threads = [threading.Thread(target=burst) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert statuses <= {"OK", "StatusCode.DEADLINE_EXCEEDED"}, statuses
        assert client.infer("double", [x_input()]).as_numpy("y") is not None
        client.close()

        import urllib.request

        def metrics() -> dict[str, float]:
            url = f"http://127.0.0.1:{address.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                lines = r.read().decode().splitlines()
            return {
                k: float(v)
                for k, _, v in (line.rpartition(" ") for line in lines if not line.startswith("#"))
            }

        labels = 'gpu="0",worker="worker0"'

        def at_rest() -> bool:
            m = metrics()
            return (
                m[f"worker_inflight_requests{{{labels}}}"] == 0
                and m['worker_queue_depth{gpu="0",model="double",worker="worker0"}'] == 0
                and m[f"worker_grpc_streams_open{{{labels}}}"] == 0
                and m[f"worker_grpc_connections_open{{{labels}}}"] == 0
            )

        wait_until(at_rest, what=lambda: metrics())
        m = metrics()
        for kind in ("expired_on_arrival", "bad_timeout", "malformed_message", "message_too_large"):
            assert (
                m[f'worker_grpc_client_errors_total{{gpu="0",kind="{kind}",worker="worker0"}}'] >= 1
            )

"""Issue 34: the gateway's client to its workers holds the bounds the workers hold their clients to.

Before, the gateway's HTTP/2 client (then ``gateway/http2.py``, now the transport's client
role, ``h2/client.py``) trusted its workers further than a worker trusts anyone: it
took frames larger than it advertised, buffered CONTINUATIONs without bound, took DATA past
its windows and WINDOW_UPDATEs of zero, took any frame as the worker's first, and answered
floods of PINGs and stream errors without end. Now it refuses each with the code the
worker's own server side would use (the one connection of both roles,
``h2/core.py``, and the abuse budget of ``h2/abuse.py``), GOAWAY first, and the calls on that connection fail as on any lost
worker connection.

Two kinds of hostile worker, on real sockets on 127.0.0.1:

* :class:`RawWorker`: a raw socket server speaking bytes -- HTTP/2's handshake, then, for
  each request, what the test scripts -- for :class:`~reactantserver.gateway.pool.WorkerClient`
  (the gateway's worker pool) driven directly; it records the GOAWAY and RST_STREAM frames
  the gateway sends it.
* :class:`Tamper`: a byte-level proxy in front of a real (fake-host) worker, behind a real
  gateway, that slips a violating frame into the worker's bytes between two frames when
  the test says so: the client's call in flight gets UNAVAILABLE, and the next call is
  served on a new connection.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from gateway_harness import fake_workers, running_gateway, wait_until
from h2_client import PREFACE, frame
from tritonclient.utils import InferenceServerException
from worker_harness import free_port

from reactantserver.config.schema import GatewayConfig, ListenConfig, LoggingConfig
from reactantserver.gateway.channel import ChannelError
from reactantserver.gateway.pool import WorkerClient
from reactantserver.h2.abuse import RESET_MIN_STREAMS
from reactantserver.transport.core.limits import WireLimits

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8, 0x9,
)  # fmt: skip
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x1, 0x3, 0x6, 0xB


def frames_in(buffer: bytearray) -> Iterator[tuple[int, int, int, bytes]]:
    """Whole frames off the front of ``buffer`` (removed as they are yielded)."""
    while len(buffer) >= 9:
        length = int.from_bytes(buffer[:3], "big")
        if len(buffer) < 9 + length:
            return
        kind, flags = buffer[3], buffer[4]
        sid = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
        payload = bytes(buffer[9 : 9 + length])
        del buffer[: 9 + length]
        yield kind, flags, sid, payload


def ok_answer(encoder: hpack.Encoder, sid: int, message: bytes) -> bytes:
    head = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    tail = encoder.encode([("grpc-status", "0")])
    return (
        frame(HEADERS, END_HEADERS, sid, head)
        + frame(DATA, 0, sid, b"\x00" + struct.pack(">I", len(message)) + message)
        + frame(HEADERS, END_HEADERS | END_STREAM, sid, tail)
    )


#: What a hostile worker answers a request with: (the connection's number and the call's
#: on it, both from 0, the request's stream id, the connection's HPACK encoder) -> bytes.
Script = Callable[[int, int, int, hpack.Encoder], bytes]


class RawWorker:
    """A worker that speaks raw HTTP/2 bytes (module docstring); one script for all its
    connections, given each request in turn. Each connection begins with the worker's
    SETTINGS, except the first one when ``first_greets`` is False: there the script's
    first answer is the worker's first frame (the gateway's SETTINGS go unacknowledged)."""

    def __init__(self, script: Script, *, first_greets: bool = True) -> None:
        self.script = script
        self.first_greets = first_greets
        #: (error code, debug data) of each GOAWAY received, and (stream, code) of each
        #: RST_STREAM, over every connection.
        self.goaways: list[tuple[int, bytes]] = []
        self.resets: list[tuple[int, int]] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = self.connections
        self.connections += 1
        encoder = hpack.Encoder()
        buffer = bytearray()
        greets = connection > 0 or self.first_greets
        if greets:
            writer.write(frame(SETTINGS, 0, 0, b""))
        calls = 0
        preface_seen = False
        try:
            while chunk := await reader.read(1 << 16):
                buffer += chunk
                if not preface_seen:
                    if len(buffer) < len(PREFACE):
                        continue
                    assert bytes(buffer[: len(PREFACE)]) == PREFACE
                    del buffer[: len(PREFACE)]
                    preface_seen = True
                for kind, flags, sid, payload in frames_in(buffer):
                    if kind == SETTINGS and not flags & ACK and greets:
                        writer.write(frame(SETTINGS, ACK, 0, b""))
                    elif kind == GOAWAY:
                        self.goaways.append((int.from_bytes(payload[4:8], "big"), payload[8:]))
                    elif kind == RST_STREAM:
                        self.resets.append((sid, int.from_bytes(payload, "big")))
                    elif kind == DATA and flags & END_STREAM:  # a whole request: answer it
                        writer.write(self.script(connection, calls, sid, encoder))
                        calls += 1
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def run(test: Callable[[], object]) -> None:
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(asyncio.wait_for(test(), 60))  # type: ignore[arg-type]


def deadline(seconds: float = 10.0) -> float:
    return asyncio.get_running_loop().time() + seconds


def first_call_only(violation: Callable[[int], bytes]) -> Script:
    """The first request gets ``violation(stream id)``, every later one (on the same
    connection or a new one) a normal answer (``b"ok"``)."""

    def script(connection: int, call: int, sid: int, encoder: hpack.Encoder) -> bytes:
        first = connection == 0 and call == 0
        return violation(sid) if first else ok_answer(encoder, sid, b"ok")

    return script


def _head(sid: int) -> bytes:
    return frame(HEADERS, END_HEADERS, sid, hpack.Encoder().encode([(":status", "200")]))


#: name -> (the violation, the GOAWAY code expected, the limits the gateway runs with).
CONNECTION_ERRORS: dict[str, tuple[Callable[[int], bytes], int, WireLimits]] = {
    # A DATA frame's header declaring 1 MiB + 1 (we advertise 1 MiB); 1 KiB of it follows.
    "frame_too_large": (
        lambda sid: _head(sid) + frame(DATA, 0, sid, bytes(1024), length=(1 << 20) + 1),
        FRAME_SIZE_ERROR,
        WireLimits(),
    ),
    # One header block in 2,000 CONTINUATIONs (the issue: buffered without bound).
    "continuation_flood": (
        lambda sid: (
            frame(HEADERS, 0, sid, b"\x88")
            + b"".join(frame(CONTINUATION, 0, sid, b"\x88") for _ in range(2000))
        ),
        PROTOCOL_ERROR,
        WireLimits(),
    ),
    # One header block of 80 KB in two frames (we advertise 64 KiB of header list).
    "header_block_too_long": (
        lambda sid: (
            frame(HEADERS, 0, sid, bytes(40_000))
            + frame(CONTINUATION, END_HEADERS, sid, bytes(40_000))
        ),
        ENHANCE_YOUR_CALM,
        WireLimits(),
    ),
    # 100 KB of DATA on a stream granted 64 KiB (the gateway run with that window).
    "data_past_the_stream_window": (
        lambda sid: _head(sid) + frame(DATA, 0, sid, bytes(100_000)),
        FLOW_CONTROL_ERROR,
        WireLimits(stream_window=65535),
    ),
    # A WINDOW_UPDATE of 0 on the connection (stream 0).
    "zero_window_update_on_the_connection": (
        lambda sid: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)),
        PROTOCOL_ERROR,
        WireLimits(),
    ),
    # The worker's first frame an answer, not SETTINGS (RFC 9113 §3.4; see UNGREETED).
    "first_frame_not_settings": (
        lambda sid: _head(sid) + frame(SETTINGS, 0, 0, b""),
        PROTOCOL_ERROR,
        WireLimits(),
    ),
    # 1,000 PINGs for one call (the abuse budget's bucket holds 500).
    "ping_flood": (
        lambda sid: frame(PING, 0, 0, bytes(8)) * 1000,
        ENHANCE_YOUR_CALM,
        WireLimits(),
    ),
    # An answer's headers, then 1,000 DATA frames carrying nothing and ending nothing.
    "empty_data_flood": (
        lambda sid: _head(sid) + frame(DATA, 0, sid, b"") * 1000,
        ENHANCE_YOUR_CALM,
        WireLimits(),
    ),
}
#: The violations that are the first connection's first frame: no SETTINGS before them.
UNGREETED = {"first_frame_not_settings"}


@pytest.mark.parametrize("name", sorted(CONNECTION_ERRORS))
def test_a_worker_breaking_a_bound_gets_goaway_and_its_calls_fail_as_lost(name: str) -> None:
    """Each violation: the gateway sends GOAWAY with the code the worker's own server would
    send, the call fails as on a lost connection (sent in full: not unprocessed, so the
    proxy answers UNAVAILABLE and does not retry it), and the next call is made on a new
    connection."""
    violation, code, limits = CONNECTION_ERRORS[name]

    async def main() -> None:
        worker = RawWorker(first_call_only(violation), first_greets=name not in UNGREETED)
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}", limits=limits)
        with pytest.raises(ChannelError) as caught:
            await client.call(b"/t.T/Echo", b"x", deadline())
        assert not caught.value.unprocessed
        assert "protocol error from the worker" in str(caught.value)
        reply = await client.call(b"/t.T/Echo", b"x", deadline())
        assert (reply.status, bytes(reply.payload)) == (0, b"ok")
        assert client.statistics().connects == 2 and worker.connections == 2
        assert [c for c, _ in worker.goaways] == [code]
        client.close()
        await client.wait_closed()
        await worker.stop()

    run(main)


@pytest.mark.parametrize(
    ("increment", "code"), [(0, PROTOCOL_ERROR), (2**31 - 1, FLOW_CONTROL_ERROR)]
)
def test_a_bad_window_update_on_a_stream_fails_that_call_only(increment: int, code: int) -> None:
    """RFC 9113 §6.9: a WINDOW_UPDATE of 0 on a stream (or one overflowing its send window)
    is a stream error: the gateway resets that stream with the code, its call fails, and
    the connection serves the next call."""

    def violation(sid: int) -> bytes:
        return _head(sid) + frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", increment))

    async def main() -> None:
        worker = RawWorker(first_call_only(violation))
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}")
        with pytest.raises(ChannelError, match="stream error from the worker"):
            await client.call(b"/t.T/Echo", b"x", deadline())
        reply = await client.call(b"/t.T/Echo", b"x", deadline())
        assert (reply.status, bytes(reply.payload)) == (0, b"ok")
        assert worker.resets == [(1, code)] and worker.goaways == []
        assert client.statistics().connects == 1
        client.close()
        await client.wait_closed()
        await worker.stop()

    run(main)


def test_a_worker_provoking_resets_on_most_calls_is_dropped() -> None:
    """MadeYouReset (CVE-2025-8671) from a worker: every call answered with a WINDOW_UPDATE
    of 0, a stream error the gateway resets. Each call fails alone, the connection going
    on, until RESET_MIN_STREAMS calls were made with more than half so reset: then the
    gateway sends GOAWAY(ENHANCE_YOUR_CALM) and drops the connection, and the next call
    is made on a new one."""

    def script(connection: int, call: int, sid: int, encoder: hpack.Encoder) -> bytes:
        if connection == 0:
            return _head(sid) + frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 0))
        return ok_answer(encoder, sid, b"ok")

    async def main() -> None:
        worker = RawWorker(script)
        await worker.start()
        client = WorkerClient(f"127.0.0.1:{worker.port}")
        for _ in range(RESET_MIN_STREAMS - 1):
            with pytest.raises(ChannelError, match="stream error from the worker"):
                await client.call(b"/t.T/Echo", b"x", deadline())
        assert client.statistics().connects == 1 and worker.goaways == []
        with pytest.raises(ChannelError, match="ENHANCE_YOUR_CALM"):
            await client.call(b"/t.T/Echo", b"x", deadline())
        reply = await client.call(b"/t.T/Echo", b"x", deadline())
        assert (reply.status, bytes(reply.payload)) == (0, b"ok")
        assert client.statistics().connects == 2
        assert [c for c, _ in worker.goaways] == [ENHANCE_YOUR_CALM]
        assert [c for _, c in worker.resets] == [PROTOCOL_ERROR] * RESET_MIN_STREAMS
        client.close()
        await client.wait_closed()
        await worker.stop()

    run(main)


# ---------------------------------------------------------------- behind a real gateway


class Tamper:
    """A proxy between the gateway and one worker, forwarding bytes both ways; once
    :meth:`inject` is called, it writes ``bytes`` to the gateway between two of the
    worker's frames (at once if the worker is quiet)."""

    def __init__(self, worker_port: int) -> None:
        self._worker_port = worker_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._injection: bytes | None = None
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def inject(self, data: bytes) -> None:
        with self._lock:
            self._injection = data

    def close(self) -> None:
        self._stop = True
        self._listener.close()
        self._thread.join(10)

    def _accept(self) -> None:
        while not self._stop:
            try:
                gateway, _ = self._listener.accept()
            except OSError:
                return
            worker = socket.create_connection(("127.0.0.1", self._worker_port))
            threading.Thread(target=self._pump, args=(gateway, worker), daemon=True).start()

    def _pump(self, gateway: socket.socket, worker: socket.socket) -> None:
        """Bytes both ways; the worker's cut into frames so that an injection falls
        between two of them."""
        pending = bytearray()  # the worker's bytes not yet a whole frame (it sends no preface)
        try:
            while True:
                with self._lock:
                    injection, self._injection = self._injection, None
                if injection is not None:
                    if pending:  # mid-frame: wait for its end
                        with self._lock:
                            self._injection = injection
                    else:
                        gateway.sendall(injection)
                ready, _, _ = select.select([gateway, worker], [], [], 0.05)
                for sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    if sock is gateway:
                        worker.sendall(data)
                        continue
                    pending += data
                    whole = bytearray()
                    while len(pending) >= 9:
                        end = 9 + int.from_bytes(pending[:3], "big")
                        if len(pending) < end:
                            break
                        whole += pending[:end]
                        del pending[:end]
                    gateway.sendall(bytes(whole))
        except OSError:
            pass
        finally:
            gateway.close()
            worker.close()


@contextmanager
def tampered_gateway() -> Iterator[tuple[Tamper, grpcclient.InferenceServerClient, object]]:
    with fake_workers(1) as (worker,):
        tamper = Tamper(worker.port)
        config = GatewayConfig(
            listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
            endpoints=(f"127.0.0.1:{tamper.port}",),
            worker_names=("w0",),
            health_interval_seconds=60.0,
            logging=LoggingConfig(format="text"),
        )
        try:
            with running_gateway(config) as run_:
                client = grpcclient.InferenceServerClient(run_.grpc)
                try:
                    yield tamper, client, worker
                finally:
                    client.close()
        finally:
            tamper.close()


def x_input() -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    return [inp]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("violation", "code_name"),
    [
        (frame(DATA, 0, 1, b"", length=(1 << 20) + 1), "FRAME_SIZE_ERROR"),
        (frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)), "PROTOCOL_ERROR"),
    ],
    ids=["frame_too_large", "zero_window_update"],
)
def test_a_call_in_flight_on_a_violating_worker_connection_is_unavailable(
    violation: bytes, code_name: str
) -> None:
    """Behind a real gateway: a ModelInfer in flight on the worker connection when the
    worker breaks a bound is answered UNAVAILABLE (sent in full, so not retried: the
    worker may have run it), naming the violation; the next call is served, on a new
    connection."""
    with tampered_gateway() as (tamper, client, worker), ThreadPoolExecutor(1) as pool:
        assert client.infer("double", x_input()).as_numpy("y") is not None
        held = pool.submit(client.infer, "slow", x_input())
        wait_until(lambda: bool(worker.host.calls), what="the slow call at the worker")  # type: ignore[attr-defined]
        tamper.inject(violation)
        with pytest.raises(InferenceServerException) as caught:
            held.result(30)
        assert "UNAVAILABLE" in str(caught.value.status())
        assert "protocol error from the worker" in caught.value.message()
        assert code_name in caught.value.message()
        worker.release_slow()  # type: ignore[attr-defined]
        assert client.infer("double", x_input()).as_numpy("y") is not None

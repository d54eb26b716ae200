"""Issue 34, the hostile-peer part: one abuse budget, and the preface, on the worker and the gateway.

Each test runs against both a real worker (``serve_grpc`` over the real ``Service`` and the
fake host, in a subprocess: ``tests/wire_server.py``) and a real gateway (``serve_gateway`` on
its own thread and loop, in front of one fake worker), each on loopback, driven by
``RawClient``: raw bytes on a socket, the server's frames parsed with hyperframe alone. Both
servers stand on the same guarded connection (``transport/h2guard.py`` over
``h2/server.py``), so one rule holds for both; these tests check that it does.

* **MadeYouReset** (CVE-2025-8671). Before: 2,000 streams each made to be reset *by the
  server* -- a full ModelInfer, then a frame that is a stream error (a WINDOW_UPDATE that
  overflows the stream's window, or DATA after END_STREAM) -- got 2,000 RST_STREAMs and no
  GOAWAY; only resets the client sent were budgeted. Now they spend the same budget:
  GOAWAY ENHANCE_YOUR_CALM after a few hundred.
* **Floods** of frames that ask for nothing (PING, SETTINGS, empty DATA) get GOAWAY
  ENHANCE_YOUR_CALM; a client that pings once per call keeps its connection.
* **A preface not followed by SETTINGS** (RFC 9113 §3.4). Before: served until the handshake
  timeout (10 s). Now: GOAWAY PROTOCOL_ERROR at once.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from gateway_harness import FakeWorker, fake_workers, running_gateway
from h2_client import (
    INFER,
    LIVE,
    PREFACE,
    RawClient,
    frame,
    grpc_message,
    request_headers,
    server_live,
)
from hyperframe.frame import RstStreamFrame
from wire_server import running_wire_server
from worker_harness import free_port

from reactantserver.config.schema import GatewayConfig, ListenConfig, LoggingConfig
from reactantserver.protocol import inference as pb

pytestmark = pytest.mark.slow

PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, ENHANCE_YOUR_CALM = 0x1, 0x3, 0x5, 0xB
DATA, HEADERS, PING, SETTINGS, WINDOW_UPDATE = 0x0, 0x1, 0x6, 0x4, 0x8


@pytest.fixture(scope="module")
def worker_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with running_wire_server(tmp_path_factory.mktemp("abuse")) as server:
        yield server.port


@pytest.fixture(scope="module")
def gateway_port() -> Iterator[int]:
    with fake_workers(1) as workers, running_gateway(_gateway_config(workers)) as run:
        yield run.address.grpc_port


def _gateway_config(workers: list[FakeWorker]) -> GatewayConfig:
    return GatewayConfig(
        listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
        endpoints=tuple(w.address for w in workers),
        worker_names=tuple(f"w{i}" for i in range(len(workers))),
        health_interval_seconds=60.0,
        logging=LoggingConfig(format="text"),
    )


@pytest.fixture(params=["worker", "gateway"])
def port(request: pytest.FixtureRequest) -> int:
    """The gRPC port of a real worker, then of a real gateway."""
    return int(request.getfixturevalue(f"{request.param}_port"))


def infer_request() -> bytes:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    return bytes(
        pb.ModelInferRequest(
            model_name="double",
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[1, 16])],
            raw_input_contents=[x.tobytes()],
        )
    )


def window_update(sid: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", increment))


def ping(n: int, *, ack: bool = False) -> bytes:
    return frame(PING, 0x1 if ack else 0, 0, struct.pack(">Q", n))


def server_resets(client: RawClient, code: int) -> int:
    return sum(1 for f in client.frames if isinstance(f, RstStreamFrame) and f.error_code == code)


# ------------------------------------------------------------------------- MadeYouReset


def _provoke_and_count(port: int, write: Callable[[RawClient, range], list[bytes]]) -> RawClient:
    """Waves of 100 streams (``write`` gives each wave's writes, read by the server one by
    one), until the server sends GOAWAY or 2,000 streams were opened; the client, once
    the server closed the connection."""
    with RawClient(port) as client:
        client.handshake()
        sid = 1
        for _ in range(20):
            wave = range(sid, sid + 2 * 100, 2)
            sid += 2 * 100
            for data in write(client, wave):
                if not client.send(data):
                    break
                client.pump(0.05)
            if client.connection.goaway is not None:
                break
        client.wait_closed(20)
    return client


def test_running_calls_the_server_is_made_to_reset_are_budgeted(port: int) -> None:
    """MadeYouReset on running calls: 100 ModelInfer calls opened (their message not yet
    sent, so each waits for it), then a WINDOW_UPDATE on each that overflows its send
    window -- a stream error, FLOW_CONTROL_ERROR (RFC 9113 §6.9.1) -- and again: the
    connection gets GOAWAY ENHANCE_YOUR_CALM once more than half of 200 calls were reset
    so, as if the client had reset them itself; before, 2,000 of 2,000."""
    half = grpc_message(infer_request())[:20]

    def write(client: RawClient, wave: range) -> list[bytes]:
        opened = b"".join(
            client.headers(s, request_headers(INFER)) + client.data(s, half) for s in wave
        )
        return [opened, b"".join(window_update(s, 2**31 - 1) for s in wave)]

    client = _provoke_and_count(port, write)
    outcome = client.connection
    assert outcome.goaway is not None and outcome.goaway[0] == ENHANCE_YOUR_CALM, outcome
    assert outcome.closed
    assert 100 <= server_resets(client, FLOW_CONTROL_ERROR) <= 300
    assert server_live(port)


PROVOCATIONS = {
    # The reproduction: a full ModelInfer, then a WINDOW_UPDATE overflowing the
    # stream's send window (65,535 + 2^31-1): FLOW_CONTROL_ERROR (RFC 9113 §6.9.1).
    "window_overflow": (lambda sid: window_update(sid, 2**31 - 1), FLOW_CONTROL_ERROR),
    # DATA on a stream the client already ended: STREAM_CLOSED (§5.1).
    "data_after_end": (lambda sid: RawClient.data(sid, b"x"), STREAM_CLOSED),
    # A WINDOW_UPDATE of 0 on the stream: a stream error, PROTOCOL_ERROR (§6.9).
    "zero_increment": (lambda sid: window_update(sid, 0), PROTOCOL_ERROR),
}


@pytest.mark.parametrize("provocation", sorted(PROVOCATIONS))
def test_resets_provoked_with_the_request_are_budgeted(port: int, provocation: str) -> None:
    """MadeYouReset as the issue ran it: 2,000 streams, each a full ModelInfer followed by a
    frame that makes the server reset the stream, all of a stream's frames in one write.
    Read together, the call never starts (the server sees the stream reset before it
    admits it), so each reset cost the server one RST_STREAM: budgeted with the frames
    that ask for nothing. GOAWAY ENHANCE_YOUR_CALM after a few hundred, not 2,000."""
    provoke, code = PROVOCATIONS[provocation]
    message = grpc_message(infer_request())

    def write(client: RawClient, wave: range) -> list[bytes]:
        return [
            b"".join(
                client.headers(s, request_headers(INFER))
                + client.data(s, message, end_stream=True)
                + provoke(s)
                for s in wave
            )
        ]

    client = _provoke_and_count(port, write)
    outcome = client.connection
    assert outcome.goaway is not None and outcome.goaway[0] == ENHANCE_YOUR_CALM, outcome
    assert outcome.closed
    assert 100 <= server_resets(client, code) <= 700
    assert server_live(port)


def test_client_resets_are_still_budgeted(port: int) -> None:
    """The rule the provoked resets joined: calls reset by the client right after they
    started (rapid reset, CVE-2023-44487) get GOAWAY ENHANCE_YOUR_CALM too."""
    with RawClient(port) as client:
        client.handshake()
        sid = 1
        for _ in range(10):
            wave = range(sid, sid + 2 * 100, 2)
            sid += 2 * 100
            client.send(b"".join(client.headers(s, request_headers(LIVE)) for s in wave))
            client.pump(0.05)
            client.send(b"".join(frame(0x3, 0, s, struct.pack(">I", 0x8)) for s in wave))
            client.pump(0.05)
            if client.connection.goaway is not None:
                break
        outcome = client.wait_closed(20)
        assert outcome.goaway is not None and outcome.goaway[0] == ENHANCE_YOUR_CALM, outcome


# ------------------------------------------------------------------------- floods

FLOODS = {
    "ping": lambda i: ping(i),
    "settings": lambda i: frame(SETTINGS, 0, 0, b""),
    "empty_data": lambda i: RawClient.data(1, b""),
}


@pytest.mark.parametrize("kind", sorted(FLOODS))
def test_floods_of_frames_that_ask_for_nothing_get_enhance_your_calm(port: int, kind: str) -> None:
    """5,000 PINGs, SETTINGS or empty DATA frames (no END_STREAM, on an open call) as fast
    as they can be written: GOAWAY ENHANCE_YOUR_CALM, connection closed; before, each was
    answered (an ACK) or ignored for as long as the client went on."""
    with RawClient(port) as client:
        client.handshake()
        client.send(client.headers(1, request_headers(INFER)))  # a call left open
        flood = FLOODS[kind]
        for start in range(0, 5000, 500):
            if not client.send(b"".join(flood(i) for i in range(start, start + 500))):
                break
            client.pump(0.01)
        outcome = client.wait_closed(20)
        assert outcome.goaway is not None and outcome.goaway[0] == ENHANCE_YOUR_CALM, outcome
        assert outcome.closed
    assert server_live(port)


def test_a_client_that_pings_once_per_call_keeps_its_connection(port: int) -> None:
    """The other side of the budget: 1,500 calls, each followed by a PING (as gRPC's
    flow-control probes do), well past the bucket's burst: every call answered OK, every
    PING acknowledged, no GOAWAY."""
    with RawClient(port) as client:
        client.handshake()
        sid = 1
        for _ in range(30):
            wave = list(range(sid, sid + 2 * 50, 2))
            sid += 2 * 50
            client.send(
                b"".join(
                    client.headers(s, request_headers(LIVE))
                    + client.data(s, grpc_message(b""), end_stream=True)
                    + ping(s)
                    for s in wave
                )
            )
            for s in wave:
                assert client.wait(s, 10).grpc_status == 0
        assert client.connection.goaway is None
        acks = [f for f in client.frames if type(f).__name__ == "PingFrame" and "ACK" in f.flags]
        deadline = time.monotonic() + 10
        while len(acks) < 1500 and time.monotonic() < deadline:
            client.pump(0.1)
            acks = [
                f for f in client.frames if type(f).__name__ == "PingFrame" and "ACK" in f.flags
            ]
        assert len(acks) == 1500
        assert client.connection.goaway is None


# ------------------------------------------------------------------------- the preface


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(ping(1), id="ping"),
        pytest.param(frame(SETTINGS, 0x1, 0, b""), id="settings_ack"),
        pytest.param(window_update(0, 1 << 20), id="window_update"),
        pytest.param(b"headers", id="headers"),
    ],
)
def test_a_preface_not_followed_by_settings_is_a_protocol_error(port: int, first: bytes) -> None:
    """RFC 9113 §3.4: the client's preface is the magic string *and* a SETTINGS frame.
    Any other frame first: GOAWAY PROTOCOL_ERROR at once (well within a second; before,
    the connection was served until the 10 s handshake timeout)."""
    with RawClient(port) as client:
        if first == b"headers":
            first = client.headers(1, request_headers(LIVE), end_stream=True)
        started = time.monotonic()
        client.send(PREFACE + first)
        outcome = client.wait_closed(8)
        took = time.monotonic() - started
        assert outcome.goaway is not None and outcome.goaway[0] == PROTOCOL_ERROR, outcome
        assert outcome.closed and took < 5, took
        assert client.results.get(1) is None or client.results[1].grpc_status is None
    assert server_live(port)


def test_the_preface_and_settings_split_across_reads_are_served(port: int) -> None:
    """The rule is about the first *frame*, not the first read: a preface and SETTINGS
    arriving a few bytes at a time are a normal connection."""
    with RawClient(port) as client:
        hello = PREFACE + frame(SETTINGS, 0, 0, b"")
        for i in range(0, len(hello), 5):
            client.send(hello[i : i + 5])
            time.sleep(0.002)  # real-clock: a slow client, so that each piece is one read
        client.send(client.headers(1, request_headers(LIVE)))
        client.send(client.data(1, grpc_message(b""), end_stream=True))
        assert client.wait(1, 10).grpc_status == 0
        assert client.connection.goaway is None


# ------------------------------------------------------------------------- issue 35, item 4


@pytest.mark.parametrize(
    ("target", "key", "other"),
    [
        ("worker", "endpoints.max_message_bytes", "grpc.max_recv_msg_bytes"),
        ("gateway", "grpc.max_recv_msg_bytes", "endpoints.max_message_bytes"),
    ],
)
def test_a_message_too_large_names_the_setting_of_the_process_that_refuses_it(
    request: pytest.FixtureRequest, target: str, key: str, other: str
) -> None:
    """Issue 35, item 4. Before: the gateway's refusal of a 4 GiB message named the
    worker's key (``endpoints.max_message_bytes``). Each process now names its own: the
    limit's key travels with the limit (``WireLimits.names``)."""
    port = int(request.getfixturevalue(f"{target}_port"))
    with RawClient(port) as client:
        client.handshake()
        client.send(client.headers(1, request_headers(INFER)))
        client.send(client.data(1, struct.pack(">BI", 0, 2**32 - 1) + bytes(1024)))
        result = client.wait(1, 10)
    assert result.grpc_status == 8, result  # RESOURCE_EXHAUSTED
    assert "4294967295 bytes exceeds the limit" in result.grpc_message
    assert key in result.grpc_message and other not in result.grpc_message

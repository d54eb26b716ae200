"""Hostile traffic, generated: HTTP/2 sessions, raw frames and gRPC messages against a
real server on loopback.

The server is the real ``serve_grpc`` over the real ``Service`` and the fake host, in a
subprocess (``tests/wire_server.py``), with small limits so that generated traffic hits
them: 64 KiB messages, 16 streams per connection, a 3 s handshake timeout. Three
generators drive it (strategies in ``tests/strategies.py``):

* ``h2_actions``: a polite HTTP/2 client (h2's state machine) speaking bad gRPC --
  odd headers, bodies that lie about their length, compressed flags, cut-short
  messages, resets, pings, settings, unknown frame types, interleaved on many streams;
* ``raw_frames``: raw frames of any type, flags, stream id and payload, with length
  fields that lie, now and then a well-formed request among them;
* ``model_infer_requests``: valid protobuf ModelInfer messages of any shape for real
  models.

The property, checked after every example: **every client gets a precise status or a
clean connection error** (a stream the client finished is answered with a status that
is never UNKNOWN or INTERNAL, or reset, or the connection ends with a GOAWAY -- except a
peer that never completed the preface, which is simply closed), **the server stays
live** (a normal call on a new connection works), and **it returns to rest**: no call
in flight, no stream or connection open, its file descriptors back to the baseline and
its RSS within a fixed margin of it.

``--fuzz-examples N`` (default: a quick run) sets the examples per generator; ``nox -s
fuzz`` runs a long one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import hpack
import numpy as np
import pytest
from clocks import wait_until
from h2.exceptions import H2Error
from h2_client import (
    INFER,
    LIVE,
    PREFACE,
    CallResult,
    H2Client,
    RawClient,
    frame,
    grpc_message,
    request_headers,
    server_live,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import h2_actions, model_infer_requests, raw_frames
from wire_server import WireServer, running_wire_server

from reactantserver.protocol import inference as pb

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024
STREAMS = 16
UNKNOWN, INTERNAL = 2, 13
#: How long a finished stream may take to be answered.
ANSWER_WAIT = 10.0
#: RSS may grow this much over the warmed-up baseline (allocator caches, fragmentation).
RSS_MARGIN = 64 << 20

PATHS = {
    "live": LIVE,
    "infer": INFER,
    "config": "/inference.GRPCInferenceService/ModelConfig",
    "unknown": "/no.Such/Method",
    "reflection": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}
HEADERS: dict[str, tuple[dict[str, Any], tuple[tuple[str, str | None], ...]]] = {
    "plain": ({}, ()),
    "timeout": ({"timeout": "5S"}, ()),
    "timeout_zero": ({"timeout": "0n"}, ()),
    "timeout_tiny": ({"timeout": "1n"}, ()),
    "timeout_bad": ({"timeout": "5 seconds"}, ()),
    "gzip": ({}, (("grpc-encoding", "gzip"),)),
    "content_type": ({}, (("content-type", "text/plain"),)),
    "get": ({}, ((":method", "GET"),)),
    "no_te": ({}, (("te", None),)),  # left out (h2 itself refuses any other value)
    "bad_bin_metadata": ({}, (("x-trace-bin", "%%%%"),)),
}


def infer_bytes(model: str = "double", rows: int = 1) -> bytes:
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


def echo_bytes() -> bytes:
    return bytes(
        pb.ModelInferRequest(
            model_name="echo",
            inputs=[pb.ModelInferRequestInferInputTensor(name="s", datatype="BYTES", shape=[1])],
            raw_input_contents=[b"\x02\x00\x00\x00hi"],
        )
    )


def body_bytes(kind: str, noise: bytes) -> bytes:
    """The request body of a fuzzed stream (see ``strategies.WIRE_BODY_KINDS``)."""
    if kind == "infer":
        return grpc_message(infer_bytes())
    if kind == "echo":
        return grpc_message(echo_bytes())
    if kind == "empty_message":
        return grpc_message(b"")
    if kind == "garbage":
        return noise  # whatever its first five bytes declare
    if kind == "oversize":
        return grpc_message(noise, length=LIMIT + 1 + len(noise))
    if kind == "compressed":
        return grpc_message(noise, flag=1)
    if kind == "cut":
        return grpc_message(noise, length=len(noise) + 10)
    if kind == "protobuf_noise":
        return grpc_message(noise)
    return b""


# ----------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireServer]:
    with running_wire_server(
        tmp_path_factory.mktemp("fuzz"),
        max_message_bytes=LIMIT,
        max_concurrent_streams=STREAMS,
        handshake_timeout_seconds=3.0,
        max_concurrent_requests=8,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def baseline(server: WireServer) -> dict[str, int]:
    """Warm the server up, then note its file descriptors and RSS at rest."""
    for _ in range(20):
        with H2Client(server.port) as client:
            assert client.call(INFER, infer_bytes()).grpc_status == 0
            assert client.call(LIVE, b"").grpc_status == 0
    at_rest(server, None)
    return {"fds": server.open_fds(), "rss": server.rss_bytes()}


def at_rest(server: WireServer, baseline: dict[str, int] | None) -> None:
    """The server is live and back to rest (see the module docstring)."""
    assert server.alive(), server.log()[-3000:]
    assert server_live(server.port), server.log()[-3000:]

    def at_rest() -> bool:
        metrics = server.metrics()
        quiet = (
            metrics["worker_inflight_requests"] == 0
            and metrics["worker_grpc_streams_open"] == 0
            and metrics["worker_grpc_connections_open"] == 0
        )
        return quiet and (baseline is None or server.open_fds() == baseline["fds"])

    wait_until(at_rest, what=lambda: (server.metrics(), server.open_fds(), baseline))
    if baseline is not None:
        assert server.rss_bytes() - baseline["rss"] < RSS_MARGIN
    assert "Traceback" not in server.log(), server.log()[-3000:]


def check_answer(result: Any, connection: Any, where: str) -> None:
    """A finished stream: a precise status, a reset, or a clean connection error."""
    if result.grpc_status is not None:
        assert result.grpc_status not in (UNKNOWN, INTERNAL), (where, result)
        return
    if result.reset is not None:
        return
    assert connection.goaway is not None, (where, result, connection)


def run(examples: int, strategy: st.SearchStrategy[Any], body: Callable[[Any], None]) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def fuzz(case: Any) -> None:
        body(case)

    fuzz()


# -------------------------------------------------------------------- h2 client sessions


class _Done:
    """``sid in done``: no stream, or one whose client half is over."""

    def __init__(self, finished: set[int], client: H2Client) -> None:
        self._finished = finished
        self._client = client

    def __contains__(self, sid: object) -> bool:
        if not isinstance(sid, int):
            return True
        result = self._client.results.get(sid)
        return sid in self._finished or result is None or result.finished


def play_h2(client: H2Client, actions: list[tuple[Any, ...]]) -> set[int]:
    """Carry out the actions; return the streams the client finished (END_STREAM)."""
    opened: list[int] = []
    finished: set[int] = set()

    def pick(index: int) -> int | None:
        return opened[index % len(opened)] if opened else None

    # The client's own half of a stream is over once it ended or reset it: h2 would
    # refuse to send more, and a refused send can leave its state inconsistent.
    done = _Done(finished, client)

    for action in actions:
        kind = action[0]
        try:
            if kind == "open":
                _, path, variant, (body_kind, noise), end = action
                options, extra = HEADERS[variant]
                headers = request_headers(PATHS[path], timeout=options.get("timeout"))
                replace = dict(extra)
                headers = [(k, replace.pop(k, v)) for k, v in headers]
                headers += list(replace.items())
                headers = [(k, v) for k, v in headers if v is not None]
                sid = client.conn.get_next_available_stream_id()
                data = body_bytes(body_kind, noise)
                client.conn.send_headers(sid, headers, end_stream=end and not data)
                client.results[sid] = CallResult()
                client.flush()
                opened.append(sid)
                if data:
                    client.send(sid, data, end_stream=end)
                if end:
                    finished.add(sid)
            elif kind == "data" and (sid := pick(action[1])) not in done:
                _, _, (body_kind, noise), end = action
                client.send(sid, body_bytes(body_kind, noise) or b"", end_stream=end)
                if end:
                    finished.add(sid)
            elif kind == "end" and (sid := pick(action[1])) not in done:
                client.end(sid)
                finished.add(sid)
            elif kind == "reset" and (sid := pick(action[1])) not in done:
                client.conn.reset_stream(sid, action[2])
                client.flush()
                finished.discard(sid)
                client.results[sid].reset = -1  # ours: no answer expected
            elif kind == "ping":
                client.conn.ping(action[1])
                client.flush()
            elif kind == "settings":
                client.conn.update_settings({action[1]: action[2]})
                client.flush()
            elif kind == "window":
                client.conn.increment_flow_control_window(action[1])
                client.flush()
            elif kind == "unknown":
                client.send_raw(frame(action[1], 0, 0, action[2]))
        except (H2Error, KeyError):
            # h2 refuses what the protocol does not allow on its side (a stream already
            # closed, too many streams, a window past 2^31); the session goes on.
            continue
        client.pump(0)
    return finished


def test_h2_sessions(server: WireServer, baseline: dict[str, int], fuzz_examples: int) -> None:
    def session(actions: list[tuple[Any, ...]]) -> None:
        with H2Client(server.port) as client:
            finished = play_h2(client, actions)
            for sid in sorted(finished):
                result = client.wait(sid, ANSWER_WAIT)
                if result.reset == -1:
                    continue
                check_answer(result, client.connection, f"stream {sid} of {actions}")
            assert client.connection.client_error is None, (actions, client.connection)
            if client.connection.closed:
                assert client.connection.goaway is not None, actions
        at_rest(server, baseline)

    run(fuzz_examples, h2_actions(), session)


# ----------------------------------------------------------------------------- raw frames


def play_raw(client: RawClient, frames: list[tuple[Any, ...]]) -> set[int]:
    encoder = hpack.Encoder()
    finished: set[int] = set()
    for item in frames:
        kind = item[0]
        if kind == "frame":
            _, ftype, flags, sid, payload = item
            data = frame(ftype, flags, sid, payload)
        elif kind == "request":
            _, sid, end = item
            f_headers = encoder.encode([(k.encode(), v.encode()) for k, v in request_headers(LIVE)])
            data = frame(0x1, 0x4 | (0x1 if end else 0), sid, f_headers)
            if end:
                finished.add(sid)
        elif kind == "message":
            _, sid, payload, end = item
            data = frame(0x0, 0x1 if end else 0, sid, grpc_message(payload))
            if end:
                finished.add(sid)
        else:  # a header whose length field lies
            _, ftype, sid, length = item
            data = frame(ftype, 0, sid, b"\x00" * 16, length=length)
        if not client.send(data):
            break
        client.pump(0)
    return finished


def test_raw_frames(server: WireServer, baseline: dict[str, int], fuzz_examples: int) -> None:
    def session(case: tuple[bool, list[tuple[Any, ...]]]) -> None:
        preface_ok, frames = case
        with RawClient(server.port) as client:
            if preface_ok:
                client.handshake()
            else:
                client.send(PREFACE[:11] + b"garbage")
            finished = play_raw(client, frames)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not client.connection.closed:
                if all(client.results.get(s) and client.results[s].finished for s in finished):
                    break
                client.pump(0.05)
            for sid, result in client.results.items():
                if result.grpc_status is not None:
                    assert result.grpc_status not in (UNKNOWN, INTERNAL), (sid, result, frames)
            if client.connection.closed and preface_ok:
                # (RFC 9113 §3.4: after an invalid preface the GOAWAY "MAY be omitted",
                # the peer is not speaking HTTP/2.)
                assert client.connection.goaway is not None, frames
        at_rest(server, baseline)

    preface = st.sampled_from([True, True, True, False])  # mostly past the handshake
    run(fuzz_examples, st.tuples(preface, raw_frames()), session)


# ----------------------------------------------------------------------- gRPC messages


def test_model_infer_messages(
    server: WireServer, baseline: dict[str, int], fuzz_examples: int
) -> None:
    def session(case: tuple[pb.ModelInferRequest, str]) -> None:
        request, model = case
        request.model_name = model
        message = bytes(request)
        with H2Client(server.port) as client:
            result = client.call(INFER, message, wait=ANSWER_WAIT)
            check_answer(result, client.connection, f"{request!r}")
        at_rest(server, baseline)

    models = st.sampled_from(["double", "echo", "cold", "busy", "no-such-model", ""])
    run(fuzz_examples, st.tuples(model_infer_requests(), models), session)

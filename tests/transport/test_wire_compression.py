"""Compressed request messages (``transport/core/compression.py``): inflated exactly, within bounds.

The inflater alone (sans-IO, Hypothesis), then a real :class:`GuardedServer` on loopback
driven by the hand-written HTTP/2 client of ``tests/h2_client.py``, on both of its paths:
a direct method (ModelInfer's) and a task-path one. What must hold:

* a gzip or deflate message that fits the limit reaches the handler as it was before it
  was compressed, and the answer says what the server accepts (``grpc-accept-encoding``);
* one that inflates past the limit is RESOURCE_EXHAUSTED, having produced at most
  ``limit + 1`` bytes, a step of at most ``STEP`` bytes at a time; a damaged one is
  INVALID_ARGUMENT; neither reaches the handler;
* an encoding not served is UNIMPLEMENTED, saying which are; the compressed flag on a call
  that named none is INVALID_ARGUMENT.
(tests/worker/test_triton_examples.py does the same through tritonclient, worker and gateway.)
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from grpclib.const import Cardinality, Handler
from h2_client import H2Client, grpc_message
from hypothesis import given
from hypothesis import strategies as st
from threaded_server import ThreadedServer

from reactantserver.status import StatusCode
from reactantserver.transport.core.compression import STEP, Inflater
from reactantserver.transport.core.framing import Refusal
from reactantserver.transport.core.limits import Fault, WireLimits
from reactantserver.transport.unary import DirectHandler, UnaryCall

COMPRESS = {"gzip": gzip.compress, "deflate": zlib.compress}


def payloads() -> st.SearchStrategy[bytes]:
    """Bytes that compress a little or a lot: runs of repeated chunks and noise."""
    chunk = st.binary(max_size=64)
    return st.lists(st.tuples(chunk, st.integers(1, 3000)), max_size=8).map(
        lambda parts: b"".join(c * n for c, n in parts)
    )


def inflate(inflater: Inflater) -> tuple[bytes | Refusal, list[int]]:
    """Run ``inflater`` to its end; what it gave and the bytes produced at each step."""
    steps = []
    while True:
        before = inflater.inflated
        result = inflater.step()
        steps.append(inflater.inflated - before)
        if result is not None:
            return result, steps


@given(payloads(), st.sampled_from(sorted(COMPRESS)), st.integers(0, 200_000))
def test_inflating_gives_the_message_or_refuses_it(data: bytes, encoding: str, limit: int) -> None:
    """For any message, algorithm and limit: inflating gives back exactly the message when
    it fits the limit, and RESOURCE_EXHAUSTED otherwise; no step produces more than STEP
    bytes, and the steps together never more than limit + 1."""
    result, steps = inflate(Inflater(COMPRESS[encoding](data), encoding, limit))
    if len(data) <= limit:
        assert result == data
    else:
        assert isinstance(result, Refusal) and result.code is StatusCode.RESOURCE_EXHAUSTED
        assert result.fault is Fault.MESSAGE_TOO_LARGE
    assert all(step <= STEP for step in steps)
    assert sum(steps) <= limit + 1


@given(payloads(), st.sampled_from(sorted(COMPRESS)), st.data())
def test_a_damaged_stream_is_refused_not_raised(
    data: bytes, encoding: str, draw: st.DataObject
) -> None:
    """A compressed message cut short anywhere, or followed by more bytes, is refused
    INVALID_ARGUMENT (never an exception, never a wrong message)."""
    packed = COMPRESS[encoding](data)
    cut = draw.draw(st.integers(0, len(packed) - 1))
    extra = draw.draw(st.binary(min_size=1, max_size=8))
    for damaged in (packed[:cut], packed + extra):
        result = Inflater(damaged, encoding, 1 << 30).run()
        assert isinstance(result, Refusal), damaged
        assert result.code is StatusCode.INVALID_ARGUMENT
        assert result.message.startswith(f"the request message is marked compressed ({encoding})")


def test_a_bomb_is_refused_before_it_is_inflated_past_the_limit() -> None:
    """64 MiB of zeros in 64 KiB of deflate, under a 1 MiB limit: refused after one step
    of at most the limit + 1 bytes (a few steps in all), the limit named."""
    bomb = zlib.compress(bytes(64 << 20), 9)
    assert len(bomb) < 70_000
    result, steps = inflate(Inflater(bomb, "deflate", 1 << 20, "grpc.max_recv_msg_bytes"))
    assert isinstance(result, Refusal) and result.code is StatusCode.RESOURCE_EXHAUSTED
    assert result.message.startswith(
        "the request message inflates past the limit of 1048576 bytes (grpc.max_recv_msg_bytes)"
    )
    assert sum(steps) == (1 << 20) + 1 and len(steps) <= 3


# ------------------------------------------------------------------ on the wire


class CompressingServer(ThreadedServer):
    """A direct echo and a task-path echo, with a small message limit."""

    LIMIT = 1 << 20

    def __init__(self) -> None:
        super().__init__(WireLimits(max_message_bytes=self.LIMIT))
        self.seen: list[bytes] = []

    def echo(self, call: UnaryCall, message: bytes | memoryview) -> None:
        self.seen.append(bytes(message))
        call.answer((b"%d" % len(message),))

    def mapping(self) -> dict[str, Handler | DirectHandler]:
        async def plain(stream: Any) -> None:
            message = await stream.recv_message()
            self.seen.append(bytes(message))
            await stream.send_message(b"%d" % len(message))

        return {
            "/t.S/Echo": DirectHandler(self.echo),
            "/t.S/Plain": Handler(plain, Cardinality.UNARY_UNARY, None, None),
        }

    def faults(self, fault: Fault) -> int:
        assert self.server is not None
        return self.server.counters.faults[fault]


@pytest.fixture(scope="module")
def server() -> Iterator[CompressingServer]:
    with CompressingServer() as s:
        yield s


def call(server: CompressingServer, path: str, message: bytes, encoding: str | None,
         *, flag: int = 1) -> Any:  # fmt: skip
    extra = (("grpc-encoding", encoding),) if encoding else ()
    with H2Client(server.port) as client:
        sid = client.start(path, extra=extra)
        client.send(sid, grpc_message(message, flag=flag), end_stream=True)
        return client.wait(sid, timeout=30)


@pytest.mark.parametrize("path", ["/t.S/Echo", "/t.S/Plain"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_message_reaches_the_handler_inflated(
    server: CompressingServer, path: str, encoding: str
) -> None:
    payload = bytes(range(256)) * 1000  # 256 KB, a few steps' worth of input
    result = call(server, path, COMPRESS[encoding](payload), encoding)
    assert result.grpc_status == 0, result.grpc_message
    assert result.data[5:] == b"%d" % len(payload)
    assert server.seen[-1] == payload
    assert result.headers["grpc-accept-encoding"] == "identity,deflate,gzip"
    # A message without the flag, on a call with an encoding, is taken as it is.
    result = call(server, path, b"plain", encoding, flag=0)
    assert result.grpc_status == 0 and server.seen[-1] == b"plain"


@pytest.mark.parametrize("path", ["/t.S/Echo", "/t.S/Plain"])
def test_a_bomb_and_a_damaged_message_never_reach_the_handler(
    server: CompressingServer, path: str
) -> None:
    seen = len(server.seen)
    too_large = server.faults(Fault.MESSAGE_TOO_LARGE)
    result = call(server, path, gzip.compress(bytes(8 << 20)), "gzip")
    assert result.grpc_status == StatusCode.RESOURCE_EXHAUSTED
    assert "inflates past the limit of 1048576 bytes" in result.grpc_message
    assert server.faults(Fault.MESSAGE_TOO_LARGE) == too_large + 1
    result = call(server, path, gzip.compress(b"abc")[:-4], "gzip")
    assert result.grpc_status == StatusCode.INVALID_ARGUMENT
    assert "stream is cut short" in result.grpc_message
    assert len(server.seen) == seen


def test_encodings_not_served_and_flags_without_one(server: CompressingServer) -> None:
    result = call(server, "/t.S/Echo", b"x", "snappy")
    assert result.grpc_status == StatusCode.UNIMPLEMENTED
    assert result.headers["grpc-accept-encoding"] == "identity,deflate,gzip"
    result = call(server, "/t.S/Echo", gzip.compress(b"x"), None)
    assert result.grpc_status == StatusCode.INVALID_ARGUMENT
    assert "no grpc-encoding header" in result.grpc_message

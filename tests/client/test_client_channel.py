"""The client's connection (:mod:`reactantserver.client.channel`) on loopback against
grpclib's own server (h2 on its side: 16 KiB frames, 4 MiB windows, at most 100 streams):
another implementation than ours, so what round-trips here is HTTP/2 and gRPC as others
speak them.

* A message larger than the server's windows goes out as pieces (never joined) and comes
  back whole, through ``AsyncClient`` and through :meth:`Channel.unary` directly.
* The server's statuses arrive as grpclib's ``GRPCError`` with the message it sent.
* A call past its timeout raises ``TimeoutError`` and resets its stream (the server's
  handler is cancelled); the connection goes on.
* More calls at once than the server's SETTINGS_MAX_CONCURRENT_STREAMS wait for a stream
  instead of being refused; after a GOAWAY they go to a new connection (h2's server).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import ClassVar

import h2.config
import h2.connection
import h2.events
import h2.settings
import numpy as np
import pytest
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server, Stream

from reactantserver.client import AsyncClient
from reactantserver.client.channel import Channel
from reactantserver.client.status import translate
from reactantserver.grpcwire import encode_grpc_timeout, parse_grpc_timeout
from reactantserver.h2.events import ErrorCodes
from reactantserver.h2.events import ProtocolError as WireProtocolError
from reactantserver.protocol import inference as pb
from reactantserver.status import StatusCode

FRAME_SIZE_ERROR = ErrorCodes.FRAME_SIZE_ERROR

INFER = "/inference.GRPCInferenceService/ModelInfer"


class _Echo:
    """ModelInfer answering every input as an output of the same name, bytes and shape;
    a model named ``sleep`` waits first (and says when it was cancelled), one named
    ``missing`` is NOT_FOUND."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def infer(self, stream: Stream[pb.ModelInferRequest, pb.ModelInferResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        if request.model_name == "missing":
            raise GRPCError(Status.NOT_FOUND, "no model named 'missing' (ünïcode 100%)")
        if request.model_name == "sleep":
            try:
                await asyncio.sleep(float(request.id))  # real-clock: a slow model, as asked
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        for tensor in request.inputs:
            response.outputs.append(
                pb.ModelInferResponseInferOutputTensor(
                    name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
                )
            )
        response.raw_output_contents = request.raw_input_contents
        await stream.send_message(response)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            INFER: Handler(
                self.infer, Cardinality.UNARY_UNARY, pb.ModelInferRequest, pb.ModelInferResponse
            )
        }


def _against_grpclib(call: Callable[[int, _Echo], Awaitable[None]]) -> None:
    """Run ``call(port, echo)`` on asyncio against grpclib's own server on loopback."""

    async def main() -> None:
        echo = _Echo()
        server = Server([echo])
        await server.start("127.0.0.1", 0)
        try:
            assert server._server is not None
            await call(server._server.sockets[0].getsockname()[1], echo)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def _channel(port: int) -> Channel:
    return Channel("127.0.0.1", port, stream_window=16 << 20, connection_window=64 << 20)


def _request(model: str, payload: bytes = b"", request_id: str = "") -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequestInferInputTensor(name="b", datatype="UINT8", shape=[len(payload)])
    return pb.ModelInferRequest(
        model_name=model, id=request_id, inputs=[tensor], raw_input_contents=[payload]
    )


def test_a_message_larger_than_the_windows_round_trips_as_pieces() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1_500_000)).astype(np.float32)  # 18 MB, windows of 4 MiB
    small = np.arange(5, dtype=np.int64)

    async def call(port: int, _: _Echo) -> None:
        async with AsyncClient(f"127.0.0.1:{port}", timeout=60) as client:
            out = await client.infer("echo", {"x": x, "n": small})
            assert np.array_equal(out["x"], x) and np.array_equal(out["n"], small)
            again = await client.infer("echo", {"n": small})  # same connection, small call
            assert np.array_equal(again["n"], small)
            stats = client.statistics()
        assert stats.bytes_sent > x.nbytes and stats.bytes_received > x.nbytes

    _against_grpclib(call)


def test_a_message_cut_into_pieces_anywhere_arrives_as_one() -> None:
    payload = bytes(range(256)) * 40_000  # 10 MB
    encoded = bytes(_request("m", payload))
    cuts = [0, 1, 2, 7, 100, 16_384, 16_390, 5_000_000, len(encoded)]
    pieces = [memoryview(encoded)[a:b] for a, b in itertools.pairwise(cuts)]

    async def call(port: int, _: _Echo) -> None:
        channel = _channel(port)
        try:
            answer = await channel.unary(INFER, pieces, timeout=60)
        finally:
            channel.close()
        assert answer is not None
        reply = pb.ModelInferResponse().parse(answer)
        assert reply.model_name == "m" and reply.raw_output_contents == [payload]

    _against_grpclib(call)


def test_the_servers_status_and_message_arrive_as_grpc_error() -> None:
    async def call(port: int, _: _Echo) -> None:
        channel = _channel(port)
        try:
            with pytest.raises(GRPCError) as caught:
                await channel.unary(INFER, [bytes(_request("missing"))], timeout=10)
        finally:
            channel.close()
        assert caught.value.status is Status.NOT_FOUND
        assert caught.value.message == "no model named 'missing' (ünïcode 100%)"

    _against_grpclib(call)


def test_a_call_past_its_timeout_resets_its_stream_and_the_connection_goes_on() -> None:
    async def call(port: int, echo: _Echo) -> None:
        channel = _channel(port)
        try:
            with pytest.raises(TimeoutError):
                await channel.unary(INFER, [bytes(_request("sleep", request_id="30"))], timeout=0.3)
            await asyncio.wait_for(echo.cancelled.wait(), 30)  # the server saw the reset
            answer = await channel.unary(INFER, [bytes(_request("m", b"ok"))], timeout=10)
        finally:
            channel.close()
        assert answer is not None
        assert pb.ModelInferResponse().parse(answer).raw_output_contents == [b"ok"]

    _against_grpclib(call)


def test_more_calls_than_the_servers_stream_limit_wait_for_a_stream() -> None:
    """h2's server allows 100 streams; 150 calls at once all succeed on one connection
    (over the limit, a new stream would be refused with RST_STREAM)."""

    async def call(port: int, _: _Echo) -> None:
        channel = _channel(port)
        try:
            answers = await asyncio.gather(
                *(
                    channel.unary(INFER, [bytes(_request("sleep", b"%d" % i, "0.05"))], timeout=60)
                    for i in range(150)
                )
            )
        finally:
            channel.close()
        for i, answer in enumerate(answers):
            assert answer is not None
            assert pb.ModelInferResponse().parse(answer).raw_output_contents == [b"%d" % i]

    _against_grpclib(call)


class _H2Server(asyncio.Protocol):
    """A test server on h2's server side: ``settings`` its SETTINGS, ``started`` what a
    subclass sets up after the connection is made."""

    settings: ClassVar[dict[int, int]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        if self.settings:
            self.h2.local_settings = h2.settings.Settings(
                client=False, initial_values=self.settings
            )
        self.h2.initiate_connection()
        self.started()
        transport.write(self.h2.data_to_send())

    def started(self) -> None:
        pass


class _OneCallPerConnection(_H2Server):
    """An h2 server allowing one stream at a time that answers one call (echoing its
    message back) and then says GOAWAY, naming that call as its last: the other calls
    must go to new connections."""

    connections = 0
    settings: ClassVar[dict[int, int]] = {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1}

    def started(self) -> None:
        type(self).connections += 1
        self.message = b""

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.message += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                sid = event.stream_id
                self.h2.send_headers(
                    sid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                )
                self.h2.send_data(sid, self.message)
                self.h2.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                self.h2.close_connection(last_stream_id=sid)
        self.transport.write(self.h2.data_to_send())


def test_calls_waiting_for_a_stream_move_to_a_new_connection_after_goaway() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_OneCallPerConnection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        channel = _channel(port)
        try:
            answers = await asyncio.gather(
                *(channel.unary(INFER, [b"%d" % i], timeout=30) for i in range(5))
            )
        finally:
            channel.close()
            server.close()
        assert answers == [b"%d" % i for i in range(5)]
        assert _OneCallPerConnection.connections == 5

    asyncio.run(main())


class _AnswersEarly(_H2Server):
    """An h2 server that answers each call as soon as its HEADERS arrive, reading none of
    its DATA (the client is left blocked on the 64 KiB window), then resets the stream
    (NO_ERROR), as a server refusing a request early does."""

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                sid = event.stream_id
                self.h2.send_headers(sid, [(b":status", b"200")])
                self.h2.send_data(sid, b"\x00\x00\x00\x00\x05early")
                self.h2.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                self.h2.reset_stream(sid, 0)
        self.transport.write(self.h2.data_to_send())


def test_an_answer_before_the_whole_request_was_sent_ends_the_call() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_AnswersEarly, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            for _ in range(2):  # and the connection goes on
                assert await channel.unary(INFER, [bytes(1 << 20)], timeout=10) == b"early"
        finally:
            channel.close()
            server.close()

    asyncio.run(main())


class _Answers(_H2Server):
    """An h2 server answering every call, once its request has ended, with the DATA in
    ``payloads`` and grpc-status 0."""

    payloads: tuple[bytes, ...] = ()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.StreamEnded):
                sid = event.stream_id
                self.h2.send_headers(sid, [(b":status", b"200")])
                for payload in self.payloads:
                    self.h2.send_data(sid, payload)
                self.h2.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        self.transport.write(self.h2.data_to_send())


@pytest.mark.parametrize(
    ("payloads", "answer"),
    [
        ((b"\x00\x00\x00", b"\x00\x03a", b"b", b"c"), b"abc"),  # the prefix across frames
        ((), None),  # no message at all
        ((b"\x00\x00\x00\x00\x00",), b""),  # an empty one
        ((b"\x00\x00\x00\x00\x03ab",), "cut short"),
        ((b"\x00\x00\x00\x00\x01ab",), "of the size it says"),
        ((b"\x00\x00\x00\x00\x01a", b"\x00\x00\x00\x00\x01b"), "of the size it says"),
        ((b"\x01\x00\x00\x00\x01a",), "uncompressed"),
    ],
)
def test_the_answers_message_is_one_uncompressed_grpc_message_whole(
    payloads: tuple[bytes, ...], answer: bytes | str | None
) -> None:
    """The message comes back read-only, however its frames cut it; anything but one
    uncompressed message of the size its prefix says is INTERNAL."""

    class Server(_Answers):
        pass

    Server.payloads = payloads

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Server, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            if isinstance(answer, str):
                with pytest.raises(GRPCError, match=answer) as caught:
                    await channel.unary(INFER, [b"x"], timeout=10)
                assert caught.value.status is Status.INTERNAL
            else:
                got = await channel.unary(INFER, [b"x"], timeout=10)
                assert got == answer
                assert got is None or got.readonly
        finally:
            channel.close()
            server.close()

    asyncio.run(main())


class _Oversized(asyncio.Protocol):
    """A server whose first bytes are SETTINGS, then a DATA frame header of 2 MiB (past
    the 1 MiB the client advertised); it records what the client writes back."""

    received = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        transport.write(b"\x20\x00\x00\x00\x00\x00\x00\x00\x01")

    def data_received(self, data: bytes) -> None:
        type(self).received += data


def test_a_server_breaking_http2_fails_the_call_after_our_goaway() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Oversized, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            with pytest.raises(WireProtocolError) as caught:
                await channel.unary(INFER, [b"x"], timeout=10)
        finally:
            channel.close()
            server.close()
        assert caught.value.error_code == FRAME_SIZE_ERROR
        goaway = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + bytes(4) + b"\x00\x00\x00\x06"
        assert goaway in _Oversized.received
        code, _ = translate(caught.value, rpc="ModelInfer", target="t")  # type: ignore[misc]
        assert code is StatusCode.UNAVAILABLE

    asyncio.run(main())


class _AlwaysGoingAway(asyncio.Protocol):
    """A server that says SETTINGS and GOAWAY (last stream 0) on every connection."""

    connections = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        type(self).connections += 1
        transport.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        transport.write(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + bytes(8))


def test_a_server_that_goes_away_before_any_call_fails_it_after_three_connections() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_AlwaysGoingAway, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            with pytest.raises(StreamTerminatedError, match="went away without answering a call"):
                await channel.unary(INFER, [b"x"], timeout=10)
        finally:
            channel.close()
            server.close()
        assert _AlwaysGoingAway.connections == 3

    asyncio.run(main())


class _Tells(_H2Server):
    """An h2 server that keeps each request's ``grpc-timeout`` (None: none) and answers
    with the ``:status`` and trailers of :attr:`answer`."""

    told: ClassVar[list[bytes | None]] = []
    answer: ClassVar[tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = (
        b"200",
        ((b"grpc-status", b"0"),),
    )

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = dict(event.headers)
                type(self).told.append(headers.get(b"grpc-timeout"))
            elif isinstance(event, h2.events.StreamEnded):
                status, trailers = self.answer
                sid = event.stream_id
                if trailers:
                    self.h2.send_headers(sid, [(b":status", status)])
                    self.h2.send_headers(sid, list(trailers), end_stream=True)
                else:
                    self.h2.send_headers(sid, [(b":status", status)], end_stream=True)
        self.transport.write(self.h2.data_to_send())


def test_the_timeout_is_told_rounded_down_in_the_finest_unit_that_fits() -> None:
    """The client tells the server its timeout as grpcwire writes it (never longer than
    the client waits itself: the server gives up first); no timeout, no header."""
    timeouts = [None, 1.0004, 29.999, 120.0, 3.3]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Tells, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            for timeout in timeouts:
                assert await channel.unary(INFER, [b"x"], timeout=timeout) is None
        finally:
            channel.close()
            server.close()

    _Tells.told.clear()
    asyncio.run(main())
    assert _Tells.told == [None, b"1000400u", b"29999000u", b"120000m", b"3300000u"]
    for timeout, told in zip(timeouts[1:], _Tells.told[1:], strict=True):
        assert told is not None
        assert told.decode() == encode_grpc_timeout(timeout)
        assert parse_grpc_timeout(told.decode()) <= timeout


@pytest.mark.parametrize(
    ("status", "trailers", "code"),
    [
        (b"503", (), StatusCode.UNAVAILABLE),  # gRPC's HTTP table (grpcwire.HTTP_TO_GRPC)
        (b"404", (), StatusCode.UNIMPLEMENTED),
        (b"418", (), StatusCode.UNKNOWN),
        (b"200", ((b"grpc-status", b"14"), (b"grpc-message", b"later")), StatusCode.UNAVAILABLE),
        (b"200", ((b"grpc-status", b"99"),), StatusCode.UNKNOWN),  # no such code
        (b"200", ((b"grpc-message", b"what?"),), StatusCode.UNKNOWN),  # no grpc-status
    ],
)
def test_an_answer_that_is_not_ok_is_read_with_the_wire_vocabulary(
    status: bytes, trailers: tuple[tuple[bytes, bytes], ...], code: StatusCode
) -> None:
    """An HTTP status other than 200 is read with gRPC's table; a grpc-status is the code
    it names, UNKNOWN if it names none; the client's translation sees that code."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Tells, "127.0.0.1", 0)
        channel = _channel(server.sockets[0].getsockname()[1])
        try:
            with pytest.raises(GRPCError) as caught:
                await channel.unary(INFER, [b"x"], timeout=10)
        finally:
            channel.close()
            server.close()
        translated = translate(caught.value, rpc="ModelInfer", target="t")
        assert translated is not None and translated[0] is code

    _Tells.answer = (status, trailers)
    try:
        asyncio.run(main())
    finally:
        _Tells.answer = (b"200", ((b"grpc-status", b"0"),))

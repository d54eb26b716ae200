"""The client's HTTP/2 connection (:mod:`reactantserver.client.channel`).

* Sans-IO: DATA frames sent as views of a message's pieces are, byte for byte, the frames
  h2's own client connection sends for the joined message, with the same windows and
  stream states; received bytes, however split into reads, are cut into h2's own frames.
* On loopback against grpclib's own server (h2 on its side: 16 KiB frames, 4 MiB
  windows): a message larger than the windows goes out as pieces and comes back whole,
  through ``AsyncClient`` and through grpclib's own ``send_message`` on the channel.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import numpy as np
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import DataFrame, HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import message_sends

from reactantserver.client import AsyncClient
from reactantserver.client.channel import MAX_FRAME, ClientChannel, Pieces, _H2Connection
from reactantserver.client.h2frames import HyperframeReader
from reactantserver.protocol import inference as pb

_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding="ascii")
_HEADERS = [(":method", "POST"), (":path", "/x"), (":scheme", "http"), (":authority", "a")]


def _opened(conn: h2.connection.H2Connection) -> bytes:
    conn.initiate_connection()
    conn.send_headers(1, _HEADERS)
    return conn.data_to_send()


@settings(max_examples=60, deadline=None)
@given(sends=message_sends())
def test_data_frames_of_pieces_are_h2s_frames(sends: tuple[list[list[bytes]], list[int]]) -> None:
    """Invariant: sending messages given as pieces, cut into frames of any sizes, writes
    exactly the bytes h2's own client connection writes when sent each frame's bytes
    joined, and leaves the same flow-control windows and stream state; the last frame
    of the last message ends the stream on both."""
    messages, frame_sizes = sends
    ours, theirs = _H2Connection(_CONFIG), h2.connection.H2Connection(_CONFIG)
    assert _opened(ours) == _opened(theirs)
    sizes = itertools.cycle(frame_sizes)
    for m, pieces in enumerate(messages):
        message, joined = Pieces(pieces), b"".join(pieces)
        assert message.left == len(joined)
        sent = 0
        while True:
            size = min(next(sizes), message.left)
            end = m == len(messages) - 1 and size == message.left
            payload: Any = message.take(size)
            ours.send_data(1, payload, end_stream=end)
            theirs.send_data(1, joined[sent : sent + size], end_stream=end)
            sent += size
            assert b"".join(ours.pieces_to_send()) == theirs.data_to_send()
            if not message.left:
                break
    assert ours.local_flow_control_window(1) == theirs.local_flow_control_window(1)
    assert ours.outbound_flow_control_window == theirs.outbound_flow_control_window
    assert ours.streams[1].state_machine.state == theirs.streams[1].state_machine.state


def _server_bytes(payloads: list[bytes], pads: list[int]) -> bytes:
    wire = [
        SettingsFrame(0).serialize(),
        HeadersFrame(1, b"\x88", flags=["END_HEADERS"]).serialize(),
    ]
    for i, payload in enumerate(payloads):
        frame = DataFrame(1, payload)
        if pads[i]:
            frame.flags.add("PADDED")
            frame.pad_length = pads[i]
        wire.append(frame.serialize())
        wire.append(PingFrame(0, opaque_data=bytes(8)).serialize())
        wire.append(WindowUpdateFrame(1, window_increment=i + 1).serialize())
    return b"".join(wire)


def _frames(buffer: FrameBuffer, chunks: list[bytes]) -> list[tuple[str, int, bytes]]:
    out = []
    for chunk in chunks:
        buffer.add_data(chunk)
        for frame in buffer:
            base = (
                type(frame).__mro__[1] if type(frame).__name__.startswith("Quiet") else type(frame)
            )
            body = bytes(frame.data) if isinstance(frame, DataFrame | HeadersFrame) else b""
            out.append((base.__name__, frame.stream_id, body))
    return out


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=20000), min_size=1, max_size=6),
    pads=st.lists(st.integers(0, 40), min_size=6, max_size=6),
    cuts=st.lists(st.integers(0, 60000), max_size=12),
)
def test_received_bytes_are_cut_into_h2s_frames_on_the_client_side(
    payloads: list[bytes], pads: list[int], cuts: list[int]
) -> None:
    """Invariant: however a server's bytes (no preface: SETTINGS, HEADERS, padded and
    unpadded DATA, PING, WINDOW_UPDATE) are split into reads, the client's frame cutter
    yields the frames h2's own client-side buffer yields: types, streams and bodies."""
    stream = _server_bytes(payloads, pads)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    ours = HyperframeReader(1 << 16, server=False)
    theirs = FrameBuffer(server=False)
    ours.max_frame_size = theirs.max_frame_size = MAX_FRAME
    assert _frames(ours, chunks) == _frames(theirs, chunks)


# ------------------------------------------------------------------------------ loopback


class _Echo:
    """ModelInfer answering every input as an output of the same name, bytes and shape."""

    async def infer(self, stream: Stream[pb.ModelInferRequest, pb.ModelInferResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
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
            "/inference.GRPCInferenceService/ModelInfer": Handler(
                self.infer,
                Cardinality.UNARY_UNARY,
                pb.ModelInferRequest,
                pb.ModelInferResponse,
            )
        }


def _against_grpclib(call: Callable[[int], Awaitable[None]]) -> None:
    """Run ``call(port)`` on asyncio against grpclib's own server on a loopback port."""

    async def main() -> None:
        server = Server([_Echo()])
        await server.start("127.0.0.1", 0)
        try:
            assert server._server is not None
            await call(server._server.sockets[0].getsockname()[1])
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_message_larger_than_the_windows_round_trips_as_pieces() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1_500_000)).astype(np.float32)  # 18 MB, windows of 4 MiB
    small = np.arange(5, dtype=np.int64)

    async def call(port: int) -> None:
        async with AsyncClient(f"127.0.0.1:{port}", timeout=60) as client:
            out = await client.infer("echo", {"x": x, "n": small})
            assert np.array_equal(out["x"], x) and np.array_equal(out["n"], small)
            again = await client.infer("echo", {"n": small})  # same connection, small call
            assert np.array_equal(again["n"], small)
            stats = client.statistics()
        assert stats.bytes_sent > x.nbytes and stats.bytes_received > x.nbytes

    _against_grpclib(call)


def test_grpclibs_own_send_message_on_the_channel() -> None:
    payload = bytes(range(256)) * 40_000  # 10 MB in one piece
    tensor = pb.ModelInferRequestInferInputTensor(name="b", datatype="UINT8", shape=[len(payload)])
    request = pb.ModelInferRequest(model_name="m", inputs=[tensor], raw_input_contents=[payload])

    async def call(port: int) -> None:
        channel = ClientChannel("127.0.0.1", port)
        try:
            async with channel.request(
                "/inference.GRPCInferenceService/ModelInfer",
                Cardinality.UNARY_UNARY,
                pb.ModelInferRequest,
                pb.ModelInferResponse,
            ) as stream:
                await stream.send_message(request, end=True)
                reply = await stream.recv_message()
        finally:
            channel.close()
        assert reply is not None and reply.raw_output_contents == [payload]

    _against_grpclib(call)

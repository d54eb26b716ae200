"""The frame cutters and the connections built on them, driven with bytes (sans-IO).

* h2's connection with our :class:`~reactantserver.transport.h2frames.FrameCutter` (as the
  client's channel and the server's reference, ``h2_reference_connection``, use it): a DATA
  frame reaches the stream as h2's own ``DataReceived`` with its bytes and flow-controlled
  length unchanged, while its ``repr`` (built by h2 for every received frame) stays short
  and does not depend on the payload's size; every other frame type h2 formats on receipt
  is handled by h2's own handler for it, with the same short ``repr``.
* the server's connection as :func:`~reactantserver.transport.h2conn.new_h2_connection`
  builds it (:mod:`~reactantserver.transport.h2lean`, on
  :class:`~reactantserver.transport.h2parse.RawFrameCutter`): a DATA payload is a view of
  the frame's one body copy.
* both cutters cut the frames h2's own buffer does, however the bytes are split into reads.
"""

from __future__ import annotations

import itertools
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from hyperframe.frame import FRAMES, DataFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.config.schema import EndpointsConfig
from reactantserver.transport import h2parse
from reactantserver.transport.h2conn import h2_reference_connection, new_h2_connection
from reactantserver.transport.h2wire import DATA, HEADERS
from reactantserver.transport.limits import WireLimits

LIMITS = WireLimits.from_endpoints(EndpointsConfig())


def _pair(lean: bool = False) -> tuple[Any, h2.connection.H2Connection]:
    """A server connection (h2's with our cutter; ``lean``: ours) and h2's client,
    past the handshake."""
    server = new_h2_connection(LIMITS) if lean else h2_reference_connection(LIMITS)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ACK
    return server, client


def test_data_frames_arrive_unchanged_with_a_short_repr() -> None:
    server, client = _pair()
    client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])  # fmt: skip
    server.receive_data(client.data_to_send())
    payload = bytes(range(256)) * 64  # 16 KiB
    wire = DataFrame(1, payload, flags=["END_STREAM"]).serialize()
    buffer = server.incoming_buffer
    buffer.add_data(wire)
    frame = next(buffer)
    assert isinstance(frame, DataFrame) and bytes(frame.data) == payload
    assert len(repr(frame)) < 200  # hyperframe's own repr hex-encodes the whole payload
    events = server._receive_frame(frame)
    (data, ended) = events
    assert isinstance(data, h2.events.DataReceived)
    assert data.data == payload and data.flow_controlled_length == len(payload)
    assert isinstance(ended, h2.events.StreamEnded)


def test_data_through_receive_data_is_h2s_own_handling() -> None:
    """The whole path (buffer, dispatch, flow control) as grpclib drives it."""
    for lean in (False, True):
        server, client = _pair(lean)
        client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                                (":authority", "a")])  # fmt: skip
        client.send_data(1, b"x" * 1000, end_stream=True)
        events = server.receive_data(client.data_to_send())
        received = [e for e in events if isinstance(e, h2.events.DataReceived)]
        assert [e.data for e in received] == [b"x" * 1000]
        assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_the_lean_servers_data_payloads_are_views_of_one_copy() -> None:
    """Padded or not, whole in one read or split between reads: each DATA payload the
    lean server reports is a view of the body copy its frame cutter made, and its
    flow-controlled length counts the padding."""
    server, client = _pair(lean=True)
    client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])  # fmt: skip
    server.receive_data(client.data_to_send())
    payload = bytes(range(256)) * 8
    padded = DataFrame(1, payload, flags=["PADDED"])
    padded.pad_length = 7
    wire = padded.serialize() + DataFrame(1, payload, flags=["END_STREAM"]).serialize()
    events = server.receive_data(wire[:100]) + server.receive_data(wire[100:])
    received = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert [bytes(e.data) for e in received] == [payload, payload]
    assert [e.flow_controlled_length for e in received] == [len(payload) + 8, len(payload)]
    for event in received:
        assert isinstance(event.data, memoryview)
        assert isinstance(event.data.obj, bytes | bytearray)  # the frame's body, not a copy
        assert len(event.data.obj) == event.flow_controlled_length


def test_every_quiet_frame_type_is_handled_by_h2s_own_handler() -> None:
    """HEADERS, PING, WINDOW_UPDATE, SETTINGS and RST_STREAM through the quiet classes give
    the events h2 gives for its own classes."""
    server, client = _pair()
    client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])  # fmt: skip
    client.ping(b"12345678")
    client.increment_flow_control_window(1000)
    client.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 32768})
    client.reset_stream(1)
    wire = client.data_to_send()
    buffer = server.incoming_buffer
    buffer.add_data(wire)
    frames = list(buffer)
    assert [type(f).__name__ for f in frames] == [
        "QuietHeadersFrame",
        "QuietPingFrame",
        "QuietWindowUpdateFrame",
        "QuietSettingsFrame",
        "QuietRstStreamFrame",
    ]
    assert all(len(repr(f)) < 80 for f in frames)
    events = [e for f in frames for e in server._receive_frame(f)]
    kinds = [type(e) for e in events]
    assert kinds == [
        h2.events.RequestReceived,
        h2.events.PingReceived,
        h2.events.WindowUpdated,
        h2.events.RemoteSettingsChanged,
        h2.events.StreamReset,
    ]
    assert server.data_to_send()  # the PING and SETTINGS acknowledgements


def _frames_of(buffer: object, chunks: list[bytes]) -> list[tuple[str, int, bytes]]:
    """Each frame a buffer yields: its hyperframe class name, stream and payload."""
    out = []
    for chunk in chunks:
        buffer.add_data(chunk)  # type: ignore[attr-defined]
        for f in buffer:  # type: ignore[attr-defined]
            if isinstance(f, tuple):  # h2parse.RawFrameCutter's (type, flags, stream, body)
                kind, flags, sid, raw = f
                body = bytes(
                    h2parse.data(flags, raw)[0]
                    if kind == DATA
                    else h2parse.headers(flags, raw)[0]
                    if kind == HEADERS
                    else raw
                )
                out.append((FRAMES[kind].__name__, sid, body))
                continue
            base = next(c for c in type(f).__mro__ if c.__module__ == "hyperframe.frame")
            body = bytes(f.data) if hasattr(f, "data") else f.serialize_body()
            out.append((base.__name__, f.stream_id, body))
    return out


@settings(max_examples=150, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
    pads=st.lists(st.integers(0, 40), min_size=8, max_size=8),
    cuts=st.lists(st.integers(0, 30000), max_size=12),
)
def test_frames_cut_from_reads_are_h2s_frames(
    payloads: list[bytes], pads: list[int], cuts: list[int]
) -> None:
    """Invariant: however the bytes of a connection are split into reads (the preface,
    then HEADERS, padded and unpadded DATA, PING, WINDOW_UPDATE, SETTINGS), our buffers
    (FrameCutter's hyperframe frames, RawFrameCutter's raw ones) yield exactly the frames
    h2's own buffer yields: the same types, streams and payloads."""
    from h2.frame_buffer import FrameBuffer
    from hyperframe.frame import HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame

    from reactantserver.transport.h2frames import FrameCutter

    wire = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", SettingsFrame(0).serialize()]
    wire.append(HeadersFrame(1, b"\x82\x84\x86", flags=["END_HEADERS"]).serialize())
    for i, payload in enumerate(payloads):
        d = DataFrame(1, payload)
        if pads[i]:
            d.flags.add("PADDED")
            d.pad_length = pads[i]
        wire.append(d.serialize())
        wire.append(PingFrame(0, opaque_data=bytes(8)).serialize())
        wire.append(WindowUpdateFrame(1, window_increment=i + 1).serialize())
    stream = b"".join(wire)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    ours = FrameCutter(LIMITS.max_header_list_size)
    raw = h2parse.RawFrameCutter(LIMITS.max_header_list_size)
    ours.max_frame_size = raw.max_frame_size = theirs_max = LIMITS.max_frame_size
    theirs = FrameBuffer(server=True)
    theirs.max_frame_size = theirs_max
    expected = _frames_of(theirs, chunks)
    assert _frames_of(ours, chunks) == expected
    assert _frames_of(raw, chunks) == expected

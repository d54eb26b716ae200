"""The one frame reader and the connections built on it, driven with bytes (sans-IO).

The oracle is h2 through its public API: an ``H2Connection`` with its own frame buffer,
fed the same bytes with ``receive_data``.

* :class:`~reactantserver.h2.parse.FrameReader`, however the bytes of a
  connection are split into reads, gives the frames h2 reads from them: the events of our
  server connection (:mod:`~reactantserver.h2.server`) and of h2's connection given
  our reader (:class:`h2frames.HyperframeReader`, as the
  client's channel and the server's reference use it) are h2's own.
* h2's connection given our reader: each frame it is handed has a ``repr`` that stays
  short whatever the payload's size, and every frame type is handled by h2's own handler.
* a DATA payload is copied at most once: not at all out of a read that held its frame
  whole and is mostly that frame, once if it is a small part of its read (so that it does
  not keep the read alive) or if its frame was split between reads.
* in the client role (no preface) the reader is the same: frame size judged from the
  header, the first frame must be the peer's SETTINGS.
"""

from __future__ import annotations

import itertools
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from h2_client import frame as raw_frame
from h2_reference import h2_reference_connection
from h2frames import HyperframeReader
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.config.schema import EndpointsConfig
from reactantserver.h2 import events as h2events
from reactantserver.h2 import parse as h2parse
from reactantserver.h2.server import ServerConnection
from reactantserver.h2.wire import DATA, HEADERS, PREFACE, SETTINGS
from reactantserver.transport.core.limits import WireLimits

LIMITS = WireLimits.from_endpoints(EndpointsConfig())
REQUEST = [(":method", "POST"), (":path", "/x"), (":scheme", "http"), (":authority", "a")]


def _h2_oracle() -> h2.connection.H2Connection:
    """h2's own server connection, its own frame buffer, our frame size: the oracle."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=False, header_encoding="ascii", validate_inbound_headers=False
        )
    )
    conn.max_inbound_frame_size = LIMITS.max_frame_size
    conn.initiate_connection()
    conn.data_to_send()
    return conn


def _summary(event: Any) -> tuple[Any, ...]:
    """An event's class name and the fields the callers read."""
    kind = type(event).__name__
    if kind in ("RequestReceived", "TrailersReceived"):
        return (kind, event.stream_id, tuple(tuple(h) for h in event.headers))
    if kind == "DataReceived":
        return (kind, event.stream_id, bytes(event.data), event.flow_controlled_length)
    if kind == "WindowUpdated":
        return (kind, event.stream_id, event.delta)
    if kind in ("PingReceived", "PingAckReceived"):
        return (kind, bytes(event.ping_data))
    if kind == "StreamReset":
        return (kind, event.stream_id, int(event.error_code))
    return (kind, getattr(event, "stream_id", None))


def _events(conn: Any, chunks: list[bytes]) -> list[tuple[Any, ...]]:
    return [_summary(e) for chunk in chunks for e in conn.receive_data(chunk)]


def _pair(lean: bool = False) -> tuple[Any, h2.connection.H2Connection]:
    """A server connection (h2's given our reader; ``lean``: ours) and h2's client,
    past the handshake."""
    server = ServerConnection(LIMITS) if lean else h2_reference_connection(LIMITS)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ACK
    return server, client


@settings(max_examples=150, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
    pads=st.lists(st.integers(0, 40), min_size=8, max_size=8),
    continuations=st.integers(0, 3),
    cuts=st.lists(st.integers(0, 30000), max_size=12),
)
def test_frames_cut_from_reads_give_h2s_events(
    payloads: list[bytes], pads: list[int], continuations: int, cuts: list[int]
) -> None:
    """Invariant: however the bytes of a connection are split into reads (the preface,
    SETTINGS, HEADERS with CONTINUATIONs, padded and unpadded DATA, PING, WINDOW_UPDATE),
    our server connection and h2's connection given our reader report exactly the events
    h2 reports with its own buffer: the same types, streams, headers and payloads."""
    import hpack

    block = hpack.Encoder().encode(REQUEST)
    step = max(1, len(block) // (continuations + 1))  # the block cut into CONTINUATIONs
    pieces = [block[i : i + step] for i in range(0, len(block), step)]
    wire = [PREFACE, SettingsFrame(0).serialize()]
    wire.append(HeadersFrame(1, pieces[0], flags=[] if pieces[1:] else ["END_HEADERS"]).serialize())
    for i, piece in enumerate(pieces[1:], start=2):
        flags = ["END_HEADERS"] if i == len(pieces) else []
        wire.append(ContinuationFrame(1, piece, flags=flags).serialize())
    for i, payload in enumerate(payloads):
        d = DataFrame(1, payload)
        if pads[i]:
            d.flags.add("PADDED")
            d.pad_length = pads[i]
        wire.append(d.serialize())
        wire.append(PingFrame(0, opaque_data=bytes([i]) * 8).serialize())
        wire.append(WindowUpdateFrame(1, window_increment=i + 1).serialize())
    stream = b"".join(wire)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    expected = _events(_h2_oracle(), chunks)
    assert expected[1][0] == "RequestReceived"  # the oracle read the block
    for ours in (ServerConnection(LIMITS), h2_reference_connection(LIMITS)):
        ours.initiate_connection()
        assert _events(ours, chunks) == expected


def test_h2s_connection_given_our_reader_sees_short_reprs_and_h2s_events() -> None:
    """Every frame type our reader hands h2 (HEADERS, DATA, PING, WINDOW_UPDATE, SETTINGS,
    RST_STREAM) has a ``repr`` that does not grow with its payload, and h2's own handler
    gives, through ``receive_data``, the events h2 gives with its own buffer."""
    server, client = _pair()
    oracle = _h2_oracle()
    oracle.receive_data(PREFACE + SettingsFrame(0).serialize())
    client.send_headers(1, REQUEST)
    client.send_data(1, bytes(range(256)) * 64)  # 16 KiB
    client.ping(b"12345678")
    client.increment_flow_control_window(1000)
    client.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 32768})
    client.reset_stream(1)
    wire = client.data_to_send()
    reader = HyperframeReader(LIMITS.max_header_list_size, server=False)
    reader.max_frame_size = LIMITS.max_frame_size
    reader.add_data(SettingsFrame(0).serialize() + wire)
    frames = list(reader)[1:]
    assert [type(f).__name__ for f in frames] == [
        "QuietHeadersFrame",
        "QuietDataFrame",
        "QuietPingFrame",
        "QuietWindowUpdateFrame",
        "QuietSettingsFrame",
        "QuietRstStreamFrame",
    ]
    assert all(len(repr(f)) < 80 for f in frames)  # hyperframe's hex-encodes the payload
    assert isinstance(frames[1].data, memoryview)  # a view of the read, not a copy
    ours = _events(server, [wire])
    assert ours == _events(oracle, [wire])
    assert [e[0] for e in ours] == [
        "RequestReceived",
        "DataReceived",
        "PingReceived",
        "WindowUpdated",
        "RemoteSettingsChanged",
        "StreamReset",
    ]
    assert server.data_to_send()  # the PING and SETTINGS acknowledgements


def test_the_lean_servers_data_payloads_are_views_never_copies_of_a_whole_frame() -> None:
    """Padded or not: a DATA frame whole in one read is reported as a view of that read;
    one split between reads as a view of the one copy its body was gathered in. The
    flow-controlled length counts the padding."""
    server, client = _pair(lean=True)
    client.send_headers(1, REQUEST)
    server.receive_data(client.data_to_send())
    payload = bytes(range(256)) * 8
    padded = DataFrame(1, payload, flags=["PADDED"])
    padded.pad_length = 7
    wire = padded.serialize() + DataFrame(1, payload, flags=["END_STREAM"]).serialize()
    first, second = wire[:100], wire[100:]
    events = server.receive_data(first) + server.receive_data(second)
    received = [e for e in events if isinstance(e, h2events.DataReceived)]
    assert [bytes(e.data) for e in received] == [payload, payload]
    assert [e.flow_controlled_length for e in received] == [len(payload) + 8, len(payload)]
    split, whole = (e.data for e in received)
    assert isinstance(split, memoryview) and isinstance(whole, memoryview)
    assert isinstance(split.obj, bytearray) and len(split.obj) == len(payload) + 8
    assert whole.obj is second  # the read itself


def test_a_small_body_does_not_keep_its_read_alive() -> None:
    """A DATA frame that is a small part of the read it came in (here with a large frame
    of an unknown type, which nothing keeps) is copied, so keeping its payload keeps only
    its own bytes; a frame that is most of its read stays a view of it."""
    server, client = _pair(lean=True)
    client.send_headers(1, REQUEST)
    server.receive_data(client.data_to_send())
    small = DataFrame(1, b"tiny").serialize()
    read = small + raw_frame(0xFA, 0, 0, bytes(60_000))
    (event, _) = server.receive_data(read)
    assert isinstance(event, h2events.DataReceived) and bytes(event.data) == b"tiny"
    assert event.data.obj is not read and len(event.data.obj) == 4
    big = DataFrame(1, bytes(50_000)).serialize()
    (event,) = server.receive_data(big)
    assert event.data.obj is big


def test_the_client_role_reads_the_same_frames_without_a_preface() -> None:
    """A client's reader expects no preface; the server's first frame must be its
    SETTINGS (RFC 9113 3.4); a frame longer than advertised is refused from its header
    alone, before its body is waited for; header blocks are joined."""
    reader = h2parse.FrameReader(server=False, max_frame_size=16384, max_header_block=4096)
    reader.feed(
        raw_frame(SETTINGS, 0, 0)
        + raw_frame(HEADERS, 0, 3, b"ab")
        + raw_frame(0x9, 0x4, 3, b"cd")
        + raw_frame(DATA, 0x1, 3, b"xyz")
    )
    frames = [(k, f, s, bytes(b)) for k, f, s, b in iter(reader.next_frame, None)]
    assert frames == [(SETTINGS, 0, 0, b""), (HEADERS, 0x4, 3, b"abcd"), (DATA, 0x1, 3, b"xyz")]
    big = h2parse.FrameReader(server=False, max_frame_size=16384, max_header_block=4096)
    big.feed(
        raw_frame(SETTINGS, 0, 0) + (16385).to_bytes(3, "big") + bytes([DATA, 0]) + b"\0\0\0\1"
    )
    with pytest.raises(h2events.FrameTooLargeError):
        list(iter(big.next_frame, None))
    first = h2parse.FrameReader(server=False, max_frame_size=16384, max_header_block=4096)
    first.feed(raw_frame(0x6, 0, 0, bytes(8)))
    with pytest.raises(h2events.ProtocolError, match="SETTINGS"):
        list(iter(first.next_frame, None))


def test_a_header_block_is_bounded_by_its_bytes_before_they_arrive() -> None:
    """A HEADERS frame then CONTINUATIONs: refused (ENHANCE_YOUR_CALM) as soon as a frame's
    header announces more than the bound, in either role."""
    for server in (True, False):
        reader = h2parse.FrameReader(server=server, max_frame_size=16384, max_header_block=100)
        reader.feed((PREFACE if server else b"") + raw_frame(SETTINGS, 0, 0))
        reader.feed(raw_frame(HEADERS, 0, 1, bytes(60)))
        assert [k for k, *_ in iter(reader.next_frame, None)] == [SETTINGS]
        reader.feed((60).to_bytes(3, "big") + bytes([0x9, 0]) + (1).to_bytes(4, "big"))
        with pytest.raises(h2events.DenialOfServiceError) as caught:
            list(iter(reader.next_frame, None))
        assert caught.value.error_code == h2events.ErrorCodes.ENHANCE_YOUR_CALM


def test_a_bad_preface_is_h2s_error() -> None:
    reader = h2parse.FrameReader(server=True, max_frame_size=16384, max_header_block=100)
    reader.feed(PREFACE[:5])
    with pytest.raises(h2events.ProtocolError, match="preamble"):
        reader.feed(b"XXXX")
    oracle = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    oracle.receive_data(PREFACE[:5])
    with pytest.raises(h2.exceptions.ProtocolError, match="preamble"):
        oracle.receive_data(b"XXXX")

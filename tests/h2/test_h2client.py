"""The client role of our HTTP/2 connection (``h2.client`` over ``h2.core``:
the gateway's to its workers and the Python client's), with h2's server side as the oracle.

Every test wires a :class:`ClientConnection` to an h2 ``H2Connection(client_side=False)`` in
memory: our bytes go into h2 and h2's into ours. h2 is strict about everything a client may
do wrong (flow-control overruns, oversized frames, malformed header blocks, stream states),
so "h2 accepted it" is the check that our output is valid HTTP/2, and h2's events say what
it understood. Both send paths are tried (one buffer, ``send_data``;
a queue of views, ``send_pieces``, as both clients send), and both ways of receiving
a DATA frame split across reads (gathered; ``pieces``, passed on a piece per read).
"""

from __future__ import annotations

import collections

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import hypothesis
import pytest
from h2_client import frame as _frame  # a raw frame; `frame` names a parameter here
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import message_sends

from reactantserver.h2 import events as h2events
from reactantserver.h2.abuse import FLOOD_BURST, FLOOD_RATE, RESET_MIN_STREAMS
from reactantserver.h2.client import ClientConnection, encode_request, request_prefix
from reactantserver.h2.events import ErrorCodes, ProtocolError
from reactantserver.h2.hpack import hpack_int, literal
from reactantserver.transport.core.limits import WireLimits

CANCEL, REFUSED_STREAM = ErrorCodes.CANCEL, ErrorCodes.REFUSED_STREAM

PATH = b"/inference.GRPCInferenceService/ModelInfer"
#: The time every read is given (the abuse budget's clock; the tests of it give others).
NOW = 0.0

#: What a test reads of an event: (kind, stream id, value, end or message).
Event = tuple[str, int, object, object]


def _events(client: ClientConnection, data: bytes, now: float) -> list[Event]:
    """``client.receive_data``'s events as tuples a test compares: the answer's parts
    (``headers``, ``data``, with whether they ended the stream), ``reset`` by the peer,
    ``error`` (a stream error: we reset it), ``goaway`` and ``window`` (blocked data may
    go); the rest (StreamEnded, which the parts carry, PING, PRIORITY...) left out."""
    out: list[Event] = []
    for e in client.receive_data(data, now):
        if isinstance(e, h2events.DataReceived):
            out.append(("data", e.stream_id, e.data, e.stream_ended is not None))
        elif isinstance(e, (h2events.ResponseReceived, h2events.TrailersReceived)):
            out.append(("headers", e.stream_id, e.headers, e.stream_ended is not None))
        elif isinstance(e, h2events.StreamReset):
            kind = "reset" if e.remote_reset else "error"
            out.append((kind, e.stream_id, e.error_code, None))
        elif isinstance(e, h2events.ConnectionTerminated):
            out.append(("goaway", e.last_stream_id, e.error_code, None))
        elif isinstance(e, (h2events.WindowUpdated, h2events.RemoteSettingsChanged)):
            out.append(("window", 0, None, None))
    return out


def _server(**settings_: int) -> h2.connection.H2Connection:
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.initiate_connection()
    if settings_:
        server.update_settings({h2.settings.SettingCodes[k]: v for k, v in settings_.items()})
    return server


def connect(
    client: ClientConnection | None = None, **server_settings: int
) -> tuple[ClientConnection, h2.connection.H2Connection]:
    """A client and an h2 server that have exchanged prefaces and SETTINGS."""
    client = client if client is not None else ClientConnection()
    client.initiate_connection()
    server = _server(**{k.upper(): v for k, v in server_settings.items()})
    pump(client, server)
    return client, server


def pump(
    client: ClientConnection, server: h2.connection.H2Connection
) -> tuple[list[Event], list[h2.events.Event]]:
    """Exchange bytes until both sides are quiet; the events each side saw."""
    ours: list[Event] = []
    theirs: list[h2.events.Event] = []
    for _ in range(10_000):
        out, back = client.data_to_send(), server.data_to_send()
        if not out and not back:
            return ours, theirs
        if out:
            theirs += server.receive_data(out)
        if back:
            ours += _events(client, back, NOW)
    raise AssertionError("the connection never went quiet")


def request(client: ClientConnection, timeout: str | None = "50m") -> int:
    return client.open_stream(encode_request(request_prefix(PATH, b"worker:8080"), timeout))


def requested(client: ClientConnection, server: h2.connection.H2Connection, n: int) -> list[int]:
    """``n`` requests with empty messages, sent and read by the server: their stream ids."""
    ids = [request(client) for _ in range(n)]
    for stream_id in ids:
        client.send_data(stream_id, b"", end_stream=True)
    pump(client, server)
    return ids


def send_all(
    client: ClientConnection, server: h2.connection.H2Connection, stream_id: int, data: bytes
) -> list[h2.events.Event]:
    """Send ``data`` as windows allow, the server consuming as it arrives."""
    theirs: list[h2.events.Event] = []
    sent = 0
    done = False
    while not done:
        room = client.local_flow_control_window(stream_id)
        assert room > 0 or not data, "stalled: no window and nothing in flight"
        chunk = data[sent : sent + room]
        sent += len(chunk)
        done = sent == len(data)
        client.send_data(stream_id, chunk, end_stream=done)
        out = client.data_to_send()
        events = server.receive_data(out)
        theirs += events
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        _events(client, server.data_to_send(), NOW)
    return theirs


def send(client: ClientConnection, stream_id: int, *pieces: bytes, end: bool = True) -> None:
    """``pieces`` as one message's DATA, from a queue of views (all of it: the windows
    are large enough)."""
    pending = collections.deque(memoryview(p) for p in pieces if p)
    client.send_pieces(stream_id, pending, end_stream=end)
    assert not pending


def send_pieces_all(
    client: ClientConnection,
    server: h2.connection.H2Connection,
    stream_id: int,
    pieces: list[bytes],
) -> list[h2.events.Event]:
    """Send the pieces as the windows allow, the server consuming as it arrives."""
    theirs: list[h2.events.Event] = []
    pending = collections.deque(memoryview(p) for p in pieces if p)
    while True:
        sent = client.send_pieces(stream_id, pending, end_stream=True)
        assert sent or not pending, "stalled: no window and nothing in flight"
        out = client.data_to_send()
        while out:
            events = server.receive_data(out)
            for event in events:
                if isinstance(event, h2.events.DataReceived):
                    server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            theirs += events
            _events(client, server.data_to_send(), NOW)
            out = client.data_to_send()
        if not pending:
            return theirs


def test_settings_are_exchanged_and_acknowledged() -> None:
    client, server = connect(max_concurrent_streams=7, max_frame_size=32768)
    assert server.remote_settings.initial_window_size == 16 * 1024 * 1024
    assert server.remote_settings.max_frame_size == 1024 * 1024
    assert server.remote_settings.enable_push == 0
    assert server.outbound_flow_control_window == 64 * 1024 * 1024
    assert client.peer_max_streams == 7
    assert client.max_outbound_frame_size == 32768


def test_a_unary_call_round_trip() -> None:
    client, server = connect()
    sid = request(client)
    client.send_data(sid, b"\x00\x00\x00\x00\x03abc", end_stream=True)
    _, events = pump(client, server)
    received = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    assert received.headers == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", PATH),
        (b":authority", b"worker:8080"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"grpc-timeout", b"50m"),
    ]
    data = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert data == b"\x00\x00\x00\x00\x03abc"
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)

    server.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    server.send_data(sid, b"\x00\x00\x00\x00\x02ok")
    server.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    ours, _ = pump(client, server)
    assert [(e[0], e[1]) for e in ours] == [("headers", sid), ("data", sid), ("headers", sid)]
    assert ours[0][2] == ((b":status", b"200"), (b"content-type", b"application/grpc"))
    assert bytes(ours[1][2]) == b"\x00\x00\x00\x00\x02ok"  # type: ignore[arg-type]
    assert ours[2][2:] == (((b"grpc-status", b"0"),), True)
    assert len(client.streams) == 0


def test_a_message_given_as_pieces_goes_as_one_frame() -> None:
    client, server = connect()
    sid = request(client)
    send(client, sid, b"\x00\x00\x00\x00\x03", b"a", b"", b"bc")
    _, events = pump(client, server)
    frames = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    assert frames == [b"\x00\x00\x00\x00\x03abc"]  # the pieces are one frame, not four
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_an_empty_message_from_pieces_still_ends_the_stream() -> None:
    client, server = connect()
    sid = request(client, timeout=None)
    send(client, sid)
    _, events = pump(client, server)
    assert [e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)] == [sid]


def test_requests_without_a_timeout_send_none() -> None:
    client, server = connect()
    request(client, timeout=None)
    client.send_data(1, b"", end_stream=True)
    _, events = pump(client, server)
    (received,) = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert b"grpc-timeout" not in dict(received.headers)


@pytest.mark.parametrize("value", ["0n", "29999876u", "99999999H", "x" * 126, "y" * 127])
def test_the_forwarded_timeout_decodes_as_sent(value: str) -> None:
    """The request block (the prefix, then ``grpc-timeout`` appended by hand) is what the
    generic encoder gives, and a plain HPACK decoder reads the value back."""
    prefix = request_prefix(PATH, b"w:1")
    block = encode_request(prefix, value)
    assert block == prefix + literal(b"grpc-timeout", value.encode())
    assert hpack.Decoder().decode(block)[-1] == ("grpc-timeout", value)


@pytest.mark.parametrize("pieces", [False, True])
@settings(deadline=None, max_examples=40)
@given(
    st.integers(0, 300_000),
    st.lists(st.integers(1, 5000), min_size=1, max_size=30),
)
@example(300_000, [1, 8, 1, 9, 16384, 3])  # a frame header cut at every byte
@example(70_000, [65_544])
def test_any_answer_split_anywhere_decodes_the_same(
    pieces: bool, size: int, splits: list[int]
) -> None:
    """However h2's bytes are cut into reads, the client sees the same headers, the same
    data (byte for byte, padding stripped) and the same end of stream, DATA frames split
    across reads gathered or passed on in pieces."""
    client, server = connect(ClientConnection(pieces=pieces))
    (sid,) = requested(client, server, 1)
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    server.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    sent = 0
    while sent < size:  # the server obeys our (large) windows
        n = min(server.local_flow_control_window(sid), server.max_outbound_frame_size, size - sent)
        server.send_data(sid, payload[sent : sent + n], pad_length=sent % 7 or None)
        sent += n
    server.send_headers(sid, [(b"grpc-status", b"0"), (b"grpc-message", b"")], end_stream=True)
    wire = server.data_to_send()
    events: list[Event] = []
    at = 0
    for cut in splits:
        events += _events(client, wire[at : at + cut], NOW)
        at += cut
    events += _events(client, wire[at:], NOW)
    data = b"".join(bytes(e[2]) for e in events if e[0] == "data")  # type: ignore[arg-type]
    heads = [e for e in events if e[0] == "headers"]
    assert data == payload
    assert heads[0][2] == ((b":status", b"200"), (b"content-type", b"application/grpc"))
    assert heads[-1][2:] == (((b"grpc-status", b"0"), (b"grpc-message", b"")), True)


@settings(deadline=None, max_examples=25)
@given(st.integers(0, 600_000), st.sampled_from([16384, 65535, 1 << 20]))
@example(600_000, 16384)
@example(200_000, 1 << 20)
def test_large_requests_never_overrun_the_peers_windows_or_frame_size(
    size: int, frame: int
) -> None:
    """A request of any size reaches h2 intact, framed by h2's SETTINGS_MAX_FRAME_SIZE and
    within its flow-control windows (h2 raises on any overrun)."""
    client, server = connect(max_frame_size=frame)
    sid = request(client)
    payload = bytes(i % 251 for i in range(size))
    events = send_all(client, server, sid, payload)
    frames = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert b"".join(e.data for e in frames) == payload
    assert all(len(e.data) <= frame for e in frames)
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


@settings(deadline=None, max_examples=60)
@given(sends=message_sends(), frame=st.sampled_from([16384, 20000, 1 << 20]),
       window=st.sampled_from([1, 700, 65535]))  # fmt: skip
@example(sends=([[b"x" * 3000] * 5] * 4, [1]), frame=16384, window=1)
def test_a_message_of_any_pieces_reaches_h2_whole_within_its_windows_and_frame_size(
    sends: tuple[list[list[bytes]], list[int]], frame: int, window: int
) -> None:
    """Invariant: a message given as any pieces (some empty) reaches h2 as their
    concatenation, in DATA frames no larger than h2's SETTINGS_MAX_FRAME_SIZE and within
    its windows however small (h2 raises on any overrun), the last one ending the
    stream; several calls on one connection each get their own."""
    messages, _ = sends
    client, server = connect(max_frame_size=frame, initial_window_size=window)
    for pieces in messages:
        sid = request(client)
        events = send_pieces_all(client, server, sid, pieces)
        frames = [e for e in events if isinstance(e, h2.events.DataReceived)]
        assert b"".join(e.data for e in frames) == b"".join(pieces)
        assert all(len(e.data) <= frame for e in frames)
        assert [e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)] == [sid]


def test_views_handed_out_survive_later_reads() -> None:
    """A DATA payload is a view of the bytes read, or of the buffer a split frame was
    gathered in; later reads never overwrite it."""
    for pieces in (False, True):
        client, server = connect(ClientConnection(pieces=pieces))
        sid = request(client)
        send(client, sid)
        pump(client, server)
        server.send_headers(sid, [(b":status", b"200")])
        wire = server.data_to_send()
        for i in range(4):
            server.send_data(sid, bytes([i]) * 10_000)
        wire += server.data_to_send()
        views = []
        for at in range(0, len(wire), 777):
            views += [e[2] for e in _events(client, wire[at : at + 777], NOW) if e[0] == "data"]
        assert b"".join(views) == b"".join(bytes([i]) * 10_000 for i in range(4))  # type: ignore[arg-type]


def test_a_data_frame_cut_anywhere_is_passed_on_in_pieces_ending_with_its_flag() -> None:
    """With ``pieces``, a DATA frame split across reads comes out as views of each read,
    in order, the last one alone carrying END_STREAM; one for a stream we reset comes
    out not at all, and the windows are counted the same (the next frames are judged as
    usual)."""
    client, server = connect()
    a, b = request(client), request(client)
    send(client, a)
    send(client, b)
    pump(client, server)
    client.reset(b)
    server.send_headers(a, [(b":status", b"200")])
    server.send_data(b, b"B" * 5000)
    server.send_data(a, bytes(range(256)) * 20, end_stream=True)
    wire = server.data_to_send()
    for cut in range(0, len(wire), 97):
        for second in (cut + 1, cut + 5000):
            fresh, _ = connect(ClientConnection(pieces=True))
            x, y = request(fresh), request(fresh)
            send(fresh, x)
            send(fresh, y)
            fresh.reset(y)
            fresh.data_to_send()
            events = []
            for piece in (wire[:cut], wire[cut:second], wire[second:]):
                events += _events(fresh, piece, NOW)
            data = [e for e in events if e[0] == "data"]
            assert {e[1] for e in data} == {x}
            assert b"".join(bytes(e[2]) for e in data) == bytes(range(256)) * 20  # type: ignore[arg-type]
            assert [e[3] for e in data] == [False] * (len(data) - 1) + [True]
            assert x not in fresh.streams


def _state(client: ClientConnection) -> tuple[object, ...]:
    return (
        client.outbound_flow_control_window,
        client.next_stream_id,
        {sid: (s.send_window, s.state, s.processed) for sid, s in client.streams.items()},
    )


@settings(deadline=None, max_examples=60)
@given(
    size=st.integers(0, 70_000),
    max_frame=st.sampled_from([16384, 65535]),
    window=st.sampled_from([0, 5, 1000, 65535]),
    open_streams=st.integers(0, 3),
    max_streams=st.integers(1, 4),
)
def test_a_request_in_one_step_is_the_two_calls_or_nothing(
    size: int, max_frame: int, window: int, open_streams: int, max_streams: int
) -> None:
    """``send_request`` queues exactly the bytes, and leaves exactly the state, of
    ``open_stream`` then ``send_data`` of the prefixed message -- or returns None and
    queues nothing, when the request would not go out whole that way (a window or the
    frame size too small, no stream left under the peer's limit)."""
    block = encode_request(request_prefix(PATH, b"worker:8080"), None)
    message = bytes(range(256)) * (size // 256) + bytes(size % 256)
    pair = []
    for _ in range(2):
        client, _ = connect(
            max_frame_size=max_frame, initial_window_size=window, max_concurrent_streams=max_streams
        )
        for _ in range(open_streams):
            if client.can_open:
                client.open_stream(block)
        client.data_to_send()
        pair.append(client)
    one, two = pair
    stream_id = one.send_request(block, message)
    framed = b"\x00" + size.to_bytes(4, "big") + message
    if stream_id is None:
        assert one.data_to_send() == b""
        assert not (
            two.can_open
            and len(framed) <= min(max_frame, window, two.outbound_flow_control_window)
            and len(block) <= max_frame
        )
        return
    assert two.open_stream(block) == stream_id
    assert two.local_flow_control_window(stream_id) >= len(framed)
    two.send_data(stream_id, framed, end_stream=True)
    assert one.data_to_send() == two.data_to_send()
    assert _state(one) == _state(two)


def test_a_response_larger_than_our_stream_window_is_let_through() -> None:
    """Our WINDOW_UPDATEs reopen the windows as data arrives (20 MiB > the 16 MiB stream
    window), so a large answer never stalls."""
    client, server = connect()
    (sid,) = requested(client, server, 1)
    server.send_headers(sid, [(b":status", b"200")])
    total = 20 * 1024 * 1024
    sent = received = 0
    while received < total:
        room = min(server.local_flow_control_window(sid), total - sent)
        while room > 0:
            n = min(room, server.max_outbound_frame_size)
            server.send_data(sid, b"\x01" * n)
            sent += n
            room -= n
        events = _events(client, server.data_to_send(), NOW)
        received += sum(len(e[2]) for e in events if e[0] == "data")  # type: ignore[arg-type]
        server.receive_data(client.data_to_send())
        assert events, "the server stalled"
    assert received == total


def test_header_blocks_larger_than_a_frame_use_continuation_both_ways() -> None:
    client, server = connect(client=ClientConnection(WireLimits(max_frame_size=16384)))
    long_path = b"/" + b"p" * 40_000
    sid = client.open_stream(encode_request(request_prefix(long_path, b"w:1"), None))
    client.send_data(sid, b"", end_stream=True)
    _, events = pump(client, server)
    (received,) = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert dict(received.headers)[b":path"] == long_path
    big = b"m" * 30_000
    server.send_headers(sid, [(b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", big)],
                        end_stream=True)  # fmt: skip
    ours, _ = pump(client, server)
    assert ours == [
        ("headers", sid, ((b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", big)), True)
    ]  # fmt: skip


def test_padding_is_stripped() -> None:
    client, server = connect()
    (sid,) = requested(client, server, 1)
    server.send_headers(sid, [(b":status", b"200")])
    server.send_data(sid, b"payload", pad_length=40, end_stream=True)
    ours, _ = pump(client, server)
    assert [bytes(e[2]) for e in ours if e[0] == "data"] == [b"payload"]  # type: ignore[arg-type]


def test_resets_both_ways_and_late_frames_are_ignored() -> None:
    client, server = connect()
    a, b = requested(client, server, 2)
    server.reset_stream(a, REFUSED_STREAM)
    ours, _ = pump(client, server)
    assert ours == [("reset", a, REFUSED_STREAM, None)]
    # We reset b; the server's answer crosses it on the wire and must change nothing --
    # except that its header block is still decoded (the HPACK table stays in step).
    server.send_headers(b, [(b":status", b"200"), (b"x-indexed", b"v" * 10)])
    client.reset(b, CANCEL)
    ours, theirs = pump(client, server)
    assert ours == []
    assert any(isinstance(e, h2.events.StreamReset) and e.error_code == CANCEL for e in theirs)
    c = request(client)
    client.send_data(c, b"", end_stream=True)
    pump(client, server)
    server.send_headers(c, [(b":status", b"200"), (b"x-indexed", b"v" * 10)], end_stream=True)
    ours, _ = pump(client, server)
    assert ours == [("headers", c, ((b":status", b"200"), (b"x-indexed", b"v" * 10)), True)]


def test_goaway_names_the_last_stream_and_stops_new_ones() -> None:
    client, server = connect()
    a, _ = requested(client, server, 2)
    server.close_connection(last_stream_id=a)
    ours, _ = pump(client, server)
    assert ours == [("goaway", a, 0, None)]
    assert client.goaway_received and not client.can_open
    with pytest.raises(ProtocolError):
        request(client)


def test_ping_is_answered_and_priority_and_unknown_frames_are_ignored() -> None:
    client, server = connect()
    server.ping(b"12345678")
    priority = b"\x00\x00\x05\x02\x00\x00\x00\x00\x03" + b"\x00\x00\x00\x00\x10"
    unknown = b"\x00\x00\x03\xfa\x00\x00\x00\x00\x00abc"
    ours = _events(client, server.data_to_send() + priority + unknown, NOW)
    assert ours == []
    theirs = server.receive_data(client.data_to_send())
    assert any(isinstance(e, h2.events.PingAckReceived) for e in theirs)


def test_stream_limit_and_window_changes_from_settings() -> None:
    client, server = connect(max_concurrent_streams=2)
    a = request(client)
    request(client)
    assert not client.can_open
    server.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    pump(client, server)
    assert client.local_flow_control_window(a) == 100
    with pytest.raises(ProtocolError, match="window"):
        client.send_data(a, b"x" * 101, end_stream=True)
    pending = collections.deque([memoryview(b"x" * 101)])
    assert client.send_pieces(a, pending, end_stream=True) == 100
    assert bytes(pending[0]) == b"x" and client.local_flow_control_window(a) == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x00\x04\x05\x04\x00\x00\x00\x01" + b"\x00\x00\x00\x02",  # PUSH_PROMISE
        b"\x00\x00\x03\x03\x00\x00\x00\x00\x01abc",  # RST_STREAM of 3 bytes
        b"\x00\x00\x05\x04\x00\x00\x00\x00\x00abcde",  # SETTINGS of 5 bytes
        b"\x00\x00\x01\x01\x04\x00\x00\x00\x01\xbf",  # an undecodable header block
        b"\x00\x00\x01\x00\x00\x00\x00\x00\x09x",  # DATA on a stream never opened
        # Refused by the frame reader shared with the server side (h2/parse.py):
        b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x",  # DATA on stream 0
        b"\x00\x00\x00\x06\x00\x00\x00\x00\x01",  # PING on a stream
        b"\x00\x00\x07\x06\x00\x00\x00\x00\x00abcdefg",  # PING of 7 bytes
        b"\x00\x00\x06\x04\x01\x00\x00\x00\x00abcdef",  # SETTINGS ACK with a payload
        b"\x00\x00\x01\x09\x04\x00\x00\x00\x01\x88",  # CONTINUATION without HEADERS
    ],
)
def test_protocol_errors_raise(frame: bytes) -> None:
    client, _ = connect()
    request(client)
    with pytest.raises(ProtocolError):
        _events(client, frame, NOW)


# --------------------------------------------------------------------------- bounds
# What a broken or hostile worker can no longer make the gateway buffer or believe: the
# rules the worker's server side holds its own clients to (the one connection,
# h2/core.py, and its frame reader), with the same limits (WireLimits). Frames are written by hand: h2 will not break them.

FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x6, 0xB
PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x1, 0x3


def _answer_head(sid: int) -> bytes:
    return _frame(0x1, 0x4, sid, hpack.Encoder().encode([(b":status", b"200")]))


def _refused(client: ClientConnection, data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        _events(client, data, NOW)
    return caught.value


def test_a_frame_past_our_advertised_frame_size_is_refused_from_its_header() -> None:
    """Before: any frame up to 16 MiB was buffered whole although we advertise 1 MiB.
    Now the 9-byte header alone is FRAME_SIZE_ERROR; a frame of exactly 1 MiB passes."""
    client, server = connect()
    (sid,) = requested(client, server, 1)
    limit = WireLimits().max_frame_size
    assert _events(client, _answer_head(sid) + _frame(0x0, 0, sid, bytes(limit)), NOW)
    error = _refused(client, _frame(0x0, 0, sid, b"", length=limit + 1))
    assert error.error_code == FRAME_SIZE_ERROR
    assert "SETTINGS_MAX_FRAME_SIZE" in str(error)


def test_header_blocks_are_bounded_in_frames_and_in_bytes() -> None:
    """Before: CONTINUATIONs were buffered without bound (2,000 frames, 32 MB). Now a block
    spans at most 64 frames (PROTOCOL_ERROR past it) and at most our advertised
    SETTINGS_MAX_HEADER_LIST_SIZE of bytes, judged from each frame's header
    (ENHANCE_YOUR_CALM) -- the server side's bounds."""
    block = hpack.Encoder().encode([(b":status", b"200"), (b"x-pad", b"p" * 100)])
    pieces = [block[i : i + 1] for i in range(63)] + [block[63:]]
    assert len(pieces) == 64  # HEADERS and 63 CONTINUATIONs: allowed
    client, _ = connect()
    sid = request(client)
    frames = [_frame(0x1, 0, sid, pieces[0])]
    frames += [_frame(0x9, 0, sid, p) for p in pieces[1:-1]]
    frames.append(_frame(0x9, 0x4, sid, pieces[-1]))
    (event,) = _events(client, b"".join(frames), NOW)
    assert event[0] == "headers" and dict(event[2])[b"x-pad"] == b"p" * 100  # type: ignore[call-overload]

    client, _ = connect()
    sid = request(client)
    flood = [_frame(0x1, 0, sid, b"\x88")] + [_frame(0x9, 0, sid, b"") for _ in range(64)]
    assert _refused(client, b"".join(flood)).error_code == PROTOCOL_ERROR

    client, _ = connect()
    sid = request(client)
    limit = WireLimits().max_header_list_size
    head = _frame(0x1, 0, sid, b"\x00" * (limit - 10))
    error = _refused(client, head + _frame(0x9, 0, sid, b"", length=11))  # its header alone
    assert error.error_code == ENHANCE_YOUR_CALM
    client, _ = connect()
    request(client)
    assert (
        _refused(client, _frame(0x1, 0x4, 1, b"", length=limit + 1)).error_code == ENHANCE_YOUR_CALM
    )


def test_data_past_a_window_we_granted_is_a_flow_control_error() -> None:
    """Before: DATA past the stream's window was taken. Now DATA beyond what the worker
    had been granted -- our SETTINGS, plus the WINDOW_UPDATEs handed out so far -- is
    FLOW_CONTROL_ERROR, on a stream and on the connection; the same bytes with our
    WINDOW_UPDATEs handed out in between are a normal large answer."""
    limits = WireLimits(stream_window=65535, connection_window=65535 * 2)
    chunk = _frame(0x0, 0, 1, bytes(16384))

    client, _ = connect(ClientConnection(limits))
    request(client)
    client.data_to_send()
    body = _answer_head(1) + chunk * 4  # 65,536 bytes: one past the stream window
    error = _refused(client, body)
    assert error.error_code == FLOW_CONTROL_ERROR and "stream 1" in str(error)

    client, _ = connect(ClientConnection(limits))
    request(client)
    client.data_to_send()
    assert _events(client, _answer_head(1) + chunk * 2, NOW)  # half: a WINDOW_UPDATE is queued
    client.data_to_send()  # ... and handed out: the worker may send 32 KiB more
    assert _events(client, chunk * 3, NOW)

    client, _ = connect(ClientConnection(limits))
    sids = [request(client) for _ in range(3)]
    client.data_to_send()
    answers = b"".join(_answer_head(s) for s in sids)
    two = b"".join(_frame(0x0, 0, s, bytes(16384 * 3)) for s in sids[:2])  # 98,304 bytes
    over = _frame(0x0, 0, sids[2], bytes(16384 * 3))  # within its stream, past the connection
    error = _refused(client, answers + two + over)
    assert error.error_code == FLOW_CONTROL_ERROR and "the connection" in str(error)


def test_a_zero_window_update_is_a_stream_error_on_a_stream_and_fatal_on_the_connection() -> None:
    """RFC 9113 §6.9. Before: a WINDOW_UPDATE of 0 was taken. On a stream it now resets
    that stream (RST_STREAM PROTOCOL_ERROR) and reports an ``error`` event, the
    connection and its other streams going on; one overflowing a stream's send window
    likewise, FLOW_CONTROL_ERROR; a 0 on stream 0 is a connection error."""
    client, server = connect()
    a, b = requested(client, server, 2)
    events = _events(client, _frame(0x8, 0, a, (0).to_bytes(4, "big")), NOW)
    assert [e[:3] for e in events] == [("error", a, PROTOCOL_ERROR)]
    _, theirs = pump(client, server)
    assert [(type(e), e.stream_id, e.error_code) for e in theirs] == [
        (h2.events.StreamReset, a, PROTOCOL_ERROR)
    ]
    events = _events(client, _frame(0x8, 0, b, (2**31 - 1).to_bytes(4, "big")), NOW)
    assert [e[:3] for e in events] == [("error", b, FLOW_CONTROL_ERROR)]
    c = request(client)
    client.send_data(c, b"", end_stream=True)
    pump(client, server)
    server.send_headers(c, [(b":status", b"200"), (b"grpc-status", b"0")], end_stream=True)
    ours, _ = pump(client, server)
    assert [e[:2] for e in ours] == [("headers", c)]
    assert _refused(client, _frame(0x8, 0, 0, (0).to_bytes(4, "big"))).error_code == PROTOCOL_ERROR


def test_the_peers_first_frame_must_be_settings() -> None:
    """RFC 9113 §3.4: the server's connection preface is a SETTINGS frame, its first.
    Before: any frame was taken first. Now anything else -- a PING, a SETTINGS ACK, an
    answer's HEADERS -- is PROTOCOL_ERROR; h2's preface (``connect``) and a SETTINGS
    frame cut before its header's end pass."""
    ping = _frame(0x6, 0, 0, bytes(8))
    settings_ack = _frame(0x4, 0x1, 0, b"")
    for first in (ping, settings_ack, _answer_head(1)):
        client = ClientConnection()
        client.initiate_connection()
        request(client)
        error = _refused(client, first + _frame(0x4, 0, 0, b""))
        assert error.error_code == PROTOCOL_ERROR and "first frame" in str(error)
    client = ClientConnection()
    client.initiate_connection()
    preface = _frame(0x4, 0, 0, (3).to_bytes(2, "big") + (7).to_bytes(4, "big"))
    assert _events(client, preface[:4], NOW) == []
    assert _events(client, preface[4:] + ping, NOW) == [("window", 0, None, None)]
    assert client.peer_max_streams == 7
    assert _events(client, ping, NOW) == []  # the rule is for the first frame only


# --------------------------------------------------------------------------- the abuse budget
# One budget per connection (h2/abuse.py), as the worker's server side keeps for
# each of its clients: frames that ask for nothing, and the resets a worker provokes.


def _settled() -> ClientConnection:
    """A client whose peer sent its (empty) SETTINGS; no stream limit."""
    client = ClientConnection()
    client.initiate_connection()
    _events(client, _frame(0x4, 0, 0, b""), NOW)
    client.data_to_send()
    return client


WASTED = {
    "ping": _frame(0x6, 0, 0, bytes(8)),
    "settings": _frame(0x4, 0, 0, b""),
    "empty_data": _frame(0x0, 0, 1, b""),
}


@pytest.mark.parametrize("kind", sorted(WASTED))
def test_frames_for_nothing_are_budgeted(kind: str) -> None:
    """PING, SETTINGS and empty DATA frames (without END_STREAM) each take one token of
    the budget's bucket, which refills with time: half a bucket at once passes, again
    once the bucket refilled; a whole bucket at once is ENHANCE_YOUR_CALM."""
    half = FLOOD_BURST // 2
    client = _settled()
    request(client)
    _events(client, WASTED[kind] * half, NOW)
    _events(client, WASTED[kind] * half, NOW + FLOOD_BURST / FLOOD_RATE)
    assert len(client.streams) == 1
    error = _refused(client, WASTED[kind] * FLOOD_BURST)
    assert error.error_code == ENHANCE_YOUR_CALM and "asked for nothing" in str(error)


def test_a_correct_peer_pinging_once_per_call_never_spends_the_budget() -> None:
    """h2's server answering 3 bursts of calls, each call answered with a PING (as
    gRPC's flow-control probes do), all at the same instant: each call earns what its
    PING costs."""
    client, server = connect(max_concurrent_streams=FLOOD_BURST)
    for _ in range(3):
        sids = [request(client) for _ in range(FLOOD_BURST)]
        for sid in sids:
            client.send_data(sid, b"", end_stream=True)
        pump(client, server)
        for sid in sids:
            server.send_headers(
                sid, [(b":status", b"200"), (b"grpc-status", b"0")], end_stream=True
            )
            server.ping(sid.to_bytes(8, "big"))
        ours, theirs = pump(client, server)
        assert len(ours) == FLOOD_BURST
        assert sum(isinstance(e, h2.events.PingAckReceived) for e in theirs) == FLOOD_BURST
    assert client.budget.wasted > FLOOD_BURST


def test_resets_the_peer_provokes_are_budgeted() -> None:
    """MadeYouReset (CVE-2025-8671) in the client role: each WINDOW_UPDATE of 0 on a call
    is a stream error we answer with RST_STREAM. Once RESET_MIN_STREAMS calls were made,
    more provoked resets than half the calls is ENHANCE_YOUR_CALM, on the reset that
    crosses it; up to half pass."""
    client = _settled()
    sids = [request(client) for _ in range(RESET_MIN_STREAMS)]
    zero = (0).to_bytes(4, "big")
    half = RESET_MIN_STREAMS // 2
    events = _events(client, b"".join(_frame(0x8, 0, sid, zero) for sid in sids[:half]), NOW)
    assert [e[0] for e in events] == ["error"] * half
    error = _refused(client, _frame(0x8, 0, sids[half], zero))
    assert error.error_code == ENHANCE_YOUR_CALM and "reset by the server" in str(error)


# --------------------------------------------------------------------------- fuzz
# A hostile worker's bytes, generated: whatever arrives, the client either reports events
# on the streams it opened or raises a connection error (h2events.ProtocolError, with a
# code for its GOAWAY) -- never another exception, never an event for a stream it did not
# open.

_worker_frames = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 0xA), st.sampled_from([0x10, 0xFA])),  # the frame type
        st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0x9, 0x20, 0x24, 0x25, 0x2D, 0xFF]),  # flags
        st.sampled_from([0, 1, 3, 5, 7, 2, 2**31 - 1]),  # the stream: 1, 3, 5 are ours
        st.one_of(
            st.binary(max_size=24),
            st.just(hpack.Encoder().encode([(b":status", b"200"), (b"grpc-status", b"0")])),
            st.integers(0, 2**31 - 1).map(lambda n: n.to_bytes(4, "big")),
        ),
        st.one_of(st.none(), st.integers(0, 2**24 - 1)),  # a length that lies
    ),
    max_size=12,
)


def test_any_bytes_from_a_worker_are_events_or_a_connection_error(fuzz_examples: int) -> None:
    """Whatever a worker sends -- any frame type, flags, stream, payload, lying lengths, cut
    into reads anywhere, with or without its SETTINGS first -- ends as events on the streams
    we opened, answered with whole frames of the kinds a client answers with, or as one
    ``ProtocolError`` with an RFC 9113 code: never another exception. 200 examples in the
    suite; ``nox -s fuzz`` (``--fuzz-examples N``) runs 20 x N."""

    @settings(deadline=None, max_examples=max(200, 20 * fuzz_examples), database=None)
    @given(
        frames=_worker_frames, cuts=st.lists(st.integers(1, 40), max_size=6), preface=st.booleans()
    )
    def check(
        frames: list[tuple[int, int, int, bytes, int | None]], cuts: list[int], preface: bool
    ) -> None:
        client = ClientConnection()
        client.initiate_connection()
        ours = {request(client) for _ in range(3)}
        client.data_to_send()
        wire = _frame(0x4, 0, 0, b"") if preface else b""
        wire += b"".join(_frame(k, f, s, p, length=n) for k, f, s, p, n in frames)
        at, events = 0, []
        try:
            for cut in [*cuts, len(wire)]:
                events += _events(client, wire[at : at + cut], NOW)
                at += cut
        except ProtocolError as error:
            assert 0 <= error.error_code <= 0xD
            hypothesis.event(f"connection error {int(error.error_code):#x}")
            return
        hypothesis.event(f"{len(events)} events" if len(events) < 3 else "3+ events")
        out, pos = client.data_to_send(), 0
        while pos < len(out):  # what it answers: whole frames, of the kinds a client answers with
            assert out[pos + 3] in (
                0x3,
                0x4,
                0x6,
                0x8,
            )  # RST_STREAM, SETTINGS ACK, PING ACK, WINDOW_UPDATE
            pos += 9 + int.from_bytes(out[pos : pos + 3], "big")
        assert pos == len(out)
        for kind, stream_id, _, _ in events:
            assert kind in ("headers", "data", "reset", "error", "goaway", "window")
            if kind in ("headers", "data", "reset", "error"):
                assert stream_id in ours

    check()


# --------------------------------------------------------------------------- stream states
# Frames on streams we never opened (idle: an odd id we have not reached, any even id --
# the worker may open none, push being disabled) and on streams we reset, with h2's
# *client* side as the oracle: the same frames are a connection error for both, or for
# neither.

_ON_A_STREAM = {
    "data": lambda sid: _frame(0x0, 0, sid, b"x"),
    "headers": lambda sid: _answer_head(sid),
    "rst_stream": lambda sid: _frame(0x3, 0, sid, bytes(4)),
    "window_update": lambda sid: _frame(0x8, 0, sid, (5).to_bytes(4, "big")),
    "window_update_0": lambda sid: _frame(0x8, 0, sid, bytes(4)),
    "priority": lambda sid: _frame(0x2, 0, sid, bytes(5)),
}


def _h2_client() -> h2.connection.H2Connection:
    """h2's client with streams 1 (then reset by us) and 3 open, after the server's SETTINGS."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    for sid in (1, 3):
        client.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", "/x"),
                                  (":authority", "w")])  # fmt: skip
    client.reset_stream(1)
    client.receive_data(_frame(0x4, 0, 0, b""))
    return client


@pytest.mark.parametrize("sid", [1, 5, 2], ids=["reset", "idle", "even"])
@pytest.mark.parametrize("kind", sorted(_ON_A_STREAM))
def test_frames_on_streams_not_open_are_judged_as_h2s_client_judges_them(
    kind: str, sid: int
) -> None:
    """DATA, HEADERS and WINDOW_UPDATE on a stream never opened are a connection error
    (RFC 9113 §5.1); RST_STREAM and PRIORITY there are ignored, as h2 and the server side
    do; on a stream we reset, late frames are ignored. One deliberate difference: h2
    makes a WINDOW_UPDATE of 0 on a stream it reset a connection error, which RFC 9113
    §6.9 makes a stream error of a stream already gone -- we ignore it."""
    data = _ON_A_STREAM[kind](sid)
    client = _settled()
    assert [request(client), request(client)] == [1, 3]
    client.reset(1)
    try:
        _events(client, data, NOW)
        ours = None
    except ProtocolError as error:
        ours = int(error.error_code)
    try:
        _h2_client().receive_data(data)
        theirs = None
    except h2.exceptions.ProtocolError as error:
        theirs = int(error.error_code)
    if (kind, sid) == ("window_update_0", 1):
        assert (ours, theirs) == (None, PROTOCOL_ERROR)
    else:
        assert ours == theirs


def test_a_shrunk_header_table_is_signalled_at_the_start_of_the_next_request() -> None:
    """A worker that lowers SETTINGS_HEADER_TABLE_SIZE below HPACK's 4096 gets, at the
    start of our next header block, a dynamic table size update (RFC 7541 §4.2), which
    h2 decodes; the one-step request declines while it is owed (its block is constant)."""
    client, server = connect(header_table_size=256)
    block = encode_request(request_prefix(PATH, b"worker:8080"), None)
    assert client.send_request(block, b"abc") is None
    sid = client.open_stream(block)
    wire = client.data_to_send()
    assert wire[9:12] == hpack_int(256, 5, 0x20)  # the block's first bytes: the update
    theirs = server.receive_data(wire)
    (received,) = [e for e in theirs if isinstance(e, h2.events.RequestReceived)]
    assert received.stream_id == sid and (b":path", PATH) in received.headers
    assert client.send_request(block, b"abc") is not None  # said once, then not again


def test_headers_after_a_stream_ended_is_a_connection_error() -> None:
    """Once the worker ended a stream, HEADERS on it is a connection error STREAM_CLOSED
    (RFC 9113 §5.1); DATA on it is ignored, its bytes returned to the connection window."""
    client, server = connect()
    (sid,) = requested(client, server, 1)
    server.send_headers(sid, [(b":status", b"200")], end_stream=True)
    ours, _ = pump(client, server)
    assert ours == [("headers", sid, ((b":status", b"200"),), True)]
    assert _events(client, _frame(0x0, 0, sid, b"late"), NOW) == []
    assert _refused(client, _answer_head(sid)).error_code == 0x5  # STREAM_CLOSED
    goaway = client.data_to_send()[-17:]  # queued by the connection itself
    assert goaway[3] == 0x7 and int.from_bytes(goaway[13:17], "big") == 0x5

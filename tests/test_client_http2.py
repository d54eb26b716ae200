"""The client's sans-IO HTTP/2 (``client.http2``), with h2's server side as the oracle.

Every test wires a :class:`ClientConnection` to an h2 ``H2Connection(client_side=False)``
in memory: our bytes go into h2 and h2's into ours. h2 is strict about everything a
client may do wrong (flow-control overruns, oversized frames, malformed header blocks,
stream states), so "h2 accepted it" is the check that our output is valid HTTP/2, and
h2's events say what it understood. The bounds are the ones the gateway's client holds
its workers to (``tests/test_gateway_http2.py``), from the same rules.
"""

from __future__ import annotations

import collections
import itertools

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from h2_client import frame as _frame  # a raw frame; `frame` names a parameter here
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import message_sends

from reactantserver.client.http2 import (
    MAX_FRAME,
    MAX_HEADER_LIST,
    ClientConnection,
    Event,
    ProtocolError,
    request_block,
    with_timeout,
)
from reactantserver.transport.h2wire import CANCEL, REFUSED_STREAM
from reactantserver.transport.hpack_blocks import literal

PATH = "/inference.GRPCInferenceService/ModelInfer"
FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x6, 0xB
PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x1, 0x3


def _server(**settings_: int) -> h2.connection.H2Connection:
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.initiate_connection()
    if settings_:
        server.update_settings({h2.settings.SettingCodes[k]: v for k, v in settings_.items()})
    return server


def _bytes(client: ClientConnection) -> bytes:
    return b"".join(client.data_to_send())


def connect(
    client: ClientConnection | None = None, **server_settings: int
) -> tuple[ClientConnection, h2.connection.H2Connection]:
    """A client and an h2 server that have exchanged prefaces and SETTINGS."""
    client = (
        client
        if client is not None
        else ClientConnection(stream_window=16 << 20, connection_window=64 << 20)
    )
    client.initiate()
    server = _server(**{k.upper(): v for k, v in server_settings.items()})
    pump(client, server)
    return client, server


def pump(
    client: ClientConnection, server: h2.connection.H2Connection
) -> tuple[list[Event], list[h2.events.Event]]:
    """Exchange bytes until both sides are quiet; the events each side saw (the server
    consuming every byte of DATA as it arrives)."""
    ours: list[Event] = []
    theirs: list[h2.events.Event] = []
    for _ in range(10_000):
        out, back = _bytes(client), server.data_to_send()
        if not out and not back:
            return ours, theirs
        if out:
            events = server.receive_data(out)
            for event in events:
                if isinstance(event, h2.events.DataReceived):
                    server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            theirs += events
        if back:
            ours += client.receive(back)
    raise AssertionError("the connection never went quiet")


def request(client: ClientConnection, timeout: float | None = 0.05) -> int:
    return client.open_stream(with_timeout(request_block(PATH, "worker:8080"), timeout))


def send(client: ClientConnection, stream_id: int, *pieces: bytes, end: bool = True) -> None:
    pending = collections.deque(memoryview(p) for p in pieces if p)
    client.send_pieces(stream_id, pending, end_stream=end)
    assert not pending


def send_all(
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
        _, events = pump(client, server)
        theirs += events
        if not pending:
            return theirs


def test_settings_are_exchanged_and_acknowledged() -> None:
    client, server = connect(max_concurrent_streams=7, max_frame_size=32768)
    assert server.remote_settings.initial_window_size == 16 << 20
    assert server.remote_settings.max_frame_size == MAX_FRAME
    assert server.remote_settings.max_header_list_size == MAX_HEADER_LIST
    assert server.remote_settings.enable_push == 0
    assert server.outbound_flow_control_window == 64 << 20
    assert client.peer_max_streams == 7
    assert client.peer_max_frame == 32768


def test_a_unary_call_round_trip() -> None:
    client, server = connect()
    sid = request(client)
    send(client, sid, b"\x00\x00\x00\x00\x03", b"a", b"", b"bc")
    _, events = pump(client, server)
    received = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    assert received.headers == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", PATH.encode()),
        (b":authority", b"worker:8080"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"grpc-timeout", b"50m"),
    ]
    frames = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    assert frames == [b"\x00\x00\x00\x00\x03abc"]  # the pieces are one frame, not four
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)

    server.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    server.send_data(sid, b"\x00\x00\x00\x00\x02ok")
    server.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    ours, _ = pump(client, server)
    assert [(e[0], e[1]) for e in ours] == [("headers", sid), ("data", sid), ("headers", sid)]
    assert ours[0][2] == ((b":status", b"200"), (b"content-type", b"application/grpc"))
    assert bytes(ours[1][2]) == b"\x00\x00\x00\x00\x02ok"  # type: ignore[arg-type]
    assert ours[2][2:] == (((b"grpc-status", b"0"),), True)
    assert client.open_streams == 0


def test_an_empty_message_still_ends_the_stream() -> None:
    client, server = connect()
    sid = request(client, timeout=None)
    send(client, sid)
    _, events = pump(client, server)
    (received,) = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert b"grpc-timeout" not in dict(received.headers)
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


@pytest.mark.parametrize(
    ("seconds", "value"), [(0.05, "50m"), (0.0001, "1m"), (1.0004, "1001m"), (120, "120000m")]
)
def test_the_timeout_is_whole_milliseconds_rounded_up_and_decodes_as_sent(
    seconds: float, value: str
) -> None:
    block = request_block(PATH, "w:1")
    assert with_timeout(block, seconds) == block + literal(b"grpc-timeout", value.encode())
    assert hpack.Decoder().decode(with_timeout(block, seconds))[-1] == ("grpc-timeout", value)


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
        events = send_all(client, server, sid, pieces)
        frames = [e for e in events if isinstance(e, h2.events.DataReceived)]
        assert b"".join(e.data for e in frames) == b"".join(pieces)
        assert all(len(e.data) <= frame for e in frames)
        assert [e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)] == [sid]


@settings(deadline=None, max_examples=40)
@given(st.integers(0, 300_000), st.lists(st.integers(1, 5000), min_size=1, max_size=30))
@example(300_000, [1, 8, 1, 9, 16384, 3])  # a frame header cut at every byte
@example(70_000, [65_544])
def test_any_answer_split_anywhere_decodes_the_same(size: int, splits: list[int]) -> None:
    """However h2's bytes are cut into reads, the client sees the same headers, the same
    data (byte for byte) and the same end of stream."""
    client, server = connect()
    sid = request(client)
    send(client, sid)
    pump(client, server)
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
    points = list(itertools.accumulate(splits))
    for a, b in itertools.pairwise([0, *points, len(wire)]):
        events += client.receive(wire[a:b] if a < len(wire) else b"")
    data = b"".join(bytes(e[2]) for e in events if e[0] == "data")  # type: ignore[arg-type]
    heads = [e for e in events if e[0] == "headers"]
    assert data == payload
    assert heads[0][2] == ((b":status", b"200"), (b"content-type", b"application/grpc"))
    assert heads[-1][2:] == (((b"grpc-status", b"0"), (b"grpc-message", b"")), True)


def test_views_handed_out_survive_later_reads() -> None:
    """A DATA payload is a view of the bytes read, or of the buffer a split frame was
    gathered in; later reads never overwrite it."""
    client, server = connect()
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
        views += [e[2] for e in client.receive(wire[at : at + 777]) if e[0] == "data"]
    assert b"".join(views) == b"".join(bytes([i]) * 10_000 for i in range(4))  # type: ignore[arg-type]


def test_a_data_frame_cut_anywhere_is_passed_on_in_pieces_ending_with_its_flag() -> None:
    """A DATA frame split across reads comes out as views of each read, in order, the
    last one alone carrying END_STREAM; one for a stream we reset comes out not at all,
    and the windows are counted the same (the next frames are judged as usual)."""
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
            fresh, _ = connect()
            x, y = request(fresh), request(fresh)
            send(fresh, x)
            send(fresh, y)
            fresh.reset(y)
            fresh.data_to_send()
            events = []
            for piece in (wire[:cut], wire[cut:second], wire[second:]):
                events += fresh.receive(piece)
            data = [e for e in events if e[0] == "data"]
            assert {e[1] for e in data} == {x}
            assert b"".join(bytes(e[2]) for e in data) == bytes(range(256)) * 20  # type: ignore[arg-type]
            assert [e[3] for e in data] == [False] * (len(data) - 1) + [True]
            assert not fresh.is_open(x)


def test_a_response_larger_than_our_stream_window_is_let_through() -> None:
    """Our WINDOW_UPDATEs reopen the windows as data arrives (20 MiB > the 16 MiB stream
    window), so a large answer never stalls."""
    client, server = connect()
    sid = request(client)
    send(client, sid)
    pump(client, server)
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
        events = client.receive(server.data_to_send())
        received += sum(len(e[2]) for e in events if e[0] == "data")  # type: ignore[arg-type]
        server.receive_data(_bytes(client))
        assert events, "the server stalled"
    assert received == total


def test_header_blocks_larger_than_a_frame_use_continuation_both_ways() -> None:
    client, server = connect(ClientConnection(max_frame=16384))
    long_path = "/" + "p" * 40_000
    sid = client.open_stream(request_block(long_path, "w:1"))
    send(client, sid)
    _, events = pump(client, server)
    (received,) = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert dict(received.headers)[b":path"] == long_path.encode()
    big = b"m" * 30_000
    server.send_headers(sid, [(b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", big)],
                        end_stream=True)  # fmt: skip
    ours, _ = pump(client, server)
    assert ours == [
        ("headers", sid, ((b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", big)), True)
    ]  # fmt: skip


def test_resets_both_ways_and_late_frames_are_ignored() -> None:
    client, server = connect()
    a, b = request(client), request(client)
    send(client, a)
    send(client, b)
    pump(client, server)
    server.reset_stream(a, REFUSED_STREAM)
    ours, _ = pump(client, server)
    assert ours == [("reset", a, REFUSED_STREAM, None)]
    # We reset b; the server's answer crosses it on the wire and must change nothing --
    # except that its header block is still decoded (the HPACK table stays in step).
    server.send_headers(b, [(b":status", b"200"), (b"x-indexed", b"v" * 10)])
    server.send_data(b, b"late")
    client.reset(b, CANCEL)
    ours, theirs = pump(client, server)
    assert ours == []
    assert any(isinstance(e, h2.events.StreamReset) and e.error_code == CANCEL for e in theirs)
    c = request(client)
    send(client, c)
    pump(client, server)
    server.send_headers(c, [(b":status", b"200"), (b"x-indexed", b"v" * 10)], end_stream=True)
    ours, _ = pump(client, server)
    assert ours == [("headers", c, ((b":status", b"200"), (b"x-indexed", b"v" * 10)), True)]


def test_goaway_names_the_last_stream_and_stops_new_ones() -> None:
    client, server = connect()
    a, b = request(client), request(client)
    send(client, a)
    send(client, b)
    pump(client, server)
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
    assert client.receive(server.data_to_send() + priority + unknown) == []
    theirs = server.receive_data(_bytes(client))
    assert any(isinstance(e, h2.events.PingAckReceived) for e in theirs)


def test_stream_limit_and_window_changes_from_settings() -> None:
    client, server = connect(max_concurrent_streams=2)
    a = request(client)
    request(client)
    assert not client.can_open
    server.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    pump(client, server)
    assert client.window(a) == 100
    pending = collections.deque([memoryview(b"x" * 101)])
    assert client.send_pieces(a, pending, end_stream=True) == 100
    assert bytes(pending[0]) == b"x" and client.window(a) == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x00\x04\x05\x04\x00\x00\x00\x01" + b"\x00\x00\x00\x02",  # PUSH_PROMISE
        b"\x00\x00\x03\x03\x00\x00\x00\x00\x01abc",  # RST_STREAM of 3 bytes
        b"\x00\x00\x05\x04\x00\x00\x00\x00\x00abcde",  # SETTINGS of 5 bytes
        b"\x00\x00\x01\x01\x04\x00\x00\x00\x01\xbf",  # an undecodable header block
        b"\x00\x00\x01\x00\x00\x00\x00\x00\x09x",  # DATA on a stream never opened
    ],
)
def test_protocol_errors_raise(frame: bytes) -> None:
    client, _ = connect()
    request(client)
    with pytest.raises(ProtocolError):
        client.receive(frame)


# --------------------------------------------------------------------------- bounds
# What a broken or hostile server cannot make the client buffer or believe. Frames are
# written by hand: h2 will not break them.


def _answer_head(sid: int) -> bytes:
    return _frame(0x1, 0x4, sid, hpack.Encoder().encode([(b":status", b"200")]))


def _refused(client: ClientConnection, data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        client.receive(data)
    return caught.value


def test_a_frame_past_our_advertised_frame_size_is_refused_from_its_header() -> None:
    client, server = connect()
    sid = request(client)
    send(client, sid)
    pump(client, server)
    assert client.receive(_answer_head(sid) + _frame(0x0, 0, sid, bytes(MAX_FRAME)))
    error = _refused(client, _frame(0x0, 0, sid, b"", length=MAX_FRAME + 1))
    assert error.code == FRAME_SIZE_ERROR
    assert "SETTINGS_MAX_FRAME_SIZE" in str(error)


def test_header_blocks_are_bounded_in_frames_and_in_bytes() -> None:
    block = hpack.Encoder().encode([(b":status", b"200"), (b"x-pad", b"p" * 100)])
    pieces = [block[i : i + 1] for i in range(63)] + [block[63:]]
    assert len(pieces) == 64  # HEADERS and 63 CONTINUATIONs: allowed
    client, _ = connect()
    sid = request(client)
    frames = [_frame(0x1, 0, sid, pieces[0])]
    frames += [_frame(0x9, 0, sid, p) for p in pieces[1:-1]]
    frames.append(_frame(0x9, 0x4, sid, pieces[-1]))
    (event,) = client.receive(b"".join(frames))
    assert event[0] == "headers" and dict(event[2])[b"x-pad"] == b"p" * 100  # type: ignore[call-overload]

    client, _ = connect()
    sid = request(client)
    flood = [_frame(0x1, 0, sid, b"\x88")] + [_frame(0x9, 0, sid, b"") for _ in range(64)]
    assert _refused(client, b"".join(flood)).code == PROTOCOL_ERROR

    client, _ = connect()
    sid = request(client)
    head = _frame(0x1, 0, sid, b"\x00" * (MAX_HEADER_LIST - 10))
    error = _refused(client, head + _frame(0x9, 0, sid, b"", length=11))  # its header alone
    assert error.code == ENHANCE_YOUR_CALM
    client, _ = connect()
    request(client)
    error = _refused(client, _frame(0x1, 0x4, 1, b"", length=MAX_HEADER_LIST + 1))
    assert error.code == ENHANCE_YOUR_CALM


def test_data_past_a_window_we_granted_is_a_flow_control_error() -> None:
    """DATA beyond what the server had been granted -- our SETTINGS, plus the
    WINDOW_UPDATEs handed out so far -- is FLOW_CONTROL_ERROR, on a stream and on the
    connection; the same bytes with our WINDOW_UPDATEs handed out in between pass."""
    small = {"stream_window": 65535, "connection_window": 65535 * 2}
    chunk = _frame(0x0, 0, 1, bytes(16384))

    client, _ = connect(ClientConnection(**small))
    request(client)
    client.data_to_send()
    error = _refused(client, _answer_head(1) + chunk * 4)  # one byte past the stream window
    assert error.code == FLOW_CONTROL_ERROR and "stream 1" in str(error)

    client, _ = connect(ClientConnection(**small))
    request(client)
    client.data_to_send()
    assert client.receive(_answer_head(1) + chunk * 2)  # half: a WINDOW_UPDATE is queued
    client.data_to_send()  # ... and handed out: the server may send 32 KiB more
    assert client.receive(chunk * 3)

    client, _ = connect(ClientConnection(**small))
    sids = [request(client) for _ in range(3)]
    client.data_to_send()
    answers = b"".join(_answer_head(s) for s in sids)
    two = b"".join(_frame(0x0, 0, s, bytes(16384 * 3)) for s in sids[:2])
    over = _frame(0x0, 0, sids[2], bytes(16384 * 3))  # within its stream, past the connection
    error = _refused(client, answers + two + over)
    assert error.code == FLOW_CONTROL_ERROR and "the connection" in str(error)


def test_a_zero_window_update_is_a_stream_error_on_a_stream_and_fatal_on_the_connection() -> None:
    client, server = connect()
    a, b = request(client), request(client)
    send(client, a)
    send(client, b)
    pump(client, server)
    events = client.receive(_frame(0x8, 0, a, (0).to_bytes(4, "big")))
    assert [e[:3] for e in events] == [("error", a, PROTOCOL_ERROR)]
    _, theirs = pump(client, server)
    assert [(type(e), e.stream_id, e.error_code) for e in theirs] == [
        (h2.events.StreamReset, a, PROTOCOL_ERROR)
    ]
    events = client.receive(_frame(0x8, 0, b, (2**31 - 1).to_bytes(4, "big")))
    assert [e[:3] for e in events] == [("error", b, FLOW_CONTROL_ERROR)]
    c = request(client)
    send(client, c)
    pump(client, server)
    server.send_headers(c, [(b":status", b"200"), (b"grpc-status", b"0")], end_stream=True)
    ours, _ = pump(client, server)
    assert [e[:2] for e in ours] == [("headers", c)]
    assert _refused(client, _frame(0x8, 0, 0, (0).to_bytes(4, "big"))).code == PROTOCOL_ERROR


def test_the_client_imports_no_http2_library_and_no_gateway() -> None:
    """Issue 34: the client's HTTP/2 is its own, over the transport's sans-IO helpers;
    grpclib is used for its codec and exceptions only (h2 comes along with it, for
    betterproto's generated stubs, but the client never touches it)."""
    import ast
    from pathlib import Path

    import reactantserver.client

    banned = ("h2", "hyperframe", "grpclib.client", "grpclib.protocol", "reactantserver.gateway",
              "reactantserver.transport.h2frames")  # fmt: skip
    found = {}
    for path in Path(reactantserver.client.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                if any(name == b or name.startswith(b + ".") for b in banned):
                    found.setdefault(path.name, []).append(name)
    assert found == {}

"""The lean server connection (:mod:`reactantserver.h2.server`) against h2's own.

The same client bytes -- a polite client's requests and a misbehaving one's frames --
are fed to our :class:`ServerConnection` and to h2's ``H2Connection`` (server side, as
grpclib configured it before), with the same server actions (answers, resets) between
reads, and what each reports is compared.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import hpack
import pytest
from h2.settings import SettingCodes
from h2_client import frame as raw_frame
from h2_reference import h2_reference_connection
from hyperframe.frame import (
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
)
from hypothesis import example, given, settings
from strategies import h2_client_scripts

from reactantserver.config.schema import EndpointsConfig
from reactantserver.h2 import events as h2events
from reactantserver.h2.core import MAX_ENDED_STREAMS
from reactantserver.h2.hpack import encode_headers, hpack_int
from reactantserver.h2.server import ServerConnection
from reactantserver.h2.wire import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    RST_STREAM,
    WINDOW_UPDATE,
)
from reactantserver.transport.core.limits import WireLimits
from reactantserver.transport.unary import ANSWER_HEADERS as ANSWER
from reactantserver.transport.unary import OK_TRAILERS as TRAILERS

LIMITS = WireLimits.from_endpoints(EndpointsConfig())
REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _h2_server() -> h2.connection.H2Connection:
    """h2's server connection exactly as ``new_h2_connection`` built it before h2lean."""
    return h2_reference_connection(LIMITS)


def _summary(event: Any) -> tuple[Any, ...]:
    """An event's class name and the fields grpclib and the guard read: ours and h2's are
    compared by name and field (ours are not h2's classes)."""
    kind = type(event).__name__
    if kind in ("RequestReceived", "TrailersReceived"):
        return (
            kind,
            event.stream_id,
            tuple(tuple(h) for h in event.headers),
            event.stream_ended is not None,
            event.priority_updated is not None,
        )
    if kind == "DataReceived":
        return (
            kind,
            event.stream_id,
            bytes(event.data),
            event.flow_controlled_length,
            event.stream_ended is not None,
        )
    if kind == "StreamReset":
        return (kind, event.stream_id, int(event.error_code), event.remote_reset)
    if kind == "WindowUpdated":
        return (kind, event.stream_id, event.delta)
    if kind in ("RemoteSettingsChanged", "SettingsAcknowledged"):
        changes = {
            int(code): (c.original_value, c.new_value) for code, c in event.changed_settings.items()
        }
        return (kind, changes)
    if kind in ("PingReceived", "PingAckReceived"):
        return (kind, bytes(event.ping_data))
    if kind == "ConnectionTerminated":  # the reserved bit ignored (RFC 9113 §6.8; h2 keeps it)
        last = event.last_stream_id & 0x7FFFFFFF
        return (kind, int(event.error_code), last, event.additional_data)
    if kind == "PriorityUpdated":
        return (kind, event.stream_id, event.depends_on, event.weight, event.exclusive)
    if kind == "StreamEnded":
        return (kind, event.stream_id)
    return (kind,)


class _Client:
    """Turns script actions into bytes (one HPACK encoder, as a real client has)."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def bytes_of(self, action: tuple[Any, ...]) -> bytes:
        kind, *args = action
        if kind == "headers":
            sid, end, priority, extra = args
            frame = HeadersFrame(sid, self.encoder.encode(REQUEST + extra))
            frame.flags.add("END_HEADERS")
            if end:
                frame.flags.add("END_STREAM")
            if priority is not None:
                frame.flags.add("PRIORITY")
                frame.depends_on, frame.stream_weight, frame.exclusive = priority
            return frame.serialize()
        if kind == "data":
            sid, size, end, pad = args
            frame = DataFrame(sid, b"\x07" * size)
            if end:
                frame.flags.add("END_STREAM")
            if pad:
                frame.flags.add("PADDED")
                frame.pad_length = pad
            return frame.serialize()
        if kind == "rst":
            sid, code = args
            return RstStreamFrame(sid, error_code=code).serialize()
        if kind == "window":
            sid, increment = args
            # hyperframe refuses to build a zero increment; the wire may carry one.
            body = increment.to_bytes(4, "big")
            return len(body).to_bytes(3, "big") + b"\x08\x00" + sid.to_bytes(4, "big") + body
        if kind == "settings":
            (values,) = args
            return SettingsFrame(0, settings=dict(values)).serialize()
        if kind == "settings_ack":
            return SettingsFrame(0, flags=["ACK"]).serialize()
        if kind == "ping":
            (ack,) = args
            return PingFrame(0, b"12345678", flags=["ACK"] if ack else []).serialize()
        if kind == "priority":
            sid, depends_on = args
            return PriorityFrame(sid, depends_on=depends_on, stream_weight=15).serialize()
        if kind == "push":
            (sid,) = args
            frame = PushPromiseFrame(sid, promised_stream_id=sid + 1, data=b"")
            frame.flags.add("END_HEADERS")
            return frame.serialize()
        if kind == "goaway":
            (code,) = args
            return GoAwayFrame(
                0, last_stream_id=0, error_code=code, additional_data=b"x"
            ).serialize()
        if kind == "unknown":
            # (hyperframe's ExtensionFrame.serialize writes its length as 0 when built)
            return raw_frame(0x10, 0, 0, b"hello")
        if kind == "frame":
            return raw_frame(*args)
        if kind == "headers_raw":
            return self._headers_raw(*args)
        if kind == "block":
            return self._block(*args)
        raise AssertionError(kind)

    def _headers_raw(
        self,
        sid: int,
        flags: int,
        pad: int | None,
        priority_bytes: int,
        depends_on: int,
        with_block: bool,
        padding: int,
    ) -> bytes:
        """A HEADERS frame with a valid block and whatever flags, pad-length byte,
        priority bytes and padding it is given (which may not agree)."""
        body = b"" if pad is None else bytes([pad])
        body += ((1 << 31) | depends_on).to_bytes(4, "big") + b"\x0f"
        body = body[: len(body) - 5 + priority_bytes]
        body += self.encoder.encode(REQUEST) if with_block else b""
        return raw_frame(HEADERS, flags, sid, body + bytes(padding))

    def _block(
        self,
        sid: int,
        end: bool,
        priority: bool,
        pad: int,
        continuations: int,
        interleave: str | None,
    ) -> bytes:
        """A header block as HEADERS and ``continuations`` CONTINUATIONs (padded and with
        priority fields as asked), with a frame ``interleave``d after the HEADERS, the
        block left open (``"open"``), or each CONTINUATION padded past the header block
        bound with zeros (``"big"``)."""
        block = self.encoder.encode(REQUEST)
        step = -(-len(block) // (continuations + 1))
        pieces = [block[i * step : (i + 1) * step] for i in range(continuations + 1)]
        if interleave == "big":
            pieces[1:] = [piece + bytes(40_000) for piece in pieces[1:]]
        flags = (END_STREAM if end else 0) | (PADDED if pad else 0)
        first = bytes([pad]) if pad else b""
        if priority:
            flags |= PRIORITY_FLAG
            first += (3).to_bytes(4, "big") + b"\x0f"
        wire = raw_frame(HEADERS, flags, sid, first + pieces[0] + bytes(pad))
        wire += {
            None: b"",
            "open": b"",
            "big": b"",
            "ping": raw_frame(PING, 0, 0, bytes(8)),
            "bad_ping": raw_frame(PING, 0, 0, bytes(3)),
            "data": raw_frame(DATA, 0, sid, b"x"),
            "headers": raw_frame(HEADERS, END_HEADERS, sid, b"\x82"),
            "other_stream": raw_frame(CONTINUATION, 0, sid + 2, b""),
            "unknown": raw_frame(0x10, 0, 0, b"x"),
        }[interleave]
        for i, piece in enumerate(pieces[1:], 1):
            last = i == continuations and interleave != "open"
            wire += raw_frame(CONTINUATION, END_HEADERS if last else 0, sid, piece)
        return wire


def _serve(conn: Any, action: tuple[Any, ...], *, whole: bool = False) -> str:
    """A server action on ``conn``; the name of what it raised ("" if nothing). ``whole``:
    an answer goes out in one step where ``send_answer`` takes it (as ``DirectCalls``
    sends a small answer), else in the three calls."""
    kind, sid = action
    try:
        if kind == "answer":
            if whole and conn.send_answer(sid, ANSWER, [b"\0\0\0\0\0"], 5, TRAILERS):
                return ""
            conn.send_headers(sid, ANSWER)
            window = conn.local_flow_control_window(sid)
            if window >= 5:
                conn.send_data(sid, b"\0\0\0\0\0")
            conn.send_headers(sid, TRAILERS, end_stream=True)
        else:
            conn.reset_stream(sid, 8)
    except Exception as exc:  # compared, not handled
        return type(exc).__name__
    return ""


def _ambiguous(h2c: h2.connection.H2Connection, action: tuple[Any, ...]) -> bool:
    """Actions whose h2 outcome depends on when h2 forgets a closed stream (lazily, at
    its next new stream) rather than on the protocol: a RST_STREAM, or a server action,
    on a stream that is already closed. RFC 9113 §5.1 lets the receiver ignore the
    former; the callers (grpclib, the guard) check a stream before the latter. A
    CONTINUATION outside a header block on a closed stream h2 still holds. And a second
    answer on one stream, which no caller sends."""
    kind, *args = action
    if kind == "frame" and args[0] == RST_STREAM:
        kind, args = "rst", [args[2]]  # a raw RST_STREAM: as the "rst" action
    elif kind == "frame" and args[0] == CONTINUATION:
        # A CONTINUATION outside a header block on a closed stream that h2 still holds:
        # h2's answer changes once it forgets the stream.
        stream = h2c.streams.get(args[2])
        return stream is not None and stream.closed
    if kind not in ("rst", "answer", "reset"):
        return False
    stream = h2c.streams.get(args[0])
    if kind == "rst":
        return (stream is None or stream.closed) and args[0] <= h2c.highest_inbound_stream_id
    if kind == "answer" and stream is not None and stream.state_machine.trailers_sent:
        # A second answer on a stream we ended: both refuse it (ProtocolError), but h2 then
        # marks the stream closed and ours keeps it half-closed; no caller does this
        # (answers are sent once: ServerStream and UnaryCall refuse a second).
        return True
    return stream is None or stream.closed


def _parts_from_h2(action: tuple[Any, ...]) -> bool:
    """Where ours departs from h2 on purpose: a WINDOW_UPDATE with a zero increment on a
    stream is a stream error (RFC 9113 §6.9: RST_STREAM PROTOCOL_ERROR), which h2 makes a
    connection error. Not compared here; :func:`test_a_zero_window_increment` checks ours."""
    kind, *args = action
    if kind == "window":
        sid, increment = args
        return sid != 0 and increment == 0
    if kind == "frame" and args[0] == WINDOW_UPDATE:
        _, _, sid, body = args
        return sid != 0 and len(body) == 4 and not int.from_bytes(body, "big")
    return False


def _differential(reads: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    ours = ServerConnection(LIMITS)
    theirs = _h2_server()
    #: Ours again, answering in one step where it can: must send the same bytes as ours.
    whole = ServerConnection(LIMITS)
    client = _Client()
    ours.initiate_connection()
    theirs.initiate_connection()
    whole.initiate_connection()
    assert ours.data_to_send() == theirs.data_to_send()  # the same first SETTINGS
    assert whole.data_to_send()
    start = PREFACE + SettingsFrame(0).serialize() + SettingsFrame(0, flags=["ACK"]).serialize()
    log: list[tuple[Any, ...]] = []
    for conn in (ours, theirs, whole):
        conn.receive_data(start)
    for read in reads:
        wire = b""
        for action in read:
            if _ambiguous(theirs, action) or _parts_from_h2(action):
                continue
            if action[0] in ("answer", "reset"):
                ours_error, theirs_error = _serve(ours, action), _serve(theirs, action)
                assert ours_error == theirs_error, (action, ours_error, theirs_error)
                assert _serve(whole, action, whole=True) == ours_error, action
                assert whole.data_to_send() == ours.data_to_send(), action
                continue
            wire += client.bytes_of(action)
        if not wire:
            continue
        outcomes = []
        for conn in (ours, theirs, whole):
            try:
                events = conn.receive_data(wire)
            except (h2.exceptions.ProtocolError, h2events.ProtocolError) as exc:
                outcomes.append(("raised", "ProtocolError", int(exc.error_code)))
            except UnicodeDecodeError:
                # A header that is not ASCII: h2 decodes it (header_encoding) after it has
                # taken the block and lets the error escape, which grpclib does not catch;
                # ours refuses the block as undecodable, a PROTOCOL_ERROR.
                outcomes.append(("raised", "ProtocolError", 1))
            except Exception as exc:  # compared, not handled
                outcomes.append(("raised", type(exc).__name__))
            else:
                outcomes.append(tuple(_summary(e) for e in events))
        assert outcomes[0] == outcomes[1], (read, outcomes)
        assert outcomes[2] == outcomes[0], (read, outcomes)
        log.append(outcomes[0])
        if outcomes[0] and outcomes[0][0] == "raised":
            break
    return log


@settings(max_examples=400, deadline=None)
@given(reads=h2_client_scripts())
@example(reads=[[("frame", 0xA, 0, 0, b"\x00\x00"), ("rst", 1, 0)]])  # ALTSVC opens h2's state
@example(reads=[[("frame", 0x7, 0, 0, b"\x80\x00\x00\x01" + bytes(4))]])  # GOAWAY, reserved bit
def test_same_events_as_h2_for_the_same_bytes(reads: list[list[tuple[Any, ...]]]) -> None:
    """Invariant: fed the same client bytes (a polite client's requests and a
    misbehaving client's frames: bad stream ids, DATA and HEADERS on closed streams,
    flow-control overruns, window overflows, zero increments, bad SETTINGS, PUSH_PROMISE,
    GOAWAY, unknown frames, frames of every type with the wrong stream, size or content,
    padding and priority fields that do not fit, header blocks split across CONTINUATIONs,
    interrupted, left open or past their bounds) with the same server answers and resets
    in between (ours also answering a second time in one step, ``send_answer``, which must
    queue the same bytes and raise the same errors as its three calls), our
    connection reports the same events as h2's -- the same types in the same order with
    the same stream ids, headers, data, lengths, error codes and settings -- and raises a
    connection error (with the same error code) on exactly the reads h2 raises on."""
    _differential(reads)


def test_a_request_and_its_answer_round_trip_with_h2_as_the_client() -> None:
    server = ServerConnection(LIMITS)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    for sid in (1, 3, 5):  # the repeated header block is remembered after the first
        client.send_headers(sid, REQUEST)
        client.send_data(sid, b"\0\0\0\0\x02hi", end_stream=True)
        kinds = [type(e) for e in server.receive_data(client.data_to_send())]
        assert kinds == [h2events.RequestReceived, h2events.DataReceived, h2events.StreamEnded]
        server.send_headers(sid, ANSWER)
        server.send_data(sid, b"\0\0\0\0\x02ok")
        server.send_headers(sid, TRAILERS, end_stream=True)
        events = client.receive_data(server.data_to_send())
        assert [type(e) for e in events] == [
            h2.events.ResponseReceived,
            h2.events.DataReceived,
            h2.events.TrailersReceived,
            h2.events.StreamEnded,
        ]
        assert [tuple(h) for h in events[0].headers] == [
            (b":status", b"200"),
            (b"content-type", b"application/grpc+proto"),
        ]
        assert sid not in server.streams  # closed both ways: forgotten at once


def test_header_blocks_stay_table_independent_when_the_peer_shrinks_its_table() -> None:
    """Our blocks never use the dynamic table; a lowered HEADER_TABLE_SIZE is signalled."""
    server = ServerConnection(LIMITS)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({SettingCodes.HEADER_TABLE_SIZE: 0})
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.send_headers(1, REQUEST, end_stream=True)
    server.receive_data(client.data_to_send())
    server.send_headers(1, ANSWER)
    wire = server.data_to_send()
    assert wire[9] == 0x20  # a dynamic table size update to 0 opens the block
    (event,) = client.receive_data(wire)
    assert isinstance(event, h2.events.ResponseReceived)
    decoder = hpack.Decoder()
    assert decoder.decode(encode_headers(ANSWER)) == ANSWER
    assert len(decoder.header_table.dynamic_entries) == 0


def _connected() -> tuple[ServerConnection, h2.connection.H2Connection]:
    server = ServerConnection(LIMITS)
    server.initiate_connection()
    server.increment_flow_control_window(LIMITS.connection_window - 65535)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return server, client


@pytest.mark.parametrize("setting", ["small window", "table size", "none"])
def test_an_answer_in_one_step_is_the_three_calls_or_nothing(setting: str) -> None:
    """``send_answer`` queues exactly the bytes of ``send_headers``, ``send_data`` and
    ``send_headers(end_stream=True)``, or declines with nothing queued where those calls
    would not go through as one answer: a stream window smaller than the message (the
    data must wait), a table size update owed at the start of the next block."""
    pair = [_connected(), _connected()]
    for server, client in pair:
        if setting == "small window":
            client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 6})
        elif setting == "table size":
            client.update_settings({SettingCodes.HEADER_TABLE_SIZE: 0})
        client.send_headers(1, REQUEST, end_stream=True)
        server.receive_data(client.data_to_send())
        server.data_to_send()
    message = [b"\0\0\0\0\x02", b"ok"]
    (whole, _), (three, _) = pair
    taken = whole.send_answer(1, ANSWER, message, 7, TRAILERS)
    assert taken is (setting == "none")
    if not taken:
        assert whole.data_to_send() == b""
        return
    three.send_headers(1, ANSWER)
    three.send_data(1, b"".join(message))
    three.send_headers(1, TRAILERS, end_stream=True)
    assert whole.data_to_send() == three.data_to_send()
    assert 1 not in whole.streams and 1 not in three.streams


def test_megabytes_flow_both_ways_within_the_windows() -> None:
    """A 3 MB request and a 3 MB answer on one stream, each side sending only what the
    other's windows allow and acknowledging what it consumed: every byte arrives, and the
    server's WINDOW_UPDATEs (half-window rule) keep the client going."""
    server, client = _connected()
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB
    client.send_headers(1, REQUEST)
    received = bytearray()
    sent = 0
    for _ in range(10_000):
        if sent < len(body):
            room = min(client.local_flow_control_window(1), client.max_outbound_frame_size)
            if room:
                piece = body[sent : sent + room]
                sent += len(piece)
                client.send_data(1, piece, end_stream=sent == len(body))
        events = server.receive_data(client.data_to_send())
        for event in events:
            if isinstance(event, h2events.DataReceived):
                received += event.data
                server.acknowledge_received_data(event.flow_controlled_length, 1)
        client.receive_data(server.data_to_send())
        if any(isinstance(e, h2events.StreamEnded) for e in events):
            break
    assert bytes(received) == body
    server.send_headers(1, ANSWER)
    answered = bytearray()
    offset = 0
    for _ in range(10_000):
        room = min(server.local_flow_control_window(1), server.max_outbound_frame_size)
        if offset < len(body) and room:
            server.send_data(1, memoryview(body)[offset : offset + room])
            offset += min(room, len(body) - offset)
            if offset == len(body):
                server.send_headers(1, TRAILERS, end_stream=True)
        events = client.receive_data(server.data_to_send())
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                answered += event.data
                client.acknowledge_received_data(event.flow_controlled_length, 1)
        server.receive_data(client.data_to_send())
        if any(isinstance(e, h2.events.StreamEnded) for e in events):
            break
    assert bytes(answered) == body
    assert 1 not in server.streams


def test_a_peer_past_the_connection_window_gets_flow_control_error() -> None:
    server, client = _connected()
    client.send_headers(1, REQUEST)
    server.receive_data(client.data_to_send())
    server.data_to_send()
    too_much = DataFrame(1, b"x" * 16_000)
    wire = too_much.serialize() * (LIMITS.stream_window // 16_000 + 1)
    with pytest.raises(h2events.FlowControlError):
        server.receive_data(wire)
    goaway = server.data_to_send()
    assert goaway[3] == 0x7 and int.from_bytes(goaway[13:17], "big") == 0x3
    assert server.state == h2events.ConnectionState.CLOSED


@pytest.mark.parametrize("sent", [True, False], ids=["grant sent", "grant still queued"])
def test_a_window_grows_when_its_grant_leaves(sent: bool) -> None:
    """A receive window we reopen counts from when its WINDOW_UPDATE is handed out
    (``data_to_send``), not when it is queued: DATA the peer sent before it could know
    the grant is held to the window it had (h2 counts a grant at once)."""
    server, client = _connected()
    client.send_headers(1, REQUEST)
    server.receive_data(client.data_to_send())
    server.data_to_send()
    chunk = DataFrame(1, b"x" * 16_000).serialize()
    full, rest = divmod(LIMITS.stream_window, 16_000)
    server.receive_data(chunk * full + DataFrame(1, b"x" * rest).serialize())  # all of it
    server.acknowledge_received_data(LIMITS.stream_window, 1)  # a grant, queued
    if sent:
        assert server.data_to_send()
        server.receive_data(chunk)
    else:
        with pytest.raises(h2events.FlowControlError):
            server.receive_data(chunk)


def _served(calls: int) -> tuple[ServerConnection, _Client]:
    """A connection that has served ``calls`` calls; the first one was reset."""
    server = ServerConnection(LIMITS)
    server.initiate_connection()
    client = _Client()
    server.receive_data(PREFACE + SettingsFrame(0).serialize())
    for n in range(calls):
        sid = 2 * n + 1
        server.receive_data(_whole_request(client, sid))
        if n == 0:
            server.reset_stream(sid, 8)  # the first call is cancelled
        else:
            server.send_headers(sid, ANSWER)
            server.send_headers(sid, TRAILERS, end_stream=True)
    server.data_to_send()
    return server, client


def _whole_request(client: _Client, sid: int) -> bytes:
    frame = HeadersFrame(sid, client.encoder.encode(REQUEST))
    frame.flags.add("END_HEADERS")
    frame.flags.add("END_STREAM")
    return frame.serialize()


def test_closed_streams_are_remembered_within_bounds() -> None:
    """A busy connection ends one stream per call: only the latest ``MAX_ENDED_STREAMS``
    normal endings are remembered (a frame on an older one is still a connection error,
    named "stream id too low" as h2 names one it forgot), while a reset stream keeps its
    stream-error answer -- RST_STREAM STREAM_CLOSED, the connection lives -- thousands of
    calls later, for a peer whose cancel raced its own frames. Before, every ending was
    kept up to 2^16 (about 6 MB per long-lived connection)."""
    calls = 3 * MAX_ENDED_STREAMS
    server, client = _served(calls)
    assert server.receive_data(_whole_request(client, 1)) == []  # the reset one
    assert server.data_to_send() == raw_frame(RST_STREAM, 0, 1, (5).to_bytes(4, "big"))
    with pytest.raises(h2events.StreamClosedError):  # ended a few calls ago
        server.receive_data(_whole_request(client, 2 * calls - 3))
    server, client = _served(calls)
    with pytest.raises(h2events.StreamIDTooLowError):  # ended long ago: forgotten
        server.receive_data(_whole_request(client, 3))


@pytest.mark.parametrize(
    "first",
    [
        PingFrame(0, opaque_data=b"12345678").serialize(),
        SettingsFrame(0, flags=["ACK"]).serialize(),
        HeadersFrame(1, hpack.Encoder().encode(REQUEST), flags=["END_HEADERS"]).serialize(),
        raw_frame(0xFA, 0, 0, b"unknown"),
    ],
    ids=["ping", "settings_ack", "headers", "unknown_type"],
)
def test_a_preface_not_followed_by_settings_is_a_connection_error(first: bytes) -> None:
    """RFC 9113 §3.4 (h2 does not check it, so this is where ours and h2 part): the
    client's first frame after the preface must be its SETTINGS; anything else is a
    connection error PROTOCOL_ERROR, with GOAWAY queued. Split across reads the same."""
    for cut in (None, len(PREFACE) + 3):
        server = ServerConnection(LIMITS)
        server.initiate_connection()
        server.data_to_send()
        wire = PREFACE + first
        with pytest.raises(h2events.ProtocolError) as caught:
            if cut is None:
                server.receive_data(wire)
            else:
                assert server.receive_data(wire[:cut]) == []
                server.receive_data(wire[cut:])
        assert caught.value.error_code == h2events.ErrorCodes.PROTOCOL_ERROR
        assert "SETTINGS" in str(caught.value)
        goaway = GoAwayFrame(0)
        goaway.parse_body(memoryview(server.data_to_send()[9:]))
        assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


def test_frames_that_ask_for_nothing_are_counted() -> None:
    """What the guard's abuse budget is told: each PING, SETTINGS, empty DATA without
    END_STREAM and frame answered RST_STREAM on a closed stream counts one; a request
    and its DATA count nothing."""
    server = ServerConnection(LIMITS)
    server.initiate_connection()
    server.receive_data(PREFACE + SettingsFrame(0).serialize())
    assert server.wasted == 1  # the client's SETTINGS, due once
    encoder = hpack.Encoder()
    server.receive_data(
        HeadersFrame(1, encoder.encode(REQUEST), flags=["END_HEADERS"]).serialize()
        + DataFrame(1, b"abc").serialize()
    )
    assert server.wasted == 1
    server.receive_data(DataFrame(1, b"").serialize() + PingFrame(0).serialize())
    assert server.wasted == 3
    server.reset_stream(1)
    server.receive_data(DataFrame(1, b"late").serialize())  # answered RST_STREAM
    assert server.wasted == 4


def test_a_zero_window_increment() -> None:
    """RFC 9113 §6.9 (where ours and h2 part): a WINDOW_UPDATE of 0 on an open stream is a
    stream error -- RST_STREAM PROTOCOL_ERROR, reported as a reset we made (``remote_reset``
    False: the guard's abuse budget counts it as a reset the peer provoked) -- and the
    connection goes on; on the connection it is a connection error, PROTOCOL_ERROR."""
    server, client = _connected()
    client.send_headers(1, REQUEST)
    client.send_headers(3, REQUEST)
    server.receive_data(client.data_to_send())
    server.data_to_send()
    zero = raw_frame(WINDOW_UPDATE, 0, 1, bytes(4))
    events = server.receive_data(zero)
    assert [_summary(e) for e in events] == [("StreamReset", 1, 0x1, False)]
    assert server.data_to_send() == raw_frame(RST_STREAM, 0, 1, (0x1).to_bytes(4, "big"))
    assert 1 not in server.streams and 3 in server.streams
    assert server.receive_data(zero) == []  # on a stream now closed: ignored
    with pytest.raises(h2events.ProtocolError) as caught:
        server.receive_data(raw_frame(WINDOW_UPDATE, 0, 0, bytes(4)))
    assert caught.value.error_code == h2events.ErrorCodes.PROTOCOL_ERROR
    goaway = GoAwayFrame(0)
    goaway.parse_body(memoryview(server.data_to_send()[9:]))
    assert goaway.error_code == h2events.ErrorCodes.PROTOCOL_ERROR


def test_initial_window_changes_move_open_streams_by_the_difference() -> None:
    """RFC 9113 §6.9.2: each SETTINGS_INITIAL_WINDOW_SIZE moves an open stream's send
    window by new - old, also from 0 (a window of 0 set, then 100: +100), as h2's."""
    client = _Client()
    wire = PREFACE + SettingsFrame(0).serialize() + client.bytes_of(("headers", 1, False, None, []))
    for value in (0, 100):
        wire += client.bytes_of(("settings", {SettingCodes.INITIAL_WINDOW_SIZE: value}))
    ours, theirs = ServerConnection(LIMITS), _h2_server()
    for conn in (ours, theirs):
        conn.initiate_connection()
        conn.receive_data(wire)
    assert ours.local_flow_control_window(1) == theirs.local_flow_control_window(1) == 100


def test_the_stream_tables_close_every_stream_and_nothing_leaves_closed() -> None:
    """The transition tables of h2core, read as a reader would: from OPEN, our END_STREAM
    and the peer's, in either order, close a server's stream; the peer's END_STREAM closes
    a client's at once (what is left of its request is not sent); no move is defined
    from CLOSED, so a closed stream stays closed."""
    from reactantserver.h2.core import CLIENT_STREAM, SERVER_STREAM, Move, StreamState

    def run(table: dict[tuple[int, int], int], moves: list[int]) -> int:
        state = StreamState.OPEN
        for move in moves:
            state = table[state, move]
        return state

    closed = StreamState.CLOSED
    assert run(SERVER_STREAM, [Move.SEND_END, Move.RECV_END]) == closed
    assert run(SERVER_STREAM, [Move.RECV_END, Move.SEND_END]) == closed
    assert run(CLIENT_STREAM, [Move.SEND_END, Move.RECV_END]) == closed
    assert run(CLIENT_STREAM, [Move.RECV_END]) == closed
    for table in (SERVER_STREAM, CLIENT_STREAM):
        assert not [key for key in table if key[0] == closed]


@pytest.mark.parametrize("shrink_to", [None, 4095, 50, 0])
def test_answers_index_their_headers_and_h2_and_our_client_role_decode_them(
    shrink_to: int | None,
) -> None:
    """Answer after answer on one connection: from the second on, an answer's headers and
    trailers are three bytes of indexed fields (content type and ``grpc-status 0`` in the
    peer's dynamic table), and h2's client -- the oracle -- decodes every one to the
    headers sent, as does our own client role (the gateway's and the Python client's,
    fed the same bytes); a peer lowering its table size before the third answer (to a
    size that holds both entries, one, none) gets the size updates at the start of the
    next block (the one-step answer declines while they are owed) and decodes on."""
    from reactantserver.h2.client import ClientConnection

    server, client = _connected()
    ours = ClientConnection(LIMITS)
    ours.initiate_connection()
    twin = ServerConnection(LIMITS)  # the server's first SETTINGS, byte for byte
    twin.initiate_connection()
    ours.receive_data(twin.data_to_send())
    answer = [(b":status", b"200"), (b"content-type", b"application/grpc+proto")]
    block_bytes = []
    for n in range(1, 6):
        sid = 2 * n - 1
        owed = n == 3 and shrink_to is not None
        if owed:
            client.update_settings({SettingCodes.HEADER_TABLE_SIZE: shrink_to})
            server.receive_data(client.data_to_send())
            client.receive_data(server.data_to_send())  # the ACK
        client.send_headers(sid, REQUEST, end_stream=True)
        server.receive_data(client.data_to_send())
        message = [b"\0\0\0\0\x02", b"ok"]
        if not server.send_answer(sid, ANSWER, message, 7, TRAILERS):
            assert owed
            server.send_headers(sid, ANSWER)
            server.send_data(sid, b"".join(message))
            server.send_headers(sid, TRAILERS, end_stream=True)
        wire = server.data_to_send()
        block_bytes.append(len(wire) - 3 * 9 - 7)  # less the frame heads and the DATA
        theirs = [e.headers for e in client.receive_data(wire) if hasattr(e, "headers")]
        assert [[tuple(h) for h in hs] for hs in theirs] == [answer, [(b"grpc-status", b"0")]]
        assert ours.open_stream(b"\x83\x86") == sid  # our stream to read the answer on
        ours.data_to_send()
        got = [e.headers for e in ours.receive_data(wire) if hasattr(e, "headers")]
        assert got == [tuple(answer), ((b"grpc-status", b"0"),)]
    assert block_bytes[0] > 30 and block_bytes[1] == 3
    if shrink_to is None:
        assert block_bytes[2:] == [3, 3, 3]
    elif shrink_to == 4095:  # both entries still fit: one size update, then indexed
        assert block_bytes[2] == 3 + len(hpack_int(4095, 5, 0x20)) and block_bytes[3:] == [3, 3]
    elif shrink_to == 50:  # room for grpc-status 0 only: emptied, then indexed again
        assert block_bytes[2] > 30 and block_bytes[3] == block_bytes[4] > 3
    else:
        assert block_bytes[2] > 30 and block_bytes[3] == block_bytes[4] > 30  # literals

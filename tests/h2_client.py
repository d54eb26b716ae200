"""Hand-driven HTTP/2 clients for the wire tests: a polite one and a raw one.

``H2Client`` drives ``h2``'s client state machine over a blocking socket: it opens
streams, sends gRPC requests piece by piece (half-sent, cut short, compressed, with
odd headers) and reads back what the server answered on each stream. ``RawClient``
sends whatever bytes it is given -- frames ``h2`` itself refuses to build (unknown
types, oversized DATA, HEADERS past the advertised stream limit) -- and parses the
server's frames with ``hyperframe`` and ``hpack`` alone. Both return the same
:class:`CallResult` per stream and :class:`ConnectionResult` per connection, so a test
asserts "a precise status, or a clean connection error" the same way for either.

Nothing here is clever on purpose: these are the hostile clients, and a reader must
see exactly which bytes go on the wire.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def grpc_message(payload: bytes, *, flag: int = 0, length: int | None = None) -> bytes:
    """The gRPC length-prefixed message: 1 flag byte, 4-byte big-endian length, payload."""
    return struct.pack(">BI", flag, len(payload) if length is None else length) + payload


def frame(
    kind: int, flags: int, stream_id: int, payload: bytes = b"", *, length: int | None = None
) -> bytes:
    """One raw HTTP/2 frame; ``length`` may lie about the payload."""
    size = len(payload) if length is None else length
    return (
        struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload
    )


def request_headers(
    path: str = INFER, *, timeout: str | None = None, extra: tuple[tuple[str, str], ...] = ()
) -> list[tuple[str, str]]:
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if timeout is not None:
        headers.append(("grpc-timeout", timeout))
    return headers + list(extra)


@attrs.define
class CallResult:
    """What came back on one stream."""

    headers: dict[str, str] = attrs.field(factory=dict)
    trailers: dict[str, str] = attrs.field(factory=dict)
    data: bytes = b""
    #: The length of each DATA frame's payload, in arrival order.
    frames: list[int] = attrs.field(factory=list)
    ended: bool = False
    #: RST_STREAM error code from the server, if it reset the stream.
    reset: int | None = None

    @property
    def grpc_status(self) -> int | None:
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def grpc_message(self) -> str:
        from urllib.parse import unquote

        return unquote(self.trailers.get("grpc-message", self.headers.get("grpc-message", "")))

    @property
    def http_status(self) -> int | None:
        value = self.headers.get(":status")
        return None if value is None else int(value)

    @property
    def finished(self) -> bool:
        return self.ended or self.reset is not None


@attrs.define
class ConnectionResult:
    """What happened to the connection as a whole."""

    #: GOAWAY error code and last stream id, when the server sent one.
    goaway: tuple[int, int] | None = None
    goaway_data: bytes = b""
    #: The server closed the socket (EOF or reset), or the client gave up on it.
    closed: bool = False
    #: It ended in a reset (ECONNRESET, or any read error), not a clean EOF.
    reset: bool = False
    #: Why the *client's* h2 refused what the server sent (a bug in one of the two).
    client_error: str | None = None
    #: The server's SETTINGS, as received.
    settings: dict[int, int] = attrs.field(factory=dict)


class _Socket:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False
        #: A send failed: the server closed (or reset) the connection. What it sent
        #: before that may still wait to be read, so reading goes on until EOF.
        self.send_failed = False
        #: The connection ended in a read error (a reset), not at EOF.
        self.reset = False

    def send(self, data: bytes) -> bool:
        """Send ``data``; False when the server already closed the connection."""
        if self.send_failed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.send_failed = True
            return False

    def recv(self, timeout: float) -> bytes | None:
        """Bytes that arrived within ``timeout`` (b"" when none; None at EOF or a reset)."""
        if self.closed:
            return None
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return b""
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            self.closed = self.reset = True
            return None
        if not data:
            self.closed = True
            return None
        return data

    def close(self) -> None:
        self.sock.close()


class H2Client:
    """A polite HTTP/2 client (h2's state machine) that can misbehave on purpose."""

    def __init__(self, port: int, *, handshake: bool = True) -> None:
        self._sock = _Socket(port)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.results: dict[int, CallResult] = {}
        self.connection = ConnectionResult()
        #: PING ACKs received (:meth:`round_trip`).
        self.ping_acks = 0
        if handshake:
            self.conn.initiate_connection()
            self.flush()

    # ------------------------------------------------------------------ sending

    def flush(self) -> bool:
        data = self.conn.data_to_send()
        return self._sock.send(data) if data else not (self._sock.closed or self._sock.send_failed)

    def send_raw(self, data: bytes) -> bool:
        """Bytes straight onto the socket, bypassing h2's state machine."""
        return self._sock.send(data)

    def start(
        self,
        path: str = INFER,
        *,
        timeout: str | None = None,
        extra: tuple[tuple[str, str], ...] = (),
        end_stream: bool = False,
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, request_headers(path, timeout=timeout, extra=extra), end_stream)
        self.results[sid] = CallResult()
        self.flush()
        return sid

    def send(self, sid: int, data: bytes, *, end_stream: bool = False) -> bool:
        """Send DATA, waiting for flow-control window as needed; False if cut off."""
        view = memoryview(data)
        while True:
            if sid not in self.conn.streams or self.results[sid].finished:
                return False
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0 and view:
                if not self.pump(1.0):
                    return False
                continue
            chunk, view = view[:window], view[window:]
            try:
                self.conn.send_data(sid, bytes(chunk), end_stream=end_stream and not view)
            except h2.exceptions.StreamClosedError:
                return False
            if not self.flush():
                return False
            if not view:
                return True

    def end(self, sid: int) -> None:
        self.conn.end_stream(sid)
        self.flush()

    def call(
        self, path: str, message: bytes, *, timeout: str | None = None, wait: float = 10.0
    ) -> CallResult:
        """One whole unary call: headers, one message, END_STREAM, wait for the answer."""
        sid = self.start(path, timeout=timeout)
        self.send(sid, grpc_message(message), end_stream=True)
        return self.wait(sid, wait)

    # ------------------------------------------------------------------ receiving

    def pump(self, timeout: float) -> bool:
        """Read what arrives within ``timeout``; False once the connection is gone."""
        data = self._sock.recv(timeout)
        if data is None:
            self.connection.closed = True
            return False
        if data:
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self.connection.client_error = repr(exc)
                self.connection.closed = True
                return False
            for event in events:
                self._on(event)
            self.flush()
        return True

    def _on(self, event: Any) -> None:
        result = self.results.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and result is not None:
            result.headers = dict(event.headers)
        elif isinstance(event, h2.events.TrailersReceived) and result is not None:
            result.trailers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            if result is not None:
                result.data += event.data
                result.frames.append(len(event.data))
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and result is not None:
            result.ended = True
        elif isinstance(event, h2.events.StreamReset) and result is not None:
            result.reset = int(event.error_code)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.connection.goaway = (int(event.error_code), event.last_stream_id or 0)
            self.connection.goaway_data = event.additional_data or b""
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_acks += 1
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            for code, change in event.changed_settings.items():
                self.connection.settings[int(code)] = change.new_value

    def wait(self, sid: int, timeout: float = 10.0) -> CallResult:
        """Read until stream ``sid`` finishes, the connection ends, or ``timeout``."""
        deadline = time.monotonic() + timeout
        result = self.results[sid]
        while not result.finished and time.monotonic() < deadline:
            if not self.pump(min(0.2, max(0.0, deadline - time.monotonic()))):
                break
        return result

    def round_trip(self, timeout: float = 10.0) -> bool:
        """PING and read until its ACK: everything the server sent before it has been
        read then (one TCP stream, in order). False if it does not come in ``timeout``."""
        acks = self.ping_acks
        self.conn.ping(b"roundtrp")
        self.flush()
        deadline = time.monotonic() + timeout
        while self.ping_acks == acks and time.monotonic() < deadline:
            if not self.pump(0.2):
                return False
        return self.ping_acks > acks

    def wait_settings(self, timeout: float = 10.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while not self.connection.settings and time.monotonic() < deadline:
            if not self.pump(0.2):
                break
        return self.connection.settings

    def wait_closed(self, timeout: float = 10.0) -> ConnectionResult:
        """Read until the server closes the connection or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.connection.closed and time.monotonic() < deadline:
            self.pump(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.connection

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawClient:
    """Sends raw bytes; parses the server's frames with hyperframe and hpack only."""

    def __init__(self, port: int) -> None:
        self._sock = _Socket(port)
        self._buffer = bytearray()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 20
        self._encoder = hpack.Encoder()
        self.results: dict[int, CallResult] = {}
        self.connection = ConnectionResult()
        self.frames: list[Frame] = []

    def send(self, data: bytes) -> bool:
        return self._sock.send(data)

    def handshake(self, settings: dict[int, int] | None = None) -> bool:
        f = SettingsFrame(0)
        f.settings = dict(settings or {})
        return self.send(PREFACE + f.serialize())

    def headers(
        self, sid: int, headers: list[tuple[str, str]], *, end_stream: bool = False
    ) -> bytes:
        """A HEADERS frame (encoded with this client's own HPACK state)."""
        f = HeadersFrame(sid)
        f.data = self._encoder.encode(headers)
        f.flags.add("END_HEADERS")
        if end_stream:
            f.flags.add("END_STREAM")
        self.results.setdefault(sid, CallResult())
        return f.serialize()

    @staticmethod
    def data(sid: int, payload: bytes, *, end_stream: bool = False) -> bytes:
        f = DataFrame(sid)
        f.data = payload
        if end_stream:
            f.flags.add("END_STREAM")
        return f.serialize()

    def pump(self, timeout: float) -> bool:
        data = self._sock.recv(timeout)
        if data is None:
            self.connection.closed = True
            self.connection.reset = self._sock.reset
            return False
        self._buffer += data
        while len(self._buffer) >= 9:
            f, length = Frame.parse_frame_header(memoryview(self._buffer[:9]))
            if len(self._buffer) < 9 + length:
                break
            f.parse_body(memoryview(self._buffer[9 : 9 + length]))
            del self._buffer[: 9 + length]
            self._on(f)
        return True

    def _on(self, f: Frame) -> None:
        self.frames.append(f)
        result = self.results.setdefault(f.stream_id, CallResult()) if f.stream_id else None
        if isinstance(f, HeadersFrame) and result is not None:
            headers = {
                k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                for k, v in self._decoder.decode(f.data)
            }
            if result.headers:
                result.trailers = headers
            else:
                result.headers = headers
            if "END_STREAM" in f.flags:
                result.ended = True
        elif isinstance(f, DataFrame) and result is not None:
            result.data += f.data
            if "END_STREAM" in f.flags:
                result.ended = True
            if f.flow_controlled_length:
                w = WindowUpdateFrame(0)
                w.window_increment = f.flow_controlled_length
                self.send(w.serialize())
        elif isinstance(f, RstStreamFrame) and result is not None:
            if result.reset is None:  # keep the first: later ones answer our later frames
                result.reset = f.error_code
        elif isinstance(f, GoAwayFrame):
            self.connection.goaway = (f.error_code, f.last_stream_id)
            self.connection.goaway_data = f.additional_data
        elif isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self.connection.settings.update(f.settings)
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self.send(ack.serialize())
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            pong = PingFrame(0)
            pong.flags.add("ACK")
            pong.opaque_data = f.opaque_data
            self.send(pong.serialize())

    def wait(self, sid: int, timeout: float = 10.0) -> CallResult:
        deadline = time.monotonic() + timeout
        result = self.results.setdefault(sid, CallResult())
        while not result.finished and time.monotonic() < deadline:
            if not self.pump(min(0.2, max(0.0, deadline - time.monotonic()))):
                break
        return result

    def wait_closed(self, timeout: float = 10.0) -> ConnectionResult:
        deadline = time.monotonic() + timeout
        while not self.connection.closed and time.monotonic() < deadline:
            self.pump(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.connection

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_live(port: int, timeout: float = 10.0) -> bool:
    """A normal ServerLive call on a fresh connection answers OK with live: true."""
    try:
        with H2Client(port) as client:
            result = client.call(LIVE, b"", wait=timeout)
    except OSError:
        return False
    # ServerLiveResponse{live: true} is field 1, varint 1.
    return result.grpc_status == 0 and result.data == grpc_message(b"\x08\x01")

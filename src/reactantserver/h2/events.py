"""The one place our HTTP/2 events, exceptions and codes come from, for both roles.

A connection (:class:`.core.Connection`) returns events from ``receive_data`` and
raises exceptions for a peer's error; every module names them and the codes through this
module and no other. They carry the names and fields h2's do (h2 stays the oracle of the
differential tests, which compare them by name and field), but nothing here imports h2:
slotted records, one exception hierarchy under :class:`ProtocolError` (a connection
error; its ``error_code``, the code RFC 9113 gives its case, goes into the GOAWAY), and
RFC 9113's codes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class ErrorCodes(enum.IntEnum):
    """HTTP/2 error codes (RFC 9113 section 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class SettingCodes(enum.IntEnum):
    """HTTP/2 setting codes (RFC 9113 section 6.5.2; RFC 8441's CONNECT protocol)."""

    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6
    ENABLE_CONNECT_PROTOCOL = 0x8


class ConnectionState:
    """A connection's state (:mod:`.core`): idle until the first stream, open, closed
    by GOAWAY (or draining: a client that received one). Plain ints, not an enum: the
    state is read per frame, and an enum member costs ~70 ns a lookup on Python 3.11."""

    IDLE = 0
    OPEN = 2
    CLOSED = 3
    #: The client role after the peer's GOAWAY: no new stream; open ones are answered.
    DRAINING = 4


def error_code(value: int) -> ErrorCodes | int:
    """``value`` as an :class:`ErrorCodes` member when it is one (a peer may send any)."""
    return ErrorCodes(value) if value in _ERROR_CODES else value


def setting_code(value: int) -> SettingCodes | int:
    """``value`` as a :class:`SettingCodes` member when it is one (unknown codes stay)."""
    return SettingCodes(value) if value in _SETTING_CODES else value


_ERROR_CODES = frozenset(ErrorCodes)
_SETTING_CODES = frozenset(SettingCodes)


# ---------------------------------------------------------------------- exceptions


class ProtocolError(Exception):
    """The peer broke HTTP/2's rules (or a call would): a connection error with
    ``error_code`` (PROTOCOL_ERROR unless the subclass or the caller says otherwise)."""

    error_code: ErrorCodes | int = ErrorCodes.PROTOCOL_ERROR

    def __init__(self, message: str = "", error_code: ErrorCodes | int | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class FlowControlError(ProtocolError):
    error_code = ErrorCodes.FLOW_CONTROL_ERROR


class FrameTooLargeError(ProtocolError):
    error_code = ErrorCodes.FRAME_SIZE_ERROR


class FrameDataMissingError(ProtocolError):
    error_code = ErrorCodes.FRAME_SIZE_ERROR


class DenialOfServiceError(ProtocolError):
    error_code = ErrorCodes.ENHANCE_YOUR_CALM


class InvalidSettingsValueError(ProtocolError):
    """A setting out of its range (the code depends on the setting: ``error_code``)."""


class StreamIDTooLowError(ProtocolError):
    """A new stream's id is not above the highest the peer opened before."""

    def __init__(self, stream_id: int, max_stream_id: int) -> None:
        super().__init__(f"StreamIDTooLowError: {stream_id} is lower than {max_stream_id}")


class NoSuchStreamError(ProtocolError):
    """A frame (or a call) names a stream that does not exist: idle, or forgotten."""

    def __init__(self, stream_id: int) -> None:
        super().__init__(f"no stream {stream_id}")


class StreamClosedError(NoSuchStreamError):
    """A frame (or a call) on a stream that is closed."""

    error_code = ErrorCodes.STREAM_CLOSED

    def __init__(self, stream_id: int) -> None:
        ProtocolError.__init__(self, f"stream {stream_id} is closed")


# ---------------------------------------------------------------------- events


class Event:
    """A thing the peer did, as :meth:`.core.Connection.receive_data` reports it."""

    __slots__ = ()


@dataclass(slots=True, eq=False)  # slotted records, compared by identity (as h2's)
class _HeadersReceived(Event):
    """A header block (``stream_ended``, ``priority_updated``: the events the same frame
    gave too, else None)."""

    stream_id: int
    headers: Any
    stream_ended: StreamEnded | None = None
    priority_updated: PriorityUpdated | None = None


@dataclass(slots=True, eq=False)
class RequestReceived(_HeadersReceived):
    """A new stream's request headers (the server role)."""


@dataclass(slots=True, eq=False)
class ResponseReceived(_HeadersReceived):
    """The response headers of a stream we opened (the client role)."""


@dataclass(slots=True, eq=False)
class TrailersReceived(_HeadersReceived):
    """A stream's trailers (always with END_STREAM)."""


@dataclass(slots=True, eq=False)
class DataReceived(Event):
    """A DATA frame's payload (a view, not a copy) and its flow-controlled length (the
    payload and any padding)."""

    stream_id: int
    data: memoryview
    flow_controlled_length: int
    stream_ended: StreamEnded | None = None


@dataclass(slots=True, eq=False)
class StreamEnded(Event):
    stream_id: int


@dataclass(slots=True, eq=False)
class StreamReset(Event):
    """A stream reset: by the peer (``remote_reset``), or by us on a stream error the
    peer provoked (the abuse budget counts both)."""

    stream_id: int
    error_code: ErrorCodes | int
    remote_reset: bool


@dataclass(slots=True, eq=False)
class WindowUpdated(Event):
    """A send window grew by ``delta`` (stream 0: the connection's)."""

    stream_id: int
    delta: int


@dataclass(slots=True)
class ChangedSetting:
    """One setting a SETTINGS frame changed: the value before (None: never set), the new."""

    original_value: int | None
    new_value: int


@dataclass(slots=True, eq=False)
class RemoteSettingsChanged(Event):
    changed_settings: dict[SettingCodes | int, ChangedSetting]


@dataclass(slots=True, eq=False)
class SettingsAcknowledged(Event):
    changed_settings: dict[SettingCodes | int, ChangedSetting]


@dataclass(slots=True, eq=False)
class PingReceived(Event):
    ping_data: bytes


@dataclass(slots=True, eq=False)
class PingAckReceived(Event):
    ping_data: bytes


@dataclass(slots=True, eq=False)
class ConnectionTerminated(Event):
    """The peer's GOAWAY."""

    error_code: ErrorCodes | int
    last_stream_id: int
    additional_data: bytes | None


@dataclass(slots=True, eq=False)
class PriorityUpdated(Event):
    """A stream's priority fields (reported; priorities are not kept)."""

    stream_id: int
    depends_on: int
    weight: int
    exclusive: bool


@dataclass(slots=True, eq=False)
class UnknownFrameReceived(Event):
    """A frame of a type HTTP/2 does not define (ignored otherwise, RFC 9113 5.5)."""

    type: int
    flags: int
    stream_id: int
    body: bytes

"""The one place the server's HTTP/2 events, exceptions and codes come from.

Every module under :mod:`reactantserver.transport` names an HTTP/2 event class (what a
connection's ``receive_data`` returns), an HTTP/2 exception (what it raises for a peer's
error) or a code (error codes, setting codes, connection states) through this module, and
no other. Today these are h2's own classes, re-exported; the owned core
(:mod:`.h2lean`) replaces them with its own definitions here, behind the same names, so
that h2 becomes a test-only dependency (the oracle of the differential tests).
"""

from __future__ import annotations

from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAckReceived,
    PingReceived,
    PriorityUpdated,
    RemoteSettingsChanged,
    RequestReceived,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    UnknownFrameReceived,
    WindowUpdated,
)
from h2.exceptions import (
    DenialOfServiceError,
    FlowControlError,
    FrameDataMissingError,
    FrameTooLargeError,
    NoSuchStreamError,
    ProtocolError,
    StreamClosedError,
    StreamIDTooLowError,
)
from h2.settings import SettingCodes

__all__ = [
    "ConnectionState",
    "ConnectionTerminated",
    "DataReceived",
    "DenialOfServiceError",
    "ErrorCodes",
    "Event",
    "FlowControlError",
    "FrameDataMissingError",
    "FrameTooLargeError",
    "NoSuchStreamError",
    "PingAckReceived",
    "PingReceived",
    "PriorityUpdated",
    "ProtocolError",
    "RemoteSettingsChanged",
    "RequestReceived",
    "SettingCodes",
    "SettingsAcknowledged",
    "StreamClosedError",
    "StreamEnded",
    "StreamIDTooLowError",
    "StreamReset",
    "TrailersReceived",
    "UnknownFrameReceived",
    "WindowUpdated",
]

"""What one HTTP/2 connection holds its peer to, and the rules a peer can break: the
library's own records (h11's shape), so that nothing under ``h2/`` stands on the gRPC
layer above it.

:class:`H2Limits` holds the five bounds the connection itself enforces or advertises; the
servers' wider record (:class:`reactantserver.transport.core.limits.WireLimits`, which also
bounds connections, messages and timeouts) has the same five attributes with these
defaults, so either may be handed to :class:`~.core.Connection` (:class:`Limits` is what
the connection reads). :class:`Abuse` names the rule a peer broke in the connection's
verdict (:attr:`.core.Connection.verdict`); its values are the wire layer's fault labels.
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs


class Limits(Protocol):
    """What the connection reads of a limits record."""

    @property
    def max_concurrent_streams(self) -> int: ...
    @property
    def max_header_list_size(self) -> int: ...
    @property
    def max_frame_size(self) -> int: ...
    @property
    def connection_window(self) -> int: ...
    @property
    def stream_window(self) -> int: ...


@attrs.frozen
class H2Limits:
    """The connection's bounds with their defaults (the worker's and the gateway's)."""

    #: SETTINGS_MAX_CONCURRENT_STREAMS, advertised and enforced per stream.
    max_concurrent_streams: int = 128
    #: SETTINGS_MAX_HEADER_LIST_SIZE (h2's default): decoded header bytes per request.
    max_header_list_size: int = 1 << 16
    #: SETTINGS_MAX_FRAME_SIZE: a DATA frame past it is FRAME_SIZE_ERROR from its header.
    max_frame_size: int = 1 << 20
    #: What all of a connection's streams may have sent and not yet been consumed.
    connection_window: int = 64 << 20
    #: What one stream may have buffered before its reader takes it.
    stream_window: int = 16 << 20


#: The defaults, as one record.
DEFAULT = H2Limits()


class Abuse(enum.Enum):
    """The rule of the abuse budget (:mod:`.abuse`) a peer broke."""

    #: Calls reset (or made to be reset) too soon after they began: CVE-2023-44487,
    #: CVE-2025-8671.
    RAPID_RESET = "rapid_reset"
    #: Frames that ask for work and carry none (empty DATA, CONTINUATION floods, PING...).
    FRAME_FLOOD = "frame_flood"

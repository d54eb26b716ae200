"""The server's SETTINGS as h2 keeps them: the values, and h2's reference connection.

Below both :mod:`.h2lean` (the connection that serves) and :mod:`.h2conn` (the corked
writes, which hands out new connections), so that neither imports the other's module
for these and the two do not import each other.

* :func:`local_settings`: every limit of :class:`~.limits.WireLimits` that goes into the
  server's first SETTINGS frame (stream count, header list size, frame size, stream
  window; push disabled), in force from the first byte.
* :class:`ServerSettings`: h2's settings record, except that it hides our stream limit
  from a connection-level check (h2 treats one stream too many as a connection error;
  the guard refuses just that stream).
* :func:`h2_reference_connection`: h2's own server connection configured as ours: the
  oracle of ``tests/test_h2lean.py`` and the baseline of ``benchmarks/bench_h2lean.py``.
  Not used to serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import h2.settings
from h2.settings import SettingCodes

from .h2frames import HyperframeReader, route_quiet_frames
from .limits import WireLimits

if TYPE_CHECKING:
    from h2.connection import H2Connection

#: What h2 sees as our stream limit: never reached, since we enforce ours per stream.
_UNCOUNTED = 2**32 + 1


class ServerSettings(h2.settings.Settings):
    """Our SETTINGS as h2 keeps them, except for the stream count h2 enforces.

    h2 treats a stream past SETTINGS_MAX_CONCURRENT_STREAMS as a *connection* error
    (``TooManyStreamsError``, GOAWAY), which drops every call of a client that raced our
    SETTINGS. RFC 9113 §5.1.2 lets a server refuse just that stream with REFUSED_STREAM,
    which gRPC clients retry; :mod:`.h2guard` does that. The advertised value is
    still ours: it is read through the mapping, not this property.
    """

    @property
    def max_concurrent_streams(self) -> int:
        return _UNCOUNTED

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


def local_settings(limits: WireLimits) -> dict[SettingCodes, int]:
    """Our SETTINGS: every limit, in the first SETTINGS frame."""
    return {
        SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        SettingCodes.MAX_FRAME_SIZE: limits.max_frame_size,
        SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
        SettingCodes.ENABLE_PUSH: 0,
    }


def h2_reference_connection(limits: WireLimits) -> H2Connection:
    """h2's own server connection, configured as ours was before :mod:`.h2lean`: the
    oracle ``tests/test_h2lean.py`` holds :class:`~.h2lean.ServerConnection` to, and the
    baseline of ``benchmarks/bench_h2lean.py``. Not used to serve."""
    from h2.config import H2Configuration
    from h2.connection import H2Connection

    conn = H2Connection(
        config=H2Configuration(
            client_side=False,
            header_encoding="ascii",
            validate_inbound_headers=False,  # ours: framing.request_head
            validate_outbound_headers=False,
            normalize_inbound_headers=False,
            normalize_outbound_headers=False,
        )
    )
    conn.local_settings = ServerSettings(client=False, initial_values=local_settings(limits))
    conn.max_inbound_frame_size = limits.max_frame_size
    conn.decoder.max_header_list_size = limits.max_header_list_size
    conn.incoming_buffer = HyperframeReader(limits.max_header_list_size)  # type: ignore[assignment]
    route_quiet_frames(conn)
    return conn

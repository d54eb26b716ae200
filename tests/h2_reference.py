"""h2's own server connection, configured as ours: the oracle the differential tests hold
:class:`~reactantserver.h2.server.ServerConnection` to (``tests/h2/test_h2lean.py``,
``tests/h2/test_h2conn.py``) and the baseline of ``benchmarks/bench_h2lean.py``. Never used
to serve: h2 is a test-only dependency of the server.

Its frames are cut by our reader (:class:`h2frames.HyperframeReader`,
as the Python client's are), so that a frame's length and a header block's bytes are judged
from the frame's header as ours are; the rest is h2's.
"""

from __future__ import annotations

import h2.settings
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes
from h2frames import HyperframeReader, route_quiet_frames

from reactantserver.h2.core import local_settings
from reactantserver.transport.core.limits import WireLimits

#: What h2 sees as our stream limit: never reached, since ours is enforced per stream.
_UNCOUNTED = 2**32 + 1


class ServerSettings(h2.settings.Settings):
    """Our SETTINGS as h2 keeps them, except for the stream count h2 enforces as a
    connection error (the guard refuses one stream too many with REFUSED_STREAM). The
    advertised value is still ours: it is read through the mapping, not this property."""

    @property
    def max_concurrent_streams(self) -> int:
        return _UNCOUNTED

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


def h2_reference_connection(limits: WireLimits) -> H2Connection:
    """h2's own server connection, configured as ours was before :mod:`.h2lean`."""
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
    initial = {SettingCodes(int(code)): value for code, value in local_settings(limits).items()}
    conn.local_settings = ServerSettings(client=False, initial_values=initial)
    conn.max_inbound_frame_size = limits.max_frame_size
    conn.decoder.max_header_list_size = limits.max_header_list_size
    conn.incoming_buffer = HyperframeReader(limits.max_header_list_size)  # type: ignore[assignment]
    route_quiet_frames(conn)
    return conn

"""The server's h2 connection as :func:`~reactantserver.transport.h2conn.new_h2_connection`
builds it, driven with bytes (sans-IO, no sockets).

Invariant: a DATA frame reaches the stream as
h2's own ``DataReceived`` with its bytes and flow-controlled length unchanged, while its
``repr`` (built by h2 for every received frame) stays short and does not depend on the
payload's size.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import DataFrame

from reactantserver.config.schema import EndpointsConfig
from reactantserver.transport.h2conn import new_h2_connection
from reactantserver.transport.limits import WireLimits

LIMITS = WireLimits.from_endpoints(EndpointsConfig())


def _pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    server = new_h2_connection(LIMITS)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ACK
    return server, client


def test_data_frames_arrive_unchanged_with_a_short_repr() -> None:
    server, client = _pair()
    client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])  # fmt: skip
    server.receive_data(client.data_to_send())
    payload = bytes(range(256)) * 64  # 16 KiB
    wire = DataFrame(1, payload, flags=["END_STREAM"]).serialize()
    buffer = server.incoming_buffer
    buffer.add_data(wire)
    frame = next(buffer)
    assert isinstance(frame, DataFrame) and bytes(frame.data) == payload
    assert len(repr(frame)) < 200  # hyperframe's own repr hex-encodes the whole payload
    events = server._receive_frame(frame)
    (data, ended) = events
    assert isinstance(data, h2.events.DataReceived)
    assert data.data == payload and data.flow_controlled_length == len(payload)
    assert isinstance(ended, h2.events.StreamEnded)


def test_data_through_receive_data_is_h2s_own_handling() -> None:
    """The whole path (buffer, dispatch, flow control) as grpclib drives it."""
    server, client = _pair()
    client.send_headers(1, [(":method", "POST"), (":path", "/x"), (":scheme", "http"),
                            (":authority", "a")])  # fmt: skip
    client.send_data(1, b"x" * 1000, end_stream=True)
    events = server.receive_data(client.data_to_send())
    received = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert [e.data for e in received] == [b"x" * 1000]
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)

"""The connection's states as tables (``h2/core.py``): one table per role, one
method that moves by it, and a move the table lacks raised as the bug it is.

The server's table is h2's connection state machine (its oracle, as for the frames): for
every state and move, ours goes where h2's goes, and refuses what h2 refuses. The client's
differs on purpose in one place: the peer's GOAWAY leaves it DRAINING (h2: CLOSED), so the
answers of the streams at or below the peer's last one are still read.
"""

from __future__ import annotations

import h2.connection
import h2.exceptions
import pytest

from reactantserver.h2.client import ClientConnection
from reactantserver.h2.core import CLIENT_CONNECTION, SERVER_CONNECTION, ConnectionMove, StreamState
from reactantserver.h2.events import ConnectionState, ProtocolError
from reactantserver.h2.server import ServerConnection
from reactantserver.h2.wire import frame_head

_H2 = h2.connection.ConnectionInputs
#: Each of our moves as the server sees it, in h2's inputs.
H2_INPUT = {
    ConnectionMove.STREAM_OPENED: _H2.RECV_HEADERS,
    ConnectionMove.ALTSVC_RECEIVED: _H2.RECV_ALTERNATIVE_SERVICE,
    ConnectionMove.GOAWAY_SENT: _H2.SEND_GOAWAY,
    ConnectionMove.GOAWAY_RECEIVED: _H2.RECV_GOAWAY,
}
#: How to bring h2's machine to each of the server's states.
TO_STATE = {
    ConnectionState.IDLE: (),
    ConnectionState.OPEN: (_H2.RECV_HEADERS,),
    ConnectionState.CLOSED: (_H2.SEND_GOAWAY,),
}
_H2_STATE = h2.connection.ConnectionState
OURS = {
    _H2_STATE.IDLE: ConnectionState.IDLE,
    _H2_STATE.CLIENT_OPEN: ConnectionState.OPEN,
    _H2_STATE.SERVER_OPEN: ConnectionState.OPEN,
    _H2_STATE.CLOSED: ConnectionState.CLOSED,
}


@pytest.mark.parametrize("state", sorted(TO_STATE))
@pytest.mark.parametrize("move", sorted(H2_INPUT))
def test_the_server_connection_table_is_h2s(state: int, move: int) -> None:
    """From each state, each move goes where h2's machine goes; a move h2 refuses
    (ProtocolError) is not in our table."""
    machine = h2.connection.H2ConnectionStateMachine()
    for step in TO_STATE[state]:
        machine.process_input(step)
    assert OURS[machine.state] == state
    try:
        machine.process_input(H2_INPUT[move])
    except h2.exceptions.ProtocolError:
        assert (state, move) not in SERVER_CONNECTION
    else:
        assert SERVER_CONNECTION[state, move] == OURS[machine.state]


def _goaway(last: int) -> bytes:
    return frame_head(0x7, 0, 0, 8) + last.to_bytes(4, "big") + bytes(4)


def _client() -> ClientConnection:
    client = ClientConnection()
    client.initiate_connection()
    client.receive_data(frame_head(0x4, 0, 0, 0))  # the server's SETTINGS
    client.data_to_send()
    return client


def test_the_client_opens_drains_and_closes_by_its_table() -> None:
    """IDLE until its first stream, OPEN, DRAINING on the peer's GOAWAY (the stream it
    opened is still answered), CLOSED on ours; a later GOAWAY leaves it CLOSED. Each
    state the client reaches is one its table says."""
    client = _client()
    assert client.state == ConnectionState.IDLE
    sid = client.open_stream(b"\x83\x86", end_stream=True)
    assert client.state == ConnectionState.OPEN
    assert client.streams[sid].state == StreamState.HALF_CLOSED_LOCAL
    client.receive_data(_goaway(sid))
    assert client.state == ConnectionState.DRAINING and client.goaway_received
    assert not client.can_open and sid in client.streams
    client.close_connection()
    assert client.state == ConnectionState.CLOSED
    client.receive_data(_goaway(sid))
    assert client.state == ConnectionState.CLOSED
    reached = {ConnectionState.OPEN, ConnectionState.DRAINING, ConnectionState.CLOSED}
    assert reached <= set(CLIENT_CONNECTION.values())


def test_the_server_closes_on_either_goaway() -> None:
    """The server: OPEN at the client's first HEADERS (or an ALTSVC, as h2), CLOSED on
    the client's GOAWAY, with nothing more queued to send."""
    server = ServerConnection()
    server.initiate_connection()
    server.receive_data(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame_head(0x4, 0, 0, 0))
    assert server.state == ConnectionState.IDLE
    server.receive_data(frame_head(0xA, 0, 0, 2) + bytes(2))  # ALTSVC, empty origin
    assert server.state == ConnectionState.OPEN
    server.receive_data(_goaway(0))
    assert server.state == ConnectionState.CLOSED and server.data_to_send() == b""


@pytest.mark.parametrize(
    ("role", "state", "move"),
    [
        (ClientConnection, ConnectionState.DRAINING, ConnectionMove.STREAM_OPENED),
        (ClientConnection, ConnectionState.CLOSED, ConnectionMove.STREAM_OPENED),
        (ServerConnection, ConnectionState.CLOSED, ConnectionMove.STREAM_OPENED),
        (ServerConnection, ConnectionState.CLOSED, ConnectionMove.ALTSVC_RECEIVED),
    ],
)
def test_a_move_the_table_lacks_is_raised_where_it_is_made(
    role: type[ClientConnection] | type[ServerConnection], state: int, move: int
) -> None:
    """Every caller checks the state before it moves the connection (a client opens no
    stream after GOAWAY: ``can_open``; a server reads no HEADERS after one), so a move
    the table lacks is a bug of ours: raised by the one method that moves, naming the
    state, and the state is left as it was."""
    conn = role()
    conn.state = state
    with pytest.raises(RuntimeError, match=f"in state {state}: not in the"):
        conn._move_connection(move)
    assert conn.state == state


def test_a_client_after_goaway_refuses_a_stream_before_it_moves() -> None:
    """The public path to the move above refuses first: ProtocolError, no stream."""
    client = _client()
    client.receive_data(_goaway(0))
    with pytest.raises(ProtocolError, match="no new stream"):
        client.open_stream(b"\x83\x86")
    assert client.send_request(b"\x83\x86", b"") is None and not client.streams

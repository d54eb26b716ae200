"""The bounds every HTTP/2 end we implement holds its peer to, written once for both roles.

The worker's and the gateway's server side (:mod:`.h2lean`, cutting frames with
:class:`.h2parse.FrameReader`) and the gateway's client to its workers
(:mod:`.h2client`, the Python client's too) receive frames from a peer they cannot trust: a
hostile client, or a broken or compromised worker. Each rule here judges one thing a peer
can do wrong and returns ``None`` or the :class:`Violation` -- the HTTP/2 error code and a
message saying what was wrong -- so that both roles refuse the same bytes with the same
code. Each role raises a violation as its own error: the server as h2's exception for it
(h2 is the oracle its differential tests compare it with), the client as its
``ProtocolError`` (a connection error: GOAWAY with the code) or a stream error
(RST_STREAM with the code, the one call failed).

The limits themselves -- the frame size and header-list size advertised, the windows --
are :class:`~.limits.WireLimits`, also shared. Each role keeps the one comparison of its
hot path inline (a DATA frame's length against the frame size, a window going below
zero) and calls the rule for the verdict on the rare path.

The rules (RFC 9113):

* a frame longer than the SETTINGS_MAX_FRAME_SIZE we advertised: connection error
  FRAME_SIZE_ERROR (§4.2), judged from the 9-byte header before its body is waited for;
* a header block (HEADERS or PUSH_PROMISE and its CONTINUATIONs) longer than the
  SETTINGS_MAX_HEADER_LIST_SIZE we advertised, judged as each frame's header arrives:
  connection error ENHANCE_YOUR_CALM (§10.5.1; h2's ``DenialOfServiceError``);
* a header block spanning more than :data:`MAX_BLOCK_FRAMES` frames (its HEADERS and
  CONTINUATIONs): connection error PROTOCOL_ERROR (a flood of tiny CONTINUATIONs costs a
  frame's work each; h2's bound);
* DATA past the receive window we granted, the stream's or the connection's: connection
  error FLOW_CONTROL_ERROR (§6.9.1);
* a WINDOW_UPDATE of zero: PROTOCOL_ERROR, a stream error on a stream and a connection
  error on stream 0 (§6.9); one that takes a send window past 2^31-1: FLOW_CONTROL_ERROR,
  likewise (§6.9.1). Both roles reset just the stream (h2 makes a zero increment a
  connection error even on a stream).
"""

from __future__ import annotations

from typing import NamedTuple

from .h2wire import (
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    PROTOCOL_ERROR,
)

#: Frames one header block may span at most, its HEADERS (or PUSH_PROMISE) included (h2's
#: ``CONTINUATION_BACKLOG``, which the server used before these rules were shared).
MAX_BLOCK_FRAMES = 64


class Violation(NamedTuple):
    """A rule broken: the HTTP/2 error code to send, and what was wrong."""

    code: int
    message: str


def frame_size(length: int, advertised: int) -> Violation | None:
    """A frame of ``length`` bytes, against the SETTINGS_MAX_FRAME_SIZE we advertised."""
    if length <= advertised:
        return None
    return Violation(
        FRAME_SIZE_ERROR,
        f"a frame of {length} bytes exceeds the advertised SETTINGS_MAX_FRAME_SIZE of {advertised}",
    )


def header_block(size: int, advertised: int) -> Violation | None:
    """A header block of ``size`` bytes so far (the frame just announced included),
    against the SETTINGS_MAX_HEADER_LIST_SIZE we advertised."""
    if size <= advertised:
        return None
    return Violation(
        ENHANCE_YOUR_CALM,
        f"a header block of more than {advertised} bytes (SETTINGS_MAX_HEADER_LIST_SIZE)",
    )


def block_frames(count: int) -> Violation | None:
    """A header block that has spanned ``count`` frames so far (HEADERS included)."""
    if count <= MAX_BLOCK_FRAMES:
        return None
    return Violation(PROTOCOL_ERROR, "Too many continuation frames received.")


def received(size: int, window: int, where: str) -> Violation | None:
    """``size`` flow-controlled bytes of DATA arriving on a receive window that had
    ``window`` bytes left (``where``: "stream 5", "the connection")."""
    if size <= window:
        return None
    return Violation(
        FLOW_CONTROL_ERROR,
        f"flow control window exceeded by {size - window} bytes ({where})",
    )


def window_update(increment: int, window: int, stream_id: int) -> Violation | None:
    """A WINDOW_UPDATE of ``increment`` on a send window of ``window`` bytes (a stream's,
    or the connection's for stream 0). A violation on a stream is a stream error."""
    if increment and window + increment <= MAX_WINDOW:
        return None
    where = f"stream {stream_id}" if stream_id else "the connection"
    if increment == 0:
        return Violation(PROTOCOL_ERROR, f"a WINDOW_UPDATE of 0 on {where}")
    return Violation(FLOW_CONTROL_ERROR, f"a WINDOW_UPDATE takes {where}'s send window past 2^31-1")

"""The bounds every HTTP/2 end of ours holds its peer to, written once for both roles.

The frame reader (:class:`.h2parse.FrameReader`) and the connection (:mod:`.h2core`) of
either role -- the worker's and gateway's served side, the gateway's and the Python
client's client role -- receive frames from a peer they cannot trust. Each rule judges one
thing a peer can do wrong and returns ``None`` or the :class:`Violation` (the HTTP/2 error
code and a message saying what was wrong), so that both roles refuse the same bytes with
the same code; the caller raises it as a connection error, or, for a WINDOW_UPDATE on a
stream, resets just that stream. The limits are :class:`~.limits.WireLimits`, also
shared. Each role keeps the one comparison of its hot path inline (a DATA frame's length
against the frame size, a window going below zero) and calls the rule for the verdict.
"""

from __future__ import annotations

from typing import NamedTuple

from .h2events import ErrorCodes
from .h2wire import MAX_WINDOW

ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR = ErrorCodes.ENHANCE_YOUR_CALM, ErrorCodes.FLOW_CONTROL_ERROR
FRAME_SIZE_ERROR, PROTOCOL_ERROR = ErrorCodes.FRAME_SIZE_ERROR, ErrorCodes.PROTOCOL_ERROR

#: Frames one header block may span at most, its HEADERS (or PUSH_PROMISE) included (h2's
#: ``CONTINUATION_BACKLOG``, which the server used before these rules were shared).
MAX_BLOCK_FRAMES = 64


class Violation(NamedTuple):
    """A rule broken: the HTTP/2 error code to send, and what was wrong."""

    code: int
    message: str


def frame_size(length: int, advertised: int) -> Violation | None:
    """A frame of ``length`` bytes, against the SETTINGS_MAX_FRAME_SIZE we advertised
    (RFC 9113 §4.2), judged from its 9-byte header before its body is waited for."""
    if length <= advertised:
        return None
    return Violation(
        FRAME_SIZE_ERROR,
        f"a frame of {length} bytes exceeds the advertised SETTINGS_MAX_FRAME_SIZE of {advertised}",
    )


def header_block(size: int, advertised: int) -> Violation | None:
    """A header block of ``size`` bytes so far (the frame just announced included),
    against the SETTINGS_MAX_HEADER_LIST_SIZE we advertised (§10.5.1; h2's
    ``DenialOfServiceError``)."""
    if size <= advertised:
        return None
    return Violation(
        ENHANCE_YOUR_CALM,
        f"a header block of more than {advertised} bytes (SETTINGS_MAX_HEADER_LIST_SIZE)",
    )


def block_frames(count: int) -> Violation | None:
    """A header block that has spanned ``count`` frames so far (HEADERS included): a
    flood of tiny CONTINUATIONs costs a frame's work each."""
    if count <= MAX_BLOCK_FRAMES:
        return None
    return Violation(PROTOCOL_ERROR, "Too many continuation frames received.")


def received(size: int, window: int, where: str) -> Violation | None:
    """``size`` flow-controlled bytes of DATA arriving on a receive window that had
    ``window`` bytes left (``where``: "stream 5", "the connection"; §6.9.1)."""
    if size <= window:
        return None
    return Violation(
        FLOW_CONTROL_ERROR,
        f"flow control window exceeded by {size - window} bytes ({where})",
    )


def window_update(increment: int, window: int, stream_id: int) -> Violation | None:
    """A WINDOW_UPDATE of ``increment`` on a send window of ``window`` bytes (a stream's,
    or the connection's for stream 0; §6.9, §6.9.1). A violation on a stream is a
    stream error (h2 makes a zero increment a connection error even there)."""
    if increment and window + increment <= MAX_WINDOW:
        return None
    where = f"stream {stream_id}" if stream_id else "the connection"
    if increment == 0:
        return Violation(PROTOCOL_ERROR, f"a WINDOW_UPDATE of 0 on {where}")
    return Violation(FLOW_CONTROL_ERROR, f"a WINDOW_UPDATE takes {where}'s send window past 2^31-1")

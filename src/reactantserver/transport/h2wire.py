"""HTTP/2's wire numbers and frame headers, as our own HTTP/2 code writes them.

Shared by the ends we implement ourselves: the server side (:mod:`.h2lean`, :mod:`.unary`)
and the client role (:mod:`.h2client`: the gateway's client to its workers and the Python
client's channel). RFC 9113 §4.1 (frame
layout), §6 (frame types and flags), §6.5.2 (settings), §7 (error codes).
"""

from __future__ import annotations

import collections
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 4, 5

NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, CANCEL = 0x0, 0x1, 0x3, 0x8
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x5, 0x6, 0x7, 0xB
SETTINGS_MAX_HEADER_LIST_SIZE = 6

#: HTTP/2's defaults before the peer's SETTINGS say otherwise.
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
DEFAULT_TABLE = 4096  # SETTINGS_HEADER_TABLE_SIZE: the HPACK dynamic table an encoder starts with
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
#: A frame longer than this is refused whatever the peer claims (HTTP/2's own ceiling).
MAX_FRAME_CEILING = 2**24 - 1


#: A frame's 9-byte header as one struct, read and written in one call: length (16 + 8
#: bits), type, flags, stream id (with its reserved bit).
FRAME_HEAD = struct.Struct(">HBBBL")
_pack_head = FRAME_HEAD.pack


def frame_head(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """A frame's 9-byte header (``struct.error`` for a length or id out of range)."""
    return _pack_head(length >> 8, length & 0xFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    """A whole frame: its header, then ``payload``."""
    return frame_head(kind, flags, stream_id, len(payload)) + payload


def take_views(pending: collections.deque[memoryview], room: int) -> tuple[list[memoryview], int]:
    """Up to ``room`` bytes off the front of ``pending``, as views (a view that does not
    fit is split, its rest left in front): the next DATA frame's payload, not copied. The
    views and the number of bytes they hold."""
    views: list[memoryview] = []
    left = room
    while pending and left:
        view = pending[0]
        if view.nbytes <= left:
            views.append(pending.popleft())
            left -= view.nbytes
        else:
            views.append(view[:left])
            pending[0] = view[left:]
            left = 0
    return views, room - left

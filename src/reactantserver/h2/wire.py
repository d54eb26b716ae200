"""HTTP/2's wire numbers and frame headers, as our own HTTP/2 code (:mod:`.core`, both
roles, and the answers :mod:`..transport.unary` writes) reads and writes them: RFC 9113 §4.1 (frame
layout), §6 (frame types and flags). Error and setting codes are :mod:`.events`'.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

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

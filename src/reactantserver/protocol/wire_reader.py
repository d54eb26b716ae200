"""A cursor over protobuf's wire format: the one reader of the hand-written codecs.

Two places read protobuf bytes by hand rather than through betterproto: the worker's
ModelInfer codec (:mod:`.codec`, every field) and the gateway's peek
(:mod:`reactantserver.gateway.wire`, the model name, id and input shapes only). Both walk
a message with this cursor, so they keep the same protobuf rules and the same error
messages: fields in any order, unknown fields (groups included, up to
:data:`MAX_GROUP_DEPTH` deep) skipped, int64 as two's complement; malformed input raises
:class:`~reactantserver.errors.InvalidArgument` naming the message (``what``), the problem
and the byte offset. Pure Python, no protobuf runtime.
"""

from __future__ import annotations

from reactantserver.errors import InvalidArgument

#: Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

#: Unknown groups are skipped recursively; deeper nesting is refused, not a RecursionError.
MAX_GROUP_DEPTH = 32
#: Most extents a tensor shape may hold (numpy's own limit; inferio refuses above 32).
MAX_DIMS = 64

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


class Reader:
    """A cursor over ``buf[pos:end]`` for one message; errors name the message."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf: bytes | memoryview, pos: int, end: int, what: str) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.what = what

    def fail(self, problem: str) -> InvalidArgument:
        return InvalidArgument(f"malformed {self.what}: {problem}")

    def varint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        if pos < end and buf[pos] < 0x80:  # one byte: tags, lengths, small ints
            self.pos = pos + 1
            return buf[pos]
        result = shift = 0
        start = pos
        while True:
            if pos >= end:
                raise self.fail(f"varint at byte {start} is truncated")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result & _MASK64
            shift += 7
            if shift >= 70:
                raise self.fail(f"varint at byte {start} is longer than 10 bytes")

    def int64(self) -> int:
        value = self.varint()
        return value - (1 << 64) if value & _SIGN64 else value

    def length(self) -> tuple[int, int]:
        """A length-delimited field's ``(start, end)``; the cursor moves past it."""
        at = self.pos
        if at < self.end and self.buf[at] < 0x80:  # a one-byte length (inline: hot)
            size = self.buf[at]
            start = at + 1
        else:
            size = self.varint()
            start = self.pos
        if size > self.end - start:
            raise self.fail(
                f"length {size} at byte {at} runs past the end of the message ({self.end})"
            )
        self.pos = start + size
        return start, start + size

    def string(self, field: str) -> str:
        start, end = self.length()
        try:
            return str(self.buf[start:end], "utf-8")  # bytes or a view of them
        except UnicodeDecodeError:
            raise self.fail(f"{field} is not valid UTF-8") from None

    def tag(self) -> tuple[int, int]:
        at = self.pos
        if at < self.end and 8 <= self.buf[at] < 0x80:  # a one-byte tag (inline: hot)
            key = self.buf[at]
            self.pos = at + 1
            return key >> 3, key & 7
        key = self.varint()
        number = key >> 3
        if number == 0:
            raise self.fail(f"field number 0 at byte {at}")
        return number, key & 7

    def expect(self, wire: int, expected: int, field: str) -> None:
        if wire != expected:
            raise self.fail(f"{field} has wire type {wire}, expected {expected}")

    def skip(self, number: int, wire: int, depth: int = 0) -> None:
        """Skip one unknown field whose tag has just been read."""
        if wire == VARINT:
            self.varint()
        elif wire == LEN:
            self.length()
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if self.pos + size > self.end:
                raise self.fail(f"fixed-width field {number} runs past the end of the message")
            self.pos += size
        elif wire == SGROUP:
            if depth >= MAX_GROUP_DEPTH:
                raise self.fail(f"groups nested deeper than {MAX_GROUP_DEPTH}")
            while True:  # a group ends with the END_GROUP tag of the same number
                inner, inner_wire = self.tag()
                if inner_wire == EGROUP:
                    if inner != number:
                        raise self.fail(f"group {number} closed by END_GROUP {inner}")
                    return
                self.skip(inner, inner_wire, depth + 1)
        elif wire == EGROUP:
            raise self.fail(f"END_GROUP {number} outside any group")
        else:
            raise self.fail(f"field {number} has invalid wire type {wire}")

    def sub(self, what: str) -> Reader:
        """A reader over the length-delimited field at the cursor."""
        start, end = self.length()
        return Reader(self.buf, start, end, what)

    def shape(self, wire: int, shape: list[int]) -> None:
        """Append a tensor shape field's extents to ``shape``: packed (what every client
        sends) or one unpacked element (parsers must accept it too); at most
        :data:`MAX_DIMS` in all."""
        if wire == LEN:
            start, end = self.length()
            buf = self.buf
            while start < end and buf[start] < 0x80:  # one-byte extents: the usual
                shape.append(buf[start])
                start += 1
            if start < end:
                sub = Reader(buf, start, end, "shape")
                while sub.pos < sub.end:
                    shape.append(sub.int64())
        elif wire == VARINT:
            shape.append(self.int64())
        else:
            raise self.fail(f"shape has wire type {wire}, expected {LEN} or {VARINT}")
        if len(shape) > MAX_DIMS:
            raise self.fail(f"shape has more than {MAX_DIMS} extents")

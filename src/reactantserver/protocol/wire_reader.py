"""A cursor over protobuf's wire format: the one reader of the hand-written codecs.

Two places read protobuf bytes by hand rather than through betterproto: the worker's
ModelInfer codec (:mod:`.codec`, every field) and the gateway's peek
(:mod:`reactantserver.gateway.core.wire`, the model name, id and input shapes only). Both walk
a message with this cursor, so they keep the same protobuf rules and the same error
messages: fields in any order, unknown fields (groups included, up to
:data:`MAX_GROUP_DEPTH` deep) skipped, int64 as two's complement; malformed input raises
:class:`~reactantserver.errors.InvalidArgument` naming the message (``what``), the problem
and the byte offset. Pure Python, no protobuf runtime.

The work budget
---------------
Every field costs the reader a few hundred nanoseconds of Python, whatever its size, and a
message is decoded on the event loop: a few megabytes of three-byte fields are a million
fields, a second during which every other client waits (issue 41 measured 0.4 s for 3 MB
and 6 s for 30 MB). So every reader of one message shares one :class:`Budget`: each tag
read costs one unit (nested fields and unknown ones included, groups too), each element of
a packed varint list one unit (:meth:`Reader.charge`, counted before the list is read), and
past :data:`MAX_FIELDS` the message is refused with
:class:`~reactantserver.errors.InvalidArgument` saying why. A field that carries bytes
(a tensor, a string) costs one unit however long it is: its bytes are sliced, not walked.
:data:`MAX_FIELDS` is what the slowest fields (nested inputs, parameters) decode in about a
millisecond on a loaded core; a real request holds tens of fields.
"""

from __future__ import annotations

from reactantserver.errors import InvalidArgument

#: Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

#: Unknown groups are skipped recursively; deeper nesting is refused, not a RecursionError.
MAX_GROUP_DEPTH = 32
#: Most extents a tensor shape may hold (numpy's own limit; inferio refuses above 32).
MAX_DIMS = 64
#: Most fields one message may make a reader decode (module docstring, "The work budget").
MAX_FIELDS = 2048
#: Most inputs, outputs, raw entries or parameters one list or map of a ModelInfer request
#: may hold (the work budget bounds them all together).
MAX_ENTRIES = 512

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


_TENSORS_HINT = "; send tensors in raw_input_contents or shared memory"


class Budget:
    """The fields one message may still make its readers decode (shared by sub-readers)."""

    __slots__ = ("hint", "left", "limit", "what")

    def __init__(self, what: str, limit: int = MAX_FIELDS, hint: str = _TENSORS_HINT) -> None:
        self.what = what
        self.limit = limit
        self.left = limit
        self.hint = hint

    def spent(self) -> InvalidArgument:
        return InvalidArgument(
            f"{self.what} has more than {self.limit} protobuf fields (nested ones and the "
            "elements of packed integer lists counted): no client sends one so intricate, and "
            f"decoding it would hold up every other call{self.hint}"
        )


#: The bytes that continue a varint: deleted, what remains counts a packed list's elements.
_CONTINUATION = bytes(range(0x80, 0x100))


class Reader:
    """A cursor over ``buf[pos:end]`` for one message; errors name the message.

    ``budget`` is shared by every reader of one message (:meth:`sub` passes it on); the
    outermost reader makes one of :data:`MAX_FIELDS` when given none.
    """

    __slots__ = ("budget", "buf", "end", "pos", "what")

    def __init__(
        self,
        buf: bytes | memoryview,
        pos: int,
        end: int,
        what: str,
        budget: Budget | None = None,
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.what = what
        self.budget = budget if budget is not None else Budget(what)

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

    def charge(self, units: int) -> None:
        """Spend ``units`` of the message's budget (refused past it)."""
        budget = self.budget
        budget.left -= units
        if budget.left < 0:
            raise budget.spent()

    def charge_varints(self, start: int, end: int) -> None:
        """Spend one unit per varint in ``buf[start:end]`` (a packed list), counted in C."""
        self.charge(len(bytes(self.buf[start:end]).translate(None, _CONTINUATION)))

    def tag(self) -> tuple[int, int]:
        budget = self.budget
        budget.left -= 1
        if budget.left < 0:
            raise budget.spent()
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
        return Reader(self.buf, start, end, what, self.budget)

    def shape(self, wire: int, shape: list[int]) -> None:
        """Append a tensor shape field's extents to ``shape``: packed (what every client
        sends) or one unpacked element (parsers must accept it too); at most
        :data:`MAX_DIMS` in all."""
        if wire == LEN:
            start, end = self.length()
            if end - start > 10 * MAX_DIMS:  # more extents than allowed, even of ten bytes
                raise self.fail(f"shape has more than {MAX_DIMS} extents")
            buf = self.buf
            while start < end and buf[start] < 0x80:  # one-byte extents: the usual
                shape.append(buf[start])
                start += 1
            if start < end:
                sub = Reader(buf, start, end, "shape", self.budget)
                while sub.pos < sub.end:
                    shape.append(sub.int64())
        elif wire == VARINT:
            shape.append(self.int64())
        else:
            raise self.fail(f"shape has wire type {wire}, expected {LEN} or {VARINT}")
        if len(shape) > MAX_DIMS:
            raise self.fail(f"shape has more than {MAX_DIMS} extents")

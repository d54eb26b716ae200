"""What the gateway reads of the gRPC wire, without a protobuf runtime: the peek and grpc-timeout.

The gateway forwards every ModelInfer as the bytes it received. To route one it needs three
things from the message and nothing else: the model name (field 1), the request id
(field 3, for logs) and, for counting items, the shape of the model's batch input (field 5,
``inputs``: each input's name (1) and shape (3)). :func:`peek_infer` walks the message once
and collects exactly those; everything else -- parameters (shared-memory ones included),
typed contents, requested outputs and ``raw_input_contents`` -- is skipped by its length
prefix, never copied, never decoded, never re-encoded. The worker decodes the request in
full, with the same rules, when it arrives there.

Protobuf rules kept (those of ``reactantserver``'s lean ModelInfer codec): fields in any
order, unknown fields (groups included) skipped, a singular field sent twice keeps its last
value, packed and unpacked shapes both accepted, int64 read as two's complement. Malformed
input raises :class:`~reactantserver.errors.InvalidArgument` naming the field and the byte
offset -- the gateway answers it INVALID_ARGUMENT itself rather than forward bytes no worker
can read. The peek is deliberately no stricter than that: a field it does not need is only
skipped, so a request the worker would refuse for its content (a wrong datatype, a missing
input) is forwarded and refused there, with the worker's message.

:func:`encode_grpc_timeout` writes the ``grpc-timeout`` header of a forwarded call: the
remaining time in the finest unit whose value fits the header's eight digits (nanoseconds
below 0.1 s, microseconds below 100 s, milliseconds below about 27 hours), rounded down so
that forwarding never extends a client's deadline. (grpclib writes whole seconds above 10 s,
and the original gateway rounded every deadline *up* to whole seconds.)

Invariants (``tests/test_gateway_wire.py``): for any serialized ``ModelInferRequest`` the
peek returns the model name, id and input shapes that protobuf's own parser reads; for any
byte string it returns or raises ``InvalidArgument``, nothing else; an encoded timeout has at
most eight digits and reads back within its unit of the original, never above it.
"""

from __future__ import annotations

from ..errors import InvalidArgument

#: Protobuf wire types.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
#: Unknown groups are skipped recursively up to this depth (then refused).
MAX_GROUP_DEPTH = 32
#: Inputs and extents the peek keeps at most (numpy's own limit on dimensions is 64).
MAX_INPUTS = 4096
MAX_DIMS = 64

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


class InferPeek:
    """What routing reads of one ModelInferRequest."""

    __slots__ = ("id", "inputs", "model")

    def __init__(self, model: str, id: str, inputs: tuple[tuple[str, tuple[int, ...]], ...]):
        self.model = model
        self.id = id
        #: ``(name, wire shape)`` of each input, in the request's order.
        self.inputs = inputs

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """The shape of input ``name`` (the first of that name), or None if absent."""
        for input_name, shape in self.inputs:
            if input_name == name:
                return shape
        return None

    def __repr__(self) -> str:
        return f"InferPeek(model={self.model!r}, id={self.id!r}, inputs={self.inputs!r})"


class _Cursor:
    """A position in ``buf[pos:end]``; errors name ``what``."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf: bytes, pos: int, end: int, what: str) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.what = what

    def fail(self, problem: str) -> InvalidArgument:
        return InvalidArgument(f"malformed {self.what}: {problem}")

    def varint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        if pos < end and buf[pos] < 0x80:
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

    def length(self) -> tuple[int, int]:
        """The ``(start, end)`` of the length-delimited field at the cursor; moves past it."""
        at = self.pos
        size = self.varint()
        start = self.pos
        if size > self.end - start:
            raise self.fail(f"length {size} at byte {at} runs past the end ({self.end})")
        self.pos = start + size
        return start, start + size

    def string(self, field: str) -> str:
        start, end = self.length()
        try:
            return self.buf[start:end].decode()
        except UnicodeDecodeError:
            raise self.fail(f"{field} is not valid UTF-8") from None

    def tag(self) -> tuple[int, int]:
        at = self.pos
        key = self.varint()
        if key >> 3 == 0:
            raise self.fail(f"field number 0 at byte {at}")
        return key >> 3, key & 7

    def expect(self, wire: int, expected: int, field: str) -> None:
        if wire != expected:
            raise self.fail(f"{field} has wire type {wire}, expected {expected}")

    def skip(self, number: int, wire: int, depth: int = 0) -> None:
        if wire == VARINT:
            self.varint()
        elif wire == LEN:
            self.length()
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if self.pos + size > self.end:
                raise self.fail(f"fixed-width field {number} runs past the end")
            self.pos += size
        elif wire == SGROUP:
            if depth >= MAX_GROUP_DEPTH:
                raise self.fail(f"groups nested deeper than {MAX_GROUP_DEPTH}")
            while True:
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


def _int64(value: int) -> int:
    return value - (1 << 64) if value & _SIGN64 else value


def _input(c: _Cursor) -> tuple[str, tuple[int, ...]]:
    name = ""
    shape: list[int] = []
    while c.pos < c.end:
        number, wire = c.tag()
        if number == 1:
            c.expect(wire, LEN, "input name")
            name = c.string("input name")
        elif number == 3:
            if wire == LEN:  # packed: what every client sends
                start, end = c.length()
                packed = _Cursor(c.buf, start, end, c.what)
                while packed.pos < packed.end:
                    shape.append(_int64(packed.varint()))
            elif wire == VARINT:  # unpacked: parsers must accept it too
                shape.append(_int64(c.varint()))
            else:
                raise c.fail(f"shape has wire type {wire}, expected {LEN} or {VARINT}")
            if len(shape) > MAX_DIMS:
                raise c.fail(f"shape has more than {MAX_DIMS} extents")
        else:
            c.skip(number, wire)
    return name, tuple(shape)


def peek_infer(data: bytes) -> InferPeek:
    """Read the model name, id and input shapes of a serialized ``ModelInferRequest``."""
    c = _Cursor(data, 0, len(data), "ModelInferRequest")
    model = ""
    request_id = ""
    inputs: list[tuple[str, tuple[int, ...]]] = []
    while c.pos < c.end:
        number, wire = c.tag()
        if number == 7:  # raw_input_contents: the tensor bytes, skipped by length
            c.expect(wire, LEN, "raw_input_contents")
            c.length()
        elif number == 5:
            c.expect(wire, LEN, "inputs")
            if len(inputs) >= MAX_INPUTS:
                raise c.fail(f"more than {MAX_INPUTS} inputs")
            start, end = c.length()
            inputs.append(_input(_Cursor(data, start, end, "ModelInferRequest.InferInputTensor")))
        elif number == 1:
            c.expect(wire, LEN, "model_name")
            model = c.string("model_name")
        elif number == 3:
            c.expect(wire, LEN, "id")
            request_id = c.string("id")
        else:
            c.skip(number, wire)
    return InferPeek(model, request_id, tuple(inputs))


def peek_name(data: bytes, field: int = 1, what: str = "request") -> str:
    """The string in ``field`` of a small request message (``name`` of ModelReadyRequest,
    ModelMetadataRequest, ModelConfigRequest, ModelStatisticsRequest: field 1)."""
    c = _Cursor(data, 0, len(data), what)
    value = ""
    while c.pos < c.end:
        number, wire = c.tag()
        if number == field:
            c.expect(wire, LEN, f"field {field}")
            value = c.string(f"field {field}")
        else:
            c.skip(number, wire)
    return value


#: ``(unit, units per second)`` from the finest; grpc-timeout allows at most 8 digits.
_UNITS: tuple[tuple[str, float], ...] = (
    ("n", 1e9),
    ("u", 1e6),
    ("m", 1e3),
    ("S", 1.0),
    ("M", 1 / 60),
    ("H", 1 / 3600),
)
_MAX_DIGITS = 10**8


def encode_grpc_timeout(seconds: float) -> str:
    """``grpc-timeout`` for ``seconds`` left: the finest unit that fits, rounded down."""
    if not seconds > 0:
        return "0n"
    for unit, scale in _UNITS:
        value = int(seconds * scale)
        if value < _MAX_DIGITS:
            return f"{value}{unit}"
    return f"{_MAX_DIGITS - 1}H"  # more than 11,000 years: as good as none


_UNIT_SECONDS = {unit: 1 / scale for unit, scale in _UNITS}


def decode_grpc_timeout(text: str) -> float:
    """Seconds of a ``grpc-timeout`` value (``ValueError`` if malformed)."""
    digits, unit = text[:-1], text[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _UNIT_SECONDS:
        raise ValueError(f"malformed grpc-timeout {text!r}")
    return int(digits) * _UNIT_SECONDS[unit]


def grpc_message(data: bytes | memoryview) -> bytes | memoryview:
    """The 5-byte gRPC length prefix and ``data``, as one buffer to send (one copy)."""
    return b"\x00" + len(data).to_bytes(4, "big") + data

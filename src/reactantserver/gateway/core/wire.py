"""What the gateway reads of the gRPC wire, without a protobuf runtime: the peek.

The gateway forwards every ModelInfer as the bytes it received. To route one it needs four
things from the message and nothing else: the model name (field 1), the version asked for
(field 2, checked by the gateway itself: ``reactantserver.model_version``), the request id
(field 3, for logs) and, for counting items, the shape of the model's batch input (field 5,
``inputs``: each input's name (1) and shape (3)). :func:`peek_infer` walks the message once
and collects exactly those; everything else -- parameters (shared-memory ones included),
typed contents, requested outputs and ``raw_input_contents`` -- is skipped by its length
prefix, never copied, never decoded, never re-encoded. The worker decodes the request in
full, with the same rules, when it arrives there.

Protobuf rules kept (those of ``reactantserver``'s lean ModelInfer codec): fields in any
order, unknown fields (groups included) skipped, a singular field sent twice keeps its last
value, packed and unpacked shapes both accepted, int64 read as two's complement; and its
work budget: a message of more than ``wire_reader.MAX_FIELDS`` fields (counted as the peek
walks them) is refused here, on the gateway's loop, in about a millisecond. Malformed
input raises :class:`~reactantserver.errors.InvalidArgument` naming the field and the byte
offset -- the gateway answers it INVALID_ARGUMENT itself rather than forward bytes no worker
can read. The peek is deliberately no stricter than that: a field it does not need is only
skipped, so a request the worker would refuse for its content (a wrong datatype, a missing
input) is forwarded and refused there, with the worker's message.

The ``grpc-timeout`` of a forwarded call is written by
:func:`reactantserver.grpcwire.encode_grpc_timeout` (rounded down: forwarding never
extends a client's deadline).

Invariants (``tests/gateway/test_gateway_wire.py``): for any serialized ``ModelInferRequest`` the
peek returns the model name, version, id and input shapes that protobuf's own parser reads; for any
byte string it returns or raises ``InvalidArgument``, nothing else.
"""

from __future__ import annotations

from reactantserver.errors import InvalidArgument
from reactantserver.protocol.wire_reader import LEN, MAX_DIMS, MAX_ENTRIES, MAX_FIELDS, Budget
from reactantserver.protocol.wire_reader import Reader as _Cursor

#: Inputs the peek keeps at most (the codec's bound; extents: ``wire_reader.MAX_DIMS``).
MAX_INPUTS = MAX_ENTRIES


class InferPeek:
    """What routing reads of one ModelInferRequest."""

    __slots__ = ("id", "inputs", "model", "version")

    def __init__(
        self,
        model: str,
        id: str,
        inputs: tuple[tuple[str, tuple[int, ...]], ...],
        version: str = "",
    ):
        self.model = model
        self.id = id
        #: ``model_version`` as sent (the gateway checks it: ``reactantserver.model_version``).
        self.version = version
        #: ``(name, wire shape)`` of each input, in the request's order.
        self.inputs = inputs

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """The shape of input ``name`` (the first of that name), or None if absent."""
        for input_name, shape in self.inputs:
            if input_name == name:
                return shape
        return None

    def __repr__(self) -> str:
        return (
            f"InferPeek(model={self.model!r}, version={self.version!r}, id={self.id!r}, "
            f"inputs={self.inputs!r})"
        )


def _input(c: _Cursor) -> tuple[str, tuple[int, ...]]:
    name = ""
    shape: list[int] = []
    while c.pos < c.end:
        number, wire = c.tag()
        if number == 1:
            c.expect(wire, LEN, "input name")
            name = c.string("input name")
        elif number == 3:
            c.shape(wire, shape)
        else:
            c.skip(number, wire)
    return name, tuple(shape)


def peek_infer(data: bytes | memoryview) -> InferPeek:
    """Read the model name, id and input shapes of a serialized ``ModelInferRequest``."""
    peek = _peek_usual(data)
    return peek if peek is not None else _peek(data)


def _varint_at(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """A varint of at most four bytes at ``pos`` and the position after it; ``(-1, pos)``
    for anything else (truncated, or longer: :func:`_peek` judges it)."""
    value = shift = 0
    for at in range(pos, min(pos + 4, end)):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + 1
        shift += 7
    return -1, pos


def _usual_field(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """The field at ``pos`` as :func:`_peek_usual` takes it: ``(number, start, stop)`` of
    a length-delimited field under a one-byte tag whose length (below 2^28) fits before
    ``end``; number 0 for anything else. (The peek inlines its usual case: a length
    below 128.)"""
    key = data[pos]
    if key & 7 != LEN or not 8 <= key < 0x80:
        return 0, pos, pos
    size = data[pos + 1] if pos + 1 < end else 0x80
    if size < 0x80:
        start = pos + 2
    else:
        size, start = _varint_at(data, pos + 1, end)
        if size < 0:
            return 0, pos, pos
    stop = start + size
    return (key >> 3, start, stop) if stop <= end else (0, pos, pos)


def _spent() -> InvalidArgument:
    """The work budget's refusal, as :func:`_peek`'s cursor words it. The usual path
    counts the fields the general one would (every tag it reads, all well-formed up to
    here), so it refuses at the same field, without reading them all again."""
    return Budget("ModelInferRequest").spent()


def _peek_usual(data: bytes | memoryview) -> InferPeek | None:
    """:func:`_peek` for the message every client sends, in one pass of plain loops:
    every field length-delimited under a one-byte tag, lengths and extents below 2^28,
    text that is UTF-8. None for anything else -- :func:`_peek` then reads the message
    again and gives its answer or its error. Where both answer, they answer alike
    (``tests/gateway/test_gateway_wire.py``)."""
    end = len(data)
    pos = 0
    model = request_id = version = ""
    inputs: list[tuple[str, tuple[int, ...]]] = []
    left = MAX_FIELDS  # the work budget (``wire_reader``): past it, _peek refuses
    try:
        while pos < end:
            left -= 1
            if left < 0:
                raise _spent()  # what _peek would say, having read the same fields
            # _usual_field, inlined for a field shorter than 128 bytes (a tensor's bytes
            # take the call)
            key = data[pos]
            size = data[pos + 1] if pos + 1 < end else 0x80
            if size < 0x80 and key & 7 == LEN and 8 <= key < 0x80 and pos + 2 + size <= end:
                number, pos, stop = key >> 3, pos + 2, pos + 2 + size
            else:
                number, pos, stop = _usual_field(data, pos, end)
            if number == 1:
                model = str(data[pos:stop], "utf-8")
            elif number == 3:
                request_id = str(data[pos:stop], "utf-8")
            elif number == 2:
                version = str(data[pos:stop], "utf-8")
            elif number == 5:
                tensor = _input_usual(data, pos, stop)
                if tensor is None or len(inputs) >= MAX_INPUTS:
                    return None
                name, shape, fields = tensor
                left -= fields
                if left < 0:
                    raise _spent()
                inputs.append((name, shape))
            elif number == 0:
                return None
            pos = stop
    except UnicodeDecodeError:
        return None
    return InferPeek(model, request_id, tuple(inputs), version)


def _input_usual(
    data: bytes | memoryview, pos: int, end: int
) -> tuple[str, tuple[int, ...], int] | None:
    """One ``InferInputTensor`` the way :func:`_peek_usual` reads (shape packed), with the
    number of fields it holds; UnicodeDecodeError for a name that is not UTF-8."""
    name = ""
    shape: list[int] = []
    fields = 0
    while pos < end:
        fields += 1
        if fields > MAX_FIELDS:
            raise _spent()
        key = data[pos]
        size = data[pos + 1] if pos + 1 < end else 0x80
        if size < 0x80 and key & 7 == LEN and 8 <= key < 0x80 and pos + 2 + size <= end:
            number, pos, stop = key >> 3, pos + 2, pos + 2 + size
        else:
            number, pos, stop = _usual_field(data, pos, end)
        if number == 1:
            name = str(data[pos:stop], "utf-8")
        elif number == 3:
            if stop - pos > 10 * MAX_DIMS:
                return None  # more extents than allowed: _peek says so
            while pos < stop:
                extent = data[pos]
                if extent < 0x80:
                    pos += 1
                else:
                    extent, pos = _varint_at(data, pos, stop)
                    if extent < 0:
                        return None
                shape.append(extent)
            if len(shape) > MAX_DIMS:
                return None
        elif number == 0:
            return None
        pos = stop
    return name, tuple(shape), fields


def _peek(data: bytes | memoryview) -> InferPeek:
    """The peek for any bytes: protobuf's rules in full, malformed input named."""
    c = _Cursor(data, 0, len(data), "ModelInferRequest")
    model = ""
    request_id = ""
    version = ""
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
            tensor = _Cursor(data, start, end, "ModelInferRequest.InferInputTensor", c.budget)
            inputs.append(_input(tensor))
        elif number == 1:
            c.expect(wire, LEN, "model_name")
            model = c.string("model_name")
        elif number == 3:
            c.expect(wire, LEN, "id")
            request_id = c.string("id")
        elif number == 2:
            c.expect(wire, LEN, "model_version")
            version = c.string("model_version")
        else:
            c.skip(number, wire)
    return InferPeek(model, request_id, tuple(inputs), version)


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


def grpc_message(data: bytes | memoryview) -> bytes | memoryview:
    """The 5-byte gRPC length prefix and ``data``, as one buffer to send (one copy)."""
    return b"\x00" + len(data).to_bytes(4, "big") + data

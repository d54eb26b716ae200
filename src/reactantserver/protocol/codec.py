"""The ModelInfer wire codec: request bytes in, response bytes out, no message objects.

Why a second codec
------------------
betterproto builds a dataclass per message and routes every field access through a
``__getattribute__`` hook; for ModelInfer, the one RPC on the hot path, decoding and
encoding with it cost more CPU than grpclib's whole HTTP/2 exchange (docs/benchmarks.md
has the profile). This module reads and writes exactly the two ModelInfer messages
of ``proto/inference.proto`` by hand; every other message keeps betterproto.

Theory of operation
-------------------
:func:`decode_infer_request` walks the received ``bytes`` once, field by field
(``tag = field_number << 3 | wire_type``), into the plain slotted records of
:mod:`reactantserver.records` (a leaf module, so ``inferio`` and the service use them
without importing the transport):

* strings are decoded (UTF-8, as protobuf requires); ``shape`` is a list of ints;
* ``raw_input_contents`` entries are ``memoryview`` slices of the received buffer --
  no copy; ``inferio`` views them with ``np.frombuffer``;
* ``parameters`` maps become ``dict[str, value]`` with plain values: ``bool``
  (``bool_param``), ``int`` (``int64_param`` and ``uint64_param``), ``str``
  (``string_param``), ``float`` (``double_param``), or ``None`` for a parameter with
  no value set;
* typed ``contents`` (``InferTensorContents``) become a :class:`TensorContents` of
  compact ``array.array``\\ s (4 or 8 bytes an element, not a Python object each; packed
  floats are copied in one go), read with protobuf's rules for each scalar type (int32
  keeps the low 32 bits, packed or unpacked, chunks append); ``bytes_contents`` is a
  list of ``bytes``.

A client sends one request *layout* again and again (the same model, inputs, shapes and
parameters; new tensors): :class:`Layout` keeps the decode of a recent layout's bytes, so
a message of it is not parsed again, only its raw contents cut out; ``inferio`` keeps
its validation against each model version beside it. A message whose raw contents do
not come last, or whose head is long, is parsed every time.

:func:`encode_infer_response` writes an :class:`InferResponse` straight to bytes with
one ``b"".join``: raw outputs may be ``memoryview``\\ s of result arrays, so the join
is their only copy; :func:`encode_infer_response_parts` leaves the pieces unjoined, for
the transport to frame directly. Output parameters (only the echo of shared-memory parameters) are
``InferParameter`` messages serialized by betterproto.
:func:`stream_response_head` and :func:`encode_stream_error` write ModelStreamInfer's
``ModelStreamInferResponse`` around those pieces (or an error), for worker and gateway.

Protobuf rules kept (what ``tritonclient``'s protobuf runtime does, checked by
tests/worker/test_codec.py against it and against betterproto): fields in any order, unknown
fields skipped (groups included), a singular field sent twice keeps its last value, a
message field sent twice merges, packed and unpacked repeated scalars both accepted (a packed
list sent in several chunks is their concatenation -- betterproto keeps only the last
chunk, one reason typed contents are not handed to it), int64 read as 64-bit two's
complement, proto3 defaults (zero, empty) not written.

Hostile input never escapes as anything but :class:`~reactantserver.errors.InvalidArgument`
naming the message, the field and the byte offset: truncated varints, varints longer
than ten bytes, lengths past the end of the enclosing message, field number 0, a
known field with the wrong wire type (protobuf's runtimes skip it as unknown; this
codec says what is wrong instead, since no correct client sends one), invalid UTF-8. Memory stays proportional to the message (which
``endpoints.max_message_bytes`` bounds) with a small factor: fields that become a
Python object each (inputs, outputs, raw entries, parameters) are capped at
:data:`MAX_ENTRIES` per list or map and shapes at ``wire_reader.MAX_DIMS``, so that a message
of millions of empty fields cannot turn into gigabytes of objects. Time is bounded too:
the reader's work budget (``wire_reader.MAX_FIELDS`` fields, packed integers counted one
each) refuses a message that would hold the event loop for more than about a millisecond,
whatever its fields are -- unknown ones, repeated singular ones, typed contents.

Why one module of this size: the reader and the writer of one RPC's two messages,
sharing the wire constants; most of it is the reader's precise error paths.
"""

from __future__ import annotations

import functools
import itertools
import struct
import sys
from array import array
from typing import Any

from reactantserver.errors import InvalidArgument
from reactantserver.protocol import inference as pb
from reactantserver.protocol.wire_reader import (
    I32,
    I64,
    LEN,
    MAX_ENTRIES,
    VARINT,
)
from reactantserver.protocol.wire_reader import Reader as _Reader
from reactantserver.records import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    ParamValue,
    RequestedOutput,
    TensorContents,
)

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_MASK32 = (1 << 32) - 1
_SIGN32 = 1 << 31
_DOUBLE = struct.Struct("<d")

# ------------------------------------------------------------------------------ reading


def _parameter(r: _Reader) -> ParamValue:
    value: ParamValue = None
    while r.pos < r.end:
        number, wire = r.tag()
        if number == 1:
            r.expect(wire, VARINT, "bool_param")
            value = r.varint() != 0
        elif number == 2:
            r.expect(wire, VARINT, "int64_param")
            value = r.int64()
        elif number == 3:
            r.expect(wire, LEN, "string_param")
            value = r.string("string_param")
        elif number == 4:
            r.expect(wire, I64, "double_param")
            if r.pos + 8 > r.end:
                raise r.fail("double_param runs past the end of the message")
            (value,) = _DOUBLE.unpack_from(r.buf, r.pos)
            r.pos += 8
        elif number == 5:
            r.expect(wire, VARINT, "uint64_param")
            value = r.varint()
        else:
            r.skip(number, wire)
    return value


def _map_entry(r: _Reader, params: dict[str, ParamValue]) -> None:
    """One ``map<string, InferParameter>`` entry (a message with key 1, value 2)."""
    entry = r.sub("parameters entry")
    key = ""
    value: ParamValue = None
    while entry.pos < entry.end:
        number, wire = entry.tag()
        if number == 1:
            entry.expect(wire, LEN, "parameters key")
            key = entry.string("parameters key")
        elif number == 2:
            entry.expect(wire, LEN, "parameters value")
            value = _parameter(entry.sub("InferParameter"))
        else:
            entry.skip(number, wire)
    if key not in params and len(params) >= MAX_ENTRIES:
        raise r.fail(f"more than {MAX_ENTRIES} parameters")
    params[key] = value


#: InferTensorContents: field number -> (attribute, wire type of one element, decode).
_CONTENTS: dict[int, tuple[str, int, Any]] = {
    1: ("bool_contents", VARINT, lambda v: int(v != 0)),
    2: ("int_contents", VARINT, lambda v: (v & _MASK32) - ((v & _SIGN32) << 1)),
    3: ("int64_contents", VARINT, lambda v: v - ((v & _SIGN64) << 1)),
    4: ("uint_contents", VARINT, lambda v: v & _MASK32),
    5: ("uint64_contents", VARINT, lambda v: v),
    6: ("fp32_contents", I32, None),
    7: ("fp64_contents", I64, None),
}
_FIXED = {I32: struct.Struct("<f"), I64: struct.Struct("<d")}
#: Packed fixed-width values are little-endian on the wire; ``array`` uses native order.
_SWAP = sys.byteorder != "little"


def _contents(r: _Reader, contents: TensorContents) -> None:
    """Append one ``contents`` field's elements (a message sent twice merges)."""
    while r.pos < r.end:
        number, wire = r.tag()
        if number == 8:
            r.expect(wire, LEN, "bytes_contents")
            start, end = r.length()
            contents.bytes_contents.append(bytes(r.buf[start:end]))
            continue
        known = _CONTENTS.get(number)
        if known is None:
            r.skip(number, wire)
            continue
        name, element, convert = known
        values: array[Any] = getattr(contents, name)
        if wire == LEN:  # packed: the usual encoding
            packed = r.sub(f"contents.{name}")
            if element == VARINT:
                packed.charge_varints(packed.pos, packed.end)  # the work budget
                while packed.pos < packed.end:
                    values.append(convert(packed.varint()))
            else:
                if (packed.end - packed.pos) % values.itemsize:
                    raise r.fail(f"contents.{name} holds a partial element")
                chunk = array(values.typecode, r.buf[packed.pos : packed.end])
                if _SWAP:
                    chunk.byteswap()
                values.extend(chunk)
        elif wire == element:  # unpacked
            if element == VARINT:
                values.append(convert(r.varint()))
            else:
                fmt = _FIXED[element]
                if r.pos + fmt.size > r.end:
                    raise r.fail(f"contents.{name} runs past the end of the message")
                values.append(fmt.unpack_from(r.buf, r.pos)[0])
                r.pos += fmt.size
        else:
            raise r.fail(f"contents.{name} has wire type {wire}, expected {element} or {LEN}")


def _input(r: _Reader) -> InputTensor:
    tensor = InputTensor()
    while r.pos < r.end:
        number, wire = r.tag()
        if number == 1:
            r.expect(wire, LEN, "input name")
            tensor.name = r.string("input name")
        elif number == 2:
            r.expect(wire, LEN, "input datatype")
            tensor.datatype = r.string("input datatype")
        elif number == 3:
            r.shape(wire, tensor.shape)
        elif number == 4:
            r.expect(wire, LEN, "input parameters")
            _map_entry(r, tensor.parameters)
        elif number == 5:
            r.expect(wire, LEN, "input contents")
            if tensor.contents is None:
                tensor.contents = TensorContents()
            _contents(r.sub("InferTensorContents"), tensor.contents)
        else:
            r.skip(number, wire)
    return tensor


def _requested_output(r: _Reader) -> RequestedOutput:
    out = RequestedOutput()
    while r.pos < r.end:
        number, wire = r.tag()
        if number == 1:
            r.expect(wire, LEN, "output name")
            out.name = r.string("output name")
        elif number == 2:
            r.expect(wire, LEN, "output parameters")
            _map_entry(r, out.parameters)
        else:
            r.skip(number, wire)
    return out


def _room(r: _Reader, entries: list[Any], what: str) -> None:
    if len(entries) >= MAX_ENTRIES:
        raise r.fail(f"more than {MAX_ENTRIES} {what}")


#: A message handed over as a view is copied to ``bytes`` up to this size (indexing bytes
#: is fastest); a larger one is read in place, so its tensors are never copied here.
COPY_BELOW = 64 * 1024


def decode_infer_request(data: bytes | memoryview) -> InferRequest:
    """Decode a serialized ``ModelInferRequest`` (see the module docstring). A message
    of a layout seen lately (:class:`Layout`) is not parsed again: only its raw contents
    are cut from it."""
    if not isinstance(data, bytes):
        if len(data) >= COPY_BELOW:
            return _parse(data, None)
        data = bytes(data)
    for layout in _LAYOUTS.get(len(data), ()):
        if layout.matches(data):
            return layout.request(data)
    spans: list[tuple[int, int, int]] = []
    request = _parse(data, spans)
    _remember(data, request, spans)
    return request


def _parse(data: bytes | memoryview, spans: list[tuple[int, int, int]] | None) -> InferRequest:
    """The field-by-field decode; ``spans`` (if given) gets, for each raw input, where
    its field begins and where its contents begin and end."""
    view = memoryview(data)
    r = _Reader(data, 0, len(data), "ModelInferRequest")
    request = InferRequest()
    while r.pos < r.end:
        at = r.pos
        number, wire = r.tag()
        if number == 7:
            r.expect(wire, LEN, "raw_input_contents")
            start, end = r.length()
            _room(r, request.raw_input_contents, "raw_input_contents entries")
            request.raw_input_contents.append(view[start:end])
            if spans is not None:
                spans.append((at, start, end))
        elif number == 5:
            r.expect(wire, LEN, "inputs")
            _room(r, request.inputs, "inputs")
            request.inputs.append(_input(r.sub("ModelInferRequest.InferInputTensor")))
        elif number == 1:
            r.expect(wire, LEN, "model_name")
            request.model_name = r.string("model_name")
        elif number == 2:
            r.expect(wire, LEN, "model_version")
            request.model_version = r.string("model_version")
        elif number == 3:
            r.expect(wire, LEN, "id")
            request.id = r.string("id")
        elif number == 4:
            r.expect(wire, LEN, "parameters")
            _map_entry(r, request.parameters)
        elif number == 6:
            r.expect(wire, LEN, "outputs")
            _room(r, request.outputs, "outputs")
            request.outputs.append(
                _requested_output(r.sub("ModelInferRequest.InferRequestedOutputTensor"))
            )
        else:
            r.skip(number, wire)
    return request


class Layout:
    """A ModelInferRequest *layout*: a message's bytes but for its raw contents.

    A client sends the same request again and again with new tensors: the same model,
    inputs, shapes and parameters, the raw contents last (protobuf writes fields in
    number order, ``raw_input_contents`` is 7). Two messages of one size whose bytes agree
    outside the raw contents decode alike but for those contents (the parse only cuts
    them out), so a layout keeps what its bytes decoded to, once, and a later message of
    it is not parsed: its request shares the layout's head (model, inputs, outputs,
    parameters: read, never changed) and gets views of its own contents. ``inferio``
    keeps the layout's validation against each model version beside it (``checked``).
    """

    __slots__ = ("_head", "_seps", "_spans", "checked", "skeleton")

    def __init__(self, data: bytes, request: InferRequest, spans: list[tuple[int, int, int]]):
        #: The bytes up to the first raw contents, and those between two raw contents
        #: (each next field's tag and length) with where they are.
        self._head = data[: spans[0][1]]
        self._seps = tuple((at, data[at:start]) for at, start, _ in spans[1:])
        self._spans = tuple((start, end) for _, start, end in spans)
        #: The head's decode, without the first message's raw contents (not kept alive).
        self.skeleton = _with_contents(request, [], None)
        #: ``inferio.decode_request``'s own: what it checked against a model version.
        self.checked: dict[int, Any] = {}

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` (of the layout's size) is of this layout."""
        return data.startswith(self._head) and all(
            data.startswith(sep, at) for at, sep in self._seps
        )

    def request(self, data: bytes) -> InferRequest:
        """``data``'s request: the layout's head, and views of ``data``'s raw contents."""
        view = memoryview(data)
        raw: list[memoryview | bytes] = [view[start:end] for start, end in self._spans]
        return _with_contents(self.skeleton, raw, self)


def _with_contents(
    head: InferRequest, raw: list[memoryview | bytes], layout: Layout | None
) -> InferRequest:
    """A request with ``head``'s fields (shared, not copied) and the raw contents ``raw``."""
    request = InferRequest()
    request.model_name = head.model_name
    request.model_version = head.model_version
    request.id = head.id
    request.parameters = head.parameters
    request.inputs = head.inputs
    request.outputs = head.outputs
    request.raw_input_contents = raw
    request.layout = layout
    return request


#: Recent layouts by message size; at most ``LAYOUTS`` of them (all forgotten when a new
#: one would pass that: a client that never repeats itself costs a parse, as without them),
#: and only of a head of at most ``LAYOUT_HEAD`` bytes, so they hold at most about 1 MiB.
_LAYOUTS: dict[int, list[Layout]] = {}
LAYOUTS = 256
LAYOUT_HEAD = 4096
_layout_count = 0


def _remember(data: bytes, request: InferRequest, spans: list[tuple[int, int, int]]) -> None:
    """Keep the layout of a message just parsed, when its raw contents come last, one
    after the other (the usual message: anything else is parsed each time)."""
    global _layout_count
    if not spans or spans[0][1] > LAYOUT_HEAD or spans[-1][2] != len(data):
        return
    for (_, _, end), (at, _, _) in itertools.pairwise(spans):
        if at != end:
            return
    if _layout_count >= LAYOUTS:
        _LAYOUTS.clear()
        _layout_count = 0
    layout = Layout(data, request, spans)
    _LAYOUTS.setdefault(len(data), []).append(layout)
    _layout_count += 1
    request.layout = layout


def from_message(message: pb.ModelInferRequest) -> InferRequest:
    """The lean form of a betterproto ``ModelInferRequest`` (tests, direct callers).

    It goes through the wire format, so it is exactly what the server would decode;
    only the raw contents are the message's own ``bytes`` objects (not copies).
    """
    request = decode_infer_request(bytes(message))
    request.raw_input_contents = list(message.raw_input_contents)
    return request


# ------------------------------------------------------------------------------ writing


def encode_varint(value: int) -> bytes:
    """``value`` as a protobuf varint."""
    value &= _MASK64  # negative int64: ten bytes of two's complement, as protobuf does
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


def _tag(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def _len_field(parts: list[Any], tag: bytes, payload: bytes | memoryview) -> None:
    parts.append(tag)
    parts.append(encode_varint(len(payload) if isinstance(payload, bytes) else payload.nbytes))
    parts.append(payload)


_T_NAME, _T_DATATYPE, _T_SHAPE, _T_TPARAMS = (_tag(n, LEN) for n in (1, 2, 3, 4))
_T_MODEL, _T_VERSION, _T_ID = (_tag(n, LEN) for n in (1, 2, 3))
_T_OUTPUT, _T_RAW = _tag(5, LEN), _tag(6, LEN)
_T_KEY, _T_VALUE = _tag(1, LEN), _tag(2, LEN)


def _output_tensor(tensor: OutputTensor) -> bytes:
    head = _output_head(tensor.name, tensor.datatype, tuple(tensor.shape))
    if not tensor.parameters:
        return head
    parts: list[Any] = [head]
    for key, param in tensor.parameters.items():
        entry: list[Any] = []
        if key:
            _len_field(entry, _T_KEY, key.encode())
        _len_field(entry, _T_VALUE, bytes(param))
        _len_field(parts, _T_TPARAMS, b"".join(entry))
    return b"".join(parts)


@functools.lru_cache(maxsize=4096)
def _output_head(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    """An output tensor's name, datatype and shape fields, encoded once for each: a model
    answers the same few again and again (one per output and row count)."""
    parts: list[Any] = []
    if name:
        _len_field(parts, _T_NAME, name.encode())
    if datatype:
        _len_field(parts, _T_DATATYPE, datatype.encode())
    if shape:
        _len_field(parts, _T_SHAPE, b"".join([encode_varint(d) for d in shape]))
    return b"".join(parts)


def encode_infer_response(response: InferResponse) -> bytes:
    """Serialize ``response`` as a ``ModelInferResponse``: the raw outputs' one copy."""
    return b"".join(encode_infer_response_parts(response))


def encode_infer_response_parts(response: InferResponse) -> list[bytes | memoryview]:
    """``response`` serialized as pieces whose concatenation is the message: raw outputs
    stay the views they were given, so a writer that frames the pieces itself copies
    each byte of them once (into its frames) instead of joining them first."""
    return encode_infer_response_sized(response)[0]


def encode_infer_response_sized(response: InferResponse) -> tuple[list[bytes | memoryview], int]:
    """:func:`encode_infer_response_parts` and the message's size in bytes. The small
    fields between two raw outputs are joined into one piece as they are made (a
    one-output answer is two pieces: its fields and the tensor's bytes), so that the
    writer and the size see a handful of pieces, not one per field."""
    fields: list[Any] = []
    if response.model_name:
        _len_field(fields, _T_MODEL, response.model_name.encode())
    if response.model_version:
        _len_field(fields, _T_VERSION, response.model_version.encode())
    if response.id:
        _len_field(fields, _T_ID, response.id.encode())
    for tensor in response.outputs:
        _len_field(fields, _T_OUTPUT, _output_tensor(tensor))
    parts: list[bytes | memoryview] = []
    size = 0
    for raw in response.raw_output_contents:
        length = len(raw) if isinstance(raw, bytes) else raw.nbytes
        fields.append(_T_RAW)
        fields.append(encode_varint(length))
        head = b"".join(fields)
        parts.append(head)
        parts.append(raw)
        size += len(head) + length
        fields = []
    if fields:
        tail = b"".join(fields)
        parts.append(tail)
        size += len(tail)
    return parts, size


# ------------------------------------------------------------------------------ streaming

_T_ERROR_MESSAGE, _T_INFER_RESPONSE = _tag(1, LEN), _tag(2, LEN)


def stream_response_head(size: int) -> bytes:
    """What goes before a serialized ``ModelInferResponse`` of ``size`` bytes to make it a
    ``ModelStreamInferResponse`` carrying it (its ``infer_response``, no error): the
    response's pieces follow unjoined, so its tensors are not copied."""
    return _T_INFER_RESPONSE + encode_varint(size)


def encode_stream_error(request: bytes | memoryview, message: str) -> list[bytes | memoryview]:
    """A ``ModelStreamInferResponse`` carrying ``message`` as the error of the request
    whose bytes are ``request``, and, as Triton does, an ``infer_response`` holding only
    the request's id (so that a client can tell which request failed)."""
    out: list[bytes | memoryview] = []
    _len_field(out, _T_ERROR_MESSAGE, message.encode())
    request_id = peek_request_id(request)
    inner = (
        [_T_ID, encode_varint(len(request_id.encode())), request_id.encode()] if request_id else []
    )
    _len_field(out, _T_INFER_RESPONSE, b"".join(inner))
    return out


def peek_request_id(data: bytes | memoryview) -> str:
    """The ``id`` of a serialized ``ModelInferRequest`` (field 3, its last value); ""
    when it has none or the bytes are not a message (an error answer names no id then)."""
    r = _Reader(data, 0, len(data), "ModelInferRequest")
    request_id = ""
    try:
        while r.pos < r.end:
            number, wire = r.tag()
            if number == 3 and wire == LEN:
                request_id = r.string("id")
            else:
                r.skip(number, wire)
    except InvalidArgument:
        return request_id
    return request_id

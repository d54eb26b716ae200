"""ModelInfer's two messages in protobuf, by hand: the request out, the response in.

Why by hand
-----------
ModelInfer is the one call on the hot path. betterproto spends about 0.4 ms of CPU per
call building and reading these two messages (a dataclass per message, a
``__getattribute__`` hook per field access), a fifth of a small call's round trip, and
copies every tensor several times on the way. Both messages are small and fixed
(``proto/inference.proto``), so this module writes the request and reads the response
directly; every other RPC keeps the generated betterproto messages. (The server reads
requests and writes responses with its own codec, ``reactantserver.protocol.codec``;
this is the mirror image, for the client.)

Writing (:meth:`InferRequestWire.SerializeToString`): fields in number order, proto3
defaults (empty strings, empty lists) left out, ``shape`` packed, a parameter's oneof
member written even when it holds its default (that is how presence works for oneofs),
and the raw contents -- ``bytes`` or ``memoryview`` of the caller's arrays -- appended as
repeated field 7 at the end. :meth:`InferRequestWire.parts` leaves the pieces unjoined
(the client sends them as they are, :mod:`.channel`); ``SerializeToString`` joins them once.

Reading (:meth:`InferResponseWire.FromString`): one pass over the received bytes; strings
decoded, ``shape`` accepted packed or not, int64 read as two's complement, unknown fields
skipped, the last value of a repeated singular field winning (protobuf's rules);
``raw_output_contents`` entries are ``memoryview`` slices of the received buffer (no
copy); typed ``contents`` (rare) are handed to betterproto. A malformed answer raises
``ExecutionFailed`` naming what broke and where.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from reactantserver.errors import ExecutionFailed
from reactantserver.protocol import inference as pb

#: A parameter value: bool_param, int64_param (uint64_param past int64), double_param,
#: string_param; ``None`` for a parameter with no member set.
ParamValue = bool | int | float | str | None

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1

#: A received message: ``bytes``, or a read-only view of the buffer it was read into.
Received = bytes | memoryview

# ------------------------------------------------------------------------------ writing


def _varint(value: int) -> bytes:
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes | memoryview) -> bytes:
    return b"".join((_key(number, LEN), _varint(len(payload)), payload))


def _parameter(value: ParamValue) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bool):
        return _key(1, VARINT) + _varint(int(value))
    if isinstance(value, int):
        if value > _INT64_MAX:
            return _key(5, VARINT) + _varint(value)
        return _key(2, VARINT) + _varint(value)
    if isinstance(value, float):
        return _key(4, I64) + struct.pack("<d", value)
    return _len_field(3, value.encode())


def _parameters(number: int, params: Mapping[str, ParamValue]) -> bytes:
    return b"".join(
        _len_field(number, _len_field(1, name.encode()) + _len_field(2, _parameter(value)))
        for name, value in params.items()
    )


def _string(number: int, value: str) -> bytes:
    return _len_field(number, value.encode()) if value else b""


def _shape(number: int, shape: Sequence[int]) -> bytes:
    return _len_field(number, b"".join(_varint(d) for d in shape)) if shape else b""


class InputWire:
    """``ModelInferRequest.InferInputTensor`` (without typed contents, never sent)."""

    __slots__ = ("datatype", "name", "parameters", "shape")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: Sequence[int],
        parameters: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.parameters = parameters or {}

    def __bytes__(self) -> bytes:
        return b"".join(
            (
                _string(1, self.name),
                _string(2, self.datatype),
                _shape(3, self.shape),
                _parameters(4, self.parameters),
            )
        )


class RequestedOutputWire:
    """``ModelInferRequest.InferRequestedOutputTensor``."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: Mapping[str, ParamValue] | None = None) -> None:
        self.name = name
        self.parameters = parameters or {}

    def __bytes__(self) -> bytes:
        return _string(1, self.name) + _parameters(2, self.parameters)


class InferRequestWire:
    """A ``ModelInferRequest`` to send; grpclib's codec calls ``SerializeToString``."""

    __slots__ = ("id", "inputs", "model_name", "outputs", "parameters", "raw")

    def __init__(
        self,
        model_name: str,
        *,
        id: str = "",
        parameters: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.model_name = model_name
        self.id = id
        self.parameters = parameters or {}
        self.inputs: list[InputWire] = []
        self.outputs: list[RequestedOutputWire] = []
        #: raw_input_contents entries, in the order of the inline inputs.
        self.raw: list[bytes | memoryview] = []

    def parts(self) -> list[bytes | memoryview]:
        """The message as pieces whose concatenation is its encoding: the raw contents
        are the caller's buffers, not copies (the client sends them as they are)."""
        parts: list[bytes | memoryview] = [
            _string(1, self.model_name),
            _string(3, self.id),
            _parameters(4, self.parameters),
        ]
        parts.extend(_len_field(5, bytes(t)) for t in self.inputs)
        parts.extend(_len_field(6, bytes(o)) for o in self.outputs)
        raw_key = _key(7, LEN)
        for data in self.raw:
            parts.append(raw_key)
            parts.append(_varint(len(data)))
            parts.append(data)
        return parts

    def SerializeToString(self) -> bytes:  # the name grpclib's codec calls
        return b"".join(self.parts())

    def to_message(self) -> pb.ModelInferRequest:
        """The equivalent betterproto message (copies the raw contents; for tests)."""
        return pb.ModelInferRequest().parse(self.SerializeToString())


# ------------------------------------------------------------------------------ reading


def _malformed(what: str, pos: int) -> ExecutionFailed:
    return ExecutionFailed(f"malformed ModelInferResponse from the server: {what} at byte {pos}")


def _read_varint(buf: Received, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end or shift > 63:
            raise _malformed("bad varint", start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7


def _int64(value: int) -> int:
    return value - (1 << 64) if value > _INT64_MAX else value


def _fields(buf: Received, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(number, wire, start, stop)`` of every field in ``buf[pos:end]``.

    For a varint field ``start`` is its value; for the others ``buf[start:stop]`` is the
    payload.
    """
    out = []
    while pos < end:
        at = pos
        key, pos = _read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _malformed("field number 0", at)
        if wire == VARINT:
            value, pos = _read_varint(buf, pos, end)
            out.append((number, wire, value, pos))
            continue
        if wire == LEN:
            length, start = _read_varint(buf, pos, end)
            pos = start + length
        elif wire == I64:
            start, pos = pos, pos + 8
        elif wire == I32:
            start, pos = pos, pos + 4
        else:
            raise _malformed(f"unsupported wire type {wire}", at)
        if pos > end:
            raise _malformed(f"field {number} runs past the end", at)
        out.append((number, wire, start, pos))
    return out


def _text(buf: Received, start: int, stop: int) -> str:
    try:
        return str(buf[start:stop], "utf-8")  # bytes or a memoryview of them
    except UnicodeDecodeError:
        raise _malformed("a string is not UTF-8", start) from None


def _read_parameter(buf: Received, pos: int, end: int) -> ParamValue:
    value: ParamValue = None
    for number, wire, start, stop in _fields(buf, pos, end):
        if number == 1 and wire == VARINT:
            value = bool(start)
        elif number == 2 and wire == VARINT:
            value = _int64(start)
        elif number == 3 and wire == LEN:
            value = _text(buf, start, stop)
        elif number == 4 and wire == I64:
            value = struct.unpack_from("<d", buf, start)[0]
        elif number == 5 and wire == VARINT:
            value = start
    return value


def _read_map_entry(buf: Received, pos: int, end: int, into: dict[str, ParamValue]) -> None:
    name = ""
    value: ParamValue = None
    for number, wire, start, stop in _fields(buf, pos, end):
        if number == 1 and wire == LEN:
            name = _text(buf, start, stop)
        elif number == 2 and wire == LEN:
            value = _read_parameter(buf, start, stop)
    into[name] = value


class OutputWire:
    """``ModelInferResponse.InferOutputTensor`` as read."""

    __slots__ = ("contents", "datatype", "name", "parameters", "shape")

    def __init__(self) -> None:
        self.name = ""
        self.datatype = ""
        self.shape: list[int] = []
        self.parameters: dict[str, ParamValue] = {}
        #: Typed contents, when the server sent them instead of raw contents.
        self.contents: pb.InferTensorContents | None = None


def _read_output(buf: Received, pos: int, end: int) -> OutputWire:
    tensor = OutputWire()
    for number, wire, start, stop in _fields(buf, pos, end):
        if number == 1 and wire == LEN:
            tensor.name = _text(buf, start, stop)
        elif number == 2 and wire == LEN:
            tensor.datatype = _text(buf, start, stop)
        elif number == 3 and wire == VARINT:
            tensor.shape.append(_int64(start))
        elif number == 3 and wire == LEN:
            at = start
            while at < stop:
                value, at = _read_varint(buf, at, stop)
                tensor.shape.append(_int64(value))
        elif number == 4 and wire == LEN:
            _read_map_entry(buf, start, stop, tensor.parameters)
        elif number == 5 and wire == LEN:
            tensor.contents = pb.InferTensorContents().parse(bytes(buf[start:stop]))
    return tensor


class InferResponseWire:
    """A received ``ModelInferResponse``; grpclib's codec calls ``FromString``."""

    __slots__ = ("id", "model_name", "model_version", "outputs", "parameters", "raw")

    def __init__(self) -> None:
        self.model_name = ""
        self.model_version = ""
        self.id = ""
        self.parameters: dict[str, ParamValue] = {}
        self.outputs: list[OutputWire] = []
        #: raw_output_contents entries: views of the received bytes.
        self.raw: list[memoryview] = []

    @classmethod
    def FromString(cls, data: Received) -> InferResponseWire:  # the name grpclib's codec calls
        response = cls()
        view = memoryview(data)
        for number, wire, start, stop in _fields(data, 0, len(data)):
            if wire != LEN:
                continue  # every known field is length-delimited; skip unknown ones
            if number == 6:
                response.raw.append(view[start:stop])
            elif number == 5:
                response.outputs.append(_read_output(data, start, stop))
            elif number == 1:
                response.model_name = _text(data, start, stop)
            elif number == 2:
                response.model_version = _text(data, start, stop)
            elif number == 3:
                response.id = _text(data, start, stop)
            elif number == 4:
                _read_map_entry(data, start, stop, response.parameters)
        return response

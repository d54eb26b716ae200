"""Every request but ModelInfer, decoded with bounded work: screened by our reader first.

Why
---
ModelInfer has its own codec (:mod:`.codec`). Every other request message -- ServerLive,
the repository and shared-memory calls, the control service, health checks, reflection
-- is small and was handed straight to betterproto, whose parser is slow per field (each
varint read a byte at a time through a ``BytesIO``) and quadratic in unknown fields (each
one is appended to one ``bytes``): a 300 KB ServerLive of three-byte unknown fields held
the worker's event loop 0.6-6 s, and the gateway's own decoding of a
SystemSharedMemoryRegister 2.5 s -- long enough for its prober to give up on every worker
(issue 41).

Theory of operation
-------------------
:func:`decode_message` walks the message once with :class:`.wire_reader.Reader` (linear,
a few hundred nanoseconds per field) against the message's schema -- the field numbers
and types of the descriptor set the server answers reflection from -- before betterproto
sees it:

* at most :data:`MAX_FIELDS` units of work in all (the reader's work budget: a field
  costs one, nested, unknown and packed elements included, a nested message
  :data:`MESSAGE_UNITS` more): past it the message is refused, so what reaches betterproto
  is at most about a millisecond of its work;
* unknown fields, at any depth, are dropped (the known ones re-joined once; a message
  with none is passed on as it came, no copy), so betterproto never meets one;
* a known field with the wrong wire type, a string that is not UTF-8, a truncated field
  are refused with :class:`~reactantserver.errors.InvalidArgument` naming the message,
  the field and the byte offset -- never an exception from inside betterproto (the
  gateway answered a malformed SystemSharedMemoryRegister INTERNAL, with a
  ``UnicodeDecodeError`` traceback in its log).

Both the worker's codec and the gateway (its codec and the handlers that read a request
themselves) decode through here. The schemas are built from the descriptor set once,
by :func:`prepare` as the server starts.

Invariants (``tests/worker/test_screen.py``): for any bytes, :func:`decode_message` returns a
message or raises ``InvalidArgument``; for a message without unknown fields it returns
what betterproto's own parser does; unknown fields never change the result.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import betterproto
from betterproto.casing import pascal_case
from betterproto.lib.google.protobuf import (
    DescriptorProto,
    FieldDescriptorProto,
    FieldDescriptorProtoLabel,
    FieldDescriptorProtoType,
)

from reactantserver.errors import InvalidArgument

from .codec import encode_varint
from .reflection import load_descriptor_set, parsed_files
from .wire_reader import I32, I64, LEN, VARINT, Budget, Reader

__all__ = ["MAX_FIELDS", "MESSAGE_UNITS", "decode_message", "prepare"]

#: The work budget of a request other than ModelInfer, in fields (nested, unknown and
#: packed elements counted), a nested message counting :data:`MESSAGE_UNITS` more:
#: betterproto spends 10-20 us a field and 60-120 us a nested message (a map entry and its
#: value), so this much is about a millisecond of its work on a loaded core. A real request
#: holds a few fields; none has a map entry (load parameters are refused anyway).
MAX_FIELDS = 48
#: What a nested message costs beyond its tag: the object betterproto builds for it.
MESSAGE_UNITS = 6

_M = TypeVar("_M", bound=betterproto.Message)
_T = FieldDescriptorProtoType
_VARINTS = frozenset({_T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_INT32, _T.TYPE_BOOL,
                      _T.TYPE_UINT32, _T.TYPE_ENUM, _T.TYPE_SINT32, _T.TYPE_SINT64})  # fmt: skip
_FIXED64 = frozenset({_T.TYPE_DOUBLE, _T.TYPE_FIXED64, _T.TYPE_SFIXED64})
_FIXED32 = frozenset({_T.TYPE_FLOAT, _T.TYPE_FIXED32, _T.TYPE_SFIXED32})


@attrs.frozen
class _Field:
    name: str
    #: The wire type of one value; ``packed``: a repeated scalar, also accepted as LEN.
    wire: int
    packed: bool
    #: ``"string"``, ``"message"`` or ``""`` (nothing to check inside).
    kind: str
    #: The full name of a message field's type.
    child: str = ""


def _field(f: FieldDescriptorProto) -> _Field:
    kind, child = "", ""
    if f.type in _VARINTS:
        wire = VARINT
    elif f.type in _FIXED64:
        wire = I64
    elif f.type in _FIXED32:
        wire = I32
    else:  # string, bytes, message (groups do not occur in our protos)
        wire = LEN
        if f.type == _T.TYPE_STRING:
            kind = "string"
        elif f.type == _T.TYPE_MESSAGE:
            kind, child = "message", f.type_name.lstrip(".")
    repeated = f.label == FieldDescriptorProtoLabel.LABEL_REPEATED
    return _Field(f.name, wire, repeated and wire != LEN, kind, child)


def _collect(
    scope: str, flat: str, message: DescriptorProto, into: dict[str, dict[int, _Field]],
    aliases: dict[str, str],
) -> None:  # fmt: skip
    full = f"{scope}.{message.name}" if scope else message.name
    into[full] = {f.number: _field(f) for f in message.field}
    # betterproto's class name: nested names joined, in its PascalCase (IPC -> Ipc).
    package, _, outer = flat.rpartition(".")
    aliases[f"{package}.{pascal_case(outer + message.name)}"] = full
    for nested in message.nested_type:
        _collect(full, flat + message.name, nested, into, aliases)


@functools.cache
def _schemas() -> tuple[Mapping[str, Mapping[int, _Field]], Mapping[str, str]]:
    """Every message of the descriptor set: full name -> field number -> field, and
    ``package.FlatClassName`` (betterproto's naming) -> full name."""
    into: dict[str, dict[int, _Field]] = {}
    aliases: dict[str, str] = {}
    for _, fdp in parsed_files(load_descriptor_set()):
        for message in fdp.message_type:
            _collect(fdp.package, f"{fdp.package}.", message, into, aliases)
    return into, aliases


def prepare() -> None:
    """Build the schemas now (about 0.15 s): a server calls it before it serves, so that
    its first small request does not pay for it on the event loop."""
    _schemas()


def _full_name(message_type: type[betterproto.Message]) -> str:
    """``inference.ServerLiveRequest`` for the generated class ``ServerLiveRequest`` of
    ``reactantserver.protocol.inference``."""
    package = message_type.__module__.removeprefix("reactantserver.protocol.")
    schemas, aliases = _schemas()
    flat = f"{package}.{message_type.__name__}"
    full = aliases.get(flat, flat)
    if full not in schemas:
        raise TypeError(f"{message_type.__qualname__} is not a message of the descriptor set")
    return full


def _screen(r: Reader, fields: Mapping[int, _Field]) -> bytes | None:
    """Check the message under ``r``; the bytes without its unknown fields, or None when
    it has none (the bytes stand as they are)."""
    buf = r.buf
    schemas = _schemas()[0]
    pieces: list[Any] = []
    kept = r.pos  # the start of the stretch of fields kept since the last drop
    changed = False
    while r.pos < r.end:
        at = r.pos
        number, wire = r.tag()
        field = fields.get(number)
        if field is None:
            r.skip(number, wire)
            pieces.append(buf[kept:at])
            kept, changed = r.pos, True
            continue
        if wire == LEN and field.packed:
            start, end = r.length()
            if field.wire == VARINT:
                r.charge_varints(start, end)
            else:
                size = 8 if field.wire == I64 else 4
                if (end - start) % size:
                    raise r.fail(f"{field.name} holds a partial element")
                r.charge((end - start) // size)
            continue
        r.expect(wire, field.wire, field.name)
        if wire == VARINT:
            r.varint()
        elif wire == LEN:
            if field.kind == "string":
                r.string(field.name)
            elif field.kind == "message":
                r.charge(MESSAGE_UNITS)
                head = r.pos
                start, end = r.length()
                inner = _screen(
                    Reader(buf, start, end, field.child, r.budget), schemas[field.child]
                )
                if inner is not None:
                    pieces.append(buf[kept:at])
                    pieces.append(buf[at:head])  # the tag, then the new length
                    pieces.append(encode_varint(len(inner)))
                    pieces.append(inner)
                    kept, changed = end, True
            else:
                r.length()
        else:
            r.skip(number, wire)  # fixed width: bounds-checked by the skip
    if not changed:
        return None
    pieces.append(buf[kept : r.end])
    return b"".join(pieces)


def decode_message(data: bytes | memoryview, message_type: type[_M]) -> _M:
    """``data`` parsed as ``message_type`` after the screening of the module docstring;
    ``InvalidArgument`` for anything it refuses."""
    full = _full_name(message_type)
    what = message_type.__name__
    reader = Reader(data, 0, len(data), what, Budget(what, MAX_FIELDS, hint=""))
    screened = _screen(reader, _schemas()[0][full])
    try:
        return message_type().parse(bytes(data) if screened is None else screened)
    except Exception as exc:  # the screen leaves nothing it knows of; betterproto's own
        raise InvalidArgument(f"malformed {what}: {type(exc).__name__} while decoding it") from None

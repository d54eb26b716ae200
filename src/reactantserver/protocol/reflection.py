"""gRPC server reflection, answered without I/O.

Theory of operation
-------------------
A reflection client (grpcurl, grpcui) opens one ``ServerReflectionInfo`` stream and sends
questions: *which services are there*, *give me the file called X*, *give me the file that
defines symbol Y*. Each question gets exactly one answer, and file answers carry serialized
``google.protobuf.FileDescriptorProto`` messages: the file asked for first, then everything
it imports, transitively, so the client can rebuild the full schema.

:class:`ReflectionAnswerer` holds everything needed for that, computed once at construction
from the ``FileDescriptorSet`` that ``proto/generate.py`` writes next to this module
(``descriptors.bin``). :meth:`ReflectionAnswerer.answer` maps one request message to one
response message; it performs no I/O and keeps no per-stream state, so the transport's
servicer is a loop that feeds it requests and writes its responses.

Invariants
----------
* The bytes sent for a file are the exact bytes protoc wrote for it. The set is split into
  per-file byte strings at the wire level and never re-serialized, because re-encoding a
  proto2 message (descriptor.proto is proto2) through proto3-style classes would drop fields
  whose value equals the default but whose *presence* matters (``oneof_index = 0``).
* Every file's imports are in the set (checked at construction), so every file answer is a
  complete, self-contained closure, ordered requested-file-first (grpcurl takes the first
  file as the answer and the rest as its dependencies).
* Symbols are indexed as protobuf scopes them: messages and enums (nested ones too), fields,
  oneofs, services, methods, extensions, and enum values in the scope *enclosing* their enum
  (``inference.TYPE_FP32``, not ``inference.DataType.TYPE_FP32``).
* Failed lookups are answered in-band with an ``ErrorResponse`` carrying a gRPC status
  number (NOT_FOUND, INVALID_ARGUMENT); the stream itself never fails.

v1 and v1alpha
--------------
``grpc.reflection.v1`` and ``grpc.reflection.v1alpha`` define the same messages with the same
field numbers; only the package name differs. :meth:`ReflectionAnswerer.answer_bytes` works on
serialized requests and therefore serves both services: a transport registers the same
answerer under both service names.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources

import betterproto
from betterproto.lib.google.protobuf import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
)

from reactantserver.protocol.grpc.reflection import v1alpha as rpb

__all__ = [
    "DESCRIPTOR_SET_RESOURCE",
    "ReflectionAnswerer",
    "ReflectionStatus",
    "load_descriptor_set",
    "parsed_files",
    "split_descriptor_set",
]

#: File name, inside the ``reactantserver.protocol`` package, of the generated descriptor set.
DESCRIPTOR_SET_RESOURCE = "descriptors.bin"

#: Fully qualified names of the services a worker serves (and lists by reflection); the
#: gateway serves these too, and its own ``GatewayControlService``.
WORKER_SERVICES: tuple[str, ...] = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
    "reactant_control.ControlService",
)


class ReflectionStatus(enum.IntEnum):
    """The gRPC status numbers this module puts in ``ErrorResponse.error_code``.

    Spelled out here rather than imported from grpclib so that this sans-IO module does not
    depend on the transport library's API.
    """

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5


def load_descriptor_set() -> bytes:
    """The serialized ``FileDescriptorSet`` shipped with the package."""
    return resources.files("reactantserver.protocol").joinpath(DESCRIPTOR_SET_RESOURCE).read_bytes()


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode one base-128 varint at ``pos``; return (value, position after it)."""
    value = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("descriptor set truncated inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("descriptor set has a varint longer than 10 bytes")


def split_descriptor_set(data: bytes) -> list[bytes]:
    """Split a serialized ``FileDescriptorSet`` into its files' exact serialized bytes.

    ``FileDescriptorSet`` has a single field, ``repeated FileDescriptorProto file = 1``, so
    its encoding is a sequence of (tag 0x0A, length, bytes) records. Anything else is refused.
    """
    files: list[bytes] = []
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        if tag != (1 << 3) | 2:  # field 1, wire type 2 (length-delimited)
            raise ValueError(f"not a FileDescriptorSet: unexpected tag {tag} at byte {pos}")
        length, pos = _read_varint(data, pos)
        end = pos + length
        if end > len(data):
            raise ValueError("descriptor set truncated inside a file descriptor")
        files.append(data[pos:end])
        pos = end
    return files


def parsed_files(descriptor_set: bytes) -> Iterator[tuple[bytes, FileDescriptorProto]]:
    """Each file of a serialized ``FileDescriptorSet``: its exact bytes, and it parsed
    without its source comments (which are not needed to index names or fields)."""
    for raw in split_descriptor_set(descriptor_set):
        yield raw, FileDescriptorProto().parse(_strip_field(raw, _SOURCE_CODE_INFO_FIELD))


# FileDescriptorProto.source_code_info: comments and source spans. Served to clients, but
# useless for indexing names, and it is two thirds of the bytes and of the parse time.
_SOURCE_CODE_INFO_FIELD = 9


def _strip_field(message: bytes, field_number: int) -> bytes:
    """``message`` with every top-level occurrence of ``field_number`` removed.

    A wire-level scan: each record is a varint tag followed by a varint (wire type 0), 8
    bytes (1), a length-prefixed payload (2) or 4 bytes (5). Groups (3, 4) do not occur in
    descriptor.proto and are refused.
    """
    kept: list[bytes] = []
    pos = 0
    while pos < len(message):
        start = pos
        tag, pos = _read_varint(message, pos)
        wire_type = tag & 0x7
        if wire_type == 0:
            _, pos = _read_varint(message, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, pos = _read_varint(message, pos)
            pos += length
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type} in a file descriptor")
        if pos > len(message):
            raise ValueError("file descriptor truncated")
        if tag >> 3 != field_number:
            kept.append(message[start:pos])
    return b"".join(kept)


def _join(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


def _enum_symbols(enum_type: EnumDescriptorProto, scope: str) -> Iterator[str]:
    yield _join(scope, enum_type.name)
    # Enum values are siblings of their enum in protobuf's name scoping.
    for value in enum_type.value:
        yield _join(scope, value.name)


def _message_symbols(message: DescriptorProto, scope: str) -> Iterator[str]:
    full = _join(scope, message.name)
    yield full
    for field in message.field:
        yield _join(full, field.name)
    for oneof in message.oneof_decl:
        yield _join(full, oneof.name)
    for extension in message.extension:
        yield _join(full, extension.name)
    for nested in message.nested_type:
        yield from _message_symbols(nested, full)
    for nested_enum in message.enum_type:
        yield from _enum_symbols(nested_enum, full)


def _file_symbols(fdp: FileDescriptorProto) -> Iterator[str]:
    package = fdp.package
    for message in fdp.message_type:
        yield from _message_symbols(message, package)
    for enum_type in fdp.enum_type:
        yield from _enum_symbols(enum_type, package)
    for extension in fdp.extension:
        yield _join(package, extension.name)
    for service in fdp.service:
        full = _join(package, service.name)
        yield full
        for method in service.method:
            yield _join(full, method.name)


def _extensions(fdp: FileDescriptorProto) -> Iterator[FieldDescriptorProto]:
    """Every extension field a file declares, top level and nested in messages."""
    yield from fdp.extension
    stack = list(fdp.message_type)
    while stack:
        message = stack.pop()
        yield from message.extension
        stack.extend(message.nested_type)


def _message_names(fdp: FileDescriptorProto) -> Iterator[str]:
    def walk(messages: Sequence[DescriptorProto], scope: str) -> Iterator[str]:
        for message in messages:
            full = _join(scope, message.name)
            yield full
            yield from walk(message.nested_type, full)

    return walk(fdp.message_type, fdp.package)


class ReflectionAnswerer:
    """Answers ``ServerReflectionRequest`` messages from a ``FileDescriptorSet``.

    ``services`` names the services the server actually serves (fully qualified); every one
    must be defined in the set. When omitted, every service in the set is listed.
    """

    def __init__(self, descriptor_set: bytes, services: Iterable[str] | None = None) -> None:
        self._files: dict[str, bytes] = {}
        self._deps: dict[str, tuple[str, ...]] = {}
        self._symbols: dict[str, str] = {}
        self._extensions: dict[tuple[str, int], str] = {}
        self._message_types: set[str] = set()
        defined_services: list[str] = []

        for raw, fdp in parsed_files(descriptor_set):
            if fdp.name in self._files:
                raise ValueError(f"descriptor set holds {fdp.name!r} twice")
            self._files[fdp.name] = raw
            self._deps[fdp.name] = tuple(fdp.dependency)
            for symbol in _file_symbols(fdp):
                # protoc refuses duplicate symbols within one compilation, so a clash here
                # means two unrelated sets were concatenated.
                if symbol in self._symbols:
                    raise ValueError(
                        f"symbol {symbol!r} defined in both {self._symbols[symbol]!r} "
                        f"and {fdp.name!r}"
                    )
                self._symbols[symbol] = fdp.name
            self._message_types.update(_message_names(fdp))
            for extension in _extensions(fdp):
                extendee = extension.extendee.lstrip(".")
                self._extensions[(extendee, extension.number)] = fdp.name
            defined_services.extend(_join(fdp.package, s.name) for s in fdp.service)

        for name, deps in self._deps.items():
            missing = [d for d in deps if d not in self._files]
            if missing:
                raise ValueError(
                    f"descriptor set is missing {missing} imported by {name!r}; "
                    "generate it with --include_imports"
                )

        if services is None:
            self._services = tuple(sorted(defined_services))
        else:
            chosen = sorted(set(services))
            unknown = [s for s in chosen if s not in defined_services]
            if unknown:
                raise ValueError(
                    f"services {unknown} are not defined in the descriptor set "
                    f"(defined: {sorted(defined_services)})"
                )
            self._services = tuple(chosen)

    @classmethod
    def from_package(cls, services: Iterable[str] | None = None) -> ReflectionAnswerer:
        """An answerer over the descriptor set shipped with reactantserver."""
        return cls(load_descriptor_set(), services)

    @property
    def services(self) -> tuple[str, ...]:
        """Fully qualified names of the listed services, sorted."""
        return self._services

    @property
    def file_names(self) -> tuple[str, ...]:
        """Names of every file in the set, in the set's (dependency-first) order."""
        return tuple(self._files)

    def file_for_symbol(self, symbol: str) -> str | None:
        """Name of the file defining a fully qualified symbol (leading dot allowed)."""
        return self._symbols.get(symbol.lstrip("."))

    def closure(self, file_name: str) -> list[bytes]:
        """Serialized descriptors of ``file_name`` and its transitive imports, it first.

        Depth-first pre-order over ``dependency`` lists, each file once.
        """
        order: list[str] = []
        seen: set[str] = set()
        stack = [file_name]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            order.append(name)
            # Reversed so that the first import is visited first.
            stack.extend(reversed(self._deps[name]))
        return [self._files[name] for name in order]

    def answer(self, request: rpb.ServerReflectionRequest) -> rpb.ServerReflectionResponse:
        """The one response to one reflection request."""
        kind, _ = betterproto.which_one_of(request, "message_request")
        response = rpb.ServerReflectionResponse(valid_host=request.host, original_request=request)
        if kind == "list_services":
            response.list_services_response = rpb.ListServiceResponse(
                service=[rpb.ServiceResponse(name=name) for name in self._services]
            )
        elif kind == "file_by_filename":
            wanted = request.file_by_filename
            if wanted in self._files:
                response.file_descriptor_response = self._file_response(wanted)
            else:
                response.error_response = _not_found(f"file not found: {wanted}")
        elif kind == "file_containing_symbol":
            symbol = request.file_containing_symbol
            file_name = self.file_for_symbol(symbol)
            if file_name is not None:
                response.file_descriptor_response = self._file_response(file_name)
            else:
                response.error_response = _not_found(f"symbol not found: {symbol}")
        elif kind == "file_containing_extension":
            extension = request.file_containing_extension
            key = (extension.containing_type.lstrip("."), extension.extension_number)
            file_name = self._extensions.get(key)
            if file_name is not None:
                response.file_descriptor_response = self._file_response(file_name)
            else:
                response.error_response = _not_found(
                    f"extension not found: {key[0]} field {key[1]}"
                )
        elif kind == "all_extension_numbers_of_type":
            type_name = request.all_extension_numbers_of_type.lstrip(".")
            if type_name in self._message_types:
                response.all_extension_numbers_response = rpb.ExtensionNumberResponse(
                    base_type_name=type_name,
                    extension_number=sorted(
                        number for (extendee, number) in self._extensions if extendee == type_name
                    ),
                )
            else:
                response.error_response = _not_found(f"message type not found: {type_name}")
        else:
            response.error_response = rpb.ErrorResponse(
                error_code=int(ReflectionStatus.INVALID_ARGUMENT),
                error_message="reflection request sets none of the message_request fields",
            )
        return response

    def answer_bytes(self, request: bytes) -> bytes:
        """:meth:`answer` on the wire encoding; serves v1 and v1alpha alike."""
        return bytes(self.answer(rpb.ServerReflectionRequest().parse(request)))

    def _file_response(self, file_name: str) -> rpb.FileDescriptorResponse:
        return rpb.FileDescriptorResponse(file_descriptor_proto=self.closure(file_name))


def _not_found(message: str) -> rpb.ErrorResponse:
    return rpb.ErrorResponse(error_code=int(ReflectionStatus.NOT_FOUND), error_message=message)

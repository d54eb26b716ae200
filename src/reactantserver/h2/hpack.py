"""HPACK as our HTTP/2 connection (:mod:`.core`, both roles) uses it: blocks of literals,
the server's constant blocks through the dynamic table, and a decoder that remembers the
blocks that cannot change the table.

* **Encoding** (:func:`encode_headers`, :func:`literal`): every header is a "literal
  without indexing" (RFC 7541 §6.2.2) -- its name by static-table index where the static
  table has it, its value as a raw string. Nothing is searched, nothing is Huffman-coded,
  the peer's decoder table never changes, and a block does not depend on what was sent
  before. Requests (the client role) and the server's varying blocks (error trailers)
  are written so.
* **Constant blocks** (:class:`TableEncoder`, the server role): the header lists sent on
  every call (``:status 200`` and the content type, ``grpc-status 0``) go through the
  peer's dynamic table. The first block that holds a field sends it as a literal *with*
  incremental indexing (§6.2.1); every later one names it by its index, one byte
  (§6.1), so an answer's headers and trailers cost 3 bytes instead of 38. The encoder
  keeps its own model of the peer's table: an entry is added only where it fits the
  table's size as the peer last allowed it, so nothing is ever evicted and an entry's
  index is 62 plus the number of entries added after it; when the peer lowers its
  SETTINGS_HEADER_TABLE_SIZE below what the entries take, the next block opens with two
  size updates (to 0, which empties the table, then to the new size) and the model
  starts over. Blocks are encoded as they are queued, in the order they go on the wire,
  which is the order the peer decodes them; each connection has its own encoder.
* **Decoding** (:class:`BlockDecoder`): ``hpack.Decoder``, plus caches of the blocks and
  fields whose decoding cannot change the dynamic table (:func:`field_ends`: indexed
  fields, literals without indexing or never indexed). Such a block decodes to the same
  headers for as long as the table is unchanged, and so does each of its fields: a block
  seen before is one lookup; a new one made of such fields is decoded field by field, each
  field remembered (our own literals by slicing, others by ``hpack``); all is forgotten
  once a block that may change the table is decoded. A peer repeating its headers is
  decoded once per connection, and a block that differs in one field (the
  ``grpc-timeout`` the gateway forwards) costs that field (4 us against hpack's 18).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from hpack import Decoder
from hpack.table import HeaderTable

T = TypeVar("T")

#: Remembered blocks per decoder; past it the cache starts over.
MAX_CACHED_BLOCKS = 64
#: Remembered fields per decoder; past it that cache starts over.
MAX_CACHED_FIELDS = 256


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An RFC 7541 §5.1 integer with an N-bit prefix; ``first`` holds the byte's other bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
#: The static table's first index for each header name (RFC 7541 Appendix A): reversed,
#: so that a name's first index is written last.
STATIC_NAMES = {name: i for i, (name, _) in reversed(list(enumerate(STATIC_TABLE, start=1)))}


def literal(name: str | bytes, value: str | bytes) -> bytes:
    """One header as a literal without indexing, raw strings (no Huffman)."""
    n = name.encode("ascii") if isinstance(name, str) else name
    v = value.encode("utf-8") if isinstance(value, str) else value
    index = STATIC_NAMES.get(n)
    head = hpack_int(index, 4, 0) if index is not None else b"\x00" + hpack_int(len(n), 7, 0) + n
    return head + hpack_int(len(v), 7, 0) + v


def encode_headers(headers: Iterable[tuple[str | bytes, str | bytes]]) -> bytes:
    """A header block that never touches the dynamic table (table-independent)."""
    return b"".join([literal(name, value) for name, value in headers])


#: The static table's full (name, value) pairs and their indices (``:status 200`` is 8).
STATIC_FIELDS = {field: i for i, field in reversed(list(enumerate(STATIC_TABLE, start=1)))}
#: RFC 7541 §4.1: an entry's size is its name's and value's octets plus 32.
ENTRY_OVERHEAD = 32
#: Index of the newest dynamic-table entry (RFC 7541 §2.3.3: after the 61 static ones).
FIRST_DYNAMIC = len(STATIC_TABLE) + 1


def _raw(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


class TableEncoder:
    """One connection's encoder of constant header lists through the peer's dynamic
    table (module docstring, "Constant blocks"), and the table size updates it owes.

    ``size`` is the table size the peer allows (SETTINGS_HEADER_TABLE_SIZE; HPACK's 4096
    until it says otherwise). :meth:`encode` gives a list's block as it must go on the
    wire now; :meth:`resize` is told of a lower size, and :meth:`take_updates` gives the
    size updates that must open the next block (both roles: the client role encodes no
    block here, only the updates it owes).
    """

    __slots__ = ("_added", "_blocks", "_cleared", "_fields", "_used", "owed", "size")

    def __init__(self, size: int = 4096) -> None:
        #: The table size the peer allows now.
        self.size = size
        #: (name, value) -> its number among the entries added (0 the oldest).
        self._fields: dict[tuple[bytes, bytes], int] = {}
        self._added = 0
        self._used = 0
        #: The blocks of lists whose every field is in a table as it stands (by list id,
        #: with the list itself so that an id is never reused while remembered).
        self._blocks: dict[int, tuple[object, bytes]] = {}
        #: A size update is owed at the start of the next block (and, first, one to 0).
        self.owed = False
        self._cleared = False

    def encode(self, headers: Sequence[tuple[str | bytes, str | bytes]]) -> bytes:
        """``headers``' block: indexed fields where the peer's table (or the static one)
        holds them, else literals -- with incremental indexing where the entry fits. It
        must be the next block on the wire after :meth:`take_updates`' bytes."""
        hit = self._blocks.get(id(headers))
        if hit is not None and hit[0] is headers:
            return hit[1]
        out = []
        added = False
        for name, value in headers:
            field = (_raw(name), _raw(value))
            static = STATIC_FIELDS.get(field)
            if static is not None:
                out.append(hpack_int(static, 7, 0x80))
                continue
            number = self._fields.get(field)
            if number is not None:
                out.append(hpack_int(FIRST_DYNAMIC + self._added - 1 - number, 7, 0x80))
                continue
            size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if self._used + size > self.size:
                out.append(literal(*field))
                continue
            index = STATIC_NAMES.get(field[0])
            head = (
                hpack_int(index, 6, 0x40)
                if index is not None
                else b"\x40" + hpack_int(len(field[0]), 7, 0) + field[0]
            )
            out.append(head + hpack_int(len(field[1]), 7, 0) + field[1])
            self._fields[field] = self._added
            self._added += 1
            self._used += size
            added = True
        block = b"".join(out)
        if added:
            self._blocks.clear()  # every index moved by the entries added
        else:
            self._blocks[id(headers)] = (headers, block)
        return block

    def resize(self, size: int) -> None:
        """The peer lowered its table size to ``size`` (a lower one than :attr:`size`):
        an update is owed; where the entries no longer fit, the table is emptied first
        (the model starts over, and the peer's table with it)."""
        self.size = size
        self.owed = True
        if self._used > size:
            self._cleared = True
            self._fields.clear()
            self._blocks.clear()
            self._added = self._used = 0

    def take_updates(self) -> bytes:
        """The size updates owed (RFC 7541 §4.2, §6.3), once: they open the next block."""
        if not self.owed:
            return b""
        updates = hpack_int(0, 5, 0x20) if self._cleared else b""
        self.owed = self._cleared = False
        return updates + hpack_int(self.size, 5, 0x20)


def _read_int(block: bytes, i: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at ``block[i]`` and the index after it (ValueError if cut short)."""
    limit = (1 << prefix_bits) - 1
    value = block[i] & limit
    i += 1
    if value < limit:
        return value, i
    shift = 0
    while True:
        byte = block[i]
        i += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def field_ends(block: bytes) -> list[int] | None:
    """Where each field of ``block`` ends, if decoding it leaves the dynamic table as it
    was; None otherwise (or if a field is cut short).

    Table-neutral fields are indexed fields (§6.1) and literals without indexing or never
    indexed (§6.2.2, §6.2.3); a literal with incremental indexing or a table size update
    makes the block not neutral.
    """
    ends: list[int] = []
    i, end = 0, len(block)
    try:
        while i < end:
            byte = block[i]
            if byte & 0x80:  # indexed field
                i = i + 1 if byte != 0xFF else _read_int(block, i, 7)[1]
            elif byte & 0xE0:
                return None  # incremental indexing (01......) or a size update (001.....)
            else:
                if not byte & 0x0F:  # the name is a string literal
                    length, i = _read_int(block, i + 1, 7)
                    i += length
                elif byte & 0x0F == 0x0F:
                    i = _read_int(block, i, 4)[1]
                else:
                    i += 1
                length, i = _read_int(block, i, 7)
                i += length
            ends.append(i)
    except IndexError:
        return None
    return ends if i == end else None


def _plain_literal(field: bytes) -> tuple[bytes, bytes] | None:
    """A literal field (without indexing or never indexed) whose name is a string or a
    static-table index below 15, and whose strings are short and not Huffman-coded -- our
    own literals: ``(name, value)`` by slicing, as ``hpack`` would decode it. None for any
    other form (``hpack`` decodes those). ``field`` is one whole field (:func:`field_ends`).
    """
    first = field[0]
    if first & 0xE0:
        return None
    index = first & 0x0F
    if index == 0x0F:
        return None
    if index:
        name = STATIC_TABLE[index - 1][0]
        at = 1
    else:
        length = field[1]
        if length >= 0x7F:  # Huffman-coded (high bit), or a longer length
            return None
        name = field[2 : 2 + length]
        at = 2 + length
    length = field[at]
    if length >= 0x7F:
        return None
    return name, field[at + 1 : at + 1 + length]


class BlockDecoder(Generic[T]):
    """``hpack.Decoder`` with the caches of table-neutral blocks and fields (module
    docstring).

    ``convert`` turns one raw ``(name, value)`` field into what the caller keeps; a block
    decodes to the tuple of its converted fields. hpack's errors, and ``convert``'s,
    propagate, in the order a plain ``hpack.Decoder`` followed by ``convert`` would raise
    them: any field that fails sends the whole block down that plain path.
    """

    def __init__(self, convert: Callable[[bytes, bytes], T], max_header_list_size: int) -> None:
        self.decoder = Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self._convert = convert
        self._blocks: dict[bytes, tuple[T, ...]] = {}
        #: field bytes -> (converted field, its RFC 7541 size: name + value + 32)
        self._fields: dict[bytes, tuple[T, int]] = {}

    def decode(self, block: bytes) -> tuple[T, ...]:
        blocks = self._blocks
        hit = blocks.get(block)
        if hit is not None:
            return hit
        ends = field_ends(block)
        if ends is not None:
            key = bytes(block)
            try:
                headers, repeated = self._from_fields(key, ends)
            except Exception:  # the plain path below raises what hpack would
                headers, repeated = None, False
            if headers is not None:
                if repeated:  # a block made only of known fields may well come again
                    if len(blocks) >= MAX_CACHED_BLOCKS:
                        blocks.clear()
                    blocks[key] = headers
                return headers
        raw: Iterable[tuple[bytes, bytes]] = self.decoder.decode(block, raw=True)
        if ends is None:
            # The table may have changed: everything remembered is stale (cleared before
            # ``convert``, which may raise, and the caller may go on decoding).
            blocks.clear()
            self._fields.clear()
        return tuple([self._convert(name, value) for name, value in raw])

    def _from_fields(self, block: bytes, ends: list[int]) -> tuple[tuple[T, ...] | None, bool]:
        """The headers of a table-neutral block, field by field (each remembered); None
        when they exceed the header list limit. Also: whether every field was known."""
        fields = self._fields
        out: list[T] = []
        size = 0
        repeated = True
        start = 0
        for end in ends:
            field = block[start:end]
            start = end
            entry = fields.get(field)
            if entry is None:
                repeated = False
                pair = _plain_literal(field)
                if pair is None:
                    # One field is a block of its own: the table does not change in between.
                    ((name, value),) = self.decoder.decode(field, raw=True)
                else:
                    name, value = pair
                entry = (self._convert(name, value), len(name) + len(value) + 32)
                if len(fields) >= MAX_CACHED_FIELDS:
                    fields.clear()
                fields[field] = entry
            out.append(entry[0])
            size += entry[1]
        if size > self.decoder.max_header_list_size:
            return None, False
        return tuple(out), repeated

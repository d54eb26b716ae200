"""HPACK as our two lean HTTP/2 endpoints use it: blocks that never touch the dynamic table,
and a decoder that remembers the blocks that cannot change it.

Both ends of a gateway-to-worker hop, and the worker's server side, are our own HTTP/2
code (:mod:`.h2lean`, :mod:`reactantserver.gateway.http2`). They share this module:

* **Encoding** (:func:`encode_headers`, :func:`literal`): every header is a "literal
  without indexing" (RFC 7541 §6.2.2) -- its name by static-table index where the static
  table has it, its value as a raw string. Nothing is searched, nothing is Huffman-coded,
  the peer's decoder table never changes, and a block does not depend on what was sent
  before, so a constant header list is encoded once.
* **Decoding** (:class:`BlockDecoder`): ``hpack.Decoder``, plus a cache of the blocks whose
  decoding cannot change the dynamic table (:func:`table_neutral`: indexed fields and
  literals without indexing or never indexed; no incremental indexing, no table size
  update). Such a block's headers depend only on the table, so the same bytes decode to
  the same headers for as long as the table is unchanged: they are remembered, and every
  remembered block is forgotten as soon as one that may change the table is decoded. A
  peer repeating the same headers -- a gRPC client's request headers once indexed, our own
  answers' literals -- is decoded once per connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from hpack import Decoder
from hpack.table import HeaderTable

T = TypeVar("T")

#: Remembered blocks per decoder; past it the cache starts over.
MAX_CACHED_BLOCKS = 64


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


def _static_names() -> dict[bytes, int]:
    names: dict[bytes, int] = {}
    for index, (name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
        names.setdefault(name, index)
    return names


#: The static table's first index for each header name (RFC 7541 Appendix A).
STATIC_NAMES = _static_names()


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


def table_neutral(block: bytes) -> bool:
    """Whether decoding ``block`` leaves the dynamic table as it was: it holds only indexed
    fields (§6.1) and literals without indexing or never indexed (§6.2.2, §6.2.3)."""
    i, end = 0, len(block)
    try:
        while i < end:
            byte = block[i]
            if byte & 0x80:  # indexed field
                _, i = _read_int(block, i, 7)
            elif byte & 0xE0:
                return False  # incremental indexing (01......) or a size update (001.....)
            else:
                index, i = _read_int(block, i, 4)
                if not index:  # the name is a string literal
                    length, i = _read_int(block, i, 7)
                    i += length
                length, i = _read_int(block, i, 7)
                i += length
    except IndexError:
        return False
    return i == end


class BlockDecoder(Generic[T]):
    """``hpack.Decoder`` with the cache of table-neutral blocks (module docstring).

    ``convert`` turns a block's raw ``(name, value)`` pairs into what the caller keeps (it
    runs once per distinct block); hpack's errors, and ``convert``'s, propagate.
    """

    def __init__(
        self, convert: Callable[[Iterable[tuple[bytes, bytes]]], T], max_header_list_size: int
    ) -> None:
        self.decoder = Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self._convert = convert
        self._cache: dict[bytes, T] = {}

    def decode(self, block: bytes) -> T:
        cache = self._cache
        hit = cache.get(block)
        if hit is not None:
            return hit
        raw: Iterable[tuple[bytes, bytes]] = self.decoder.decode(block, raw=True)
        neutral = table_neutral(block)
        if not neutral:
            # The table may have changed: every remembered block is stale (cleared before
            # ``convert``, which may raise, and the caller may go on decoding).
            cache.clear()
        headers = self._convert(raw)
        if neutral:
            if len(cache) >= MAX_CACHED_BLOCKS:
                cache.clear()
            cache[bytes(block)] = headers
        return headers

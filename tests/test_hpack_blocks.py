"""HPACK as the lean HTTP/2 endpoints use it (``transport/hpack_blocks.py``).

Invariants: a block :func:`table_neutral` accepts leaves a decoder's dynamic table as it
was; :class:`BlockDecoder` decodes every block of a connection -- whatever mix of indexed
fields, literals with and without indexing, and table size updates the peer's encoder
chose -- to exactly what a plain ``hpack.Decoder`` gives, in the same order; our own
literal blocks decode to the headers they were built from and never touch the table.
"""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.transport.hpack_blocks import (
    BlockDecoder,
    encode_headers,
    table_neutral,
)

NAMES = [b":path", b":authority", b"content-type", b"te", b"grpc-timeout", b"x-id", b"user-agent"]
headers_st = st.lists(
    st.tuples(st.sampled_from(NAMES), st.binary(min_size=0, max_size=12).map(bytes.hex)),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize(
    ("block", "neutral"),
    [
        (b"\x82\x86", True),  # indexed fields
        (b"\xff\x05\x82", True),  # a multi-byte index
        (b"\x04\x01/", True),  # literal without indexing, static name (:path)
        (b"\x10\x01a\x01b", True),  # literal never indexed, literal name
        (b"\x82\x40\x01a\x01b", False),  # literal with incremental indexing
        (b"\x3f\x01", False),  # a dynamic table size update
        (b"\x04\x05/", False),  # a string cut short
    ],
)
def test_table_neutral_blocks_are_recognised(block: bytes, neutral: bool) -> None:
    assert table_neutral(block) is neutral


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(headers_st, st.booleans(), st.booleans()), min_size=1, max_size=12))
def test_block_decoder_decodes_as_hpack_does(
    blocks: list[tuple[list[tuple[bytes, str]], bool, bool]],
) -> None:
    """A stream of blocks from one encoder (indexed, incremental, never-indexed, Huffman or
    not, our literals), decoded by a plain decoder and by ours: the same headers, and a
    block judged table-neutral never changed the plain decoder's table."""
    encoder = hpack.Encoder()
    plain = hpack.Decoder()
    ours: BlockDecoder[tuple[tuple[bytes, bytes], ...]] = BlockDecoder(tuple, 65536)
    for headers, literal_only, sensitive in blocks:
        pairs = [(name, value.encode()) for name, value in headers]
        if literal_only:
            block = encode_headers(pairs)
        elif sensitive:
            block = encoder.encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in pairs])
        else:
            block = encoder.encode(pairs)
        for _ in range(2):  # the second time a repeated block may come from the cache
            before = list(plain.header_table.dynamic_entries)
            want = tuple(plain.decode(block, raw=True))
            if table_neutral(block):
                assert list(plain.header_table.dynamic_entries) == before
            assert ours.decode(block) == want
            assert [tuple(h) for h in want] == pairs or not literal_only

"""HPACK as the lean HTTP/2 endpoints use it (``h2/hpack.py``).

Invariants: a block :func:`field_ends` accepts (table-neutral) leaves a decoder's dynamic table as it
was; :class:`BlockDecoder` decodes every block of a connection -- whatever mix of indexed
fields, literals with and without indexing, and table size updates the peer's encoder
chose -- to exactly what a plain ``hpack.Decoder`` gives, in the same order; our own
literal blocks decode to the headers they were built from and never touch the table; the
server's constant blocks through the table (:class:`TableEncoder`) decode to their lists
whatever sizes the peer allowed, within those sizes. A
block that fails (a bad index, a header list over the limit, a byte ``convert`` refuses)
raises what a plain decoder followed by ``convert`` raises first, whatever the caches
already hold.
"""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactantserver.h2.hpack import (
    BlockDecoder,
    TableEncoder,
    encode_headers,
    field_ends,
    hpack_int,
    literal,
)


def _pair(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    return name, value


def _ascii(name: bytes, value: bytes) -> tuple[str, str]:
    return name.decode("ascii"), value.decode("ascii")


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
    assert (field_ends(block) is not None) is neutral


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
    ours: BlockDecoder[tuple[bytes, bytes]] = BlockDecoder(_pair, 65536)
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
            if field_ends(block) is not None:
                assert list(plain.header_table.dynamic_entries) == before
            assert ours.decode(block) == want
            assert [tuple(h) for h in want] == pairs or not literal_only


PREFIX = encode_headers(
    [(b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b"te", b"trailers")]
)
field_st = st.one_of(
    # our literals: static-table name or string name, raw value (the gateway's grpc-timeout)
    st.tuples(st.sampled_from(NAMES), st.binary(max_size=200)).map(lambda p: literal(*p)),
    # a string name too long for one length byte
    st.binary(min_size=127, max_size=140).map(lambda v: literal(b"x-" + v.hex().encode(), v)),
    # hpack's own never-indexed encoding (Huffman where shorter)
    st.tuples(st.sampled_from(NAMES), st.binary(max_size=20)).map(
        lambda p: hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(*p)])
    ),
    st.sampled_from([b"\x82", b"\x86", b"\xbe", b"\xff\x00", b"\xff\x7f"]),  # indexed; bad ones
)


def _plain(block: bytes, limit: int) -> tuple[tuple[str, str], ...] | type[Exception]:
    plain = hpack.Decoder()
    plain.max_header_list_size = limit
    try:
        return tuple(_ascii(n, v) for n, v in plain.decode(block, raw=True))
    except Exception as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(field_st, min_size=1, max_size=5), min_size=1, max_size=10),
    st.sampled_from([120, 400, 65536]),
)
def test_fields_of_a_changing_block_decode_as_hpack_does(
    tails: list[list[bytes]], limit: int
) -> None:
    """Blocks that share a constant prefix and differ in their last fields (a forwarded
    ``grpc-timeout``, new every call): each decodes to what a plain decoder followed by
    ``convert`` gives, or raises the same error first, however many of its fields (or of
    the blocks before it) were seen already."""
    ours: BlockDecoder[tuple[str, str]] = BlockDecoder(_ascii, limit)
    for tail in tails:
        block = PREFIX + b"".join(tail)
        for _ in range(2):  # again: now from the caches
            want = _plain(block, limit)
            try:
                got: object = ours.decode(block)
            except Exception as exc:
                got = type(exc)
            assert got == want


def test_a_block_over_the_limit_fails_even_when_its_fields_are_known() -> None:
    """The header list limit holds for the block, not per field: known fields that add up
    past it raise hpack's error."""
    a, b = literal(b"x-a", b"a" * 40), literal(b"x-b", b"b" * 40)
    ours: BlockDecoder[tuple[str, str]] = BlockDecoder(_ascii, 140)
    assert ours.decode(a) == (("x-a", "a" * 40),)
    assert ours.decode(b) == (("x-b", "b" * 40),)
    with pytest.raises(hpack.OversizedHeaderListError):
        ours.decode(a + b)


# ---------------------------------------------------------------------- TableEncoder

ANSWER = [(":status", "200"), ("content-type", "application/grpc+proto")]
OK = [("grpc-status", "0")]
OTHER = [("grpc-status", "13"), ("grpc-message", "Internal Server Error")]
LISTS = {"answer": ANSWER, "ok": OK, "other": OTHER}
# Entry sizes (RFC 7541 §4.1): content-type's 66, grpc-status 0's 44, the rest 45 and 76.
SIZES = st.sampled_from([0, 40, 44, 66, 70, 110, 111, 150, 4096])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(sorted(LISTS)), st.tuples(st.just("resize"), SIZES)),
        max_size=30,
    )
)
def test_constant_blocks_through_the_table_decode_as_sent(ops: list[object]) -> None:
    """Whatever mix of constant lists and lowered table sizes: every block the encoder
    gives, opened by the size updates it owes, decodes with a plain ``hpack.Decoder``
    (held to each size the peer allowed) to exactly its list; the decoder's table never
    holds more than that size; and once a list's fields are in the table it costs one
    byte a field."""
    encoder = TableEncoder()
    decoder = hpack.Decoder()
    allowed = 4096
    for op in ops:
        if isinstance(op, tuple):
            if op[1] < encoder.size:  # the connection passes on lower sizes only
                encoder.resize(op[1])
                allowed = op[1]
                decoder.max_allowed_table_size = allowed
            continue
        headers = LISTS[op]
        block = encoder.take_updates() + encoder.encode(headers)
        assert decoder.decode(block) == headers
        table = decoder.header_table
        assert table.maxsize <= allowed  # the updates owed were sent
        assert sum(len(n) + len(v) + 32 for n, v in table.dynamic_entries) <= allowed
        again = encoder.encode(headers)
        if field_ends(again) is not None and all(b & 0x80 for b in again):
            assert len(again) == len(headers)  # all indexed: one byte each
        assert decoder.decode(again) == headers


def test_after_the_first_answer_the_headers_and_trailers_are_three_bytes() -> None:
    encoder = TableEncoder()
    first = encoder.encode(ANSWER) + encoder.encode(OK)
    assert len(first) > 30  # the literals that add the two entries
    assert encoder.encode(ANSWER) == b"\x88\xbf"  # :status 200 static, content-type 63
    assert encoder.encode(OK) == b"\xbe"  # grpc-status 0, the newest entry (62)
    decoder = hpack.Decoder()
    assert decoder.decode(first) == ANSWER + OK
    assert decoder.decode(b"\x88\xbf\xbe") == ANSWER + OK


def test_a_table_too_small_for_an_entry_gets_literals_and_a_lowered_one_starts_over() -> None:
    encoder = TableEncoder()
    encoder.resize(50)  # room for grpc-status 0 (44), not for content-type (66)
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 50
    assert decoder.decode(encoder.take_updates() + encoder.encode(ANSWER)) == ANSWER
    assert len(decoder.header_table.dynamic_entries) == 0  # content-type: a plain literal
    assert decoder.decode(encoder.encode(OK)) == OK
    assert encoder.encode(OK) == b"\xbe"
    encoder.resize(40)  # grpc-status 0 no longer fits: the table is emptied, then 40
    updates = encoder.take_updates()
    assert updates == hpack_int(0, 5, 0x20) + hpack_int(40, 5, 0x20)
    assert encoder.take_updates() == b""  # said once
    decoder.max_allowed_table_size = 40
    assert decoder.decode(updates + encoder.encode(OK)) == OK
    assert len(decoder.header_table.dynamic_entries) == 0

"""The sans-IO rules of the wire: headers (``request_head``) and message framing
(``MessageFramer``), as properties over generated input plus a few named cases.

The HTTP/2 layer applies these as events arrive (``transport/h2guard.py``); here they
run alone, with no socket, so every chunking of every byte sequence can be tried.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import (
    chunked,
    grpc_message_streams,
    grpc_prefix,
    grpc_timeouts,
    wire_garbage,
)

from reactantserver.grpcwire import parse_grpc_timeout
from reactantserver.status import StatusCode
from reactantserver.transport.core.framing import MessageFramer, Refusal, RequestHead, request_head
from reactantserver.transport.core.limits import Fault, WireLimits

LIMIT = 100


def feed_all(framer: MessageFramer, chunks: list[bytes]) -> tuple[int, Refusal | None]:
    """Feed ``chunks`` until one is refused: (index of that chunk or len, refusal)."""
    for index, chunk in enumerate(chunks):
        refusal = framer.feed(chunk)
        if refusal is not None:
            return index, refusal
    return len(chunks), framer.end()


def byte_by_byte(data: bytes, *, unary: bool) -> tuple[int, Refusal | None]:
    """Where (byte index) and how a stream of ``data`` is refused, one byte at a time."""
    framer = MessageFramer(LIMIT, unary=unary)
    for index in range(len(data)):
        refusal = framer.feed(data[index : index + 1])
        if refusal is not None:
            return index, refusal
    return len(data), framer.end()


# ---------------------------------------------------------------------------- properties


@given(data=st.data(), body=grpc_message_streams(LIMIT))
def test_well_formed_streams_are_never_refused(data: st.DataObject, body: bytes) -> None:
    """A streaming request made of messages within the limit is accepted whatever DATA
    frames carry it, and so is a unary request of exactly one such message."""
    framer = MessageFramer(LIMIT, unary=False)
    chunks = data.draw(chunked(body))
    assert feed_all(framer, chunks) == (len(chunks), None)
    one = grpc_prefix(len(body[:LIMIT])) + body[:LIMIT]
    unary = MessageFramer(LIMIT, unary=True)
    pieces = data.draw(chunked(one))
    assert feed_all(unary, pieces) == (len(pieces), None)


@given(data=st.data(), body=wire_garbage(LIMIT), unary=st.booleans())
@example(data=None, body=grpc_prefix(2**32 - 1) + b"x" * 8, unary=True)
@example(data=None, body=grpc_prefix(4, flags=1) + b"abcd", unary=False)
@example(data=None, body=grpc_prefix(10) + b"short", unary=True)
def test_the_verdict_does_not_depend_on_the_chunking(
    data: st.DataObject | None, body: bytes, unary: bool
) -> None:
    """Any body, split into DATA frames any way, gets the same verdict as when it
    arrives one byte at a time, and a refusal comes with the frame that holds the byte
    that decides it -- never later, so nothing past that byte is ever accepted."""
    where, refusal = byte_by_byte(body, unary=unary)
    chunks = data.draw(chunked(body)) if data is not None else [body]
    framer = MessageFramer(LIMIT, unary=unary)
    index, got = feed_all(framer, chunks)
    assert got == refusal
    if refusal is not None and where < len(body):
        start = sum(len(c) for c in chunks[:index])
        assert start <= where < start + len(chunks[index])


@given(length=st.integers(LIMIT + 1, 2**32 - 1), cut=st.integers(1, 4), tail=st.binary(max_size=32))
def test_an_oversized_prefix_is_refused_by_the_feed_that_completes_it(
    length: int, cut: int, tail: bytes
) -> None:
    """A prefix declaring more than the limit is RESOURCE_EXHAUSTED as soon as its fifth
    byte arrives, before any byte of the body is accepted."""
    framer = MessageFramer(LIMIT, unary=True)
    prefix = grpc_prefix(length)
    assert framer.feed(prefix[:cut]) is None
    refusal = framer.feed(prefix[cut:] + tail)
    assert refusal is not None
    assert refusal.code is StatusCode.RESOURCE_EXHAUSTED
    assert refusal.fault is Fault.MESSAGE_TOO_LARGE
    assert f"request message of {length} bytes exceeds the limit of {LIMIT} bytes" in (
        refusal.message
    )


@given(value=grpc_timeouts())
@example(value="99999999H")
@example(value="00000000n")
def test_grpc_timeout_is_parsed_exactly_as_the_spec_says(value: str) -> None:
    """1 to 8 ASCII digits and one of H M S m u n parse to digits x unit; anything else
    is refused with INVALID_ARGUMENT naming the header, never an exception."""
    units = {"H": 3600, "M": 60, "S": 1, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    valid = 1 <= len(value) - 1 <= 8 and value[:-1].isdigit() and value[:-1].isascii()
    valid = valid and value[-1] in units
    head = request_head([*BASE_HEADERS, ("grpc-timeout", value)])
    if valid:
        seconds = int(value[:-1]) * units[value[-1]]
        assert math.isclose(parse_grpc_timeout(value), seconds)
        if seconds > 0:
            assert isinstance(head, RequestHead) and head.timeout == parse_grpc_timeout(value)
        else:
            assert isinstance(head, Refusal) and head.code is StatusCode.DEADLINE_EXCEEDED
    else:
        with pytest.raises(ValueError):
            parse_grpc_timeout(value)
        assert isinstance(head, Refusal) and head.code is StatusCode.INVALID_ARGUMENT
        assert head.fault is Fault.BAD_TIMEOUT and "grpc-timeout" in head.message


@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from([":method", ":path", "content-type", "te", "grpc-encoding", "x"]),
            st.text(max_size=20),
        ),
        max_size=8,
    )
)
def test_any_header_list_gets_a_head_or_a_refusal(headers: list[tuple[str, str]]) -> None:
    """Whatever headers arrive, the check answers (never raises), and a refusal is a
    client error with a message -- never UNKNOWN or INTERNAL."""
    head = request_head(headers)
    if isinstance(head, Refusal):
        assert head.code not in (StatusCode.UNKNOWN, StatusCode.INTERNAL)
        assert head.message
    else:
        assert head.path


# ---------------------------------------------------------------------------- named cases

BASE_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Service/Method"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def replaced(name: str, value: str | None) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in BASE_HEADERS if k != name]
    return headers if value is None else [*headers, (name, value)]


@pytest.mark.parametrize(
    ("headers", "code", "http", "text"),
    [
        (replaced(":method", "GET"), StatusCode.INVALID_ARGUMENT, 405, "HTTP POST"),
        (replaced("content-type", "text/html"), StatusCode.INVALID_ARGUMENT, 415, "content-type"),
        (
            replaced("content-type", "application/grpc+json"),
            StatusCode.INVALID_ARGUMENT,
            415,
            "content-type",
        ),
        (replaced("te", None), StatusCode.INVALID_ARGUMENT, 400, "te: trailers"),
        (replaced(":path", None), StatusCode.INVALID_ARGUMENT, 400, ":path"),
        (
            [*BASE_HEADERS, ("grpc-encoding", "snappy")],
            StatusCode.UNIMPLEMENTED,
            200,
            "grpc-encoding 'snappy' is not supported",
        ),
        ([*BASE_HEADERS, ("grpc-timeout", "0m")], StatusCode.DEADLINE_EXCEEDED, 200, "deadline"),
    ],
)
def test_refused_headers(
    headers: list[tuple[str, str]], code: StatusCode, http: int, text: str
) -> None:
    head = request_head(headers)
    assert isinstance(head, Refusal)
    assert (head.code, head.http_status) == (code, http)
    assert text in head.message


def test_accepted_headers() -> None:
    head = request_head(
        [
            *BASE_HEADERS,
            ("grpc-encoding", "identity"),
            ("grpc-timeout", "5S"),
            ("grpc-timeout", "300m"),
            ("user-agent", "grpc-python/1.0"),
        ]
    )
    assert head == RequestHead("/pkg.Service/Method", 0.3, "5S, 300m", "grpc-python/1.0")
    assert isinstance(request_head(replaced("content-type", "application/grpc+proto")), RequestHead)


def test_unsupported_encoding_says_what_is_accepted() -> None:
    head = request_head([*BASE_HEADERS, ("grpc-encoding", "br")])
    assert isinstance(head, Refusal)
    assert head.headers == (("grpc-accept-encoding", "identity,deflate,gzip"),)


@pytest.mark.parametrize("encoding", ["identity", "deflate", "gzip"])
def test_served_encodings_are_accepted(encoding: str) -> None:
    head = request_head([*BASE_HEADERS, ("grpc-encoding", encoding)])
    assert isinstance(head, RequestHead)
    assert head.encoding == encoding and head.compressed is (encoding != "identity")
    assert request_head(BASE_HEADERS) == RequestHead("/pkg.Service/Method")  # identity


def test_the_compressed_flag_needs_an_encoding() -> None:
    """A message flagged compressed is refused on a call that named no encoding, and
    passes (its compressed length held to the limit) on one that did."""
    body = grpc_prefix(3, flags=1) + b"abc"
    _, refusal = feed_all(MessageFramer(LIMIT, unary=True), [body])
    assert refusal is not None and "no grpc-encoding header" in refusal.message
    assert feed_all(MessageFramer(LIMIT, unary=True, compressed=True), [body]) == (1, None)
    too_long = grpc_prefix(LIMIT + 1, flags=1)
    _, refusal = feed_all(MessageFramer(LIMIT, unary=True, compressed=True), [too_long])
    assert refusal is not None and refusal.code is StatusCode.RESOURCE_EXHAUSTED
    _, refusal = feed_all(
        MessageFramer(LIMIT, unary=True, compressed=True), [grpc_prefix(0, flags=2)]
    )
    assert refusal is not None and "flags byte is 0x02" in refusal.message


@pytest.mark.parametrize(
    ("body", "unary", "text"),
    [
        (grpc_prefix(3, flags=1) + b"abc", False, "compressed flag set"),
        (grpc_prefix(3, flags=0x80) + b"abc", False, "flags byte is 0x80"),
        (grpc_prefix(1) + b"a" + grpc_prefix(0), True, "a second one arrived"),
        (grpc_prefix(10) + b"abc", True, "after 3 of the 10 message bytes"),
        (grpc_prefix(10)[:2], True, "inside a message's 5-byte prefix (2 of 5 bytes)"),
        (b"", True, "without a request message"),
    ],
)
def test_malformed_messages(body: bytes, unary: bool, text: str) -> None:
    framer = MessageFramer(LIMIT, unary=unary)
    _, refusal = feed_all(framer, [body])
    assert refusal is not None
    assert refusal.code is StatusCode.INVALID_ARGUMENT
    assert refusal.fault is Fault.MALFORMED_MESSAGE
    assert text in refusal.message


def test_streaming_requests_may_be_empty_or_many() -> None:
    assert feed_all(MessageFramer(LIMIT, unary=False), []) == (0, None)
    body = grpc_prefix(0) * 3 + grpc_prefix(2) + b"ab"
    assert feed_all(MessageFramer(LIMIT, unary=False), [body]) == (1, None)


def test_limits_record_validates_and_bounds() -> None:
    limits = WireLimits()
    assert limits.max_frame_size == 1 << 20
    assert limits.worst_case_buffered_bytes() == 256 * 128 * ((512 << 20) + (16 << 20))
    with pytest.raises(ValueError, match="max_frame_size"):
        WireLimits(max_frame_size=1 << 24)
    with pytest.raises(ValueError, match="handshake_timeout"):
        WireLimits(handshake_timeout=0)
    with pytest.raises(ValueError, match="max_concurrent_streams"):
        WireLimits(max_concurrent_streams=0)


def test_a_refused_size_names_the_setting_given() -> None:
    """The refusal names the key that sets the limit in the process that refuses (issue
    35, item 4): a worker's ``endpoints.max_message_bytes`` unless told otherwise."""
    prefix = b"\x00" + (LIMIT + 1).to_bytes(4, "big")
    worker = MessageFramer(LIMIT, unary=True).feed(prefix)
    gateway = MessageFramer(LIMIT, unary=True, setting="grpc.max_recv_msg_bytes").feed(prefix)
    assert worker is not None and "(endpoints.max_message_bytes)" in worker.message
    assert gateway is not None and "(grpc.max_recv_msg_bytes)" in gateway.message
    assert "endpoints" not in gateway.message

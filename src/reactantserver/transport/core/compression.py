"""Compressed request messages (``grpc-encoding: gzip`` / ``deflate``), inflated within bounds.

Sans-IO, like :mod:`.framing`: given a message's bytes, it returns the inflated message
or a :class:`~.framing.Refusal`; the connection (:mod:`..unary`, :mod:`..server`) decides
when each step runs.

Why
---
gRPC lets a client compress each message (the 5-byte prefix's flag, with the algorithm
named by ``grpc-encoding``); Triton accepts gzip and deflate, and its clients send them
on request (``infer_client -C gzip``, tritonclient's ``compression_algorithm=``). A
compressed message is a promise about its size that the sender does not have to keep:
deflate expands up to about 1032 times, so the 512 KiB a client may send becomes half a
gigabyte, and a "zip bomb" of a few kilobytes asks for more memory than the machine has.
Two rules keep that bounded:

* **The inflated message is held to the message limit.** ``max_message_bytes`` bounds
  what a message is *after* inflation, as it bounds an uncompressed one (the framer has
  already bounded the compressed bytes). zlib is asked for at most the bytes still
  allowed plus one (``decompressobj`` with ``max_length``), so a bomb is refused with
  RESOURCE_EXHAUSTED having produced at most ``limit + 1`` bytes -- never inflated past
  the limit first and measured after.
* **Inflating never holds the event loop for long.** :class:`Inflater` produces at most
  :data:`STEP` bytes per :meth:`~Inflater.step`; the connection runs one step per pass of
  the event loop, so one large message (zlib inflates a few hundred MB/s) delays the
  other calls by one step at a time, not by the whole message.

A stream that is not valid gzip (RFC 1952) or zlib (RFC 1950, what gRPC calls
``deflate``), is cut short, or carries bytes after its end is INVALID_ARGUMENT. The
compressed flag on a message of a call without ``grpc-encoding`` is refused by the
framer; a message without the flag on a call with one is taken as it is (gRPC allows
that per message).

Responses are never compressed: measured in ``nox -s bench`` (docs/protocol.md,
"Compression"), tensor bytes barely shrink and compressing them costs more CPU than the
bytes saved take to send on any link a server sits on. A compressed request's answer
says what is accepted (``grpc-accept-encoding``), as the gRPC compression spec asks.

Invariants (``tests/transport/test_wire_compression.py``): for any message and split into steps,
inflating returns exactly the original bytes when they fit the limit, and a refusal
otherwise; no step produces more than :data:`STEP` bytes; the total produced never
exceeds ``limit + 1``.
"""

from __future__ import annotations

import zlib

from reactantserver.grpcwire import StatusCode

from .framing import ACCEPT_ENCODING, Refusal
from .limits import Fault

__all__ = ["ACCEPT_ENCODING", "FEED", "STEP", "WBITS", "Inflater", "accepting"]

#: ``grpc-encoding`` -> zlib's ``wbits``: gzip's header and trailer, or zlib's (RFC 1950).
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: Bytes one step inflates at most (about a millisecond of zlib's work).
STEP = 1024 * 1024
#: Compressed bytes handed to zlib at a time.
FEED = 256 * 1024


def accepting(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` (a response's initial headers) saying what this server accepts: the
    answer to a compressed request tells its client, as the gRPC compression spec asks."""
    return [*headers, ("grpc-accept-encoding", ACCEPT_ENCODING)]


class Inflater:
    """One compressed message, inflated a step at a time (module docstring).

    The input goes to zlib :data:`FEED` bytes at a time (views of the message, not
    copies): what zlib leaves unconsumed when a step's output is full is copied by zlib,
    and a tail the size of the whole message would be copied again at every step.
    """

    __slots__ = ("_data", "_decompressor", "_encoding", "_left", "_limit", "_parts", "_pos",
                 "_produced", "_setting", "_tail")  # fmt: skip

    def __init__(
        self,
        data: bytes | memoryview,
        encoding: str,
        limit: int,
        setting: str = "endpoints.max_message_bytes",
    ) -> None:
        self._encoding = encoding
        self._decompressor = zlib.decompressobj(WBITS[encoding])
        self._data = memoryview(data).cast("B")
        #: Next byte of ``data`` not yet given to zlib, and what zlib left of the last feed.
        self._pos = 0
        self._tail = b""
        self._limit = limit
        #: Bytes the message may still grow by before it is over the limit.
        self._left = limit
        self._produced = 0
        self._setting = setting
        self._parts: list[bytes] = []

    @property
    def inflated(self) -> int:
        """Bytes zlib produced so far (a refused step's included)."""
        return self._produced

    def step(self) -> bytes | Refusal | None:
        """Inflate up to :data:`STEP` more bytes: the whole message once it is complete,
        a refusal if it cannot be, else None (call again)."""
        d = self._decompressor
        if self._tail:
            feed: bytes | memoryview = self._tail
        else:
            feed = self._data[self._pos : self._pos + FEED]
            self._pos += len(feed)
        try:
            out = d.decompress(feed, min(STEP, self._left + 1))
        except zlib.error as exc:
            return self._malformed(f"it is not a valid {self._encoding} stream ({exc})")
        self._tail = d.unconsumed_tail
        self._produced += len(out)
        if len(out) > self._left:
            return Refusal(
                StatusCode.RESOURCE_EXHAUSTED,
                f"the request message inflates past the limit of {self._limit} bytes "
                f"({self._setting}); send less, or send it uncompressed in shared memory",
                Fault.MESSAGE_TOO_LARGE,
            )
        self._left -= len(out)
        if out:
            self._parts.append(out)
        if d.eof:
            extra = len(d.unused_data) + len(self._data) - self._pos
            if extra:
                return self._malformed(
                    f"{extra} bytes follow the end of its {self._encoding} stream"
                )
            parts, self._parts = self._parts, []
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if not out and not self._tail and self._pos >= len(self._data):
            return self._malformed(f"its {self._encoding} stream is cut short")
        return None

    def run(self) -> bytes | Refusal:
        """Every step at once (for a message known to be small, and for tests)."""
        while True:
            result = self.step()
            if result is not None:
                return result

    def _malformed(self, why: str) -> Refusal:
        return Refusal(
            StatusCode.INVALID_ARGUMENT,
            f"the request message is marked compressed ({self._encoding}), but {why}",
            Fault.MALFORMED_MESSAGE,
        )

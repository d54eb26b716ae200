"""Every request but ModelInfer is decoded with bounded work (protocol/screen.py).

The screen walks a message with our reader against its schema before betterproto parses
it: the result must be what betterproto reads from the same bytes, unknown fields must
change nothing, any bytes must give a message or ``InvalidArgument``, and the work budget
must refuse what would hold the event loop (issue 41: a 300 KB ServerLive of three-byte
unknown fields held it 0.6-6 s).
"""

from __future__ import annotations

import betterproto
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import codec_unknown_field, screened_requests

from reactantserver.errors import InvalidArgument
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.protocol.screen import MAX_FIELDS, MESSAGE_UNITS, decode_message


@given(screened_requests())
def test_a_request_reads_as_betterproto_reads_it(message: betterproto.Message) -> None:
    """Without unknown fields, the screen changes nothing: the message decodes to what
    betterproto's own parser reads from the same bytes (and to the message sent)."""
    data = bytes(message)
    kind = type(message)
    assert decode_message(data, kind) == kind().parse(data) == message


@given(screened_requests(), st.lists(codec_unknown_field(), min_size=1, max_size=4), st.data())
def test_unknown_fields_change_nothing(
    message: betterproto.Message, unknown: list[bytes], data: st.DataObject
) -> None:
    """Unknown fields anywhere at the top level decode to the message without them --
    or, where they take it past the work budget (which counts unknown fields too, nested
    groups' included: the module docstring), to the budget's refusal and no other."""
    wire = bytes(message)
    for field in unknown:
        at = data.draw(st.sampled_from(_field_boundaries(wire)))
        wire = wire[:at] + field + wire[at:]
    try:
        decoded = decode_message(wire, type(message))
    except InvalidArgument as exc:
        # Found by Hypothesis (2026-12-03): a 41-byte RepositoryModelLoadRequest with two
        # map entries and three unknown groups of nested groups costs more than 48 units.
        assert f"more than {MAX_FIELDS} protobuf fields" in str(exc)
        assert decode_message(bytes(message), type(message)) == message
        return
    assert decoded == message


def _field_boundaries(wire: bytes) -> list[int]:
    """Offsets in ``wire`` where a top-level field begins (and the end)."""
    from reactantserver.protocol.wire_reader import Reader

    r = Reader(wire, 0, len(wire), "m")
    found = [0]
    while r.pos < r.end:
        number, kind = r.tag()
        r.skip(number, kind)
        found.append(r.pos)
    return found


def test_unknown_fields_inside_a_nested_message_are_dropped() -> None:
    param = bytes(pb.ModelRepositoryParameter(string_param="x")) + b"\x52\x01\x00"
    entry = b"\x0a\x01k" + b"\x12" + bytes([len(param)]) + param
    wire = (
        bytes(pb.RepositoryModelLoadRequest(model_name="m")) + b"\x1a" + bytes([len(entry)]) + entry
    )
    assert decode_message(wire, pb.RepositoryModelLoadRequest) == pb.RepositoryModelLoadRequest(
        model_name="m", parameters={"k": pb.ModelRepositoryParameter(string_param="x")}
    )


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_fail_as_invalid_argument(data: bytes) -> None:
    """Whatever the bytes, a message comes back or InvalidArgument, nothing else."""
    for kind in (pb.SystemSharedMemoryRegisterRequest, pb.RepositoryModelLoadRequest,
                 cpb.SetModelPolicyRequest):  # fmt: skip
        try:
            decode_message(data, kind)
        except InvalidArgument:
            pass


def test_the_work_budget_refuses_what_would_hold_the_loop() -> None:
    assert (
        decode_message(b"\x52\x01\x00" * MAX_FIELDS, pb.ServerLiveRequest) == pb.ServerLiveRequest()
    )
    with pytest.raises(InvalidArgument) as refused:
        decode_message(b"\x52\x01\x00" * 100_000, pb.ServerLiveRequest)
    assert str(refused.value) == (
        f"ServerLiveRequest has more than {MAX_FIELDS} protobuf fields (nested ones and the "
        "elements of packed integer lists counted): no client sends one so intricate, and "
        "decoding it would hold up every other call"
    )
    # A nested message costs more: what betterproto spends building its object.
    entry = b"\x1a\x08\x0a\x01a\x12\x03\x1a\x01x"
    per_entry = 2 * (1 + MESSAGE_UNITS) + 2
    fits = MAX_FIELDS // per_entry
    assert len(decode_message(entry * fits, pb.RepositoryModelLoadRequest).parameters) == 1
    with pytest.raises(InvalidArgument):
        decode_message(entry * (fits + 1), pb.RepositoryModelLoadRequest)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x02\xff\xfe", "malformed SystemSharedMemoryRegisterRequest: name is not valid UTF-8"),
        (b"\x0a\x05ab", "malformed SystemSharedMemoryRegisterRequest: length 5 at byte 1 runs past the end of the message (4)"),
        (b"\x18\x01\x02", "malformed SystemSharedMemoryRegisterRequest: field number 0 at byte 2"),
        (b"\x1a\x00", "malformed SystemSharedMemoryRegisterRequest: offset has wire type 2, expected 0"),
        (b"\x20", "malformed SystemSharedMemoryRegisterRequest: varint at byte 1 is truncated"),
    ],
)  # fmt: skip
def test_malformed_requests_are_named(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        decode_message(data, pb.SystemSharedMemoryRegisterRequest)
    assert str(refused.value) == message

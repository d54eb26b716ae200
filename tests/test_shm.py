"""The system shared-memory registry against real POSIX shared memory objects."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from reactantserver.errors import FailedPrecondition, InvalidArgument, NotFound
from reactantserver.shm import RegionInfo, SharedMemoryRegistry


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    shm = shared_memory.SharedMemory(name=f"rs_test_{uuid.uuid4().hex[:8]}", create=True, size=8192)
    try:
        yield shm
    finally:
        shm.close()
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def test_register_read_write_in_place(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    data = np.arange(16, dtype=np.float32)
    segment.buf[4096 + 64 : 4096 + 128] = data.tobytes()
    # A non page-aligned window: offset 4096 + 32 inside the object.
    reg.register("in", "/" + segment.name, 4096 + 32, 1024)
    view = reg.view("in", 32, 64)
    arr = np.frombuffer(view, dtype=np.float32)
    np.testing.assert_array_equal(arr, data)
    # Writes land in the client's memory.
    reg.view("in", 0, 4)[:] = b"\x01\x02\x03\x04"
    assert bytes(segment.buf[4096 + 32 : 4096 + 36]) == b"\x01\x02\x03\x04"
    del arr, view
    assert reg.status() == [RegionInfo("in", "/" + segment.name, 4128, 1024)]
    reg.close()


def test_bounds_are_checked_at_register_and_use(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    key = "/" + segment.name
    with pytest.raises(InvalidArgument, match=r"offset 8000 \+ byte_size 1000 exceeds the size"):
        reg.register("r", key, 8000, 1000)
    with pytest.raises(InvalidArgument, match="does not exist"):
        reg.register("r", "/no_such_segment_here", 0, 16)
    with pytest.raises(InvalidArgument, match="not a POSIX shared memory name"):
        reg.register("r", "/../etc/passwd", 0, 16)
    reg.register("r", key, 0, 100)
    with pytest.raises(InvalidArgument, match="outside the registered 100 bytes"):
        reg.view("r", 90, 20)
    # Overflow-shaped numbers are refused, not wrapped.
    with pytest.raises(InvalidArgument, match="outside"):
        reg.view("r", 1 << 62, 1 << 62)
    with pytest.raises(InvalidArgument, match="outside"):
        reg.view("r", -1, 4)
    reg.close()


def test_unknown_region_is_failed_precondition() -> None:
    reg = SharedMemoryRegistry()
    with pytest.raises(FailedPrecondition, match="'nope' is not registered"):
        reg.view("nope", 0, 4)
    with pytest.raises(NotFound):
        reg.status("nope")


def test_unregister_is_idempotent_and_empty_means_all(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    key = "/" + segment.name
    reg.register("a", key, 0, 16)
    reg.register("b", key, 16, 16)
    reg.unregister("a")
    reg.unregister("a")
    assert [r.name for r in reg.status()] == ["b"]
    reg.unregister("")
    assert reg.status() == []


def test_reregister_replaces(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    key = "/" + segment.name
    reg.register("a", key, 0, 16)
    reg.register("a", key, 32, 64)
    assert reg.status() == [RegionInfo("a", key, 32, 64)]
    reg.close()


def test_unregister_while_a_view_is_held(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    reg.register("a", "/" + segment.name, 0, 64)
    view = reg.view("a", 0, 8)
    reg.unregister("a")  # must not raise although `view` still exports the buffer
    view[:] = b"12345678"
    assert bytes(segment.buf[:8]) == b"12345678"
    view.release()


def test_recreated_object_is_stale(segment: shared_memory.SharedMemory) -> None:
    reg = SharedMemoryRegistry()
    key = "/" + segment.name
    reg.register("a", key, 0, 64)
    segment.unlink()
    with pytest.raises(FailedPrecondition, match="stale"):
        reg.view("a", 0, 8)
    again = shared_memory.SharedMemory(name=segment.name, create=True, size=64)
    try:
        with pytest.raises(FailedPrecondition, match="register it again"):
            reg.view("a", 0, 8)
        reg.register("a", key, 0, 64)
        assert len(reg.view("a", 0, 8)) == 8
    finally:
        reg.close()
        again.close()
        again.unlink()
    assert not os.path.exists("/dev/shm/" + segment.name)

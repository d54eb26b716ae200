"""The system shared-memory registry against real files under /dev/shm.

The registry never maps a client's object: it holds a file descriptor and reads and
writes with ``preadv``/``pwritev``. These tests check the rules of ``reactantserver.shm``
one by one -- keys, bounds, staleness, descriptors -- and a Hypothesis state machine
checks that descriptors are closed exactly when the last user of a region is done.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from reactantserver.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from reactantserver.shm import Lease, RegionInfo, SharedMemoryRegistry, object_exists

SHM = Path("/dev/shm")
PREFIX = "reactantserver-test_shm_"


@pytest.fixture
def make() -> Iterator[Callable[[int], tuple[str, Path]]]:
    """``make(size) -> (key, path)``: a fresh zero-filled object, removed afterwards."""
    made: list[Path] = []

    def new(size: int) -> tuple[str, Path]:
        path = SHM / f"{PREFIX}{uuid.uuid4().hex[:10]}"
        path.write_bytes(bytes(size))
        made.append(path)
        return "/" + path.name, path

    yield new
    for path in made:
        if path.is_symlink() or path.exists():
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()


def shm_fds() -> int:
    """File descriptors of this process open on our test objects."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(SHM / PREFIX)):
            count += 1
    return count


def test_read_and_write_at_any_offset(make: Callable[[int], tuple[str, Path]]) -> None:
    key, path = make(8192)
    data = np.arange(16, dtype=np.float32)
    with open(path, "r+b") as f:
        f.seek(4128 + 32)
        f.write(data.tobytes())
    reg = SharedMemoryRegistry()
    reg.register("in", key, 4128, 1024)  # not page aligned: nothing is mapped
    got = reg.read("in", 32, 64)
    assert got.dtype == np.uint8 and got.flags.writeable
    np.testing.assert_array_equal(got.view(np.float32), data)
    assert reg.write("in", 0, np.array([1, 2, 3, 4], np.uint8)) == 4
    assert path.read_bytes()[4128:4132] == b"\x01\x02\x03\x04"
    assert reg.write("in", 1020, memoryview(b"abcd")) == 4
    assert reg.status() == [RegionInfo("in", key, 4128, 1024)]
    assert reg.read("in", 0, 0).size == 0
    reg.close()
    assert shm_fds() == 0


def test_bounds_are_checked_at_register_and_use(make: Callable[[int], tuple[str, Path]]) -> None:
    key, _ = make(8192)
    reg = SharedMemoryRegistry()
    with pytest.raises(InvalidArgument, match=r"offset 8000 \+ byte_size 1000 exceeds the size"):
        reg.register("r", key, 8000, 1000)
    with pytest.raises(InvalidArgument, match="offset must be >= 0 and byte_size > 0"):
        reg.register("r", key, 0, 0)
    reg.register("r", key, 0, 100)
    with pytest.raises(InvalidArgument, match="outside the registered 100 bytes"):
        reg.read("r", 90, 20)
    with pytest.raises(InvalidArgument, match="outside the registered 100 bytes"):
        reg.write("r", 99, b"ab")
    # Overflow-shaped numbers are refused, not wrapped.
    for offset, size in ((1 << 62, 1 << 62), (-1, 4), (4, -1)):
        with pytest.raises(InvalidArgument, match="outside"):
            reg.read("r", offset, size)
        with pytest.raises(InvalidArgument, match="outside"):
            reg.check("r", offset, size)
    reg.close()


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("/" + "k" * 256, "longer than 255"),
        ("/" + "k" * 5000, "longer than 255"),
        ("name", "not a POSIX shared memory name"),
        ("/", "not a POSIX shared memory name"),
        ("", "not a POSIX shared memory name"),
        ("/a/b", "not a POSIX shared memory name"),
        ("/../etc/passwd", "not a POSIX shared memory name"),
        ("/.", "not a POSIX shared memory name"),
        ("/..", "not a POSIX shared memory name"),
        ("/white space", "not a POSIX shared memory name"),
        ("/nul\x00byte", "not a POSIX shared memory name"),
        ("/ünïcode", "not a POSIX shared memory name"),
        (f"/{PREFIX}does_not_exist", "does not exist"),
    ],
)
def test_keys_are_validated(key: str, expected: str) -> None:
    reg = SharedMemoryRegistry()
    with pytest.raises(InvalidArgument, match=expected):
        reg.register("r", key, 0, 8)
    assert len(reg) == 0


def test_links_directories_and_fifos_are_refused(
    make: Callable[[int], tuple[str, Path]], tmp_path: Path
) -> None:
    reg = SharedMemoryRegistry()
    victim = tmp_path / "victim"
    victim.write_bytes(bytes(64))
    link_key, link = make(0)
    link.unlink()
    link.symlink_to(victim)
    with pytest.raises(InvalidArgument, match="is a symbolic link"):
        reg.register("r", link_key, 0, 8)
    dir_key, directory = make(0)
    directory.unlink()
    directory.mkdir()
    with pytest.raises(InvalidArgument, match=r"not a regular file \(it is a directory\)"):
        reg.register("r", dir_key, 0, 8)
    fifo_key, fifo = make(0)
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgument, match="is not a regular file"):
        reg.register("r", fifo_key, 0, 8)  # and returns: O_NONBLOCK
    assert len(reg) == 0 and shm_fds() == 0
    # IsSameIPCNamespace's probe sees none of them, and never blocks on the FIFO.
    assert not object_exists(link_key)
    assert not object_exists(dir_key)
    assert not object_exists(fifo_key)
    assert not object_exists(f"/{PREFIX}missing")
    ok_key, _ = make(8)
    assert object_exists(ok_key)
    with pytest.raises(InvalidArgument):
        object_exists("/a/b")


def test_region_names_are_bounded(make: Callable[[int], tuple[str, Path]]) -> None:
    key, _ = make(64)
    reg = SharedMemoryRegistry()
    with pytest.raises(InvalidArgument, match="must not be empty"):
        reg.register("", key, 0, 8)
    with pytest.raises(InvalidArgument, match="longer than 255"):
        reg.register("n" * 256, key, 0, 8)
    with pytest.raises(InvalidArgument, match="unprintable"):
        reg.register("bell\a", key, 0, 8)


def test_region_count_is_capped(make: Callable[[int], tuple[str, Path]]) -> None:
    key, _ = make(64)
    reg = SharedMemoryRegistry(max_regions=2)
    reg.register("a", key, 0, 8)
    reg.register("b", key, 8, 8)
    with pytest.raises(ResourceExhausted, match=r"endpoints.max_shm_regions\) is 2"):
        reg.register("c", key, 16, 8)
    reg.register("a", key, 16, 8)  # replacing is not a new region
    assert [r.name for r in reg.status()] == ["b", "a"]
    assert shm_fds() == 2
    reg.close()
    assert shm_fds() == 0


def test_unknown_region_is_failed_precondition() -> None:
    reg = SharedMemoryRegistry()
    for use in (lambda: reg.read("nope", 0, 4), lambda: reg.write("nope", 0, b"x")):
        with pytest.raises(FailedPrecondition, match="'nope' is not registered"):
            use()
    with pytest.raises(FailedPrecondition, match="'nope' is not registered"):
        reg.check("nope", 0, 4)
    with pytest.raises(NotFound):
        reg.status("nope")


def test_unregister_is_idempotent_and_empty_means_all(
    make: Callable[[int], tuple[str, Path]],
) -> None:
    key, _ = make(64)
    reg = SharedMemoryRegistry()
    reg.register("a", key, 0, 16)
    reg.register("b", key, 16, 16)
    reg.unregister("a")
    reg.unregister("a")
    assert [r.name for r in reg.status()] == ["b"]
    reg.unregister("")
    assert reg.status() == [] and shm_fds() == 0


def test_reregister_replaces_and_closes_the_old_descriptor(
    make: Callable[[int], tuple[str, Path]],
) -> None:
    key, _ = make(128)
    reg = SharedMemoryRegistry()
    reg.register("a", key, 0, 16)
    reg.register("a", key, 32, 64)
    assert reg.status() == [RegionInfo("a", key, 32, 64)]
    assert shm_fds() == 1
    reg.close()


def test_unregister_while_a_lease_is_held(make: Callable[[int], tuple[str, Path]]) -> None:
    key, path = make(64)
    reg = SharedMemoryRegistry()
    reg.register("a", key, 0, 64)
    lease = reg.lease("a")
    reg.unregister("a")
    assert shm_fds() == 1  # the lease keeps it open
    lease.write(0, b"12345678")
    assert path.read_bytes()[:8] == b"12345678"
    assert bytes(lease.read(0, 8)) == b"12345678"
    lease.release()
    assert shm_fds() == 0
    lease.release()  # idempotent
    with pytest.raises(RuntimeError, match="released"):
        lease.read(0, 1)


@pytest.mark.parametrize("change", ["unlink", "recreate", "symlink", "truncate", "grow"])
def test_a_changed_object_is_stale(
    make: Callable[[int], tuple[str, Path]], tmp_path: Path, change: str
) -> None:
    """Removed, replaced (also by a link) or resized after registration: every use is
    FAILED_PRECONDITION naming the region -- never a crash, never the wrong file."""
    key, path = make(64)
    reg = SharedMemoryRegistry()
    reg.register("a", key, 0, 64)
    if change == "unlink":
        path.unlink()
    elif change == "recreate":
        path.unlink()
        path.write_bytes(bytes(64))
    elif change == "symlink":
        path.unlink()
        (tmp_path / "other").write_bytes(bytes(64))
        path.symlink_to(tmp_path / "other")
    elif change == "truncate":
        os.truncate(path, 8)
    else:
        os.truncate(path, 4096)
    expected = "is stale" if change != "truncate" else "is now 8 bytes, it was 64"
    for use in (
        lambda: reg.read("a", 0, 8),
        lambda: reg.write("a", 0, b"x"),
        lambda: reg.check("a", 0, 8),
    ):
        with pytest.raises(FailedPrecondition, match=f"region 'a'.*{expected}"):
            use()
    if change == "symlink":
        assert (tmp_path / "other").read_bytes() == bytes(64)
    # Registering again makes it usable.
    if change == "unlink":
        path.write_bytes(bytes(64))
    if change == "symlink":
        path.unlink()
        path.write_bytes(bytes(64))
    reg.register("a", key, 0, 8)
    assert reg.read("a", 0, 8).size == 8
    reg.close()
    assert shm_fds() == 0


# ----------------------------------------------------------------- descriptors, generated

NAMES = ("a", "b", "c")


class RegistryDescriptors(RuleBasedStateMachine):
    """Registering, replacing, unregistering and leasing in any order never leaks a
    descriptor and never closes one in use: at every step the process holds exactly one
    descriptor per region that is registered or held by a live lease, every live lease
    can still read and write its region, and once everything is unregistered and every
    lease released, no descriptor is left."""

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.paths = []
        for _ in range(2):
            path = SHM / f"{PREFIX}{uuid.uuid4().hex[:10]}"
            path.write_bytes(bytes(256))
            self.paths.append(path)
        self.reg = SharedMemoryRegistry(max_regions=len(NAMES))
        #: name -> the region object we expect registered (its identity as a token).
        self.registered: dict[str, object] = {}
        #: token of every region a live lease holds, with the number of such leases.
        self.live: list[tuple[Lease, object]] = []
        self.token = 0

    @rule(name=st.sampled_from(NAMES), which=st.integers(0, 1), offset=st.integers(0, 128))
    def register(self, name: str, which: int, offset: int) -> None:
        self.reg.register(name, "/" + self.paths[which].name, offset, 64)
        self.token += 1
        self.registered[name] = self.token

    @rule(name=st.sampled_from((*NAMES, "")))
    def unregister(self, name: str) -> None:
        self.reg.unregister(name)
        if name:
            self.registered.pop(name, None)
        else:
            self.registered.clear()

    @precondition(lambda self: bool(self.registered))
    @rule(target=leases, data=st.data())
    def take_lease(self, data: st.DataObject) -> Lease:
        name = data.draw(st.sampled_from(sorted(self.registered)))
        lease = self.reg.lease(name)
        self.live.append((lease, self.registered[name]))
        return lease

    @rule(lease=consumes(leases))
    def release(self, lease: Lease) -> None:
        self.live = [(held, token) for held, token in self.live if held is not lease]
        lease.release()

    @rule(lease=leases, byte=st.integers(0, 255))
    def use(self, lease: Lease, byte: int) -> None:
        if any(held is lease for held, _ in self.live):
            lease.write(3, bytes([byte]))
            assert lease.read(3, 1)[0] == byte

    @invariant()
    def one_descriptor_per_live_region(self) -> None:
        tokens = set(self.registered.values()) | {token for _, token in self.live}
        assert shm_fds() == len(tokens)

    def teardown(self) -> None:
        self.reg.close()
        for lease, _ in self.live:
            lease.release()
        assert shm_fds() == 0
        for path in self.paths:
            path.unlink()


TestRegistryDescriptors = RegistryDescriptors.TestCase
TestRegistryDescriptors.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)

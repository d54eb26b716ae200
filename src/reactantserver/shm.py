"""System shared-memory regions: the Triton ``SystemSharedMemory*`` data plane.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), writes its
input tensors into it and registers it under a *region name* with a key (the object's
name, e.g. ``/input_data``), an offset and a byte size. Requests then name the region,
an offset inside it and a byte size instead of carrying tensor bytes; outputs can be
written into a region the same way. Nothing crosses the socket but names and numbers.

Theory of operation:

- ``register`` opens the object, checks that ``offset + byte_size`` lies inside it and
  maps exactly that window. Registering an existing name replaces it (Triton answers
  ALREADY_EXISTS; the original replaces, and replacing is what a client that restarted
  wants). ``unregister("")`` removes every region; unregistering an unknown name is a
  no-op, so cleanup code can call it unconditionally.
- ``view(name, offset, size)`` returns a ``memoryview`` into the mapping: inputs are
  then read with ``np.frombuffer`` without a copy. All bounds arithmetic is done on
  Python ints against the registered window, so hostile offsets cannot reach outside it.
- A region whose object was unlinked or replaced after registration is *stale*: the
  mapping still points at the old memory, which the client no longer writes. Every use
  compares the object's (device, inode) with the ones seen at registration and refuses
  a stale region with FAILED_PRECONDITION, telling the client to register it again.
- Unregistering while a request still holds a view is safe: the mapping is dropped
  from the table and closed when the last view is released (``mmap.close`` refuses
  while buffers are exported; we then leave it to the garbage collector).

The registry is used from the event loop thread only; it needs no lock.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import attrs

from .errors import FailedPrecondition, InvalidArgument, NotFound

SHM_ROOT = "/dev/shm"


@attrs.frozen
class RegionInfo:
    """What SystemSharedMemoryStatus reports for one region."""

    name: str
    key: str
    offset: int
    byte_size: int


@attrs.define(eq=False)
class _Region:
    info: RegionInfo
    path: str
    identity: tuple[int, int]
    mapping: mmap.mmap
    #: ``offset`` rounded down to the page size: mmap offsets must be page aligned.
    skew: int

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:
            # A request still holds a view; the mapping closes when it is collected.
            pass


def _key_path(key: str) -> str:
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", ".."):
        raise InvalidArgument(
            f"shared memory key {key!r} is not a POSIX shared memory name (expected '/name')"
        )
    return os.path.join(SHM_ROOT, name)


class SharedMemoryRegistry:
    """The table of registered system shared-memory regions."""

    def __init__(self, root: str = SHM_ROOT) -> None:
        self._root = root
        self._regions: dict[str, _Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def __iter__(self) -> Iterator[RegionInfo]:
        return iter([r.info for r in self._regions.values()])

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("shared memory region name must not be empty")
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(
                f"shared memory region {name!r}: offset must be >= 0 and byte_size > 0 "
                f"(got offset={offset}, byte_size={byte_size})"
            )
        path = _key_path(key)
        if self._root != SHM_ROOT:
            path = os.path.join(self._root, os.path.basename(path))
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise InvalidArgument(
                f"shared memory region {name!r}: key {key!r} does not exist "
                f"(create it with shm_open before registering)"
            ) from None
        except PermissionError:
            raise InvalidArgument(
                f"shared memory region {name!r}: no read/write permission on key {key!r}"
            ) from None
        try:
            st = os.fstat(fd)
            if offset + byte_size > st.st_size:
                raise InvalidArgument(
                    f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} "
                    f"exceeds the size of {key!r} ({st.st_size} bytes)"
                )
            skew = offset % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fd, byte_size + skew, offset=offset - skew)
        finally:
            os.close(fd)
        old = self._regions.pop(name, None)
        if old is not None:
            old.close()
        self._regions[name] = _Region(
            RegionInfo(name, key, offset, byte_size), path, (st.st_dev, st.st_ino), mapping, skew
        )

    def unregister(self, name: str = "") -> None:
        """Remove ``name`` (or every region when ``name`` is empty); unknown names are fine."""
        names = list(self._regions) if not name else [name]
        for n in names:
            region = self._regions.pop(n, None)
            if region is not None:
                region.close()

    def status(self, name: str = "") -> list[RegionInfo]:
        if not name:
            return [r.info for r in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"shared memory region {name!r} is not registered")
        return [region.info]

    def view(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A writable view of ``byte_size`` bytes at ``offset`` inside region ``name``."""
        region = self._regions.get(name)
        if region is None:
            raise FailedPrecondition(
                f"shared memory region {name!r} is not registered; "
                "call SystemSharedMemoryRegister first"
            )
        size = region.info.byte_size
        if offset < 0 or byte_size < 0 or offset > size or byte_size > size - offset:
            raise InvalidArgument(
                f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} "
                f"is outside the registered {size} bytes"
            )
        self._check_fresh(region)
        start = region.skew + offset
        return memoryview(region.mapping)[start : start + byte_size]

    def _check_fresh(self, region: _Region) -> None:
        try:
            st = os.stat(region.path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != region.identity:
            raise FailedPrecondition(
                f"shared memory region {region.info.name!r} is stale: {region.info.key!r} was "
                "removed or recreated after registration; register it again"
            )

    def close(self) -> None:
        self.unregister("")

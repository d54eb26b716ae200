"""System shared-memory regions: the Triton ``SystemSharedMemory*`` data plane, safely.

A client creates a POSIX shared-memory object (a file under ``/dev/shm``), writes its
input tensors into it and registers it under a *region name* with a key (the object's
name, e.g. ``/input_data``), an offset and a byte size. Requests then name the region,
an offset inside it and a byte size instead of carrying tensor bytes; outputs can be
written into a region the same way. Nothing crosses the socket but names and numbers.

What the worker trusts, and what it checks
------------------------------------------
The object belongs to the client, who can truncate, grow, unlink or replace it at any
moment, also while the server is using it. So:

- **Nothing is mapped.** A mapping of a file that shrinks under it turns the next access
  into SIGBUS, which Python cannot catch: the process dies (and with it every other
  client's calls). The registry holds an open file descriptor instead, reads inputs with
  ``os.preadv`` into a buffer the server owns and writes outputs with ``os.pwritev``; a
  file that shrank makes a short read, which is an error naming the region, not a
  crash. The price is one copy of each input (a mapping gave a view); the batch
  assembly copies inputs anyway, and the bench (``nox -s bench -- hostile``) measures
  the round trip.
- **Keys are names, not paths, and only those the operator allows.** A key is ``/`` and
  1 to 255 characters of ``A-Z a-z 0-9 . _ -`` (not ``.`` or ``..``): nothing can point
  outside ``/dev/shm``. And it must start with the registry's ``prefix``
  (``endpoints.shm_key_prefix``, ``/reactantserver-`` by default): the server runs as a
  user who can open other programs' objects (a database's, another server's), and a
  client that could register one could read it through an input and overwrite it
  through an output. Triton (CVE-2025-23319/23320/23334, 25.07) refused its own
  ``triton_`` prefix after the fact; an allow-list also keeps out what we do not know of.
  A key outside it is refused before anything is opened, with the same answer whether
  or not the object exists (nothing to probe with).
- **Regions have an owner.** A region is the caller's who registered it (its *owner*:
  the client certificate, the restricted key it presented, the client the gateway acts
  for, or else its connection; :mod:`reactantserver.transport.core.auth`). Another owner does
  not see it in the status, cannot use it in a request, and cannot unregister it; its
  ``unregister("")`` removes its own regions only. Two owners may use the same name.
  The object is opened ``O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK`` -- a symbolic
  link is refused (``shm_open`` refuses them too), and a FIFO cannot block the event
  loop -- and ``fstat`` must say it is a regular file.
- **Every use checks the object is still the one registered.** Its (device, inode),
  looked up again by name without following links, must match registration (else it
  was unlinked or replaced: *stale*), and its size must not have changed. Either is
  FAILED_PRECONDITION telling the client to register again; a window outside the
  registered bytes is INVALID_ARGUMENT. All bounds arithmetic is on Python ints, so
  hostile offsets cannot wrap.
- **File descriptors are counted.** The table holds one reference to a region and every
  use (a :class:`Lease`) another; the descriptor is closed exactly when the last one is
  dropped, so unregistering a region while calls use it neither breaks those calls nor
  leaks the descriptor. At most ``max_regions`` regions are registered at once (each
  holds a descriptor).

Other rules: registering an existing name (of the same owner) replaces it (Triton answers ALREADY_EXISTS;
replacing is what a client that restarted wants); ``unregister("")`` removes every
region of the owner and unregistering an unknown name is a no-op, so cleanup code can
call it unconditionally; :meth:`SharedMemoryRegistry.forget` drops a connection owner's
regions when its connection closes. The registry is used from the event-loop thread only; it needs no lock.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator

import attrs
import numpy as np

from .errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

SHM_ROOT = "/dev/shm"
#: The keys a client may register unless the operator says otherwise.
DEFAULT_PREFIX = "/reactantserver-"
#: What follows the leading ``/`` of a key (NAME_MAX is 255).
_KEY = re.compile(r"[A-Za-z0-9._-]{1,255}")
#: Region names are the client's labels; they appear in every message about the region.
MAX_NAME = 255
#: ``O_NONBLOCK``: opening a FIFO for reading would otherwise wait for a writer.
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

#: ``os.preadv`` or ``os.pwritev``: (fd, buffers, offset) -> bytes moved.
_Move = Callable[[int, list[memoryview], int], int]
#: Why a read or write stopped short: the region's file ended before the window did.
_STUCK = {
    "reading": "{key} shrank while it was being read; register it again",
    "writing": "nothing could be written to {key}",
}


@attrs.frozen
class RegionInfo:
    """What SystemSharedMemoryStatus reports for one region."""

    name: str
    key: str
    offset: int
    byte_size: int


def validate_key(key: str) -> str:
    """The file name inside the shared-memory root for ``key``; ``InvalidArgument`` if bad."""
    name = key[1:] if key.startswith("/") else ""
    if len(name) > 255:
        raise InvalidArgument(
            f"shared memory key of {len(key)} characters is longer than 255 "
            "(a POSIX shared memory name is '/' and at most 255 characters)"
        )
    if not _KEY.fullmatch(name) or name in (".", ".."):
        raise InvalidArgument(
            f"shared memory key {key!r} is not a POSIX shared memory name (expected '/name' "
            "with letters, digits, '.', '_' or '-')"
        )
    return name


def _open_error(exc: OSError, region: str, key: str) -> Exception:
    """The request error for a failed open of ``key`` (what the client must fix)."""
    where = f"shared memory region {region!r}: key {key!r}"
    if exc.errno == errno.ENOENT:
        return InvalidArgument(
            f"{where} does not exist (create it with shm_open before registering)"
        )
    if exc.errno == errno.ELOOP:
        return InvalidArgument(
            f"{where} is a symbolic link; register the shared memory object itself"
        )
    if exc.errno == errno.EISDIR:
        return InvalidArgument(f"{where} is not a regular file (it is a directory)")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return InvalidArgument(f"{where}: the server may not open it for reading and writing")
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceExhausted(f"{where}: the server is out of file descriptors; retry later")
    return InvalidArgument(f"{where} cannot be opened: {exc.strerror or exc}")


def object_exists(key: str, root: str = SHM_ROOT, *, prefix: str = DEFAULT_PREFIX) -> bool:
    """Whether ``key`` names a shared-memory object this server could use.

    For ``IsSameIPCNamespace``: a client creates an object and asks whether the server
    sees it. Opened exactly as :meth:`SharedMemoryRegistry.register` would (no links, no
    blocking on a FIFO) and closed at once. A key outside ``prefix`` is refused, so the
    call cannot tell which other objects exist.
    """
    path = os.path.join(root, validate_key(key))
    if prefix and not key.startswith(prefix):
        raise InvalidArgument(
            f"shared memory key {key!r}: the server answers only for keys that start with "
            f"{prefix!r} (endpoints.shm_key_prefix)"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


class _Region:
    """One registered window and its file descriptor, reference-counted."""

    __slots__ = ("fd", "identity", "info", "path", "refs", "size")

    def __init__(self, info: RegionInfo, path: str, fd: int, st: os.stat_result) -> None:
        self.info = info
        self.path = path
        self.fd = fd
        self.identity = (st.st_dev, st.st_ino)
        #: The object's size at registration; any change makes the region stale.
        self.size = st.st_size
        #: The table's reference plus one per live lease.
        self.refs = 1

    def drop(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            os.close(self.fd)
            self.fd = -1

    def _where(self) -> str:
        return f"shared memory region {self.info.name!r}"

    def check_window(self, offset: int, byte_size: int) -> int:
        """The file position of a window inside the registered bytes."""
        size = self.info.byte_size
        if offset < 0 or byte_size < 0 or offset > size or byte_size > size - offset:
            raise InvalidArgument(
                f"{self._where()}: offset {offset} + byte_size {byte_size} "
                f"is outside the registered {size} bytes"
            )
        return self.info.offset + offset

    def check_fresh(self) -> None:
        """Refuse a region whose object was removed, replaced or resized."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self.identity:
            raise FailedPrecondition(
                f"{self._where()} is stale: {self.info.key!r} was removed or recreated "
                "after registration; register it again"
            )
        size = os.fstat(self.fd).st_size
        if size != self.size:
            raise FailedPrecondition(
                f"{self._where()} is stale: {self.info.key!r} is now {size} bytes, it was "
                f"{self.size} at registration; register it again"
            )

    def _io_error(self, exc: OSError, doing: str) -> FailedPrecondition:
        return FailedPrecondition(f"{self._where()}: {doing} {self.info.key!r} failed: {exc}")


def _move_all(region: _Region, move: _Move, view: memoryview, at: int, doing: str) -> None:
    """Move all of ``view`` between memory and the region's file from offset ``at``, with
    ``move`` (``os.preadv`` or ``os.pwritev``), in as many calls as it takes: an error is
    :meth:`_Region._io_error` for ``doing``, a call that moves nothing (the file ended)
    FAILED_PRECONDITION saying so (:data:`_STUCK`)."""
    done = 0
    while done < view.nbytes:
        try:
            n = move(region.fd, [view[done:]], at + done)
        except OSError as exc:
            raise region._io_error(exc, doing) from None
        if n == 0:
            stuck = _STUCK[doing].format(key=repr(region.info.key))
            raise FailedPrecondition(f"shared memory region {region.info.name!r}: {stuck}")
        done += n


class Lease:
    """One use of a region: its descriptor stays open until :meth:`release`."""

    __slots__ = ("_region",)

    def __init__(self, region: _Region) -> None:
        region.refs += 1
        self._region: _Region | None = region

    def _live(self) -> _Region:
        if self._region is None:
            raise RuntimeError("the lease was released")
        return self._region

    def read(self, offset: int, byte_size: int) -> np.ndarray:
        """``byte_size`` bytes at ``offset`` of the window, copied into a new uint8 array."""
        region = self._live()
        position = region.check_window(offset, byte_size)
        region.check_fresh()
        out = np.empty(byte_size, dtype=np.uint8)
        _move_all(region, os.preadv, out.data, position, "reading")
        return out

    def write(self, offset: int, data: bytes | memoryview | np.ndarray) -> int:
        """Write ``data`` at ``offset`` of the window; return the bytes written."""
        region = self._live()
        view = (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
        position = region.check_window(offset, view.nbytes)
        region.check_fresh()
        _move_all(region, os.pwritev, view, position, "writing")
        return view.nbytes

    def release(self) -> None:
        if self._region is not None:
            self._region.drop()
            self._region = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class SharedMemoryRegistry:
    """The table of registered system shared-memory regions; see the module docstring.

    Every method takes the caller's ``owner``: regions are keyed by (owner, name)."""

    def __init__(
        self, root: str = SHM_ROOT, *, max_regions: int = 256, prefix: str = DEFAULT_PREFIX
    ) -> None:
        if max_regions < 1:
            raise ValueError("max_regions must be >= 1")
        self._root = root
        self._max = max_regions
        #: Keys must start with this ("" allows any name under the root).
        self.prefix = prefix
        self._regions: dict[tuple[str, str], _Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def __iter__(self) -> Iterator[RegionInfo]:
        return iter([r.info for r in self._regions.values()])

    def _allowed(self, name: str, key: str) -> None:
        if self.prefix and not key.startswith(self.prefix):
            raise InvalidArgument(
                f"shared memory region {name!r}: the server opens only keys that start "
                f"with {self.prefix!r} (endpoints.shm_key_prefix); create the object under "
                "that prefix (reactantserver.client's shared_memory does)"
            )

    def register(self, name: str, key: str, offset: int, byte_size: int, owner: str = "") -> None:
        if not name:
            raise InvalidArgument("shared memory region name must not be empty")
        if len(name) > MAX_NAME:
            raise InvalidArgument(
                f"shared memory region name of {len(name)} characters is longer than {MAX_NAME}"
            )
        if not name.isprintable():
            raise InvalidArgument(f"shared memory region name {name!r} has unprintable characters")
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(
                f"shared memory region {name!r}: offset must be >= 0 and byte_size > 0 "
                f"(got offset={offset}, byte_size={byte_size})"
            )
        entry = (owner, name)
        if entry not in self._regions and len(self._regions) >= self._max:
            raise ResourceExhausted(
                f"shared memory region {name!r}: {len(self._regions)} regions are registered, "
                f"the limit (endpoints.max_shm_regions) is {self._max}; unregister some first"
            )
        path = os.path.join(self._root, validate_key(key))
        self._allowed(name, key)
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            raise _open_error(exc, name, key) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(
                    f"shared memory region {name!r}: key {key!r} is not a regular file"
                )
            if offset + byte_size > st.st_size:
                raise InvalidArgument(
                    f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} "
                    f"exceeds the size of {key!r} ({st.st_size} bytes)"
                )
        except BaseException:
            os.close(fd)
            raise
        old = self._regions.pop(entry, None)
        if old is not None:
            old.drop()
        self._regions[entry] = _Region(RegionInfo(name, key, offset, byte_size), path, fd, st)

    def unregister(self, name: str = "", owner: str = "") -> None:
        """Remove ``owner``'s region ``name`` (or every region of ``owner`` when ``name`` is
        empty); unknown names are fine. A region still in use by a call stays open until
        that use ends."""
        entries = [e for e in self._regions if e[0] == owner] if not name else [(owner, name)]
        for entry in entries:
            region = self._regions.pop(entry, None)
            if region is not None:
                region.drop()

    def forget(self, owner: str) -> None:
        """``owner``'s connection closed: its regions go (:class:`~reactantserver.transport.server.GuardedServer` ``on_closed``)."""
        self.unregister("", owner)

    def held(self) -> list[tuple[str, RegionInfo]]:
        """Every registered region with its owner (what an operator's tooling, or a test,
        reads on the server itself; no RPC answers this)."""
        return [(owner, region.info) for (owner, _), region in self._regions.items()]

    def status(self, name: str = "", owner: str = "") -> list[RegionInfo]:
        if not name:
            return [r.info for (o, _), r in self._regions.items() if o == owner]
        region = self._regions.get((owner, name))
        if region is None:
            raise NotFound(f"shared memory region {name!r} is not registered")
        return [region.info]

    def _get(self, name: str, owner: str) -> _Region:
        region = self._regions.get((owner, name))
        if region is None:
            raise FailedPrecondition(
                f"shared memory region {name!r} is not registered; "
                "call SystemSharedMemoryRegister first"
            )
        return region

    def lease(self, name: str, owner: str = "") -> Lease:
        """Hold region ``name`` open for a use that may outlive its registration."""
        return Lease(self._get(name, owner))

    def check(self, name: str, offset: int, byte_size: int, owner: str = "") -> None:
        """Refuse now what a later read or write of this window would refuse."""
        region = self._get(name, owner)
        region.check_window(offset, byte_size)
        region.check_fresh()

    def read(self, name: str, offset: int, byte_size: int, owner: str = "") -> np.ndarray:
        """A copy of ``byte_size`` bytes at ``offset`` inside region ``name``."""
        with self.lease(name, owner) as lease:
            return lease.read(offset, byte_size)

    def write(
        self, name: str, offset: int, data: bytes | memoryview | np.ndarray, owner: str = ""
    ) -> int:
        """Write ``data`` at ``offset`` inside region ``name``; return the bytes written."""
        with self.lease(name, owner) as lease:
            return lease.write(offset, data)

    def close(self) -> None:
        for region in self._regions.values():
            region.drop()
        self._regions.clear()

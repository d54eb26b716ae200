"""Client-side system shared memory: a POSIX shared-memory object this process owns.

Theory of operation
-------------------
A :class:`SharedMemoryRegion` creates a fresh object under ``/dev/shm`` (a unique name,
``rsc_<pid>_<random>``, created exclusively, mode ``0600`` unless told otherwise), sizes
it and maps it. Registering it with a server (``Client.shared_memory`` does this) lets
requests name windows of it instead of carrying tensor bytes: the server maps the same
object, reads the inputs from it and writes the outputs into it, so a tensor crosses
between the processes without passing through the socket.

Space inside a region is handed out by a bump allocator (64-byte aligned):

* *user* allocations -- :meth:`SharedMemoryRegion.empty` and
  :meth:`~SharedMemoryRegion.write_inputs` -- return writable numpy views and live until
  :meth:`~SharedMemoryRegion.reset` (``write_inputs`` resets first). An input that is such
  a view is sent by reference: nothing is copied.
* *call* allocations -- inputs that are not already in the region (copied in once) and
  the windows outputs are written into -- start right after the user allocations at each
  ``infer`` call. Outputs returned by an ``infer`` are views of those windows, so they stay
  valid until the next ``infer`` with the same region: copy them to keep them longer.

One ``infer`` at a time may use a region (:meth:`~SharedMemoryRegion.claim` refuses a
second one at once instead of letting two calls overwrite each other's tensors). BYTES
tensors and empty tensors always travel inline.

Closing unlinks the object (the name disappears from ``/dev/shm`` at once, whatever else
still maps it) and unmaps it; numpy views still held by the caller keep the memory alive
until they are dropped, so closing never invalidates an array under someone's feet.
"""

from __future__ import annotations

import mmap
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from reactantserver import tensors
from reactantserver.errors import ExecutionFailed, InvalidArgument
from reactantserver.shm import SHM_ROOT

from .codec import Placement, wire_array

#: Start offsets of allocations are multiples of this (a cache line; any dtype's alignment).
ALIGNMENT = 64
#: Object names this client creates start with this (and then the process id).
#: The servers' default ``endpoints.shm_key_prefix``: objects are created under it, so a
#: server that opens nothing else (the default) accepts them.
KEY_PREFIX = "/reactantserver-"
NAME_PREFIX = KEY_PREFIX[1:]


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class SharedMemoryRegion:
    """A POSIX shared-memory object of ``nbytes`` bytes, created and mapped here.

    ``name`` is the region name used with the server (default: the object's own name);
    ``key`` is the object's POSIX name, ``prefix`` + a unique tail (``/reactantserver-...``
    by default: the prefix a server accepts unless its ``endpoints.shm_key_prefix`` says
    otherwise). ``mode`` is the object's permission bits: ``0o600`` lets only this user's
    processes map it; a server running as another user needs ``0o660`` (same group) or
    ``0o666``.
    """

    def __init__(
        self,
        nbytes: int,
        *,
        name: str | None = None,
        mode: int = 0o600,
        prefix: str = KEY_PREFIX,
    ) -> None:
        if not prefix.startswith("/") or "/" in prefix[1:]:
            raise ValueError(f"prefix must be '/' and a name without '/', got {prefix!r}")
        if nbytes <= 0:
            raise ValueError(f"a shared memory region needs nbytes > 0, got {nbytes}")
        token = f"{prefix[1:]}{os.getpid()}_{uuid.uuid4().hex[:12]}"
        self.name = name or token
        self.key = "/" + token
        self.path = os.path.join(SHM_ROOT, token)
        self._nbytes = nbytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # os.open's mode is filtered by the umask
            os.ftruncate(fd, nbytes)
            self._mmap = mmap.mmap(fd, nbytes)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self._base: np.ndarray | None = np.frombuffer(self._mmap, dtype=np.uint8)
        self._address = self._base.ctypes.data
        self._user_end = 0
        self._cursor = 0
        self._busy = threading.Lock()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._cursor} of {self._nbytes} bytes used"
        return f"<SharedMemoryRegion {self.name!r} key={self.key!r} {state}>"

    def __enter__(self) -> SharedMemoryRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def closed(self) -> bool:
        return self._base is None

    def _memory(self) -> np.ndarray:
        if self._base is None:
            raise ValueError(f"shared memory region {self.name!r} is closed")
        return self._base

    # ------------------------------------------------------------------ allocation

    def _allocate(self, nbytes: int, what: str) -> int:
        offset = _align(self._cursor)
        if offset + nbytes > self._nbytes:
            raise InvalidArgument(
                f"shared memory region {self.name!r} ({self._nbytes} bytes) has no room for "
                f"{what} ({nbytes} bytes at offset {offset}); create a larger region"
            )
        self._cursor = offset + nbytes
        return offset

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` view of ``nbytes`` bytes at ``offset``."""
        memory = self._memory()
        if offset < 0 or nbytes < 0 or offset + nbytes > self._nbytes:
            raise InvalidArgument(
                f"shared memory region {self.name!r}: offset {offset} + {nbytes} bytes is "
                f"outside its {self._nbytes} bytes"
            )
        return memory[offset : offset + nbytes]

    def empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """A new writable array inside the region (uninitialised), kept until ``reset``.

        Fill it and pass it to ``infer(..., shm=region)``: it is sent by reference.
        """
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = tensors.element_count(dims, what="array") * dt.itemsize
        self._memory()
        offset = self._allocate(nbytes, f"an array of shape {list(dims)}")
        self._user_end = self._cursor
        return self.view(offset, nbytes).view(dt).reshape(dims)

    def write_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Copy ``inputs`` into the region (after a ``reset``); return the views, by name.

        Pass the returned mapping to ``infer(..., shm=region)``: nothing is copied again.
        BYTES and empty inputs are returned unchanged (they travel inline).
        """
        self.reset()
        placed: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            datatype, arr = wire_array(name, value)
            if datatype == "BYTES" or arr.nbytes == 0:
                placed[name] = arr
                continue
            dst = self.empty(arr.shape, arr.dtype)
            np.copyto(dst, arr)
            placed[name] = dst
        return placed

    def reset(self) -> None:
        """Forget every allocation; arrays handed out before now may be overwritten."""
        self._memory()
        self._user_end = 0
        self._cursor = 0

    def offset_of(self, arr: np.ndarray) -> int | None:
        """Where ``arr``'s bytes start in the region, if they all lie inside it contiguously."""
        if self._base is None or not arr.flags.c_contiguous or arr.nbytes == 0:
            return None
        start = int(arr.__array_interface__["data"][0]) - self._address
        if start >= 0 and start + arr.nbytes <= self._nbytes:
            return start
        return None

    # ------------------------------------------------------------------ one infer call

    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the region for one ``infer`` call; a concurrent second call fails at once."""
        if not self._busy.acquire(blocking=False):
            raise InvalidArgument(
                f"shared memory region {self.name!r} is in use by another infer call; "
                "use one region per concurrent call"
            )
        try:
            self._memory()
            self._cursor = self._user_end
            yield
        finally:
            self._busy.release()

    def place_inputs(self, inputs: Mapping[str, tuple[str, np.ndarray]]) -> dict[str, Placement]:
        """Placements for the fixed-width, non-empty inputs; copy in those not yet here.

        ``inputs`` maps names to ``codec.wire_array`` results. Call inside :meth:`claim`.
        """
        placements: dict[str, Placement] = {}
        for name, (datatype, arr) in inputs.items():
            if datatype == "BYTES" or arr.nbytes == 0:
                continue
            offset = self.offset_of(arr)
            if offset is None:
                offset = self._allocate(arr.nbytes, f"input {name!r}")
                np.copyto(self.view(offset, arr.nbytes), arr.reshape(-1).view(np.uint8))
            placements[name] = Placement(self.name, offset, arr.nbytes)
        return placements

    def place_outputs(self, sizes: Mapping[str, int]) -> dict[str, Placement]:
        """A window for each output of known size (name -> bytes). Call inside :meth:`claim`."""
        return {
            name: Placement(self.name, self._allocate(n, f"output {name!r}"), n)
            for name, n in sizes.items()
        }

    def read(self, placement: Placement, datatype: str, shape: Sequence[int]) -> np.ndarray:
        """The output the server wrote at ``placement``, as a view of the region."""
        where = f"output in shared memory region {placement.region!r}"
        if placement.region != self.name:
            raise ExecutionFailed(f"{where}: the request offered region {self.name!r}")
        try:
            dtype = tensors.to_numpy_dtype(datatype)
            count = tensors.element_count(shape, what=where)
        except InvalidArgument as exc:
            raise ExecutionFailed(f"the server's answer is unreadable: {exc}") from None
        if datatype == "BYTES":
            data = self.view(placement.offset, placement.byte_size)
            return tensors.deserialize_bytes(data.tobytes(), count, what=where).reshape(shape)
        nbytes = count * dtype.itemsize
        if nbytes != placement.byte_size:
            raise ExecutionFailed(
                f"{where}: the server wrote {placement.byte_size} bytes for shape "
                f"{list(shape)} of {datatype} ({nbytes} expected)"
            )
        return self.view(placement.offset, nbytes).view(dtype).reshape(shape)

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        """Unlink the object and unmap it (idempotent).

        Views still referenced elsewhere keep their pages alive until they are dropped.
        """
        if self._base is None:
            return
        self._base = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            self._mmap.close()
        except BufferError:
            # Arrays handed out still export the buffer; the mapping goes with them.
            pass

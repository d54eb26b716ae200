"""Host memory for weight transfers: pinned staging where the device has it, and CPU copies.

Two small tools the weight cache (``weight_cache.py``) uses to make a load what it should
be on each backend:

* :class:`PinnedHostStaging` keeps ``system`` host copies in the device's page-locked
  (``pinned_host``) memory space -- one array per version, its packed buffer
  (``weights/host.py``) -- so a load is one DMA rather than a copy through the driver's
  bounce buffer. On by default on CUDA; the CPU client lists the space too, which lets
  the path run in CPU tests, but gains nothing from it.
* :func:`copying_allocate` is the host allocator on the CPU backend, where "device"
  memory is host memory and the client would otherwise adopt some host buffers instead
  of copying them.

JAX is imported lazily, inside the methods that need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PinnedHostStaging", "copying_allocate"]


class PinnedHostStaging:
    """Host copies kept in the device's page-locked (``pinned_host``) memory space.

    A transfer from pinned memory is a plain DMA; from pageable memory the driver first
    copies through a bounce buffer. JAX exposes the space as a memory kind: arrays are
    placed there with a ``SingleDeviceSharding(device, memory_kind="pinned_host")`` and
    moved to the device with the ``"device"`` kind (a bare ``Device`` target is refused
    for them).
    """

    def __init__(self, device: Any) -> None:
        from jax.sharding import SingleDeviceSharding

        self._host = SingleDeviceSharding(device, memory_kind="pinned_host")
        self._device = SingleDeviceSharding(device, memory_kind="device")

    @classmethod
    def for_device(cls, device: Any) -> PinnedHostStaging | None:
        """Staging for ``device``, or ``None`` when it has no pinned host memory space."""
        kinds = {m.kind for m in device.addressable_memories()}
        if not {"pinned_host", "device"} <= kinds:
            return None
        return cls(device)

    def stage_packed(self, packed: np.ndarray) -> Any:
        """Copy a version's packed host buffer into pinned host memory: one array (blocks
        until done). A load moves it with ``unpack.py``'s function."""
        import jax

        return jax.block_until_ready(jax.device_put(packed, self._host))

    def stage(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """Copy host arrays into pinned host memory (blocks until done)."""
        import jax

        out = jax.device_put(list(arrays), self._host)
        jax.block_until_ready(out)
        return list(out)

    def to_device(self, staged: Sequence[Any]) -> list[Any]:
        """Copy staged arrays to device memory (blocks until done)."""
        import jax

        out = jax.device_put(list(staged), self._device)
        jax.block_until_ready(out)
        return list(out)


def copying_allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """Host arrays starting 16 bytes past a 64-byte boundary: the CPU backend's allocator.

    The CPU client adopts a 64-byte-aligned host buffer as the "device" buffer instead of
    copying it (``may_alias=False`` notwithstanding), and numpy's alignment is a matter of
    chance. An aliased device copy would make eviction free nothing and a load cost
    nothing, so the budget and every load measurement would depend on where malloc
    happened to put a buffer. Offsetting the host copies keeps the CPU a faithful model
    of a GPU: a device copy is a copy.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + 80, np.uint8)
    start = (-raw.ctypes.data) % 64 + 16
    return raw[start : start + nbytes].view(dtype).reshape(shape)

"""One transfer per weight load: a version's packed host copy, cut into its weights on the device.

A ``system`` host copy is one uint8 buffer (``weights/host.py``: each tensor at a
``PACK_ALIGN`` boundary, in argument order, :func:`~reactantserver.weights.host.pack_offsets`).
A load moves that buffer to the device in one transfer and cuts it into the program's
weight arguments with a small compiled program of its own, the *unpack* program: per
tensor a slice of the bytes and a bitcast to the tensor's dtype and shape. Nothing waits
for either: both are queued on the device, whose stream runs the batch's program after
them, so the caller (the dispatch loop, ``weight_cache.py``) has its device arrays as
soon as the two calls return.

Why a program, not one ``jax.device_put`` per tensor: on the CPU backend (2026-12-01,
this 2-core machine at a load average of 8-9, the 51 KB models of the catalog
benchmark) a put of the tensor list costs about 30 us per tensor in JAX's Python
dispatch before any byte moves -- 192 us for a 6-tensor MLP, 419 us for a 14-tensor
ResNet, about 10 % less without the ``block_until_ready`` -- while the packed buffer
handed to the unpack program costs 18 and 32 us (``weight_cache.py``'s header has the
whole profile). The program's outputs are new device buffers, so the device copy is a
real copy. Why not one packed *argument* of the model's own program (the slices inside
it): XLA then cuts the weights again on every execution (the MLP's execution went from
38-49 us to 219-326 us on the CPU) and holds a second copy of them as scratch while it
runs.

The device: on the CPU the packed numpy buffer is handed to the unpack program, whose
call transfers it (JAX's C++ path); on CUDA the buffer is staged once in pinned host
memory (``host_memory.py``), and a load is a ``jax.device_put`` of that one array into
device memory -- one DMA -- then the unpack program on it. The transient packed device
copy is dropped as the call returns; the runtime frees it once the unpack program has
read it (JAX's buffers are freed after the work queued on them, never under it).

Errors: what the device refuses when the work is queued (out of memory: the allocation
is made then) raises here, and the weight cache retries or fails the load; an error of
the transfer itself surfaces in the execution that reads the weights.

Programs are compiled once per distinct layout (the tensors' shapes and dtypes), in the
caller's thread (the cache adds a version in a worker thread), and shared by every
version of that layout: a catalog of variants of four architectures compiles four.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..weights import TensorSpec
from ..weights.host import pack_offsets

__all__ = ["Unpack", "Unpackers", "layout_key"]

#: ``unpack(packed host buffer) -> device arrays`` in argument order, queued on the
#: device and not waited for.
Unpack = Callable[[Any], list[Any]]

#: What determines an unpack program: each tensor's shape and dtype, in argument order.
LayoutKey = tuple[tuple[tuple[int, ...], str], ...]


def layout_key(tensors: Sequence[TensorSpec]) -> LayoutKey:
    return tuple((tuple(t.shape), str(t.dtype)) for t in tensors)


def _nothing(packed: Any) -> list[Any]:
    return []


class Unpackers:
    """The unpack program of every layout in use on one device (see the module docstring).

    Thread-safe: versions are added from worker threads. Two first loads of one layout at
    once may both compile; the second replaces the first, which stays valid.
    """

    def __init__(self, device: Any) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._programs: dict[LayoutKey, Unpack] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._programs)

    def get(self, tensors: Sequence[TensorSpec]) -> Unpack:
        """The unpack function of ``tensors``' layout (compiled on first use: slow)."""
        if not tensors:
            return _nothing
        key = layout_key(tensors)
        with self._lock:
            found = self._programs.get(key)
        if found is not None:
            return found
        made = self._make(tensors)
        with self._lock:
            return self._programs.setdefault(key, made)

    def _make(self, tensors: Sequence[TensorSpec]) -> Unpack:
        import jax
        from jax import lax
        from jax.sharding import SingleDeviceSharding

        on_device = SingleDeviceSharding(self._device, memory_kind="device")
        offsets, size = pack_offsets(tensors)
        specs = [(o, t.nbytes, t.shape, t.dtype) for o, t in zip(offsets, tensors, strict=True)]

        def cut(buffer: Any) -> list[Any]:
            out = []
            for offset, nbytes, shape, dtype in specs:
                piece = lax.slice(buffer, (offset,), (offset + nbytes,))
                if dtype == np.bool_:
                    value = piece != 0
                elif dtype.itemsize == 1:
                    value = lax.bitcast_convert_type(piece, dtype)
                else:
                    words = piece.reshape(nbytes // dtype.itemsize, dtype.itemsize)
                    value = lax.bitcast_convert_type(words, dtype)
                out.append(value.reshape(shape))
            return out

        canonical = all(jax.dtypes.canonicalize_dtype(t.dtype) == t.dtype for t in tensors)
        if size == 0 or not canonical:
            # Tensors of zero elements only (nothing to cut), or 64-bit ones without
            # jax_enable_x64, which JAX converts by value (a float64 becomes a float32):
            # the tensors' views are put as a list, as ``Runtime.to_device`` does.
            def put(packed: Any) -> list[Any]:
                views = [
                    packed[o : o + t.nbytes].view(t.dtype).reshape(t.shape)
                    for o, t in zip(offsets, tensors, strict=True)
                ]
                return list(jax.device_put(views, on_device))

            return put
        compiled = (
            jax.jit(cut, out_shardings=on_device)
            .lower(jax.ShapeDtypeStruct((size,), np.uint8, sharding=on_device))
            .compile()
        )

        def unpack(packed: Any) -> list[Any]:
            if not isinstance(packed, np.ndarray):
                # A staged (pinned host) array: one transfer into device memory first. The
                # transient device copy is dropped when this returns and freed by the
                # runtime after the unpack program has read it.
                packed = jax.device_put(packed, on_device)
            return list(compiled(packed))

        return unpack

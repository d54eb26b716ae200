"""One transfer per weight load: a version's packed host copy, cut into its weights on the device.

A ``system`` host copy is one uint8 buffer (``weights/host.py``: each tensor at a
``PACK_ALIGN`` boundary, in argument order, :func:`~reactantserver.weights.host.pack_offsets`).
A load moves that buffer to the device in one transfer and cuts it into the program's
weight arguments with a small compiled program of its own, the *unpack* program: per
tensor a slice of the buffer, reshaped to the tensor's shape. Nothing waits
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

How the program cuts (2026-12-02, this 2-core machine, quiet; the catalog's four layouts,
loads into a ring of 100 live versions, each load's call and its eventual free):

* **In the tensors' own words.** The buffer is handed to the program as the layout's one
  dtype where the tensors share it (every model of the catalog: float32), so a tensor is
  a slice and a reshape (:func:`packed_word`; the host buffer is only viewed as that
  dtype, no copy). Cut from bytes, each tensor was a byte slice reshaped to (elements,
  width) and bitcast, which XLA's CPU kernels copy element by element.
* **At most ``CPU_MAX_OUTPUTS`` tensors a program on the CPU.** XLA's CPU runtime runs
  a program of at most 8 kernels in the caller's thread, one after another, and spreads
  a longer one over its thread pool, whose hand-offs cost more than these slices on a
  loaded machine. A 14-tensor ResNet is cut by two programs, each handed the whole
  buffer (one transfer each of 51 KB: no measurable cost against sub-buffers).

Per load, the two 6-tensor MLPs and the two 14-tensor ResNets: 48-54, 84-102, 103-108
and 159-170 us cut from bytes in one program; 23, 36, 50 and 79 us in words, at most 8
a program. Cut from words in one program the ResNets took 145-162 us: the split is the
larger half of their gain.

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
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..weights import TensorSpec
from ..weights.host import pack_offsets

__all__ = ["CPU_MAX_OUTPUTS", "Unpack", "Unpackers", "layout_key", "packed_word"]

#: ``unpack(packed host buffer) -> device arrays`` in argument order, queued on the
#: device and not waited for.
Unpack = Callable[[Any], list[Any]]

#: What determines an unpack program: each tensor's shape and dtype, in argument order.
LayoutKey = tuple[tuple[tuple[int, ...], str], ...]


def layout_key(tensors: Sequence[TensorSpec]) -> LayoutKey:
    return tuple((tuple(t.shape), str(t.dtype)) for t in tensors)


def packed_word(tensors: Sequence[TensorSpec]) -> np.dtype[Any]:
    """The element type a packed buffer of ``tensors`` is handed to its unpack program as.

    The tensors' own dtype where they all share one (the program then only slices and
    reshapes); an unsigned integer of their one width where they share a width of 2 or 4
    bytes (a bitcast of the same shape); bytes otherwise (booleans, 8-byte or mixed widths:
    the slices are reshaped to bytes per element and bitcast). The host buffer is the same
    bytes whichever it is (``numpy.ndarray.view``): PACK_ALIGN is a multiple of every width.
    Why: a slice of words is a copy; a bitcast of bytes to elements is a copy element by
    element in XLA's CPU kernels (the module docstring has the figures).
    """
    dtypes = {t.dtype for t in tensors}
    widths = {d.itemsize for d in dtypes}
    if not dtypes or np.dtype(np.bool_) in dtypes or len(widths) != 1:
        return np.dtype(np.uint8)
    (width,) = widths
    if len(dtypes) == 1 and width <= 4:
        (only,) = dtypes
        return only
    if width in (2, 4):
        return np.dtype(f"<u{width}")
    return np.dtype(np.uint8)


def _nothing(packed: Any) -> list[Any]:
    return []


#: The most tensors one unpack program cuts on the CPU backend. XLA's CPU runtime runs a
#: program of at most 8 kernels in the caller's thread, one after another, and spreads a
#: longer one over its thread pool, whose hand-offs cost more than the slices: the
#: 14-tensor catalog ResNets' loads took 145-162 us as one program and 50-79 us as two of
#: at most 8 (2026-12-02, this 2-core machine; the module docstring). Elsewhere (CUDA)
#: the program runs on the device and one program a load is the cheapest.
CPU_MAX_OUTPUTS = 8


class Unpackers:
    """The unpack program of every layout in use on one device (see the module docstring).

    ``max_outputs``: the most tensors one program cuts (a layout with more is cut by
    several, each from the whole buffer); ``None``, one program a layout.

    Thread-safe: versions are added from worker threads. Two first loads of one layout at
    once may both compile; the second replaces the first, which stays valid.
    """

    def __init__(self, device: Any, max_outputs: int | None = None) -> None:
        self._device = device
        self._max_outputs = max_outputs
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
        from jax.sharding import SingleDeviceSharding

        on_device = SingleDeviceSharding(self._device, memory_kind="device")
        offsets, size = pack_offsets(tensors)
        canonical = all(jax.dtypes.canonicalize_dtype(t.dtype) == t.dtype for t in tensors)
        if size == 0 or not canonical:
            # Tensors of zero elements only (nothing to cut), or 64-bit ones without
            # jax_enable_x64, which JAX converts by value (a float64 becomes a float32):
            # the tensors' views are put as a list, as ``Runtime.to_device`` does.
            def put(packed: Any) -> list[Any]:
                packed = packed.view(np.uint8)
                views = [
                    packed[o : o + t.nbytes].view(t.dtype).reshape(t.shape)
                    for o, t in zip(offsets, tensors, strict=True)
                ]
                return list(jax.device_put(views, on_device))

            return put
        word = packed_word(tensors)
        k = word.itemsize
        specs = [
            _Cut(o // k, t.nbytes // k, tuple(t.shape), t.dtype)
            for o, t in zip(offsets, tensors, strict=True)
        ]
        step = self._max_outputs or len(specs)
        whole = jax.ShapeDtypeStruct((size // k,), word, sharding=on_device)
        programs = [
            jax.jit(partial(_cut, specs[i : i + step], word), out_shardings=on_device)
            .lower(whole)
            .compile()
            for i in range(0, len(specs), step)
        ]

        def unpack(packed: Any) -> list[Any]:
            if isinstance(packed, np.ndarray):
                packed = packed.view(word)  # no copy: the same bytes as the program's words
            else:
                # A staged (pinned host) array: one transfer into device memory first. The
                # transient device copy is dropped when this returns and freed by the
                # runtime after the unpack program has read it.
                packed = jax.device_put(packed, on_device)
            if len(programs) == 1:
                return list(programs[0](packed))
            out: list[Any] = []
            for program in programs:
                out.extend(program(packed))
            return out

        return unpack


class _Cut(NamedTuple):
    """One tensor of a packed buffer, in the buffer's words."""

    start: int
    length: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


def _cut(cuts: Sequence[_Cut], word: np.dtype[Any], buffer: Any) -> list[Any]:
    """The unpack program's function: each tensor's words of ``buffer``, as the tensor."""
    from jax import lax

    out = []
    for start, length, shape, dtype in cuts:
        piece = lax.slice(buffer, (start,), (start + length,))
        if dtype == word:
            value = piece
        elif dtype == np.bool_:
            value = piece != 0
        elif dtype.itemsize == word.itemsize:
            value = lax.bitcast_convert_type(piece, dtype)
        else:  # bytes cut into wider elements
            elements = piece.reshape(length // dtype.itemsize, dtype.itemsize)
            value = lax.bitcast_convert_type(elements, dtype)
        out.append(value.reshape(shape))
    return out

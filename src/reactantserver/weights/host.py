"""The host side of model weights: ``weights.safetensors`` read into RAM, kept or transient.

JAX-free (numpy only). The device side (transfers, pinned host buffers) lives in
``reactantserver.runtime``; this module only produces numpy arrays in argument order.

Theory of operation
-------------------
A bundle's ``weights.safetensors`` is an 8-byte little-endian header length, a JSON
header (per tensor: ``dtype``, ``shape``, ``data_offsets`` relative to the data section;
plus ``__metadata__``), then the raw little-endian data. ``__metadata__["argument_order"]``
is a JSON list of tensor names: the order the weights are passed to the compiled program
after the inputs. :func:`read_layout` parses and validates the header *only* (no tensor
data is read) and returns a :class:`WeightsLayout` whose tensors are in argument order.

Two ways to get the data, matching the residency floors of ``policy``:

* :meth:`HostStore.materialize` (floor ``system``): the tensors are read with ``readinto``
  straight into **one packed buffer** from the store's *allocator* (each tensor at a
  :data:`PACK_ALIGN`-byte boundary, in argument order: :func:`pack_offsets`), once, and
  kept until dropped; the arrays are views of it. One buffer is what makes a device load
  one transfer (``runtime/weight_cache.py``), and its layout depends only on the tensors'
  shapes and dtypes, so the variants of one architecture share it. The allocator is the
  seam for the backend's host memory (the runtime stages the buffer in pinned memory
  where the backend offers it); the default is ``numpy.empty``.
* :func:`map_weights` (floors ``unpinned`` and ``device``): one load's transient copy.
  The data section is read (``readinto``, as above) into one buffer of anonymous memory
  and each tensor is a zero-copy ``numpy`` view of it; :meth:`MappedWeights.close` drops
  the views and the buffer, so an ``unpinned`` model holds no host memory between loads.

Why read, not map: the file is a bundle's, in a repository others write to. A mapped
file that is truncated while the transfer reads it kills the worker with SIGBUS (issue
41: a 256 MiB bundle renamed into a dynamic repository and truncated 1.5 s later) --
``MAP_POPULATE`` does not help, the kernel unmaps truncated pages from every mapping. A
read of a truncated file is a short read: a :class:`~reactantserver.errors.BundleError`
naming the tensor, and the load fails cleanly. The cost is one copy through the page
cache that the map avoided; the bytes were read from it by the transfer anyway.

Invariants: every array has exactly the header's shape and dtype; arrays follow
``argument_order``; a transient array is a view of the load's one buffer (never a
separate copy); every byte range is checked against the file size before it is read, with
Python integers, so a hostile header cannot make us read or allocate past the file; no
file is ever memory-mapped.

``HostStore`` is shared by the dispatch loop and the transfer thread, so its table is
guarded by a lock; the slow reads happen outside it.

Why one module of this size: the header check, the two ways to read the data and the
store that owns the copies share one layout record and one set of bounds checks.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np

from ..errors import BundleError

__all__ = [
    "PACK_ALIGN",
    "WEIGHTS_FILE",
    "Allocator",
    "HostStore",
    "HostStoreStatistics",
    "HostWeights",
    "MappedWeights",
    "TensorSpec",
    "WeightsLayout",
    "map_weights",
    "materialize",
    "numpy_allocate",
    "pack_offsets",
    "read_layout",
]

#: The weights file of a bundle.
WEIGHTS_FILE = "weights.safetensors"

#: Largest JSON header accepted (safetensors itself caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000

#: Allocates a C-contiguous host array; the seam for pinned host memory.
Allocator = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray]

#: Each tensor of a packed host copy starts at a multiple of this many bytes (a cache
#: line: every dtype is aligned, and a DMA engine reads whole lines).
PACK_ALIGN = 64


def numpy_allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """The default allocator: ordinary pageable memory."""
    return np.empty(shape, dtype)


def _ml_dtype(name: str, fallback: type[np.generic]) -> np.dtype[Any]:
    # ml_dtypes ships with JAX and is tiny; without it the words are carried raw with the
    # same width, and TensorSpec.dtype_name tells the runtime to bitcast them.
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - depends on the environment
        return np.dtype(fallback)
    return np.dtype(getattr(ml_dtypes, name))


#: safetensors dtype tokens -> numpy dtypes (all little-endian, as the format mandates).
DTYPES: Mapping[str, np.dtype[Any]] = MappingProxyType(
    {
        "BOOL": np.dtype(np.bool_),
        "U8": np.dtype("<u1"),
        "U16": np.dtype("<u2"),
        "U32": np.dtype("<u4"),
        "U64": np.dtype("<u8"),
        "I8": np.dtype("<i1"),
        "I16": np.dtype("<i2"),
        "I32": np.dtype("<i4"),
        "I64": np.dtype("<i8"),
        "F16": np.dtype("<f2"),
        "F32": np.dtype("<f4"),
        "F64": np.dtype("<f8"),
        "BF16": _ml_dtype("bfloat16", np.uint16),
        "F8_E5M2": _ml_dtype("float8_e5m2", np.uint8),
        "F8_E4M3": _ml_dtype("float8_e4m3fn", np.uint8),
    }
)


# ------------------------------------------------------------------------------ layout


@attrs.frozen(kw_only=True)
class TensorSpec:
    """One tensor of the file; offsets are absolute (from the start of the file)."""

    name: str
    dtype_name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@attrs.frozen(kw_only=True)
class WeightsLayout:
    """A validated safetensors header, tensors in argument order."""

    path: str
    tensors: tuple[TensorSpec, ...]
    file_size: int
    metadata: Mapping[str, str]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data: what the weights occupy on the device and in RAM."""
        return sum(t.nbytes for t in self.tensors)


def _bundle_name(path: Path) -> str:
    return path.parent.name or str(path)


def read_layout(path: str | os.PathLike[str]) -> WeightsLayout:
    """Parse and validate the header of a ``weights.safetensors`` (no tensor data read).

    Raises ``BundleError`` naming the bundle (the file's directory) and what is wrong.
    """
    p = Path(path)
    bundle = _bundle_name(p)

    def bad(message: str) -> BundleError:
        return BundleError(bundle, f"{p.name}: {message}")

    try:
        with p.open("rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"file is {file_size} bytes, too short for a safetensors header")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
                raise bad(f"header length {header_len} does not fit the file ({file_size} bytes)")
            raw = f.read(header_len)
    except OSError as exc:
        raise BundleError(bundle, f"cannot read {p.name}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad("__metadata__ must map strings to strings")

    data_start = 8 + header_len
    data_len = file_size - data_start
    specs: dict[str, TensorSpec] = {}
    for name, entry in header.items():
        specs[name] = _tensor_spec(name, entry, data_start, data_len, bad)

    order = _argument_order(metadata, specs, bad)
    return WeightsLayout(
        path=str(p),
        tensors=tuple(specs[n] for n in order),
        file_size=file_size,
        metadata=MappingProxyType(dict(metadata)),
    )


def _tensor_spec(
    name: str, entry: object, data_start: int, data_len: int, bad: Callable[[str], BundleError]
) -> TensorSpec:
    if not isinstance(entry, dict):
        raise bad(f"tensor {name!r}: expected an object with dtype, shape, data_offsets")
    token = entry.get("dtype")
    if not isinstance(token, str) or token not in DTYPES:
        raise bad(f"tensor {name!r}: dtype {token!r} is not one of {', '.join(DTYPES)}")
    dtype = DTYPES[token]
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise bad(f"tensor {name!r}: shape must be a list of integers >= 0; got {shape!r}")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise bad(
            f"tensor {name!r}: data_offsets {offsets!r} must be [begin, end] with "
            f"0 <= begin <= end <= {data_len} (the data section)"
        )
    # Python integers: no overflow however large the declared shape.
    expected = math.prod(shape) * dtype.itemsize
    begin, end = offsets
    if end - begin != expected:
        raise bad(
            f"tensor {name!r}: {token} {shape} needs {expected} bytes but data_offsets "
            f"span {end - begin}"
        )
    return TensorSpec(
        name=name,
        dtype_name=token,
        dtype=dtype,
        shape=tuple(shape),
        begin=data_start + begin,
        end=data_start + end,
    )


def _argument_order(
    metadata: Mapping[str, str], specs: Mapping[str, TensorSpec], bad: Callable[[str], BundleError]
) -> list[str]:
    raw = metadata.get("argument_order")
    if raw is None:
        if specs:
            raise bad(
                '__metadata__["argument_order"] is missing; it must list the tensor names in '
                "the order the compiled program takes them"
            )
        return []
    try:
        order = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise bad(f'__metadata__["argument_order"] is not JSON ({exc})') from exc
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        raise bad('__metadata__["argument_order"] must be a JSON list of tensor names')
    if len(set(order)) != len(order):
        raise bad('__metadata__["argument_order"] names a tensor twice')
    missing = sorted(set(specs) - set(order))
    unknown = sorted(set(order) - set(specs))
    if missing or unknown:
        raise bad(
            f'__metadata__["argument_order"] must name every tensor exactly once '
            f"(not listed: {missing}; not in the file: {unknown})"
        )
    return order


# -------------------------------------------------------------------------- host copies


@attrs.frozen(kw_only=True, eq=False)
class HostWeights:
    """One model's weights on the host, arrays in argument order."""

    model: str
    layout: WeightsLayout
    arrays: tuple[np.ndarray, ...]
    #: One load's transient copy (``unpinned``/``device`` loads) rather than kept RAM copies.
    mapped: bool
    #: The one uint8 buffer ``arrays`` are views of, at :func:`pack_offsets` (a RAM copy
    #: from :func:`materialize`); ``None`` for a map.
    packed: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes


def _read_into(
    f: Any, spec: TensorSpec, out: np.ndarray, bad: Callable[[str], BundleError]
) -> None:
    if out.shape != spec.shape or out.dtype != spec.dtype or not out.flags.c_contiguous:
        raise TypeError(
            f"allocator returned {out.dtype} {out.shape} (contiguous={out.flags.c_contiguous}) "
            f"for {spec.dtype} {spec.shape}"
        )
    if spec.nbytes == 0:
        return
    # A byte view of the destination: readinto fills it in place, no intermediate buffer.
    view = out.reshape(-1).view(np.uint8).data
    f.seek(spec.begin)
    done = 0
    while done < spec.nbytes:
        n = f.readinto(view[done:])
        if not n:
            raise bad(f"tensor {spec.name!r}: file ended after {done} of {spec.nbytes} bytes")
        done += n


def pack_offsets(tensors: Sequence[TensorSpec]) -> tuple[tuple[int, ...], int]:
    """Where each tensor starts in a packed host copy (argument order, each at a
    :data:`PACK_ALIGN` boundary), and the copy's size in bytes."""
    offsets: list[int] = []
    end = 0
    for t in tensors:
        start = -(-end // PACK_ALIGN) * PACK_ALIGN
        offsets.append(start)
        end = start + t.nbytes
    return tuple(offsets), end


def materialize(
    model: str, layout: WeightsLayout, allocate: Allocator = numpy_allocate
) -> HostWeights:
    """Read every tensor into one packed buffer from ``allocate`` (one copy, no
    intermediate buffer); the arrays are views of it (module docstring)."""
    p = Path(layout.path)

    def bad(message: str) -> BundleError:
        return BundleError(_bundle_name(p), f"{p.name}: {message}")

    offsets, size = pack_offsets(layout.tensors)
    packed = allocate((size,), np.dtype(np.uint8))
    if packed.shape != (size,) or packed.dtype != np.uint8 or not packed.flags.c_contiguous:
        raise TypeError(f"allocator returned {packed.dtype} {packed.shape} for uint8 ({size},)")
    arrays: list[np.ndarray] = []
    try:
        with p.open("rb", buffering=0) as f:
            for spec, offset in zip(layout.tensors, offsets, strict=True):
                out = packed[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
                _read_into(f, spec, out, bad)
                arrays.append(out)
    except OSError as exc:
        raise BundleError(_bundle_name(p), f"cannot read {p.name}: {exc.strerror or exc}") from exc
    return HostWeights(
        model=model, layout=layout, arrays=tuple(arrays), mapped=False, packed=packed
    )


class MappedWeights:
    """One load's transient copy of the weights: views of one buffer read from the file
    (module docstring: read, never memory-mapped); close to drop it.

    ``close`` drops the views and the buffer. If a caller still holds one of the arrays
    the buffer goes with its last view, so closing is always safe; use as a context
    manager around the transfer.
    """

    def __init__(self, model: str, layout: WeightsLayout) -> None:
        p = Path(layout.path)

        def bad(message: str) -> BundleError:
            return BundleError(_bundle_name(p), f"{p.name}: {message}")

        tensors = layout.tensors
        start = min((t.begin for t in tensors), default=0)
        end = max((t.end for t in tensors), default=0)
        buffer = np.empty(end - start, dtype=np.uint8)
        try:
            with p.open("rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size != layout.file_size:
                    raise BundleError(
                        _bundle_name(p),
                        f"{p.name} changed size since its header was read "
                        f"({layout.file_size} -> {size} bytes)",
                    )
                section = TensorSpec(
                    name="the data section", dtype_name="U8", dtype=buffer.dtype,
                    shape=buffer.shape, begin=start, end=end,
                )  # fmt: skip
                _read_into(f, section, buffer, bad)  # a truncated file: a short read
        except OSError as exc:
            raise BundleError(
                _bundle_name(p), f"cannot read {p.name}: {exc.strerror or exc}"
            ) from exc
        buffer.flags.writeable = False  # the file's bytes: nobody writes them
        self._buffer: np.ndarray | None = buffer
        arrays = tuple(
            buffer[t.begin - start : t.end - start].view(t.dtype).reshape(t.shape) for t in tensors
        )
        self._weights: HostWeights | None = HostWeights(
            model=model, layout=layout, arrays=arrays, mapped=True
        )

    @property
    def weights(self) -> HostWeights:
        if self._weights is None:
            raise ValueError("the weights map is closed")
        return self._weights

    @property
    def closed(self) -> bool:
        return self._weights is None

    def close(self) -> None:
        self._weights = None
        self._buffer = None  # freed with its last view

    def __enter__(self) -> MappedWeights:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def map_weights(model: str, layout: WeightsLayout) -> MappedWeights:
    """Memory-map a model's weights (see :class:`MappedWeights`)."""
    return MappedWeights(model, layout)


# ------------------------------------------------------------------------------- store


@attrs.frozen(kw_only=True)
class HostStoreStatistics:
    """What the host store holds (byte counts in bytes)."""

    #: Bytes of ``system`` copies held in RAM.
    resident_bytes: int
    #: Transient copies open right now (``unpinned``/``device`` loads in flight).
    maps_open: int
    materializations: int
    maps: int
    #: Bytes held per model (``system`` copies only).
    models: Mapping[str, int]


class HostStore:
    """The ``system``-floor host copies of one worker, by model name.

    ``allocate`` is where materialized arrays come from: the seam for pinned host memory.
    """

    def __init__(self, allocate: Allocator = numpy_allocate) -> None:
        self._allocate = allocate
        self._lock = threading.Lock()
        self._copies: dict[str, HostWeights] = {}
        self._maps_open = 0
        self._materializations = 0
        self._maps = 0

    def materialize(self, model: str, layout: WeightsLayout) -> HostWeights:
        """Read ``model``'s weights into RAM and keep them (replacing an older copy)."""
        weights = materialize(model, layout, self._allocate)
        with self._lock:
            self._copies[model] = weights
            self._materializations += 1
        return weights

    def get(self, model: str) -> HostWeights | None:
        with self._lock:
            return self._copies.get(model)

    def drop(self, model: str) -> bool:
        """Release ``model``'s host copy; ``False`` if it had none."""
        with self._lock:
            return self._copies.pop(model, None) is not None

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            if old in self._copies:
                w = self._copies.pop(old)
                self._copies[new] = attrs.evolve(w, model=new)

    def map(self, model: str, layout: WeightsLayout) -> MappedWeights:
        """A transient copy for one load; counted open until the returned object closes."""
        mapped = _CountedMap(model, layout, self)
        with self._lock:
            self._maps_open += 1
            self._maps += 1
        return mapped

    def _map_closed(self) -> None:
        with self._lock:
            self._maps_open -= 1

    def statistics(self) -> HostStoreStatistics:
        with self._lock:
            per_model = {n: w.nbytes for n, w in sorted(self._copies.items())}
            return HostStoreStatistics(
                resident_bytes=sum(per_model.values()),
                maps_open=self._maps_open,
                materializations=self._materializations,
                maps=self._maps,
                models=MappingProxyType(per_model),
            )


class _CountedMap(MappedWeights):
    def __init__(self, model: str, layout: WeightsLayout, store: HostStore) -> None:
        super().__init__(model, layout)
        self._store: HostStore | None = store

    def close(self) -> None:
        super().close()
        store, self._store = self._store, None
        if store is not None:
            store._map_closed()

"""The weight cache's I/O handles: device arrays, host copies, and the transfers between them.

:class:`WeightHandles` holds what the weight cache's driver has *in hand* per version key:
the header of its weights file, its device arrays, its staged (pinned host) copy, its
memory map; the :class:`~reactantserver.weights.HostStore` holds the system copies. It
decides nothing -- which key is resident, loading, in use or being removed is known to
:class:`~reactantserver.weights.WeightCachePolicy` alone -- and every method is one
step of a plan the policy handed out: make a host copy, drop it, give the function
that transfers a key to the device, or free device arrays.

The functions at the bottom run in worker threads (``trio.to_thread``): header checks,
transfers and frees block on I/O or on the device.

Loads: a ``system`` host copy is one packed buffer (``weights/host.py``). A version of at
most :data:`PACKED_LOAD_MAX_BYTES` loads by :meth:`WeightHandles.inline_source`: one
transfer and the version's unpack program (``unpack.py``), queued on the device and not
waited for, cheap enough to run on the event loop itself (no thread hop). A larger one,
whose copy takes longer than any per-tensor overhead, and a version without a RAM copy
(``unpinned`` and ``device`` floors, a transient warm-up: from a read-only map of its file,
open until the transfer is done) load by :meth:`WeightHandles.source` in a worker thread,
one ``jax.device_put`` of its tensors, waited for there.

Host memory: where the backend offers a ``pinned_host`` memory space (CUDA), ``system``
host copies are staged there, so a load is one DMA; on the CPU, host copies come from
``copying_allocate`` (``host_memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

from ..bundle import Bundle
from ..errors import BundleError
from ..threads import ThreadRunner
from ..weights import (
    HostStore,
    MappedWeights,
    MemoryStats,
    TensorSpec,
    WeightsLayout,
    read_layout,
)
from ..weights.host import pack_offsets
from .host_memory import PinnedHostStaging
from .unpack import Unpack, packed_word

__all__ = [
    "DeviceRuntime",
    "Source",
    "WeightHandles",
    "describe",
    "free_all",
    "read_checked_layout",
]

#: A thread-side function that transfers one key's weights and returns the device arrays.
Source = Callable[[], list[Any]]

#: Versions of at most this many bytes (packed) load on the event loop in one transfer,
#: cut by an unpack program; larger ones per tensor in a thread. Why 4 MiB: the device
#: holds the transient packed copy too until the unpack program has read it (bounded by
#: this), and on the CPU backend the call copies the buffer before it returns (about a
#: millisecond for 4 MiB on a busy 2-core machine), while past it a per-tensor put's
#: overhead (25-30 us a tensor) is small against the copy itself.
PACKED_LOAD_MAX_BYTES = 4 << 20


class DeviceRuntime(Protocol):
    """What the cache needs of ``Runtime`` (tests pass a fake with the same methods)."""

    def to_device(self, host_arrays: Sequence[Any]) -> list[Any]: ...

    def packed_loader(self, tensors: Sequence[TensorSpec]) -> Unpack: ...

    def free(self, device_arrays: Sequence[Any]) -> None: ...

    def memory_stats(self) -> MemoryStats | None: ...


class WeightHandles:
    """Per version key: its layout, device arrays and host copies (module docstring)."""

    def __init__(
        self,
        runtime: DeviceRuntime,
        store: HostStore,
        staging: PinnedHostStaging | None,
        thread: ThreadRunner,
    ) -> None:
        self._runtime = runtime
        self.store = store
        self.staging = staging
        self._thread = thread
        #: The header of each registered key's weights file.
        self.layouts: dict[str, WeightsLayout] = {}
        #: The load function of each registered key's packed host copy (``unpack.py``),
        #: for the keys of at most ``PACKED_LOAD_MAX_BYTES``.
        self.loaders: dict[str, Unpack] = {}
        #: Device arrays of each key the policy made resident.
        self.device: dict[str, list[Any]] = {}
        #: The pinned host copy of each staged key: its packed buffer (one array) where it
        #: has a loader, else one array per tensor.
        self._staged: dict[str, Any] = {}
        self._maps: dict[str, MappedWeights] = {}

    def nbytes(self, key: str) -> int:
        return self.layouts[key].nbytes

    def packed(self, layout: WeightsLayout) -> bool:
        """Whether a version of ``layout`` loads packed, on the loop (module docstring)."""
        return pack_offsets(layout.tensors)[1] <= PACKED_LOAD_MAX_BYTES

    @property
    def staged_bytes(self) -> int:
        return sum(self.layouts[k].nbytes for k in self._staged)

    async def make_host_copy(self, key: str, *, system: bool) -> None:
        """A ``system`` copy read into RAM (then staged, where there is pinned memory), or
        a transient read-only map for the others."""
        layout = self.layouts[key]
        if system:
            copy = await self._thread(self.store.materialize, key, layout)
            if self.staging is not None:
                if key in self.loaders and copy.packed is not None:
                    words = copy.packed.view(packed_word(layout.tensors))  # no copy
                    staged = await self._thread(self.staging.stage_packed, words)
                else:
                    staged = await self._thread(self.staging.stage, copy.arrays)
                self._staged[key] = staged
                self.store.drop(key)  # the pinned copy replaces the pageable one
        elif layout.tensors:
            self._maps[key] = await self._thread(self.store.map, key, layout)

    async def drop_host_copies(self, keys: Iterable[str]) -> None:
        for key in keys:
            mapped = self._maps.pop(key, None)
            if mapped is not None:
                mapped.close()
            staged = self._staged.pop(key, None)
            if staged is not None:
                await self._thread(free_all, self._runtime, [_arrays(staged)])
            self.store.drop(key)

    def inline_source(self, key: str) -> Source | None:
        """``key``'s load from its packed host copy -- one transfer and the unpack program,
        queued on the device and not waited for: cheap enough for the event loop -- or
        ``None`` when it has no such copy (then :meth:`source`, in a thread)."""
        load = self.loaders.get(key)
        if load is None:
            return None
        staged = self._staged.get(key)
        if staged is not None:
            return partial(load, staged)
        copy = self.store.get(key)
        if copy is not None and copy.packed is not None:
            return partial(load, copy.packed)
        return None

    def source(self, key: str) -> Source:
        """A thread-side function that transfers ``key``'s weights and returns them."""
        layout = self.layouts[key]
        if not layout.tensors:
            return list
        inline = self.inline_source(key)
        if inline is not None:
            return inline
        staged = self._staged.get(key)
        if staged is not None and self.staging is not None:
            return partial(self.staging.to_device, staged)
        copy = self.store.get(key)
        if copy is not None:
            return partial(self._runtime.to_device, copy.arrays)
        mapped = self._maps.get(key)
        if mapped is not None and not mapped.closed:
            return partial(self._runtime.to_device, mapped.weights.arrays)
        # No host copy (a transient warm-up, or a system copy that failed to be made):
        # map the file for this one transfer.
        return partial(_transfer_mapped, self._runtime, self.store, key, layout)


# ------------------------------------------------------------------ thread-side helpers


def read_checked_layout(bundle: Bundle) -> WeightsLayout:
    """The weights header, checked against what the bundle was validated with."""
    path = bundle.weights_path
    if path is None:
        return WeightsLayout(path="", tensors=(), file_size=0, metadata=MappingProxyType({}))
    layout = read_layout(path)
    got = [(t.name, t.dtype, t.shape) for t in layout.tensors]
    want = [(w.name, w.dtype, tuple(w.shape)) for w in bundle.weight_specs]
    if got != want:
        raise BundleError(
            bundle.name,
            f"{path.name} changed on disk since the bundle was read (tensors now {got}, "
            f"loaded as {want}); the repository watcher will load the new version",
        )
    return layout


def _transfer_mapped(
    runtime: DeviceRuntime, store: HostStore, key: str, layout: WeightsLayout
) -> list[Any]:
    with store.map(key, layout) as mapped:
        return runtime.to_device(mapped.weights.arrays)


def _arrays(staged: Any) -> Sequence[Any]:
    """A staged copy's arrays: its one packed array, or its list of tensors."""
    return staged if isinstance(staged, list) else [staged]


def free_all(runtime: DeviceRuntime, groups: Sequence[Sequence[Any]]) -> None:
    for arrays in groups:
        runtime.free(arrays)


def describe(exc: BaseException) -> str:
    """``Type: first line`` of an exception, for logs and error messages."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

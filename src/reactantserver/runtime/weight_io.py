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

Host memory: where the backend offers a ``pinned_host`` memory space (CUDA), ``system``
host copies are staged there, so a load is one DMA; on the CPU, host copies come from
``copying_allocate`` so that a device copy is a real copy (``host_memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

from ..bundle import Bundle
from ..errors import BundleError
from ..threads import ThreadRunner
from ..weights import HostStore, MappedWeights, MemoryStats, WeightsLayout, read_layout
from .host_memory import PinnedHostStaging

__all__ = [
    "DeviceRuntime",
    "Source",
    "WeightHandles",
    "describe",
    "read_checked_layout",
]

#: A thread-side function that transfers one key's weights and returns the device arrays.
Source = Callable[[], list[Any]]


class DeviceRuntime(Protocol):
    """What the cache needs of ``Runtime`` (tests pass a fake with the same methods)."""

    def to_device(self, host_arrays: Sequence[Any]) -> list[Any]: ...

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
        #: Device arrays of each key the policy made resident.
        self.device: dict[str, list[Any]] = {}
        self._staged: dict[str, list[Any]] = {}
        self._maps: dict[str, MappedWeights] = {}

    def nbytes(self, key: str) -> int:
        return self.layouts[key].nbytes

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
                self._staged[key] = await self._thread(self.staging.stage, copy.arrays)
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
                await self._thread(free_all, self._runtime, [staged])
            self.store.drop(key)

    def source(self, key: str) -> Source:
        """A thread-side function that transfers ``key``'s weights and returns them."""
        layout = self.layouts[key]
        if not layout.tensors:
            return list
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


def free_all(runtime: DeviceRuntime, groups: Sequence[Sequence[Any]]) -> None:
    for arrays in groups:
        runtime.free(arrays)


def free_then(runtime: DeviceRuntime, victims: Sequence[Sequence[Any]], load: Source) -> list[Any]:
    """Free the victims, then transfer: the plan's order, in one thread hop."""
    free_all(runtime, victims)
    return load()


def describe(exc: BaseException) -> str:
    """``Type: first line`` of an exception, for logs and error messages."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

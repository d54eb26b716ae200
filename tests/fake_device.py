"""A fake device for the weight cache's driver, and fake model versions on real files.

``FakeDevice`` implements ``DeviceRuntime`` (what ``CachedWeights`` needs of
``Runtime``): it copies arrays like a real device -- a list of host arrays
(``to_device``), or a version's packed host copy cut into its tensors
(``packed_loader``, the cache's loads from a ``system`` copy), each one transfer -- and
keeps books the tests read --
bytes live on the "device" and their high-water mark, transfers, frees, whether an array
was freed while an execution held it. With ``stats=True`` it reports allocator
statistics shaped as JAX's GPU client reports them (bytes in use, the peak), which is
what the startup probe reads; a transfer can be made to fail with any exception, e.g.
the ``JaxRuntimeError`` JAX raises when the device is out of memory.

``Models`` writes small real ``weights.safetensors`` files and makes the fake model
versions the cache reads (name, generation, bundle, residency, a warm-up); ``run_batch``
plays the executor.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio
from conftest import inline

from reactantserver.bundle import read_weight_specs, read_weights, write_weights
from reactantserver.config.schema import ModelSchedConfig, Residency, RuntimeConfig
from reactantserver.runtime import MemoryStats
from reactantserver.runtime.weight_cache import CachedWeights
from reactantserver.weights import TensorSpec
from reactantserver.weights.host import pack_offsets


def jax_out_of_memory(nbytes: int) -> RuntimeError:
    """The exception JAX raises when the device allocator refuses ``nbytes``: its own
    class (``jax.errors.JaxRuntimeError``) with XLA's status text."""
    from jax.errors import JaxRuntimeError

    return JaxRuntimeError(
        f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {nbytes} bytes."
    )


class FakeArray:
    """A device array: a private copy, ``delete()`` frees it."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.deleted = False

    def is_deleted(self) -> bool:
        return self.deleted


class FakeDevice:
    """``DeviceRuntime`` with books: live bytes, their peak, transfers, frees."""

    def __init__(self, *, stats: bool = False, capacity: int | None = None) -> None:
        self._lock = threading.Lock()
        self._stats = stats
        #: The allocator's limit: a transfer that would take live bytes past it fails
        #: as JAX fails on a full device (``jax_out_of_memory``). None: unlimited.
        self.capacity = capacity
        #: Bytes held by something other than the cache (another process, a leak).
        self.foreign = 0
        self.live = 0
        self.peak = 0
        self.transfers = 0
        self.frees = 0
        #: The next ``fail_next`` transfers raise ``failure`` (any device error).
        self.fail_next = 0
        self.failure: Exception = RuntimeError("INTERNAL: the host-to-device copy failed")
        #: Held arrays: freeing one of these is the bug the cache must never commit.
        self.executing: set[int] = set()
        self.freed_while_executing = 0
        #: When set, transfers of host arrays (``to_device``, the thread path) block until
        #: it is set (to hold a load in flight). Packed loads never block: the real ones
        #: are queued on the device and run on the event loop.
        self.gate: threading.Event | None = None
        #: Transfers from packed host copies (one each), a subset of ``transfers``.
        self.packed_transfers = 0

    def packed_loader(self, tensors: Sequence[TensorSpec]) -> Any:
        offsets, _ = pack_offsets(tensors)

        def load(packed: np.ndarray) -> list[FakeArray]:
            views = [
                packed[o : o + t.nbytes].view(t.dtype).reshape(t.shape)
                for o, t in zip(offsets, tensors, strict=True)
            ]
            out = self._transfer(views)
            with self._lock:
                self.packed_transfers += 1
            return out

        return load

    def to_device(self, host_arrays: Sequence[np.ndarray]) -> list[FakeArray]:
        if self.gate is not None:
            self.gate.wait(10)
        return self._transfer(host_arrays)

    def _transfer(self, host_arrays: Sequence[np.ndarray]) -> list[FakeArray]:
        with self._lock:
            if self.fail_next:
                self.fail_next -= 1
                raise self.failure
            need = sum(a.nbytes for a in host_arrays)
            if self.capacity is not None and self.foreign + self.live + need > self.capacity:
                raise jax_out_of_memory(need)
            out = [FakeArray(np.array(a, copy=True)) for a in host_arrays]
            self.live += sum(a.data.nbytes for a in out)
            self.peak = max(self.peak, self.live)
            self.transfers += 1
            return out

    def free(self, device_arrays: Sequence[FakeArray]) -> None:
        with self._lock:
            for a in device_arrays:
                if id(a) in self.executing:
                    self.freed_while_executing += 1
                if not a.deleted:
                    a.deleted = True
                    self.live -= a.data.nbytes
                    self.frees += 1

    def transient(self, nbytes: int) -> None:
        """An execution's scratch: raises the peak over what is live."""
        with self._lock:
            self.peak = max(self.peak, self.live + nbytes)

    def memory_stats(self) -> MemoryStats | None:
        if not self._stats:
            return None
        with self._lock:
            return MemoryStats(in_use=self.live, limit=0, peak=self.peak, raw={})


@attrs.define(eq=False)
class FakeBundle:
    name: str
    weights_path: Path
    weight_specs: tuple[Any, ...]

    is_meta: bool = False

    @property
    def weights_nbytes(self) -> int:
        return sum(w.nbytes for w in self.weight_specs)

    def read_weights(self) -> list[np.ndarray]:
        return read_weights(self.name, self.weights_path, self.weight_specs)


@attrs.define(eq=False)
class FakeLoaded:
    device: FakeDevice
    scratch: int = 0
    #: Live device bytes seen at each warm-up (the probe runs models alone).
    seen_live: list[int] = attrs.field(factory=list)

    def warmup(self, weights: Sequence[FakeArray]) -> dict[int, float]:
        assert not any(w.deleted for w in weights)
        self.seen_live.append(self.device.live)
        self.device.transient(self.scratch)
        return {1: 0.001 + self.scratch / 1e6}


@attrs.define(eq=False)
class FakeModel:
    """What the cache reads of a ``ServedModel`` (hashable by identity, like it)."""

    name: str
    generation: int
    bundle: FakeBundle
    sched: ModelSchedConfig
    loaded: FakeLoaded
    expected: list[np.ndarray]


class Models:
    """Writes small weights files and makes fake model versions of them."""

    def __init__(self, root: Path, device: FakeDevice) -> None:
        self.root = root
        self.device = device
        self.generation = 0

    def __call__(
        self, name: str, nbytes: int, floor: Residency | None = None, *, scratch: int = 0
    ) -> FakeModel:
        self.generation += 1
        directory = self.root / f"{name}-{self.generation}"
        directory.mkdir()
        path = directory / "weights.safetensors"
        # Two tensors, content unique per version, so a mix-up would show.
        first = nbytes // 2
        rng = np.random.default_rng(self.generation)
        arrays = [
            rng.integers(0, 255, size=first, dtype=np.uint8),
            rng.integers(0, 255, size=nbytes - first, dtype=np.uint8),
        ]
        write_weights(path, [("w0", arrays[0]), ("w1", arrays[1])])
        bundle = FakeBundle(name, path, read_weight_specs(name, path))
        return FakeModel(
            name,
            self.generation,
            bundle,
            ModelSchedConfig(residency=floor),
            FakeLoaded(self.device, scratch),
            arrays,
        )


def make_cache(
    device: FakeDevice, budget: int, *, explicit: bool = False, interval: int = 0, **runtime: Any
) -> CachedWeights:
    # wiggle 0 and fraction 1: the on-demand budget is exactly the arena (no pinned models).
    config = RuntimeConfig(
        weight_cache_fraction=1.0, weight_cache_wiggle_fraction=0.0, arena_bytes=budget, **runtime
    )
    return CachedWeights(
        device,  # type: ignore[arg-type]
        config,
        arena=budget,
        explicit=explicit,
        compaction_interval=interval,
        thread=inline,
    )


async def run_batch(cache: CachedWeights, device: FakeDevice, model: FakeModel) -> None:
    """Play the executor: acquire, "execute" (yielding so others run), check, release."""
    arrays = await cache.acquire(model)  # type: ignore[arg-type]
    held = {id(a) for a in arrays}
    device.executing |= held
    try:
        for a, want in zip(arrays, model.expected, strict=True):
            assert not a.deleted, f"{model.name} is missing weights at execution"
            np.testing.assert_array_equal(a.data, want)
        await trio.sleep(0.001)  # virtual-clock: run_batch's callers run on autojump_clock
        assert not any(a.deleted for a in arrays), f"{model.name} lost its weights mid-run"
    finally:
        device.executing -= held
        cache.release(model)  # type: ignore[arg-type]

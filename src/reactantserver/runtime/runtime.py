"""The device runtime: backend selection, model loading, weight transfers, memory stats.

Theory of operation
-------------------
``Runtime.start`` runs once per worker process, before anything else touches JAX:

1. ``apply_environment`` expresses ``runtime:`` as XLA/JAX settings (platforms,
   allocator fraction, preallocation);
2. the backend is chosen: ``cpu`` is always available; ``cuda`` with no usable GPU
   falls back to the CPU with a warning when ``allow_cpu_fallback`` is set, and is a
   ``ConfigError`` otherwise;
3. the persistent compilation cache is pointed at ``cache_dir`` (empty: off).

``load`` turns a validated ``Bundle`` into a ``LoadedModel``: deserialize the
artifact, check it against the manifest argument by argument, compile every compiled
batch size ahead of time (logging seconds and cache hits) and check each compiled
program's concrete result shapes. Programs are compiled for the runtime's transfer path
(``model.output_path``, chosen at start from the device's memory kinds: on CUDA the
outputs are compiled into pinned host memory; a program whose pinned-host compile fails
is compiled again without, and copies its outputs asynchronously instead). A program already compiled for another loaded bundle
with the same artifact and argument types is shared instead of compiled again
(``programs.py``: catalogs of variants of one architecture). Loading is synchronous and
slow; callers run it in a worker thread.

Weights are moved separately: ``packed_loader(tensors)`` gives the function that moves
a version's packed host copy to the device in one transfer and cuts it into its weights
without waiting (``unpack.py``: the weight cache's loads); ``to_device`` takes host arrays
(argument order) and returns device arrays once they are there (the cache off, mapped
files); ``free`` releases them without waiting. Keeping transfers out of ``load`` and
``execute`` lets the weight cache decide residency on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bundle import Bundle
from ..config import RuntimeConfig
from ..errors import BundleError, ConfigError
from ..weights import TensorSpec
from ..weights.records import MemoryStats
from .artifact import check_artifact, deserialize_artifact
from .compile import CompileReport, compile_at, configure_cache
from .environment import EnvironmentReport, apply_environment
from .model import UNBATCHED, LoadedModel, OutputPath, output_path
from .programs import SharedPrograms, artifact_digest, program_key
from .unpack import CPU_MAX_OUTPUTS, Unpack, Unpackers

if TYPE_CHECKING:
    from jax import Device

log = logging.getLogger("reactantserver.runtime")


def _select_device(cfg: RuntimeConfig, ordinal: int) -> tuple[Device, str, bool]:
    """(device, actual backend, fell back?) for ``cfg``; initialises JAX's backends."""
    import jax

    fell_back = False
    if cfg.backend == "cuda":
        try:
            gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
            reason = "no CUDA device is visible" if not gpus else ""
        except RuntimeError as exc:
            gpus, reason = [], str(exc).splitlines()[0]
        if not gpus:
            if not cfg.allow_cpu_fallback:
                raise ConfigError(
                    f"runtime.backend: cuda: no usable GPU ({reason}); set "
                    "runtime.allow_cpu_fallback: true to run on the CPU instead"
                )
            log.warning("runtime.backend is cuda but %s; falling back to the CPU", reason)
            fell_back = True
        else:
            if ordinal >= len(gpus):
                raise ConfigError(
                    f"gpu: {ordinal}: only {len(gpus)} GPU(s) are visible to this worker"
                )
            return gpus[ordinal], "cuda", False
    try:
        cpus = jax.devices("cpu")
    except RuntimeError:
        # The platform list excluded the CPU (e.g. JAX_PLATFORMS=cuda from outside
        # and no GPU): start over with the CPU alone.
        from jax.extend.backend import clear_backends

        jax.config.update("jax_platforms", "cpu")
        clear_backends()
        cpus = jax.devices("cpu")
    if cfg.backend == "cpu" and ordinal:
        log.warning("gpu: %d ignored on the CPU backend", ordinal)
    return cpus[0], "cpu", fell_back


class Runtime:
    """The JAX side of one worker (one device)."""

    def __init__(
        self,
        cfg: RuntimeConfig,
        device: Device,
        backend: str,
        fell_back: bool,
        cache_dir: str,
        environment: EnvironmentReport,
        *,
        output_memory: str = "pinned_host",
    ) -> None:
        self.config = cfg
        self.device = device
        #: The backend actually in use: ``cpu`` or ``cuda``.
        self.backend = backend
        #: True when ``cuda`` was asked for and the CPU is used instead.
        self.fell_back = fell_back
        self.cache_dir = cache_dir
        self.environment = environment
        #: Compiled programs by artifact and argument types, shared between bundles.
        self.programs = SharedPrograms()
        #: The weight loads' unpack programs, one set per layout of weights in use; on the
        #: CPU each cuts at most CPU_MAX_OUTPUTS tensors (``unpack.py``).
        self.unpackers = Unpackers(device, CPU_MAX_OUTPUTS if backend == "cpu" else None)
        #: The memory kind a ``pinned_host``-path program's outputs are compiled into (a
        #: constructor argument so that a test can make that compile fail on the CPU).
        self.output_memory = output_memory
        #: Keys of programs whose pinned-host compile failed (compiled without instead).
        self._pinned_failed: set[Any] = set()
        #: How executions move their inputs and outputs (``model.output_path``).
        self.output_path: OutputPath = output_path(
            backend, (m.kind for m in device.addressable_memories())
        )

    @classmethod
    def start(
        cls, cfg: RuntimeConfig, cache_dir: str | Path = "", *, device_ordinal: int | None = None
    ) -> Runtime:
        """Configure JAX for ``cfg`` and pick the device (see the module docstring)."""
        env = apply_environment(cfg)
        device, backend, fell_back = _select_device(cfg, device_ordinal or 0)
        import jax

        # Programs are lowered for, and inputs placed on, the default device.
        jax.config.update("jax_default_device", device)
        configure_cache(str(cache_dir) if cache_dir else None)
        runtime = cls(cfg, device, backend, fell_back, str(cache_dir or ""), env)
        log.info(
            "runtime started: backend %s (%s)%s, persistent compilation cache %s, "
            "execution transfers: %s",
            backend,
            device.device_kind,
            " [fallback from cuda]" if fell_back else "",
            cache_dir or "off",
            runtime.output_path,
        )
        return runtime

    @property
    def platform(self) -> str:
        """The lowering platform name (``cpu`` or ``cuda``)."""
        return self.backend

    def load(self, bundle: Bundle, *, sizes: Sequence[int] | None = None) -> LoadedModel:
        """Check and compile ``bundle`` for each compiled batch size (or just ``sizes``)."""
        import jax

        if bundle.is_meta:
            raise BundleError(bundle.name, "kind: meta bundles run model.py; nothing to compile")
        data = bundle.read_artifact()
        digest = artifact_digest(data)
        exported = deserialize_artifact(bundle, data)
        check_artifact(
            bundle.name, exported, bundle.manifest, bundle.weight_specs, platform=self.platform
        )
        if bundle.batched:
            wanted = tuple(sizes) if sizes is not None else bundle.compiled_batch_sizes
            unknown = sorted(set(wanted) - set(bundle.compiled_batch_sizes))
            if unknown:
                raise BundleError(
                    bundle.name,
                    f"batch sizes {unknown} are not in batching.compiled_batch_sizes "
                    f"{list(bundle.compiled_batch_sizes)}",
                )
        else:
            wanted = (UNBATCHED,)
        weight_specs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in bundle.weight_specs]
        executables = {}
        paths: dict[int, OutputPath] = {}
        reports: list[CompileReport] = []
        shared: list[int] = []
        artifact = bundle.manifest.artifact
        for size in wanted:
            in_specs = [
                jax.ShapeDtypeStruct(
                    spec.with_batch(size) if size else spec.shape, spec.numpy_dtype
                )
                for spec in bundle.inputs
            ]
            args = [*in_specs, *weight_specs]
            path = self.output_path
            key = program_key(digest, self.platform, size, args, output_memory=_memory(path))
            if key in self._pinned_failed:
                # Its pinned-host compile failed before: share the fallback, do not retry.
                path = "copy_async"
                key = program_key(digest, self.platform, size, args)
            reused = self.programs.get(key)
            if reused is not None:
                _check_result_shapes(bundle, reused, size)
                executables[size] = reused
                paths[size] = path
                reports.append(CompileReport(bundle.name, size, 0.0, "shared"))
                shared.append(size)
                continue
            try:
                compiled, report, compiled_for = self._compile(bundle, exported, args, size, path)
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                at = f"batch size {size}" if size else "its fixed shapes"
                raise BundleError(
                    bundle.name,
                    f"{artifact}: compiling at {at} failed: {type(exc).__name__}: {first}",
                ) from exc
            _check_result_shapes(bundle, compiled, size)
            if compiled_for != path:
                self._pinned_failed.add(key)
                path = compiled_for
                key = program_key(digest, self.platform, size, args)
            self.programs.put(key, compiled)
            executables[size] = compiled
            paths[size] = path
            reports.append(report)
        if shared:
            log.info(
                "model %s: batch size(s) %s run the programs already compiled for another "
                "loaded model with the same artifact",
                bundle.name,
                ", ".join(str(s) if s else "-" for s in shared),
            )
        return LoadedModel(bundle, executables, reports, paths=paths)

    def _compile(
        self, bundle: Bundle, exported: Any, args: Sequence[Any], size: int, path: OutputPath
    ) -> tuple[Any, CompileReport, OutputPath]:
        """Compile for ``path``; a pinned-host compile that fails is done again without
        (``copy_async``), with a warning. Returns the path the program was compiled for."""
        if path == "pinned_host":
            try:
                compiled, report = compile_at(
                    bundle.name,
                    exported,
                    args,
                    size,
                    output_memory=(self.device, self.output_memory),
                )
                return compiled, report, path
            except Exception as exc:
                log.warning(
                    "model %s: compiling batch size %s with its outputs in pinned host memory "
                    "failed (%s: %s); its outputs are copied to the host asynchronously instead",
                    bundle.name,
                    size,
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
                path = "copy_async"
        compiled, report = compile_at(bundle.name, exported, args, size)
        return compiled, report, path

    def to_device(self, host_arrays: Sequence[np.ndarray]) -> list[Any]:
        """Copy host weights to the device (argument order kept); blocks until done."""
        import jax

        arrays = jax.device_put(list(host_arrays), self.device)
        jax.block_until_ready(arrays)
        return list(arrays)

    def packed_loader(self, tensors: Sequence[TensorSpec]) -> Unpack:
        """The function that loads a packed host copy of ``tensors`` onto the device in
        one transfer, queued and not waited for (``unpack.py``); compiled on the first
        call for a layout (slow: call it in a worker thread), shared after."""
        return self.unpackers.get(tensors)

    def free(self, device_arrays: Sequence[Any]) -> None:
        """Release device arrays now rather than when Python collects them. Never waits:
        JAX frees a buffer once the work already queued on it is done."""
        for arr in device_arrays:
            if not arr.is_deleted():
                arr.delete()

    def memory_stats(self) -> MemoryStats | None:
        """Allocator statistics of the device, or None where it keeps none (CPU)."""
        stats = self.device.memory_stats()
        if not stats:
            return None
        return MemoryStats(
            in_use=int(stats.get("bytes_in_use", 0)),
            limit=int(stats.get("bytes_limit", 0)),
            peak=int(stats.get("peak_bytes_in_use", 0)),
            raw={k: int(v) for k, v in stats.items()},
        )

    def __repr__(self) -> str:
        return f"<Runtime backend={self.backend} device={self.device}>"


def _memory(path: OutputPath) -> str:
    """The output memory kind a program for ``path`` is compiled with (its sharing key)."""
    return "pinned_host" if path == "pinned_host" else "device"


def _check_result_shapes(bundle: Bundle, compiled: Any, size: int) -> None:
    """The concrete results at ``size`` must be the manifest's outputs with ``size`` rows."""
    import jax

    infos = jax.tree.leaves(compiled.out_info)
    for spec, info in zip(bundle.outputs, infos, strict=True):
        want = spec.with_batch(size) if size else spec.shape
        if tuple(info.shape) != tuple(want):
            raise BundleError(
                bundle.name,
                f"{bundle.manifest.artifact}: output {spec.name!r} at batch size {size} has shape "
                f"{list(info.shape)}, expected {list(want)} (the batch axis must carry the rows)",
            )

"""The JAX runtime: the only package (with ``reactantserver.export``) that imports JAX.

JAX is imported lazily, inside functions: the XLA allocator settings and the platform
list must be in place before JAX initialises (``Runtime.start`` does that first), and
importing this package from JAX-free code (type hints, the worker's wiring) must not
initialise anything.

    Runtime.start(runtime_cfg, cache_dir)   -> Runtime (device, backend, memory_stats())
    runtime.load(bundle)                    -> LoadedModel (every compiled size, AOT)
    runtime.to_device(host_weights)         -> device arrays; runtime.free(arrays)
    model.execute(inputs, device_weights)   -> list[np.ndarray]  (sync, thread-safe)
    model.warmup(device_weights)            -> {batch size: seconds}

Modules: ``environment`` (XLA/JAX settings, JAX-free), ``artifact`` (deserialize and
check against the manifest), ``compile`` (AOT compile, persistent cache, hit
detection), ``model`` (LoadedModel), ``runtime`` (Runtime).
"""

from .artifact import check_artifact, deserialize_artifact
from .compile import CompileReport, configure_cache
from .environment import EnvironmentReport, apply_environment, desired_environment
from .model import UNBATCHED, LoadedModel
from .runtime import MemoryStats, Runtime

__all__ = [
    "UNBATCHED",
    "CompileReport",
    "EnvironmentReport",
    "LoadedModel",
    "MemoryStats",
    "Runtime",
    "apply_environment",
    "check_artifact",
    "configure_cache",
    "deserialize_artifact",
    "desired_environment",
]

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

Modules, one concern each:

``environment``      process-wide XLA/JAX settings, applied before JAX initialises (JAX-free)
``runtime``          ``Runtime``: backend selection, model loading, weight transfers, memory stats
``artifact``         deserialize a bundle's artifact and prove it matches the manifest
``compile``          AOT compilation per batch size; the persistent cache, hit detection
``programs``         compiled programs shared between bundles with the same artifact
``model``            ``LoadedModel``: one executable per compiled batch size; launch, then fetch
``assemble``         a batch's data: gather requests into one padded batch, split the results
``executor``         the scheduler's executor for a real device: weights, assembly, execution
``device_errors``    out of device memory: recognising it, and the errors callers get instead
``host_memory``      host memory for transfers: pinned staging where the device has it
``unpack``           one transfer per weight load, cut into its weights on the device
``weight_io``        the weight cache's handles: device arrays, host copies, the transfers
``weight_cache``     the on-demand weight cache on a device: a thin driver over the policy
``weight_provider``  device weights per model version: the one interface the worker uses
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

"""Deserializing a bundle's artifact and proving it matches the manifest.

Theory of operation
-------------------
The artifact is a serialized ``jax.export.Exported``: StableHLO plus the abstract
signature it was traced with. Because that signature travels with the program, a
mismatch between artifact and manifest can be caught *before* compiling anything, and
reported by argument, which is what an operator needs to fix a bundle:

    bundle 'mlp': model.jaxexport: argument 2 (weight 'dense1.w', entry 0 of
    argument_order in weights.safetensors): the artifact takes float32 (64, 32),
    weights.safetensors holds float32 (32, 64); is argument_order right?

The calling convention is ``exe(*inputs, *weights)`` with flat positional arrays and
a flat tuple (or single array) of results. A batched manifest needs a *symbolic*
axis 0 on every input and output (one artifact serves every compiled size); fixed
axes must match exactly. The artifact must be exported for the platform the runtime
runs on and for a single device.

JAX is imported lazily (see ``reactantserver.runtime``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bundle import Bundle, Manifest, TensorSpec, WeightSpec
from ..errors import BundleError

if TYPE_CHECKING:
    from jax.export import Exported


def deserialize_artifact(bundle: Bundle, data: bytes | None = None) -> Exported:
    """The bundle's artifact (``data``: its bytes, already read) as an ``Exported``
    (BundleError if it is not one)."""
    from jax import export

    if data is None:
        data = bundle.read_artifact()
    try:
        return export.deserialize(bytearray(data))
    except Exception as exc:  # flatbuffers raises assorted low-level errors
        file = bundle.manifest.artifact
        raise BundleError(
            bundle.name,
            f"{file}: not a serialized jax.export artifact ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); re-export the bundle",
        ) from None


def format_dims(shape: Sequence[Any]) -> str:
    """``(b, 16)`` for an abstract shape with symbolic or concrete dims."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _is_symbolic(dim: Any) -> bool:
    from jax import export

    return bool(export.is_symbolic_dim(dim))


def _check_tensor(
    bundle: str,
    artifact: str,
    label: str,
    aval: Any,
    spec: TensorSpec,
    what: str,
) -> None:
    """One input or output against its manifest spec."""
    got = np.dtype(aval.dtype)
    if got != spec.numpy_dtype:
        raise BundleError(
            bundle,
            f"{artifact}: {label}: the artifact {what} {got}, the manifest declares {spec.datatype}",
        )
    shape = tuple(aval.shape)
    mismatch = BundleError(
        bundle,
        f"{artifact}: {label}: the artifact {what} shape {format_dims(shape)}, the manifest "
        f"declares {list(spec.shape)}",
    )
    if len(shape) != len(spec.shape):
        raise mismatch
    for axis, (dim, declared) in enumerate(zip(shape, spec.shape, strict=True)):
        if declared == -1:
            if not _is_symbolic(dim):
                raise BundleError(
                    bundle,
                    f"{artifact}: {label}: axis {axis} is fixed at {dim} in the artifact, but "
                    "the manifest declares a batch axis (-1); export with a symbolic batch "
                    "dimension",
                )
        elif _is_symbolic(dim) or int(dim) != declared:
            raise mismatch


def check_artifact(
    bundle: str,
    exported: Exported,
    manifest: Manifest,
    weights: Sequence[WeightSpec],
    *,
    platform: str | None,
) -> None:
    """Raise ``BundleError`` unless ``exported`` is callable as the manifest says.

    ``platform`` is the lowering platform the runtime uses (``cpu``, ``cuda``), or
    ``None`` to skip that check (the exporter verifies on whatever it runs on).
    """
    import jax

    artifact = manifest.artifact or "artifact"
    weights_file = manifest.weights or "weights"
    if platform is not None and platform not in exported.platforms:
        raise BundleError(
            bundle,
            f"{artifact}: exported for {', '.join(exported.platforms)}, but this worker runs on "
            f"{platform}; re-export with that platform included",
        )
    if exported.nr_devices != 1:
        raise BundleError(
            bundle,
            f"{artifact}: exported for {exported.nr_devices} devices; a bundle runs on one device",
        )
    n_in, n_w = len(manifest.inputs), len(weights)
    in_avals = exported.in_avals
    flat = jax.tree_util.tree_structure((tuple(range(len(in_avals))), {}))
    # Compared as text: PyTreeDef's stubs declare no comparison operators.
    if str(exported.in_tree) != str(flat):
        raise BundleError(
            bundle,
            f"{artifact}: the artifact takes structured arguments {exported.in_tree}; the "
            "calling convention is flat positional arrays exe(*inputs, *weights)",
        )
    if len(in_avals) != n_in + n_w:
        raise BundleError(
            bundle,
            f"{artifact}: the artifact takes {_n(len(in_avals), 'argument')}, but the manifest "
            f"declares {_n(n_in, 'input')} and {weights_file} holds {_n(n_w, 'weight')} "
            f"({_n(n_in + n_w, 'argument')} in all)",
        )
    for i, spec in enumerate(manifest.inputs):
        _check_tensor(
            bundle, artifact, f"argument {i} (input {spec.name!r})", in_avals[i], spec, "takes"
        )
    for j, w in enumerate(weights):
        aval = in_avals[n_in + j]
        got_dtype, got_shape = np.dtype(aval.dtype), tuple(aval.shape)
        if got_dtype != w.dtype or got_shape != w.shape:
            raise BundleError(
                bundle,
                f"{artifact}: argument {n_in + j} (weight {w.name!r}, entry {j} of argument_order "
                f"in {weights_file}): the artifact takes {got_dtype} {format_dims(got_shape)}, "
                f"{weights_file} holds {w.dtype} {format_dims(w.shape)}; is argument_order right?",
            )
    out_avals = exported.out_avals
    if len(out_avals) != len(manifest.outputs):
        raise BundleError(
            bundle,
            f"{artifact}: the artifact returns {_n(len(out_avals), 'result')}, but the manifest "
            f"declares {_n(len(manifest.outputs), 'output')}",
        )
    for k, spec in enumerate(manifest.outputs):
        _check_tensor(
            bundle, artifact, f"result {k} (output {spec.name!r})", out_avals[k], spec, "returns"
        )

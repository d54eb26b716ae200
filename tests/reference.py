"""Reference answers for end-to-end tests: what a model computes, run directly.

``client_inputs`` draws random client-side inputs for a bundle's signature;
``expected_outputs`` runs a compiled program (in the test process, on the CPU) with a
bundle's own weights the way the worker would: preprocess hook, zero padding up to the
smallest compiled batch size that fits, execute, cut the rows back, postprocess hook.
A catalog variant shares its template's artifact, so the template's compiled program
with the variant's weights is the variant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver import hooks as hooks_mod
from reactantserver.bundle import Bundle


def client_input(spec: Any, rows: int, rng: np.random.Generator) -> np.ndarray:
    """A random array for one client input (``-1`` axes get ``rows``)."""
    shape = [rows if d == -1 else d for d in spec.shape]
    if spec.datatype == "UINT8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(spec.numpy_dtype)


def client_inputs(bundle: Bundle, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {s.name: client_input(s, rows, rng) for s in bundle.client_inputs}


def expected_outputs(
    bundle: Bundle, program: Any, runtime: Any, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``program`` (compiled for ``bundle``'s artifact) on ``inputs`` with ``bundle``'s
    own weights, through its hooks, as the worker runs one request."""
    weights = runtime.to_device(bundle.read_weights())
    try:
        rows = next(iter(inputs.values())).shape[0]
        exe = hooks_mod.run_preprocess(bundle.name, bundle.hooks, inputs, bundle.inputs, rows)
        size = min(s for s in bundle.compiled_batch_sizes if s >= rows)
        padded = [
            np.concatenate(
                [exe[s.name], np.zeros((size - rows, *exe[s.name].shape[1:]), exe[s.name].dtype)]
            )
            for s in bundle.inputs
        ]
        outs = program.execute(padded, weights)
        named = {s.name: out[:rows] for s, out in zip(bundle.outputs, outs, strict=True)}
        return hooks_mod.run_postprocess(
            bundle.name, bundle.hooks, named, bundle.client_outputs, rows
        )
    finally:
        runtime.free(weights)

"""``mlp``: a two-hidden-layer MLP classifier on 32 features, 10 classes.

Outputs both the logits and the softmax probabilities, so a client can ask for
either (and tests see a model with more than one output).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from reactantserver.export import ExportSpec

from ._init import he, normals

NAME = "mlp"
FEATURES = 32
CLASSES = 10
DEFAULT_WIDTH = 64
DEFAULT_BATCH_SIZES = (1, 8, 32)


# One compiled program instead of a dozen eagerly dispatched ops.
@functools.partial(jax.jit, static_argnames="width")
def init_params(key: jax.Array, width: int = DEFAULT_WIDTH) -> dict[str, Any]:
    # He-normal weights, zero biases: the standard initialisation of a ReLU network.
    dims = [(FEATURES, width), (width, width), (width, CLASSES)]
    ws = normals(key, dims)
    return {
        name: {"w": he(w, fan_in), "b": jnp.zeros((fan_out,), jnp.float32)}
        for name, w, (fan_in, fan_out) in zip(("dense1", "dense2", "head"), ws, dims, strict=True)
    }


def apply(params: dict[str, Any], features: jax.Array) -> dict[str, jax.Array]:
    h = jax.nn.relu(features @ params["dense1"]["w"] + params["dense1"]["b"])
    h = jax.nn.relu(h @ params["dense2"]["w"] + params["dense2"]["b"])
    logits = h @ params["head"]["w"] + params["head"]["b"]
    return {"logits": logits, "probabilities": jax.nn.softmax(logits, axis=-1)}


def export_spec(
    seed: int = 0, width: int = DEFAULT_WIDTH, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=apply,
        params=init_params(jax.random.key(seed), width),
        inputs=[("features", "FP32", [-1, FEATURES])],
        outputs=["logits", "probabilities"],
        batch_sizes=batch_sizes,
        description=f"MLP classifier {FEATURES}->{width}->{width}->{CLASSES} (seed {seed})",
        seed=seed,
    )

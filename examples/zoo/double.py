"""``double``: ``y = w * x`` with a scalar weight ``w = 2``: the smallest real bundle.

Benchmarks and end-to-end tests use it because its answer is obvious
(``[1, 2, 3, ...] -> [2, 4, 6, ...]``) and it compiles in milliseconds, yet it goes
through every step a real model does, weight argument included.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from reactantserver.export import ExportSpec

NAME = "double"
FEATURES = 16
DEFAULT_BATCH_SIZES = (1, 4, 8)


def init_params(key: jax.Array | None = None, width: int = 0) -> dict[str, Any]:
    # Deterministic by construction; key and width exist for the zoo's uniform API.
    del key, width
    return {"scale": jnp.float32(2.0)}


def apply(params: dict[str, Any], x: jax.Array) -> jax.Array:
    return params["scale"] * x


def export_spec(
    seed: int = 0, width: int = 0, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=apply,
        params=init_params(),
        inputs=[("x", "FP32", [-1, FEATURES])],
        outputs=["y"],
        batch_sizes=batch_sizes,
        description="y = 2 * x",
        seed=seed,
        rtol=0.0,
        atol=0.0,
    )

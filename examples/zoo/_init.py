"""Seeded parameter initialisation shared by the zoo modules."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def normals(key: jax.Array, shapes: Sequence[tuple[int, ...]]) -> list[jax.Array]:
    """Independent standard-normal float32 tensors of ``shapes``, all from ``key``.

    Drawn as one flat vector and sliced: XLA then compiles one random-bits kernel
    instead of one per tensor, which on a CPU is the difference between a fraction of
    a second and several seconds per model.
    """
    sizes = [math.prod(s) for s in shapes]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    out, offset = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return out


def he(w: jax.Array, fan_in: int, gain: float = 1.0) -> jax.Array:
    """Scale a standard-normal tensor to He initialisation (ReLU networks)."""
    return w * (gain * math.sqrt(2.0 / fan_in))

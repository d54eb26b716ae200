"""``resnet``: a small residual CNN on 32x32 RGB images (NHWC), 10 classes.

Stem convolution, one identity residual block, one down-sampling block with a 1x1
projection shortcut, global average pooling and a linear head: the shape of a
ResNet, at a width that compiles in a fraction of a second on a CPU.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from reactantserver.export import ExportSpec

from ._init import he, normals

NAME = "resnet"
SIZE = 32
CLASSES = 10
DEFAULT_WIDTH = 8
DEFAULT_BATCH_SIZES = (1, 4, 8)
_DIMS = ("NHWC", "HWIO", "NHWC")


def _conv(p: dict[str, jax.Array], x: jax.Array, stride: int = 1) -> jax.Array:
    y = lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME", dimension_numbers=_DIMS)
    return y + p["b"]


# One compiled program instead of dozens of eagerly dispatched ops.
@functools.partial(jax.jit, static_argnames="width")
def init_params(key: jax.Array, width: int = DEFAULT_WIDTH) -> dict[str, Any]:
    w2 = 2 * width
    kernels = {  # name -> (k, c_in, c_out)
        "stem": (3, 3, width),
        "block1.conv1": (3, width, width),
        "block1.conv2": (3, width, width),
        "block2.conv1": (3, width, w2),
        "block2.conv2": (3, w2, w2),
        "block2.proj": (1, width, w2),
    }
    draws = normals(key, [(k, k, ci, co) for k, ci, co in kernels.values()] + [(w2, CLASSES)])
    convs = {
        name: {"w": he(w, k * k * ci), "b": jnp.zeros((co,), jnp.float32)}
        for (name, (k, ci, co)), w in zip(kernels.items(), draws[:-1], strict=True)
    }
    return {
        "stem": convs["stem"],
        "block1": {"conv1": convs["block1.conv1"], "conv2": convs["block1.conv2"]},
        "block2": {
            "conv1": convs["block2.conv1"],
            "conv2": convs["block2.conv2"],
            "proj": convs["block2.proj"],
        },
        # The head is linear: Glorot-like scale rather than He.
        "head": {"w": he(draws[-1], w2, gain=0.7071), "b": jnp.zeros((CLASSES,), jnp.float32)},
    }


def apply(params: dict[str, Any], images: jax.Array) -> jax.Array:
    x = jax.nn.relu(_conv(params["stem"], images))
    b1 = params["block1"]
    x = jax.nn.relu(x + _conv(b1["conv2"], jax.nn.relu(_conv(b1["conv1"], x))))
    b2 = params["block2"]
    shortcut = _conv(b2["proj"], x, stride=2)
    x = jax.nn.relu(shortcut + _conv(b2["conv2"], jax.nn.relu(_conv(b2["conv1"], x, stride=2))))
    pooled = jnp.mean(x, axis=(1, 2))
    return pooled @ params["head"]["w"] + params["head"]["b"]


def export_spec(
    seed: int = 0, width: int = DEFAULT_WIDTH, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=apply,
        params=init_params(jax.random.key(seed), width),
        inputs=[("images", "FP32", [-1, SIZE, SIZE, 3])],
        outputs=["logits"],
        batch_sizes=batch_sizes,
        description=f"residual CNN, width {width}, on {SIZE}x{SIZE} RGB (seed {seed})",
        seed=seed,
        # Convolutions accumulate in a different order once fused differently.
        rtol=1e-4,
        atol=1e-5,
    )

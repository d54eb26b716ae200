"""``uint8_classifier``: a CNN whose bundle takes raw UINT8 images (model.py hooks).

The executable sees normalised FP32 ``pixels``; the bundle's ``model.py``
(``uint8_classifier_hooks.py``) converts the client's UINT8 ``image`` on the way in
and turns ``logits`` into ``probabilities`` and ``label`` on the way out, so the
client-facing signature differs from the executable's.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from reactantserver.export import ExportSpec

from ._init import he, normals

NAME = "uint8_classifier"
SIZE = 32
CLASSES = 10
DEFAULT_WIDTH = 8
DEFAULT_BATCH_SIZES = (1, 4, 8)
HOOKS = Path(__file__).with_name("uint8_classifier_hooks.py")
_DIMS = ("NHWC", "HWIO", "NHWC")


# One compiled program instead of a dozen eagerly dispatched ops.
@functools.partial(jax.jit, static_argnames="width")
def init_params(key: jax.Array, width: int = DEFAULT_WIDTH) -> dict[str, Any]:
    w1, w2, head = normals(key, [(3, 3, 3, width), (3, 3, width, 2 * width), (2 * width, CLASSES)])
    return {
        "conv1": {"w": he(w1, 9 * 3), "b": jnp.zeros((width,), jnp.float32)},
        "conv2": {"w": he(w2, 9 * width), "b": jnp.zeros((2 * width,), jnp.float32)},
        "head": {"w": he(head, 2 * width, gain=0.7071), "b": jnp.zeros((CLASSES,), jnp.float32)},
    }


def apply(params: dict[str, Any], pixels: jax.Array) -> jax.Array:
    x = pixels
    for name in ("conv1", "conv2"):
        p = params[name]
        x = lax.conv_general_dilated(x, p["w"], (2, 2), "SAME", dimension_numbers=_DIMS)
        x = jax.nn.relu(x + p["b"])
    return jnp.mean(x, axis=(1, 2)) @ params["head"]["w"] + params["head"]["b"]


def export_spec(
    seed: int = 0, width: int = DEFAULT_WIDTH, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=apply,
        params=init_params(jax.random.key(seed), width),
        inputs=[("pixels", "FP32", [-1, SIZE, SIZE, 3])],
        outputs=["logits"],
        batch_sizes=batch_sizes,
        model_py=HOOKS,
        client_inputs=[("image", "UINT8", [-1, SIZE, SIZE, 3])],
        client_outputs=[
            ("probabilities", "FP32", [-1, CLASSES]),
            ("label", "INT32", [-1]),
        ],
        description=f"CNN on raw UINT8 {SIZE}x{SIZE} RGB images, width {width} (seed {seed})",
        seed=seed,
        rtol=1e-4,
        atol=1e-5,
    )

"""The two compiled stages of the example detector, in plain JAX with seeded weights.

* ``detector_backbone`` (stage one): a small strided CNN over a 64x64 RGB image with a
  box-and-score head on an 8x8 grid (stride 8, one anchor per cell). For each cell it
  predicts a box ``[y0, x0, y1, x1]`` in pixels (centre offset inside the cell, size
  around 16 px) and an objectness score in (0, 1). Outputs ``boxes`` [n, 64, 4] and
  ``scores`` [n, 64].
* ``detector_classifier`` (stage two): a CNN over 16x16 RGB crops, ``logits`` [n, 5].

The weights are random (seeded), so the "detections" are meaningless but
deterministic, which is all a serving example needs: the glue between the stages
(``detector/model.py``) is what it demonstrates. ``build.py`` exports both stages and
the meta bundle into a repository.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from reactantserver.export import ExportSpec

IMAGE = 64
GRID = 8
STRIDE = IMAGE // GRID
ANCHOR = 16.0
CROP = 16
CLASSES = 5
BACKBONE_BATCH_SIZES = (1, 4)
#: The glue keeps at most 8 detections, so stage two never needs more rows.
CLASSIFIER_BATCH_SIZES = (1, 4, 8)
_DIMS = ("NHWC", "HWIO", "NHWC")


def _conv_params(key: jax.Array, k: int, c_in: int, c_out: int, gain: float = 1.0) -> Any:
    w = jax.random.normal(key, (k, k, c_in, c_out), jnp.float32)
    return {
        "w": w * (gain * math.sqrt(2.0 / (k * k * c_in))),
        "b": jnp.zeros((c_out,), jnp.float32),
    }


def _conv(p: Any, x: jax.Array, stride: int) -> jax.Array:
    y = lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME", dimension_numbers=_DIMS)
    return y + p["b"]


# ------------------------------------------------------------------------- stage one


def backbone_params(seed: int = 0) -> dict[str, Any]:
    k = jax.random.split(jax.random.key(seed), 4)
    return {
        "conv1": _conv_params(k[0], 3, 3, 8),
        "conv2": _conv_params(k[1], 3, 8, 16),
        "conv3": _conv_params(k[2], 3, 16, 16),
        # Five numbers per cell: centre offsets (2), log size (2), objectness (1).
        "head": _conv_params(k[3], 1, 16, 5, gain=0.5),
    }


def backbone(params: dict[str, Any], images: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``images`` [n, 64, 64, 3] -> (``boxes`` [n, 64, 4], ``scores`` [n, 64])."""
    x = images
    for name in ("conv1", "conv2", "conv3"):  # 64 -> 32 -> 16 -> 8
        x = jax.nn.relu(_conv(params[name], x, 2))
    t = _conv(params["head"], x, 1)  # [n, 8, 8, 5]
    rows = jnp.arange(GRID, dtype=jnp.float32)[None, :, None]
    cols = jnp.arange(GRID, dtype=jnp.float32)[None, None, :]
    cy = (rows + jax.nn.sigmoid(t[..., 0])) * STRIDE
    cx = (cols + jax.nn.sigmoid(t[..., 1])) * STRIDE
    h = ANCHOR * jnp.exp(jnp.clip(t[..., 2], -1.0, 1.0))
    w = ANCHOR * jnp.exp(jnp.clip(t[..., 3], -1.0, 1.0))
    boxes = jnp.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)
    boxes = jnp.clip(boxes, 0.0, float(IMAGE))
    n = images.shape[0]
    return boxes.reshape(n, GRID * GRID, 4), jax.nn.sigmoid(t[..., 4]).reshape(n, GRID * GRID)


def backbone_spec(seed: int = 0) -> ExportSpec:
    return ExportSpec(
        fn=backbone,
        params=backbone_params(seed),
        inputs=[("images", "FP32", [-1, IMAGE, IMAGE, 3])],
        outputs=["boxes", "scores"],
        batch_sizes=BACKBONE_BATCH_SIZES,
        description=f"detector stage one: CNN backbone + box/score head, 8x8 grid (seed {seed})",
        seed=seed,
        rtol=1e-4,
        atol=1e-4,
    )


# ------------------------------------------------------------------------- stage two


def classifier_params(seed: int = 1) -> dict[str, Any]:
    k = jax.random.split(jax.random.key(seed), 3)
    features = (CROP // 2) * (CROP // 2) * 16
    head = jax.random.normal(k[2], (features, CLASSES), jnp.float32) * math.sqrt(1.0 / features)
    return {
        "conv1": _conv_params(k[0], 3, 3, 8),
        "conv2": _conv_params(k[1], 3, 8, 16),
        "head": {"w": head, "b": jnp.zeros((CLASSES,), jnp.float32)},
    }


def classifier(params: dict[str, Any], crops: jax.Array) -> jax.Array:
    """``crops`` [n, 16, 16, 3] -> ``logits`` [n, 5]."""
    x = jax.nn.relu(_conv(params["conv1"], crops, 1))
    x = jax.nn.relu(_conv(params["conv2"], x, 2))  # 16 -> 8
    # A dense head over every position (no global pooling): with random weights, pooled
    # features of different crops look alike and every crop would get the same label.
    x = x.reshape(x.shape[0], -1)
    return x @ params["head"]["w"] + params["head"]["b"]


def classifier_spec(seed: int = 1) -> ExportSpec:
    return ExportSpec(
        fn=classifier,
        params=classifier_params(seed),
        inputs=[("crops", "FP32", [-1, CROP, CROP, 3])],
        outputs=["logits"],
        batch_sizes=CLASSIFIER_BATCH_SIZES,
        description=f"detector stage two: CNN classifier over 16x16 crops (seed {seed})",
        seed=seed,
        rtol=1e-4,
        atol=1e-5,
    )

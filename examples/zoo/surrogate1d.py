"""``surrogate1d``: a 1-D convolutional surrogate that advances a signal one step.

Input: a batch of signals on a periodic 128-point grid with two channels (the state
``u`` and a forcing term). Output: the next state of ``u``, predicted as ``u`` plus a
learned correction from three dilated convolutions (receptive field 29 points), the
usual shape of a neural PDE time-stepper.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from reactantserver.export import ExportSpec

from ._init import he, normals

NAME = "surrogate1d"
POINTS = 128
CHANNELS = 2
DEFAULT_WIDTH = 16
DEFAULT_BATCH_SIZES = (1, 4, 8)
_DIMS = ("NWC", "WIO", "NWC")
_KERNEL = 5
_DILATIONS = (1, 2, 4)


# One compiled program instead of a dozen eagerly dispatched ops.
@functools.partial(jax.jit, static_argnames="width")
def init_params(key: jax.Array, width: int = DEFAULT_WIDTH) -> dict[str, Any]:
    chans = [CHANNELS, width, width, 1]
    shapes = [(_KERNEL, chans[i], chans[i + 1]) for i in range(len(_DILATIONS))]
    layers = []
    for i, w in enumerate(normals(key, shapes)):
        # The last layer starts small: the surrogate begins close to "u stays put".
        gain = 0.1 if i == len(shapes) - 1 else 1.0
        layers.append(
            {"w": he(w, _KERNEL * chans[i], gain), "b": jnp.zeros((chans[i + 1],), jnp.float32)}
        )
    return {"layers": layers}


def _periodic_conv(p: dict[str, jax.Array], x: jax.Array, dilation: int) -> jax.Array:
    pad = dilation * (_KERNEL // 2)
    x = jnp.concatenate([x[:, -pad:], x, x[:, :pad]], axis=1)  # wrap around the grid
    y = lax.conv_general_dilated(
        x, p["w"], (1,), "VALID", rhs_dilation=(dilation,), dimension_numbers=_DIMS
    )
    return y + p["b"]


def apply(params: dict[str, Any], signal: jax.Array) -> jax.Array:
    h = signal
    layers = params["layers"]
    for i, (p, d) in enumerate(zip(layers, _DILATIONS, strict=True)):
        h = _periodic_conv(p, h, d)
        if i < len(layers) - 1:
            h = jax.nn.gelu(h)
    return signal[:, :, 0] + h[:, :, 0]


def export_spec(
    seed: int = 0, width: int = DEFAULT_WIDTH, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=apply,
        params=init_params(jax.random.key(seed), width),
        inputs=[("signal", "FP32", [-1, POINTS, CHANNELS])],
        outputs=["next_state"],
        batch_sizes=batch_sizes,
        description=f"1-D conv surrogate, width {width}, {POINTS}-point periodic grid (seed {seed})",
        seed=seed,
        rtol=1e-4,
        atol=1e-5,
    )

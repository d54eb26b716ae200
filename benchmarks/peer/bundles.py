"""Export specs for the serving benchmarks' extra bundles (``reactantserver export`` input).

``double_38mb`` is the zoo's ``double`` (``y = 2 * x``, same function, same weight)
with one compiled batch size, 593750 rows of 16 FP32: exactly 38,000,000 bytes in and
out. The zoo's ``double`` compiles batch sizes 1, 4 and 8, and a request is never
split, so a 38 MB tensor needs a program of its own; keeping it a separate bundle also
keeps the small-request model's batch sizes (and hence its coalescing) exactly the
zoo's. It is batched rather than fixed-shape because the 38 MB request then fills its
one compiled size exactly, with no padding.

``mlp_wide`` is the zoo's MLP at width 4096, for the batching table of ``bench_peer``.

``double_b64`` is the zoo's ``double`` compiled at every power of two up to 64, the
batch sizes of the Triton comparison (``--peer triton``: Triton's model has
``max_batch_size: 64``); ``bench_peer`` exports it into a repository of its own under
the name ``double``, so that every server gets the same ModelInfer bytes.

    reactantserver export benchmarks/peer/bundles.py:double_38mb --out REPO/double_38mb \\
        --platforms cpu
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))  # the zoo is a package under examples/

from zoo import double, mlp  # noqa: E402

from reactantserver.export import ExportSpec  # noqa: E402

#: Rows of the 38 MB tensor: 593750 x 16 x 4 bytes = 38,000,000 bytes.
BIG_ROWS = 593_750
MLP_WIDE_WIDTH = 4096
MLP_WIDE_BATCH_SIZES = (1, 8, 32, 64)
#: ``double_b64``'s batch sizes: Triton's ``max_batch_size: 64`` in compiled programs.
B64_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def double_38mb() -> ExportSpec:
    """``double`` compiled for one 38 MB request."""
    return attrs.evolve(
        double.export_spec(batch_sizes=(BIG_ROWS,)),
        description=f"y = 2 * x on one [{BIG_ROWS}, {double.FEATURES}] FP32 tensor (38 MB)",
    )


def mlp_wide() -> ExportSpec:
    """The zoo's MLP at width 4096: a 64 MiB middle layer that dominates every call.

    At batch 1 each call streams the weights through the CPU for one row; a batch of 32
    streams them once for 32 rows -- the weight reuse that makes batching pay on any
    device. ``bench_peer``'s batching table serves it with coalescing on and off.
    """
    return mlp.export_spec(width=MLP_WIDE_WIDTH, batch_sizes=MLP_WIDE_BATCH_SIZES)


def double_b64() -> ExportSpec:
    """``double`` at batch sizes 1 to 64 (the Triton comparison's model)."""
    return attrs.evolve(
        double.export_spec(batch_sizes=B64_BATCH_SIZES),
        description="y = 2 * x, batch sizes 1-64 (bench_peer --peer triton)",
    )

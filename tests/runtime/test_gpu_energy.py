"""On a GPU: NVML's energy counter advances while the device computes, and the
attribution of that advance adds up (issue 36).

A subprocess keeps the GPU busy with matrix products for a few seconds and reports the
device seconds it spent (each product timed to its ``block_until_ready``); this process
reads NVML before and after, and hands the ledger exactly what the worker's meter
would: the device seconds charged, then the reading. The test process stays on the CPU
(as every gpu test here). Skipped without a GPU; under ``REACTANT_GPU_DRY_RUN`` too,
since a CPU has no NVML counter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from gpu_support import require_gpu

from reactantserver.energy import EnergyLedger, NvmlReader
from reactantserver.worker.core import gpu_label

pytestmark = [pytest.mark.gpu]

_BUSY = """\
import json, time
import jax, jax.numpy as jnp
x = jnp.ones((8192, 8192), jnp.float32)
f = jax.jit(lambda a: (a @ a) / 8192.0)
f(x).block_until_ready()  # compile outside the timed part
busy, end = 0.0, time.monotonic() + 3.0
while time.monotonic() < end:
    t = time.perf_counter()
    f(x).block_until_ready()
    busy += time.perf_counter() - t
print(json.dumps({"busy": busy, "device": jax.devices()[0].device_kind}))
"""


def test_the_nvml_counter_advances_and_the_attribution_adds_up() -> None:
    require_gpu("NVML's energy counter")
    reader = NvmlReader.open(gpu_label(None, os.environ), env=os.environ)
    assert isinstance(reader, NvmlReader), reader  # the reason NVML could not be read
    ledger = EnergyLedger("nvml", min_interval=1.0)
    first = reader.read()
    assert first is not None
    t0 = time.monotonic()
    ledger.sample(t0, first)
    env = {**os.environ, "JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    done = subprocess.run(
        [sys.executable, "-c", _BUSY], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    busy = json.loads(done.stdout.strip().splitlines()[-1])["busy"]
    ledger.ran("matmul", busy)
    last = reader.read()
    assert last is not None
    interval = ledger.sample(time.monotonic(), last)
    assert interval is not None
    # Three seconds of dense products on any NVML-metered GPU draw well over 50 J.
    assert interval.joules > 50.0, interval
    assert last.watts is not None and last.watts > 0
    attributed = interval.attributed["matmul"]
    assert attributed > 0
    assert attributed + interval.idle_joules == pytest.approx(interval.joules, rel=1e-9)
    print(
        f"{reader.description}: {interval.joules:.1f} J over {interval.seconds:.2f} s, "
        f"busy {busy:.2f} s -> matmul {attributed:.1f} J, idle {interval.idle_joules:.1f} J"
    )

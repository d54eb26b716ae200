"""Whether this run has a GPU, decided once and cheaply, and what the ``gpu`` tests share.

Tests marked ``gpu`` need an NVIDIA GPU that JAX can use; ``conftest.py`` skips them,
with the reason, when there is none. The decision (:func:`no_gpu_reason`) never
initialises CUDA in the test process, and costs nothing in the CPU suite:

1. ``JAX_PLATFORMS`` as the run was started with (before ``conftest.py`` defaults it to
   ``cpu`` for the test process) names no ``cuda``/``gpu`` platform: a CPU-only run
   (``nox -s tests`` sets ``JAX_PLATFORMS=cpu``; CI is such a run). No further look.
2. No CUDA plugin of JAX is installed (``jax-cuda12-plugin``, ``jax-cuda13-plugin``...):
   read from the installed distributions' metadata, nothing imported.
3. Otherwise a subprocess asks JAX for its GPUs (``jax.devices("gpu")``); its error, if
   any, is the reason. The test process itself keeps running JAX on the CPU: it
   computes the reference answers, and each GPU configuration runs in a worker process
   of its own (allocator settings are per process), see ``benchmarks/gpu/harness.py``.

``REACTANT_GPU_DRY_RUN=1`` runs the ``gpu`` tests on the CPU backend instead (no skip),
to check the tests themselves on a machine without a GPU; the checks that need a GPU's
allocator skip themselves then (:func:`require_gpu`). It proves the harness, not the GPU.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_BENCH = ROOT / "benchmarks" / "gpu"
if str(GPU_BENCH) not in sys.path:
    sys.path.insert(0, str(GPU_BENCH))  # harness.py: shared with the GPU benchmarks

#: Set to 1 to run the gpu tests on the CPU backend (checks the tests, not the GPU).
DRY_RUN_VARIABLE = "REACTANT_GPU_DRY_RUN"

_PLUGIN = re.compile(r"^jax[-_]cuda\d+[-_](plugin|pjrt)$")

#: The probe run in a subprocess: one JSON line, the GPUs or the error.
_PROBE = """\
import json
try:
    import jax
    devices = jax.devices("gpu")
    print(json.dumps({"devices": [d.device_kind for d in devices], "jax": jax.__version__}))
except Exception as exc:
    text = str(exc).splitlines()[0] if str(exc) else ""
    print(json.dumps({"error": f"{type(exc).__name__}: {text}"}))
"""


@attrs.frozen
class ProbeResult:
    """What the subprocess found: device kinds, or why none."""

    devices: tuple[str, ...] = ()
    jax: str = ""
    error: str = ""


def dry_run(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(DRY_RUN_VARIABLE, "") not in ("", "0")


#: The backend the gpu tests ask their workers for.
BACKEND = "cpu" if dry_run() else "cuda"


def cuda_plugins(distributions: Iterable[str] | None = None) -> list[str]:
    """Installed distributions that give JAX a CUDA backend."""
    if distributions is None:
        distributions = (d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    return sorted({n.lower() for n in distributions if _PLUGIN.match(n.lower())})


def probe_gpus(timeout: float = 180.0) -> ProbeResult:
    """Ask JAX for its GPUs in a subprocess (CUDA is initialised there, not here)."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cuda"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the probe needs no arena
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(error=f"asking JAX for its GPUs took more than {timeout:.0f} s")
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeResult(error=f"the probe exited with status {out.returncode}: {tail}")
    found = json.loads(lines[-1])
    if "error" in found:
        return ProbeResult(error=found["error"])
    return ProbeResult(devices=tuple(found["devices"]), jax=found["jax"])


def no_gpu_reason(
    jax_platforms: str | None,
    plugins: Callable[[], list[str]] = cuda_plugins,
    probe: Callable[[], ProbeResult] = probe_gpus,
) -> tuple[str | None, ProbeResult | None]:
    """(why the gpu tests cannot run, or None; the probe's result when it ran).

    ``jax_platforms`` is ``JAX_PLATFORMS`` as the run was started with (None: unset).
    """
    if jax_platforms is not None:
        listed = {p.strip().lower() for p in jax_platforms.split(",") if p.strip()}
        if listed and not listed & {"cuda", "gpu"}:
            return (
                f"JAX_PLATFORMS={jax_platforms}: a CPU-only run (nox -s tests); nox -s gpu "
                "runs these on a machine with an NVIDIA GPU",
                None,
            )
    if not plugins():
        return (
            "no CUDA plugin of JAX is installed (jax-cuda12-plugin or jax-cuda13-plugin; "
            "nox -s gpu installs .[cuda])",
            None,
        )
    result = probe()
    if result.error or not result.devices:
        why = result.error or 'jax.devices("gpu") is empty'
        return f"JAX sees no GPU: {why}", result
    return None, result


def require_gpu(what: str) -> None:
    """Skip the rest of a test in a dry run: ``what`` needs a real GPU."""
    if dry_run():
        pytest.skip(f"dry run on the CPU ({DRY_RUN_VARIABLE}=1): {what} needs a GPU")


def huge_bundle(out: Path, nbytes: int) -> Path:
    """A bundle ``y = x + w[:16]`` whose one weight vector has ``nbytes`` bytes: far more
    weight than computation, to fill device memory on purpose. Exported in this process
    (on the CPU) for both platforms."""
    import numpy as np

    from reactantserver.export import export_bundle

    def fn(params: dict[str, object], x: object) -> dict[str, object]:
        return {"y": x + params["w"][:16]}  # type: ignore[index, operator]

    export_bundle(
        fn,
        {"w": np.zeros(nbytes // 4, np.float32)},
        inputs=[("x", "FP32", [-1, 16])],
        outputs=["y"],
        batch_sizes=(1, 4),
        out_dir=out,
        platforms=("cpu", "cuda"),
    )
    return out

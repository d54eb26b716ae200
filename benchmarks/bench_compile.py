"""Compile time of a cold start vs a restart with the same persistent cache.

Builds the example zoo into a temporary repository, then starts the runtime twice, each
time in a fresh interpreter (as a restarted worker would be) with the same, initially
empty ``cache_dir``, and loads every bundle, compiling every compiled batch size. The
first start compiles and fills the cache; the second should find every executable there.

    python benchmarks/bench_compile.py

Prints, per model, the summed compile seconds of both starts, their ratio and what the
persistent cache reported on the second start. Timings are wall-clock on whatever
machine runs it; on a busy machine expect noise, not a different conclusion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(repo: str, cache_dir: str) -> None:
    """One worker start: runtime up, every bundle compiled; JSON report on stdout."""
    started = time.perf_counter()
    from reactantserver.bundle import scan_repository
    from reactantserver.config import RuntimeConfig
    from reactantserver.runtime import Runtime

    runtime = Runtime.start(RuntimeConfig(backend="cpu"), cache_dir)
    # The first compile in a process also pays for setting up JAX's lowering and
    # jax.export machinery (about half a second); pay it here, through the same path a
    # bundle takes, so it is not billed to whichever model happens to load first.
    import jax
    from jax import export

    spec = jax.ShapeDtypeStruct((), "float32")
    trivial = export.deserialize(export.export(jax.jit(lambda x: x + 1))(spec).serialize())
    jax.jit(trivial.call).lower(spec).compile()
    result = scan_repository(repo)
    report = {}
    for name, bundle in sorted(result.bundles.items()):
        model = runtime.load(bundle)
        report[name] = {
            "sizes": list(model.sizes),
            "seconds": model.compile_seconds,
            "cache": sorted({r.cache for r in model.compile_reports}),
        }
    print(json.dumps({"models": report, "wall": time.perf_counter() - started}))


def _start(repo: Path, cache_dir: Path) -> dict[str, object]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(repo), str(cache_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    data: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def main() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT / "examples"))
    import build_repo

    with tempfile.TemporaryDirectory(prefix="bench_compile_") as tmp:
        repo, cache = Path(tmp) / "repo", Path(tmp) / "cache"
        build_repo.build(repo, detector=False)  # the zoo's compiled models
        first, second = _start(repo, cache), _start(repo, cache)

    models_1: dict[str, dict[str, object]] = first["models"]  # type: ignore[assignment]
    models_2: dict[str, dict[str, object]] = second["models"]  # type: ignore[assignment]
    print("compile seconds per model, all compiled batch sizes (CPU backend)")
    header = (
        f"{'model':<18} {'sizes':<9} {'1st start':>10} {'2nd start':>10} {'speedup':>8}  2nd cache"
    )
    print(header)
    print("-" * len(header))
    total_1 = total_2 = 0.0
    for name in sorted(models_1):
        a, b = models_1[name], models_2[name]
        s1, s2 = float(a["seconds"]), float(b["seconds"])  # type: ignore[arg-type]
        total_1, total_2 = total_1 + s1, total_2 + s2
        sizes = ",".join(str(s) for s in a["sizes"])  # type: ignore[attr-defined]
        cache_2 = "/".join(b["cache"])  # type: ignore[arg-type]
        print(f"{name:<18} {sizes:<9} {s1:>10.3f} {s2:>10.3f} {s1 / s2:>7.1f}x  {cache_2}")
    print("-" * len(header))
    print(f"{'all models':<28} {total_1:>10.3f} {total_2:>10.3f} {total_1 / total_2:>7.1f}x")
    w1, w2 = float(first["wall"]), float(second["wall"])  # type: ignore[arg-type]
    print(f"{'start to ready':<28} {w1:>10.3f} {w2:>10.3f} {w1 / w2:>7.1f}x")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()

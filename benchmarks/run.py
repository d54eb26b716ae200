"""Run every benchmark and print its table.

Each ``benchmarks/bench_*.py`` defines ``main() -> None`` and prints one or more
tables. They run one after another, each in its own interpreter so that one
benchmark's JAX or allocator settings cannot leak into the next.

    python benchmarks/run.py              # all of them
    python benchmarks/run.py scheduler    # only those whose name contains "scheduler"
    python benchmarks/run.py fleet --runs 3   # one benchmark, with its own options

Everything from the first argument that starts with ``-`` on is given to the picked
benchmark (``nox -s bench -- fleet --runs 3``); options need exactly one benchmark.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    split = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    wanted, options = argv[:split], argv[split:]
    scripts = sorted(HERE.glob("bench_*.py"))
    picked = [s for s in scripts if not wanted or any(w in s.stem for w in wanted)]
    if not picked:
        names = ", ".join(s.stem.removeprefix("bench_") for s in scripts)
        print(f"no benchmark matches {wanted}; known: {names}", file=sys.stderr)
        return 2
    if options and len(picked) != 1:
        names = ", ".join(s.stem.removeprefix("bench_") for s in picked)
        print(
            f"options {' '.join(options)} need exactly one benchmark; these match: {names}",
            file=sys.stderr,
        )
        return 2
    failed = []
    for script in picked:
        print(f"\n=== {script.stem.removeprefix('bench_')} ===", flush=True)
        rc = subprocess.call([sys.executable, str(script), *options])
        if rc != 0:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

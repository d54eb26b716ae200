"""Build the example detector's three bundles into a model repository.

    python examples/detector/build.py --out /tmp/repo
    python examples/detector/build.py --out /tmp/repo --force

(``examples/build_repo.py`` builds them into the example repository with the zoo.)

Writes ``detector_backbone`` and ``detector_classifier`` (exported from the JAX
functions in ``stages.py`` with seeded weights, each checked against its function by
the exporter) and ``detector`` (the ``kind: meta`` bundle: ``detector/manifest.yaml``
and ``detector/model.py`` from this directory, validated and written atomically).
Existing bundles are kept unless ``--force``. See docs/meta_models.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # `stages` is a sibling module, also when imported by path

#: The meta bundle's source directory (manifest.yaml + model.py).
META_SOURCE = HERE / "detector"
META = "detector"
BACKBONE = "detector_backbone"
CLASSIFIER = "detector_classifier"
NAMES = (BACKBONE, CLASSIFIER, META)


def write_meta_bundle(out: Path, *, overwrite: bool = False) -> None:
    """Copy the meta bundle into ``out`` atomically (hidden temp dir, checked, renamed)."""
    from reactantserver.bundle import load_bundle
    from reactantserver.errors import BundleError

    if out.exists() and not overwrite:
        raise BundleError(out.name, f"{out} already exists (use --force)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.build-{uuid.uuid4().hex[:8]}"
    shutil.copytree(META_SOURCE, tmp, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        load_bundle(tmp, name=out.name)  # manifest rules, model.py imports and defines run
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_one(name: str, target: Path, *, overwrite: bool = False) -> str:
    """Write bundle ``name`` (one of ``NAMES``) as ``target``; what was done (exported,
    copied, or kept when it exists and ``overwrite`` is off)."""
    import stages

    from reactantserver.export import export_spec

    if target.exists() and not overwrite:
        return "kept"
    if name == META:
        write_meta_bundle(target, overwrite=overwrite)
        return "copied"
    spec = {BACKBONE: stages.backbone_spec, CLASSIFIER: stages.classifier_spec}[name]
    export_spec(
        spec(),
        target,
        overwrite=overwrite,
        provenance={"source": f"examples/detector/stages.py:{spec.__name__}"},
    )
    return "exported"


def build(out: Path | str, *, overwrite: bool = False) -> dict[str, str]:
    """Write the three bundles into ``out``; name -> what was done (exported/copied/kept)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {name: build_one(name, out / name, overwrite=overwrite) for name in NAMES}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="model repository directory")
    parser.add_argument("--force", action="store_true", help="rebuild existing bundles")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    for name, how in build(args.out, overwrite=args.force).items():
        print(f"{name:<22} {how}")
    print(f"3 bundles in {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

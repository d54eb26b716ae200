"""Build the example model repository: the zoo and the detector, plus N seeded variants.

    python examples/build_repo.py                        # into examples/repo
    python examples/build_repo.py --out /tmp/repo --catalog 40
    python examples/build_repo.py --only mlp,double --force
    python examples/build_repo.py --no-detector          # the zoo alone

The zoo is five bundles: ``mlp``, ``resnet``, ``surrogate1d``, ``uint8_classifier``
(with a model.py taking UINT8 images) and ``double``. The two-stage detector of
``examples/detector/`` adds three: its compiled stages ``detector_backbone`` and
``detector_classifier``, and ``detector``, the ``kind: meta`` model whose glue calls them
(docs/meta_models.md). ``--catalog N`` adds N variants named ``<arch>_v<NNN>``: variant
``i`` uses architecture ``VARIANT_ARCHS[i % 4]``, seed ``1000 + i`` and every other
round twice the width, so the catalog mixes sizes.

A variant whose (architecture, width, batch sizes) was already exported reuses that
artifact: the artifact takes the weights as arguments, so only the weights file
differs. Such variants cost one parameter initialisation and one file write instead
of a trace, an export and a check; only the first of each shape is exported (and
checked against the original function). Existing bundles are kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import attrs

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # `zoo` is a sibling package, also when imported by path

from zoo import double, mlp, resnet, surrogate1d, uint8_classifier  # noqa: E402

ZOO: dict[str, ModuleType] = {
    m.NAME: m for m in (mlp, resnet, surrogate1d, uint8_classifier, double)
}
VARIANT_ARCHS: tuple[str, ...] = ("mlp", "surrogate1d", "resnet", "uint8_classifier")
DEFAULT_OUT = HERE / "repo"


def _detector() -> ModuleType:
    """``examples/detector/build.py`` (imported by path: ``detector`` is not a package)."""
    name = "reactantserver_examples_detector_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "detector" / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


#: The detector's bundles, stages before the meta model that calls them.
DETECTOR_NAMES: tuple[str, ...] = ("detector_backbone", "detector_classifier", "detector")


@attrs.frozen
class Planned:
    """One bundle to build: which architecture, seed and width."""

    name: str
    arch: str
    seed: int
    width: int


@attrs.frozen
class Built:
    name: str
    arch: str
    seed: int
    width: int
    how: str  # exported | derived | kept
    seconds: float


def plan(catalog: int = 0, only: Sequence[str] = (), *, detector: bool = True) -> list[Planned]:
    """The zoo (seed 0, default widths), the detector's bundles (``arch`` is the bundle
    name), then ``catalog`` variants."""
    out = [Planned(name, name, 0, getattr(m, "DEFAULT_WIDTH", 0)) for name, m in ZOO.items()]
    if detector:
        out += [Planned(name, name, 0, 0) for name in DETECTOR_NAMES]
    for i in range(catalog):
        arch = VARIANT_ARCHS[i % len(VARIANT_ARCHS)]
        factor = 1 + (i // len(VARIANT_ARCHS)) % 2
        width = ZOO[arch].DEFAULT_WIDTH * factor
        out.append(Planned(f"{arch}_v{i:03d}", arch, 1000 + i, width))
    if only:
        out = [p for p in out if p.name in only]
    return out


def _derive(template: Path, target: Path, item: Planned, overwrite: bool) -> None:
    """A bundle with ``template``'s artifact and manifest and new seeded weights."""
    import jax

    from reactantserver.bundle import load_bundle
    from reactantserver.export import flatten_params, write_bundle

    base = load_bundle(template)
    module = ZOO[item.arch]
    named, _ = flatten_params(module.init_params(jax.random.key(item.seed), item.width))
    spec_names = [w.name for w in base.weight_specs]
    if [n for n, _ in named] != spec_names:  # same architecture => same argument order
        raise RuntimeError(f"{item.name}: weights do not line up with {template.name}")
    provenance = {
        **base.manifest.provenance,
        "variant_of": template.name,
        "seed": item.seed,
        "width": item.width,
    }
    manifest = attrs.evolve(
        base.manifest,
        description=f"{item.arch} variant, width {item.width} (seed {item.seed})",
        provenance=provenance,
    )
    model_py = template / "model.py"
    write_bundle(
        target,
        manifest,
        base.read_artifact(),
        named,
        model_py if model_py.is_file() else None,
        overwrite,
    )


def build(
    out: Path | str = DEFAULT_OUT,
    *,
    catalog: int = 0,
    only: Sequence[str] = (),
    overwrite: bool = False,
    detector: bool = True,
    batch_sizes: Callable[[str], Sequence[int]] | None = None,
    progress: Callable[[Built], None] | None = None,
    planned: Sequence[Planned] | None = None,
) -> list[Built]:
    """Write the planned bundles into ``out``; returns what was done for each.

    ``batch_sizes(arch)`` overrides an architecture's compiled sizes (tests use it to
    keep builds small); ``planned`` replaces ``plan(catalog, only, detector=detector)``.
    """
    from reactantserver.export import export_spec

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    templates: dict[tuple[str, int], Path] = {}
    done: list[Built] = []
    items = plan(catalog, only, detector=detector) if planned is None else planned
    for item in items:
        target = out / item.name
        start = time.perf_counter()
        key = (item.arch, item.width)
        if target.exists() and not overwrite:
            how = "kept"
            templates.setdefault(key, target)
        elif item.arch in DETECTOR_NAMES:
            how = _detector().build_one(item.arch, target, overwrite=overwrite)
        elif key in templates:
            _derive(templates[key], target, item, overwrite)
            how = "derived"
        else:
            module = ZOO[item.arch]
            kwargs = {"seed": item.seed, "width": item.width}
            if batch_sizes is not None:
                kwargs["batch_sizes"] = tuple(batch_sizes(item.arch))
            spec = module.export_spec(**kwargs)
            export_spec(
                spec,
                target,
                overwrite=overwrite,
                provenance={
                    "source": f"examples/zoo/{item.arch}.py:export_spec",
                    "seed": item.seed,
                },
            )
            templates[key] = target
            how = "exported"
        built = Built(item.name, item.arch, item.seed, item.width, how, time.perf_counter() - start)
        done.append(built)
        if progress is not None:
            progress(built)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="repository directory")
    parser.add_argument("--catalog", type=int, default=0, help="number of extra variants")
    parser.add_argument("--only", default="", help="comma-separated bundle names to build")
    parser.add_argument("--force", action="store_true", help="rebuild existing bundles")
    parser.add_argument(
        "--no-detector",
        dest="detector",
        action="store_false",
        help="leave out the two-stage detector (three bundles)",
    )
    args = parser.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    items = plan(args.catalog, only, detector=args.detector)
    out = Path(args.out)
    todo = sum(1 for p in items if args.force or not (out / p.name).exists())
    if not todo:
        print(f"all {len(items)} bundles are in {args.out} already (--force rebuilds them)")
        return 0
    print(
        f"building {todo} of {len(items)} bundles into {args.out} (each is exported and "
        "checked against its JAX function; existing ones are kept)",
        flush=True,
    )
    started = time.perf_counter()
    width = len(str(len(items)))
    print(
        f"{'':>{2 * width + 3}} {'bundle':<22} {'arch':<20} {'seed':>5} {'width':>5}  "
        f"{'how':<8} {'seconds':>7}"
    )
    count = 0

    def show(b: Built) -> None:
        nonlocal count
        count += 1
        size = str(b.width) if b.width else "-"
        print(
            f"[{count:>{width}}/{len(items)}] {b.name:<22} {b.arch:<20} {b.seed:>5} {size:>5}  "
            f"{b.how:<8} {b.seconds:>7.2f}",
            flush=True,
        )

    done = build(out, overwrite=args.force, progress=show, planned=items)
    print(f"{len(done)} bundles in {args.out} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Stand-ins for the models Triton's client examples call, exported with our exporter.

    python examples/triton/build.py --out /tmp/triton_repo

Triton's Python gRPC examples (``triton-inference-server/client``, ``src/python/examples``)
call models of Triton's own test repository by name. These are bundles with the same
names, tensor names, datatypes and answers, so the examples run unmodified against a
worker or a gateway (docs/protocol.md, "Triton's client examples"):

=================  ======================================  ==============================
bundle             inputs                                  outputs
=================  ======================================  ==============================
``simple``         ``INPUT0``, ``INPUT1`` INT32 [-1, 16]   ``OUTPUT0`` = sum,
                                                           ``OUTPUT1`` = difference
``simple_int8``    the same in INT8                        the same in INT8
``simple_string``  the same in BYTES (decimal strings)     the same in BYTES (model.py)
``simple_identity`` ``INPUT0`` BYTES [-1, 16]              ``OUTPUT0``: the input (model.py)
=================  ======================================  ==============================

The compiled programs are JAX functions like any other bundle's; the BYTES models convert
strings to numbers and back in their ``model.py`` (``hooks.py`` here): ``simple_string``
parses the decimal strings, ``simple_identity`` carries each element through the program
as a fixed-width row of bytes (at most :data:`hooks.WIDTH` bytes an element).

``EXTRA`` names bundles of the example zoo added to the repository:
``simple_grpc_model_control`` expects exactly eight models in the repository index.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # the zoo, a sibling package

import jax.numpy as jnp  # noqa: E402

from reactantserver.export import ExportSpec, export_spec  # noqa: E402

HOOKS = HERE / "hooks.py"
#: Batch sizes compiled for every stand-in: up to 32 rows, so that a load with
#: ``config: {"max_batch_size": 16}`` visibly lowers the limit (Triton's ``simple`` has 8).
BATCH_SIZES = (1, 8, 16, 32)
#: Zoo bundles added so that the repository holds eight models.
EXTRA = ("double", "mlp", "surrogate1d", "resnet")
WIDTH = 64  # keep in step with hooks.WIDTH


def _sum_difference(params: dict[str, Any], a: Any, b: Any) -> tuple[Any, Any]:
    # ``one`` is a weight argument like any bundle's (always 1): the program is a real one.
    return (a + b) * params["one"], (a - b) * params["one"]


def _identity(params: dict[str, Any], rows: Any) -> Any:
    return rows * params["one"]


def simple(
    datatype: str = "INT32", dtype: Any = jnp.int32, batch_sizes: Sequence[int] = BATCH_SIZES
) -> ExportSpec:
    return ExportSpec(
        fn=_sum_difference,
        params={"one": jnp.asarray(1, dtype)},
        inputs=[("INPUT0", datatype, [-1, 16]), ("INPUT1", datatype, [-1, 16])],
        outputs=["OUTPUT0", "OUTPUT1"],
        batch_sizes=batch_sizes,
        description=f"Triton's 'simple' stand-in: {datatype} sum and difference",
        rtol=0.0,
        atol=0.0,
    )


def simple_string(batch_sizes: Sequence[int] = BATCH_SIZES) -> ExportSpec:
    base = simple()
    return ExportSpec(
        fn=base.fn,
        params=base.params,
        inputs=base.inputs,
        outputs=base.outputs,
        batch_sizes=batch_sizes,
        model_py=HOOKS,
        client_inputs=[("INPUT0", "BYTES", [-1, 16]), ("INPUT1", "BYTES", [-1, 16])],
        client_outputs=[("OUTPUT0", "BYTES", [-1, 16]), ("OUTPUT1", "BYTES", [-1, 16])],
        description="Triton's 'simple_string' stand-in: decimal strings in and out",
        rtol=0.0,
        atol=0.0,
    )


def simple_identity(batch_sizes: Sequence[int] = BATCH_SIZES) -> ExportSpec:
    return ExportSpec(
        fn=_identity,
        params={"one": jnp.asarray(1, jnp.int32)},
        # Each element: its length, then its bytes, zero-padded (hooks.py).
        inputs=[("ROWS", "INT32", [-1, 16, WIDTH + 1])],
        outputs=["ROWS_OUT"],
        batch_sizes=batch_sizes,
        model_py=HOOKS,
        client_inputs=[("INPUT0", "BYTES", [-1, 16])],
        client_outputs=[("OUTPUT0", "BYTES", [-1, 16])],
        description="Triton's 'simple_identity' stand-in: BYTES elements answered as sent",
        rtol=0.0,
        atol=0.0,
    )


STANDINS: dict[str, Callable[..., ExportSpec]] = {
    "simple": simple,
    "simple_int8": lambda batch_sizes=BATCH_SIZES: simple("INT8", jnp.int8, batch_sizes),
    "simple_string": simple_string,
    "simple_identity": simple_identity,
}


def build(
    out: Path | str,
    *,
    only: Sequence[str] = (),
    extra: Sequence[str] = EXTRA,
    overwrite: bool = False,
    batch_sizes: Sequence[int] = BATCH_SIZES,
) -> list[str]:
    """Export the stand-ins (and the ``extra`` zoo bundles) into ``out``; the names built
    (existing bundles are kept unless ``overwrite``). ``batch_sizes``: the stand-ins'."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for name, make in STANDINS.items():
        if only and name not in only:
            continue
        if (out / name).exists() and not overwrite:
            continue
        export_spec(make(batch_sizes=tuple(batch_sizes)), out / name, overwrite=overwrite,
                    provenance={"source": f"examples/triton/build.py:{name}"})  # fmt: skip
        built.append(name)
    if extra:
        from build_repo import build as build_zoo

        done = build_zoo(out, only=tuple(extra), detector=False, overwrite=overwrite)
        built += [b.name for b in done if b.how != "kept"]
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="repository directory")
    parser.add_argument("--only", default="", help="comma-separated stand-ins to build")
    parser.add_argument("--no-extra", action="store_true", help="leave out the zoo bundles")
    parser.add_argument("--force", action="store_true", help="rebuild existing bundles")
    args = parser.parse_args(argv)
    only = tuple(n for n in args.only.split(",") if n)
    names = build(args.out, only=only, extra=() if args.no_extra else EXTRA, overwrite=args.force)
    print(f"built {', '.join(names) or 'nothing (all present)'} in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

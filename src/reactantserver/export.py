"""Export a JAX function and its parameters as a bundle (``reactantserver export``).

Theory of operation
-------------------
``export_bundle(fn, params, inputs=..., outputs=..., batch_sizes=..., out_dir=...)``
where ``fn(params, *inputs)`` is a JAX function and ``params`` any pytree:

1. Flatten ``params`` into named leaves (names from tree paths, ``dense1.w``); their
   order becomes the weight-argument order, recorded in the safetensors metadata.
2. Trace ``flat(*inputs, *weights) = fn(unflatten(weights), *inputs)`` with a
   *symbolic* batch axis ``b`` on axis 0 of every input (when ``batch_sizes`` is
   non-empty) and serialize it with ``jax.export`` for ``platforms`` (default
   ``cpu`` and ``cuda``, so one artifact serves both). Weights are arguments, never
   constants: the artifact is small and independent of the weight values.
3. Build the manifest (output dtypes and shapes are inferred from the trace unless
   given) and validate it with the same code the server uses.
4. **Check**: deserialize the serialized bytes, check them against the manifest as
   the runtime would, and for every batch size run both the deserialized artifact
   (with the weights exactly as they will be written) and the original ``fn`` (with
   the original ``params``) on seeded random inputs. Any output outside
   ``rtol``/``atol`` is a ``BundleError`` and nothing is written.
5. Write manifest, artifact, weights and ``model.py`` into a hidden temporary
   directory next to ``out_dir``, load it back with ``load_bundle`` (hooks import,
   argument_order) and only then rename it into place, so a repository watcher never
   sees a half-written bundle.

The CLI resolves ``MODULE:CALLABLE`` (a dotted module or a ``.py`` path) to a function
returning an ``ExportSpec`` (the keyword arguments of ``export_bundle`` as a record).

Why one module of this size: the five steps above are one transaction (nothing is
written unless every check passed); each step is a function of its own.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from . import __version__
from .bundle import (
    DEFAULT_ARTIFACT,
    DEFAULT_WEIGHTS,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_PY,
    Manifest,
    TensorSpec,
    WeightSpec,
    dump_manifest,
    load_bundle,
    manifest_from_data,
    write_weights,
)
from .errors import BundleError
from .tensors import from_numpy_dtype

#: ``(name, datatype, shape)`` or a ``TensorSpec``.
TensorLike = TensorSpec | tuple[str, str, Sequence[int]]


@attrs.frozen(kw_only=True)
class ExportSpec:
    """Everything ``export_bundle`` needs besides the output directory."""

    fn: Callable[..., Any]
    params: Any
    inputs: Sequence[TensorLike]
    #: Output names (dtype/shape inferred) or full specs, in result order.
    outputs: Sequence[str | TensorLike]
    batch_sizes: Sequence[int] = ()
    model_py: str | os.PathLike[str] | None = None
    client_inputs: Sequence[TensorLike] | None = None
    client_outputs: Sequence[TensorLike] | None = None
    description: str = ""
    seed: int = 0
    rtol: float = 1e-5
    atol: float = 1e-6
    platforms: Sequence[str] = ("cpu", "cuda")


@attrs.frozen
class ExportResult:
    """What ``export_bundle`` wrote and how well the artifact reproduced ``fn``."""

    path: Path
    manifest: Manifest
    #: Largest absolute output difference per batch size (0 = the unbatched program).
    max_abs_error: Mapping[int, float]
    artifact_bytes: int
    weights_bytes: int
    weight_count: int
    seconds: float


def _spec(value: TensorLike, what: str) -> dict[str, Any]:
    if isinstance(value, TensorSpec):
        return value.to_dict()
    try:
        name, datatype, shape = value
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected (name, datatype, shape), got {value!r}") from None
    return {"name": name, "datatype": datatype, "shape": list(shape)}


def flatten_params(params: Any) -> tuple[list[tuple[str, np.ndarray]], Any]:
    """Params as (name, host array) in flattening order (= weight-argument order), and
    the treedef. Names come from tree paths: ``{'dense1': {'w': ...}}`` -> ``dense1.w``.
    """
    import jax

    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    named: list[tuple[str, np.ndarray]] = []
    seen: set[str] = set()
    for path, leaf in flat:
        name = jax.tree_util.keystr(path, simple=True, separator=".") or "param"
        if name in seen:
            raise ValueError(f"two parameters flatten to the same name {name!r}")
        seen.add(name)
        arr = np.asarray(leaf)
        # Store what JAX will actually trace (float64 -> float32 unless x64 is on).
        canonical = np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
        named.append((name, np.ascontiguousarray(arr.astype(canonical, copy=False))))
    return named, treedef


def _normalise_outputs(result: Any, names: Sequence[str]) -> tuple[Any, ...]:
    """fn's result (array, tuple/list or dict) as a tuple in ``names`` order."""
    if isinstance(result, Mapping):
        missing = [n for n in names if n not in result]
        extra = sorted(set(result) - set(names))
        if missing or extra:
            raise ValueError(f"fn returned keys {sorted(result)}, outputs are {list(names)}")
        return tuple(result[n] for n in names)
    if isinstance(result, tuple | list):
        if len(result) != len(names):
            raise ValueError(f"fn returned {len(result)} results, outputs are {list(names)}")
        return tuple(result)
    if len(names) != 1:
        raise ValueError(f"fn returned one array, outputs are {list(names)}")
    return (result,)


def _random_inputs(
    specs: Sequence[TensorSpec], rows: int, rng: np.random.Generator
) -> list[np.ndarray]:
    out = []
    for spec in specs:
        shape = spec.with_batch(rows) if rows else spec.shape
        dt = spec.numpy_dtype
        arr: np.ndarray
        if dt == np.bool_:
            arr = rng.random(shape) < 0.5
        elif dt.kind == "u":
            arr = rng.integers(0, min(256, np.iinfo(dt).max), size=shape)
        elif dt.kind == "i":
            arr = rng.integers(-8, 8, size=shape)
        else:
            arr = rng.standard_normal(shape)
        out.append(np.asarray(arr).astype(dt))
    return out


def _git_provenance(fn: Callable[..., Any]) -> dict[str, Any]:
    """Commit and dirtiness of the repository holding fn's source, when there is one."""
    try:
        where = Path(inspect.getsourcefile(fn) or ".").resolve().parent
    except TypeError:
        where = Path.cwd()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status)}


def _check_against_fn(
    name: str,
    fn: Callable[..., Any],
    params: Any,
    exported: Any,
    manifest: Manifest,
    leaves: Sequence[np.ndarray],
    *,
    seed: int,
    rtol: float,
    atol: float,
) -> dict[int, float]:
    """Run artifact and original on random inputs per batch size; max |error| per size."""
    import jax

    output_names = [o.name for o in manifest.outputs]
    reference = jax.jit(lambda p, *xs: _normalise_outputs(fn(p, *xs), output_names))
    artifact = jax.jit(exported.call)
    errors: dict[int, float] = {}
    for rows in manifest.compiled_batch_sizes or (0,):
        rng = np.random.default_rng([seed, rows])
        xs = _random_inputs(manifest.inputs, rows, rng)
        want = [np.asarray(w) for w in reference(params, *xs)]
        got = [np.asarray(g) for g in jax.tree.leaves(artifact(*xs, *leaves))]
        worst = 0.0
        for spec, w, g in zip(manifest.outputs, want, got, strict=True):
            at = f"batch size {rows}" if rows else "its fixed shapes"
            if w.shape != g.shape or w.dtype != g.dtype:
                raise BundleError(
                    name,
                    f"export check failed: output {spec.name!r} at {at}: the artifact returned "
                    f"{g.dtype}{list(g.shape)}, the function {w.dtype}{list(w.shape)}",
                )
            if w.dtype.kind in "biu":
                diff = float(np.max(np.abs(w.astype(np.int64) - g.astype(np.int64)), initial=0))
                ok = diff == 0
            else:
                wf, gf = w.astype(np.float64), g.astype(np.float64)
                diff = float(np.nanmax(np.abs(wf - gf), initial=0.0))
                ok = bool(np.allclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True))
            if not ok:
                raise BundleError(
                    name,
                    f"export check failed: output {spec.name!r} at {at}: the deserialized "
                    f"artifact differs from the function by up to {diff:.3g} "
                    f"(rtol={rtol:g}, atol={atol:g})",
                )
            worst = max(worst, diff)
        errors[rows] = worst
    return errors


def _infer_outputs(
    outputs: Sequence[str | TensorLike], out_avals: Sequence[Any], batched: bool
) -> list[dict[str, Any]]:
    from jax import export

    specs = []
    for i, (out, aval) in enumerate(zip(outputs, out_avals, strict=True)):
        if not isinstance(out, str):
            specs.append(_spec(out, f"outputs[{i}]"))
            continue
        shape = []
        for axis, dim in enumerate(aval.shape):
            if export.is_symbolic_dim(dim):
                if axis != 0 or not batched:
                    raise ValueError(
                        f"output {out!r}: axis {axis} is {dim}; only axis 0 may follow the batch"
                    )
                shape.append(-1)
            else:
                shape.append(int(dim))
        if batched and (not shape or shape[0] != -1):
            raise ValueError(f"output {out!r}: shape {list(aval.shape)} has no batch axis 0")
        specs.append({"name": out, "datatype": from_numpy_dtype(aval.dtype), "shape": shape})
    return specs


def write_bundle(
    out_dir: Path,
    manifest: Manifest,
    artifact: bytes,
    named: Sequence[tuple[str, np.ndarray]],
    model_py: Path | None,
    overwrite: bool,
) -> None:
    """Write a bundle directory atomically (hidden temp dir, validated, renamed).

    Used by ``export_bundle`` and by tools that derive bundles from an exported one
    (same artifact, other weights). ``named`` are the weights in argument order.
    """
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.export-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / (manifest.artifact or DEFAULT_ARTIFACT)).write_bytes(artifact)
        write_weights(tmp / (manifest.weights or DEFAULT_WEIGHTS), named)
        if model_py is not None:
            shutil.copyfile(model_py, tmp / MODEL_PY)
        # The manifest last: a directory is a bundle only once it has one.
        (tmp / MANIFEST_FILE).write_text(dump_manifest(manifest), encoding="utf-8")
        load_bundle(tmp, name=out_dir.name)  # JAX-free checks, hooks import
        if out_dir.exists():
            if not overwrite:
                raise BundleError(out_dir.name, f"{out_dir} already exists (use overwrite/--force)")
            old = parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def export_bundle(
    fn: Callable[..., Any],
    params: Any,
    *,
    inputs: Sequence[TensorLike],
    outputs: Sequence[str | TensorLike],
    batch_sizes: Sequence[int],
    out_dir: str | os.PathLike[str],
    model_py: str | os.PathLike[str] | None = None,
    client_inputs: Sequence[TensorLike] | None = None,
    client_outputs: Sequence[TensorLike] | None = None,
    description: str = "",
    seed: int = 0,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    platforms: Sequence[str] = ("cpu", "cuda"),
    overwrite: bool = False,
    provenance: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Export ``fn(params, *inputs)`` as the bundle directory ``out_dir``.

    See the module docstring for the steps. Raises ``BundleError`` (nothing written)
    when the manifest would be invalid or the artifact does not reproduce ``fn``.
    """
    import jax
    from jax import export

    from .runtime.artifact import check_artifact

    started = time.perf_counter()
    out = Path(out_dir)
    name = out.name
    if out.exists() and not overwrite:
        raise BundleError(name, f"{out} already exists (use overwrite/--force)")
    model_path = Path(model_py) if model_py is not None else None
    if model_path is not None and not model_path.is_file():
        raise BundleError(name, f"model_py: {model_path}: file not found")
    batched = bool(batch_sizes)
    in_dicts = [_spec(s, f"inputs[{i}]") for i, s in enumerate(inputs)]
    if not batched:
        # Said in the exporter's terms, not the manifest's ("needs
        # batching.compiled_batch_sizes"): what was left out is the batch sizes.
        for i, d in enumerate(in_dicts):
            if d["shape"] and d["shape"][0] == -1:
                raise BundleError(
                    name,
                    f"inputs[{i}] ({d['name']!r}, shape {d['shape']}) has a batch axis but no "
                    "batch sizes were given to compile it at: pass --batch-sizes 1,4,8 to "
                    "reactantserver export (batch_sizes= in Python), or give every axis a "
                    "size for an unbatched model",
                )
    # Validate what we can before tracing: datatype names, shapes, batch sizes.
    draft = {
        "format_version": FORMAT_VERSION,
        "inputs": in_dicts,
        "outputs": [{"name": "_", "datatype": "FP32", "shape": [-1] if batched else []}],
        "batching": {"compiled_batch_sizes": list(batch_sizes)},
    }
    pre = manifest_from_data(name, draft, has_model_py=model_path is not None)
    for i, spec in enumerate(pre.inputs):
        if np.dtype(jax.dtypes.canonicalize_dtype(spec.numpy_dtype)) != spec.numpy_dtype:
            raise BundleError(
                name,
                f"inputs[{i}].datatype: {spec.datatype} needs jax_enable_x64 (JAX would trace "
                f"it as {jax.dtypes.canonicalize_dtype(spec.numpy_dtype)})",
            )

    named, treedef = flatten_params(params)
    leaves = [a for _, a in named]
    n_in = len(pre.inputs)
    out_names = [o if isinstance(o, str) else _spec(o, "outputs")["name"] for o in outputs]

    def flat(*args: Any) -> tuple[Any, ...]:
        p = jax.tree_util.tree_unflatten(treedef, args[n_in:])
        return _normalise_outputs(fn(p, *args[:n_in]), out_names)

    (b,) = export.symbolic_shape("b")
    arg_specs = [
        jax.ShapeDtypeStruct((b, *s.shape[1:]) if batched else s.shape, s.numpy_dtype)
        for s in pre.inputs
    ] + [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves]
    try:
        exported = export.export(jax.jit(flat), platforms=tuple(platforms))(*arg_specs)
    except Exception as exc:
        raise BundleError(name, f"tracing fn failed: {type(exc).__name__}: {exc}") from exc
    blob = bytes(exported.serialize())

    data: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": "model",
        "inputs": in_dicts,
        "outputs": _infer_outputs(outputs, exported.out_avals, batched),
        "batching": {"compiled_batch_sizes": sorted(batch_sizes)},
        "artifact": DEFAULT_ARTIFACT,
        "weights": DEFAULT_WEIGHTS,
    }
    if description:
        data["description"] = description
    if client_inputs is not None:
        data["client_inputs"] = [
            _spec(s, f"client_inputs[{i}]") for i, s in enumerate(client_inputs)
        ]
    if client_outputs is not None:
        data["client_outputs"] = [
            _spec(s, f"client_outputs[{i}]") for i, s in enumerate(client_outputs)
        ]
    manifest = manifest_from_data(name, data, has_model_py=model_path is not None)

    # The check runs on what was serialized, not on the in-memory Exported.
    reloaded = export.deserialize(bytearray(blob))
    weight_specs = [WeightSpec(name=n, dtype=a.dtype, shape=a.shape) for n, a in named]
    check_artifact(name, reloaded, manifest, weight_specs, platform=None)
    errors = _check_against_fn(
        name, fn, params, reloaded, manifest, leaves, seed=seed, rtol=rtol, atol=atol
    )

    import jaxlib

    prov: dict[str, Any] = {
        "exporter": f"reactantserver {__version__}",
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "exported_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "platforms": list(platforms),
        "source": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}",
        **_git_provenance(fn),
        "check": {
            "seed": seed,
            "rtol": rtol,
            "atol": atol,
            "max_abs_error": {int(k): float(v) for k, v in errors.items()},
        },
        **(provenance or {}),
    }
    manifest = attrs.evolve(manifest, provenance=prov)
    write_bundle(out, manifest, blob, named, model_path, overwrite)
    return ExportResult(
        path=out,
        manifest=manifest,
        max_abs_error=errors,
        artifact_bytes=len(blob),
        weights_bytes=sum(a.nbytes for a in leaves),
        weight_count=len(leaves),
        seconds=time.perf_counter() - started,
    )


def export_spec(
    spec: ExportSpec,
    out_dir: str | os.PathLike[str],
    *,
    batch_sizes: Sequence[int] | None = None,
    overwrite: bool = False,
    provenance: Mapping[str, Any] | None = None,
) -> ExportResult:
    """``export_bundle`` from an ``ExportSpec`` (``batch_sizes`` overrides the spec's)."""
    return export_bundle(
        spec.fn,
        spec.params,
        inputs=spec.inputs,
        outputs=spec.outputs,
        batch_sizes=spec.batch_sizes if batch_sizes is None else batch_sizes,
        out_dir=out_dir,
        model_py=spec.model_py,
        client_inputs=spec.client_inputs,
        client_outputs=spec.client_outputs,
        description=spec.description,
        seed=spec.seed,
        rtol=spec.rtol,
        atol=spec.atol,
        platforms=spec.platforms,
        overwrite=overwrite,
        provenance=provenance,
    )


def _import_path(path: Path) -> ModuleType:
    """Import a ``.py`` file; inside a package (``__init__.py`` beside it), as part of it.

    ``examples/zoo/mlp.py`` is imported as ``zoo.mlp`` with ``examples`` on
    ``sys.path``, so the module's relative imports work as they do for its package.
    """
    parts = [path.stem]
    top = path.parent
    while (top / "__init__.py").is_file():
        parts.insert(0, top.name)
        top = top.parent
    if len(parts) > 1:
        if str(top) not in sys.path:
            sys.path.insert(0, str(top))
        return importlib.import_module(".".join(parts))
    mod_name = f"reactantserver_export_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


def resolve_spec(ref: str) -> ExportSpec:
    """Call ``MODULE:CALLABLE`` (dotted module or ``path/to/file.py``) for an ExportSpec."""
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise ValueError(f"expected MODULE:CALLABLE, got {ref!r}")
    try:
        if module_ref.endswith(".py") or os.sep in module_ref:
            path = Path(module_ref).resolve()
            if not path.is_file():
                raise ValueError(f"{module_ref}: file not found")
            module = _import_path(path)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the working directory
            module = importlib.import_module(module_ref)
    except ImportError as exc:
        # Other exceptions from the user's module keep their traceback: it is their code.
        raise ValueError(f"{module_ref}: cannot import ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{ref}: {attr!r} is not a callable in {module_ref}")
    result = factory()
    if not isinstance(result, ExportSpec):
        raise ValueError(
            f"{ref}: returned {type(result).__name__}; expected reactantserver.export.ExportSpec"
        )
    return result


def describe_result(result: ExportResult) -> str:
    """A short human summary of an export, as the CLI prints it."""

    def tensors(specs: Sequence[TensorSpec]) -> str:
        return ", ".join(f"{s.name} {s.datatype} {list(s.shape)}" for s in specs)

    m = result.manifest
    sizes = ", ".join(map(str, m.compiled_batch_sizes)) or "unbatched"
    errs = ", ".join(
        f"{e:.2g} (b={k})" if k else f"{e:.2g}" for k, e in sorted(result.max_abs_error.items())
    )
    check = m.provenance.get("check", {})
    lines = [
        f"exported {result.path.name} -> {result.path}",
        f"  inputs       {tensors(m.inputs)}",
        f"  outputs      {tensors(m.outputs)}",
    ]
    if m.client_inputs is not None:
        lines.append(f"  client in    {tensors(m.client_inputs)}")
    if m.client_outputs is not None:
        lines.append(f"  client out   {tensors(m.client_outputs)}")
    lines += [
        f"  batch sizes  {sizes}",
        f"  sizes        artifact {result.artifact_bytes} B, weights {result.weights_bytes} B "
        f"in {result.weight_count} tensors",
        f"  check        max |error| {errs} (rtol={check.get('rtol')}, atol={check.get('atol')})",
        f"  took         {result.seconds:.2f} s",
    ]
    return "\n".join(lines)


def run_cli(
    ref: str,
    out: str,
    *,
    batch_sizes: Sequence[int] | None = None,
    platforms: Sequence[str] | None = None,
    force: bool = False,
) -> int:
    """``reactantserver export``: resolve, export, print a summary; exit status.

    The command writes the bundle directory it is given and nothing else: importing the
    spec's module (``examples/zoo/mlp.py``) must not leave a ``__pycache__`` beside it.
    """
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return _run_cli(ref, out, batch_sizes=batch_sizes, platforms=platforms, force=force)
    finally:
        sys.dont_write_bytecode = writes_bytecode


def _run_cli(
    ref: str,
    out: str,
    *,
    batch_sizes: Sequence[int] | None,
    platforms: Sequence[str] | None,
    force: bool,
) -> int:
    try:
        spec = resolve_spec(ref)
        if platforms:
            spec = attrs.evolve(spec, platforms=tuple(platforms))
        result = export_spec(
            spec, out, batch_sizes=batch_sizes, overwrite=force, provenance={"source": ref}
        )
    except (BundleError, ValueError) as exc:
        print(f"reactantserver export: {exc}", file=sys.stderr)
        return 1
    print(describe_result(result))
    return 0

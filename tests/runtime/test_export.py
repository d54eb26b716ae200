"""The exporter: what it writes, the check it runs before writing, and the CLI."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from reactantserver.bundle import load_bundle
from reactantserver.errors import BundleError
from reactantserver.export import ExportSpec, export_bundle, export_spec, resolve_spec

ROOT = Path(__file__).resolve().parents[2]


def _linear(params: dict[str, Any], x: Any) -> Any:
    return x @ params["w"] + params["b"]


def _params() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }


def _visible(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_unbatched_export_runs_in_the_runtime(tmp_path: Path, zoo_runtime: Any) -> None:
    params = _params()
    result = export_bundle(
        _linear,
        params,
        inputs=[("x", "FP32", [2, 4])],
        outputs=["y"],
        batch_sizes=[],
        out_dir=tmp_path / "linear",
    )
    assert result.manifest.outputs[0].shape == (2, 3)
    assert result.max_abs_error == {0: 0.0}
    model = zoo_runtime.load(load_bundle(result.path))
    assert model.sizes == (0,)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    weights = zoo_runtime.to_device(load_bundle(result.path).read_weights())
    (y,) = model.execute([x], weights)
    np.testing.assert_allclose(y, x @ params["w"] + params["b"], rtol=1e-6)


def test_weights_are_written_in_flattening_order_with_argument_order(tmp_path: Path) -> None:
    params = {"layer": {"w": np.ones((4, 3), np.float32), "b": np.zeros(3, np.float32)}}
    export_bundle(
        lambda p, x: x @ p["layer"]["w"] + p["layer"]["b"],
        params,
        inputs=[("x", "FP32", [-1, 4])],
        outputs=["y"],
        batch_sizes=[2],
        out_dir=tmp_path / "m",
    )
    with safe_open(str(tmp_path / "m" / "weights.safetensors"), framework="numpy") as f:
        assert json.loads(f.metadata()["argument_order"]) == ["layer.b", "layer.w"]
        np.testing.assert_array_equal(f.get_tensor("layer.w"), params["layer"]["w"])


def test_provenance_records_versions_time_check_and_git(tmp_path: Path) -> None:
    import jax

    result = export_bundle(
        _linear,
        _params(),
        inputs=[("x", "FP32", [-1, 4])],
        outputs=["y"],
        batch_sizes=[1, 2],
        out_dir=tmp_path / "m",
        seed=5,
    )
    prov = load_bundle(result.path).manifest.provenance
    assert prov["exporter"] == "reactantserver 0.1.0"
    assert prov["jax_version"] == jax.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", prov["exported_at"])
    assert prov["platforms"] == ["cpu", "cuda"]
    assert prov["source"] == "test_export._linear"
    assert prov["check"] == {
        "seed": 5,
        "rtol": 1e-5,
        "atol": 1e-6,
        "max_abs_error": {1: 0.0, 2: 0.0},
    }
    # This file lives in the project's git checkout.
    assert re.fullmatch(r"[0-9a-f]{40}", prov["git_commit"])
    assert isinstance(prov["git_dirty"], bool)


def test_a_function_the_artifact_does_not_reproduce_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    """Each trace of this function bakes in a different constant: the artifact (first
    trace) and the function as called again disagree, so nothing may be written."""
    traces = itertools.count(1)

    def unstable(params: Any, x: Any) -> Any:
        import jax.numpy as jnp

        return jnp.zeros_like(x) + next(traces) * params["one"]

    with pytest.raises(BundleError) as info:
        export_bundle(
            unstable,
            {"one": np.float32(1.0)},
            inputs=[("x", "FP32", [-1, 2])],
            outputs=["y"],
            batch_sizes=[1],
            out_dir=tmp_path / "unstable",
        )
    assert str(info.value) == (
        "bundle 'unstable': export check failed: output 'y' at batch size 1: the deserialized "
        "artifact differs from the function by up to 1 (rtol=1e-05, atol=1e-06)"
    )
    assert _visible(tmp_path) == []  # not even a temporary directory


def test_existing_bundle_is_kept_unless_overwrite(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {
        "inputs": [("x", "FP32", [-1, 4])],
        "outputs": ["y"],
        "batch_sizes": [1],
        "out_dir": tmp_path / "m",
    }
    export_bundle(_linear, _params(), **kwargs)
    with pytest.raises(BundleError) as info:
        export_bundle(_linear, _params(), **kwargs)
    assert str(info.value) == f"bundle 'm': {tmp_path / 'm'} already exists (use overwrite/--force)"
    result = export_bundle(_linear, _params(), **{**kwargs, "batch_sizes": [1, 2]}, overwrite=True)
    assert load_bundle(result.path).compiled_batch_sizes == (1, 2)
    assert _visible(tmp_path) == ["m"]  # the old copy and the temporary are gone


def test_output_specs_may_be_given_and_are_checked(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as info:
        export_bundle(
            _linear,
            _params(),
            inputs=[("x", "FP32", [-1, 4])],
            outputs=[("y", "FP16", [-1, 3])],
            batch_sizes=[1],
            out_dir=tmp_path / "m",
        )
    assert str(info.value) == (
        "bundle 'm': model.jaxexport: result 0 (output 'y'): the artifact returns float32, the "
        "manifest declares FP16"
    )


def test_invalid_input_specs_are_reported_like_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as info:
        export_bundle(
            _linear,
            _params(),
            inputs=[("x", "FLOAT", [-1, 4])],
            outputs=["y"],
            batch_sizes=[1],
            out_dir=tmp_path / "m",
        )
    assert str(info.value).startswith("bundle 'm': manifest.yaml: inputs[0].datatype: expected one")
    with pytest.raises(BundleError) as info:
        export_bundle(
            _linear,
            _params(),
            inputs=[("x", "FP32", [-1, 4])],
            outputs=["y"],
            batch_sizes=[0],
            out_dir=tmp_path / "m",
        )
    assert str(info.value) == (
        "bundle 'm': manifest.yaml: batching.compiled_batch_sizes[0]: expected a positive "
        "integer, got 0"
    )


def test_64_bit_inputs_need_x64(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as info:
        export_bundle(
            _linear,
            _params(),
            inputs=[("x", "FP64", [-1, 4])],
            outputs=["y"],
            batch_sizes=[1],
            out_dir=tmp_path / "m",
        )
    assert str(info.value) == (
        "bundle 'm': inputs[0].datatype: FP64 needs jax_enable_x64 (JAX would trace it as float32)"
    )


def test_tuple_outputs_and_multiple_inputs(tmp_path: Path, zoo_runtime: Any) -> None:
    def fn(p: Any, a: Any, mask: Any) -> Any:
        import jax.numpy as jnp

        return a * p["s"], jnp.where(mask, a, 0).sum(axis=1).astype(jnp.int32)

    result = export_bundle(
        fn,
        {"s": np.float32(3.0)},
        inputs=[("a", "FP32", [-1, 5]), ("mask", "BOOL", [-1, 5])],
        outputs=["scaled", "count"],
        batch_sizes=[2],
        out_dir=tmp_path / "two",
    )
    assert [(o.name, o.datatype, o.shape) for o in result.manifest.outputs] == [
        ("scaled", "FP32", (-1, 5)),
        ("count", "INT32", (-1,)),
    ]
    bundle = load_bundle(result.path)
    model = zoo_runtime.load(bundle)
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    mask = a % 2 == 0
    scaled, count = model.execute([a, mask], zoo_runtime.to_device(bundle.read_weights()))
    np.testing.assert_array_equal(scaled, 3 * a)
    np.testing.assert_array_equal(count, np.where(mask, a, 0).sum(axis=1))


def test_a_fixed_batch_axis_in_the_artifact_is_refused_for_a_batched_manifest(
    tmp_path: Path, zoo_runtime: Any
) -> None:
    result = export_bundle(
        _linear,
        _params(),
        inputs=[("x", "FP32", [4, 4])],
        outputs=["y"],
        batch_sizes=[],
        out_dir=tmp_path / "fixed",
    )
    manifest = (result.path / "manifest.yaml").read_text()
    manifest = manifest.replace("[4, 4]", "[-1, 4]").replace("[4, 3]", "[-1, 3]")
    manifest = manifest.replace("compiled_batch_sizes: []", "compiled_batch_sizes: [4]")
    (result.path / "manifest.yaml").write_text(manifest)
    with pytest.raises(BundleError) as info:
        zoo_runtime.load(load_bundle(result.path))
    assert str(info.value) == (
        "bundle 'fixed': model.jaxexport: argument 0 (input 'x'): axis 0 is fixed at 4 in the "
        "artifact, but the manifest declares a batch axis (-1); export with a symbolic batch "
        "dimension"
    )


def test_export_spec_overrides_batch_sizes(tmp_path: Path) -> None:
    spec = ExportSpec(
        fn=_linear,
        params=_params(),
        inputs=[("x", "FP32", [-1, 4])],
        outputs=["y"],
        batch_sizes=[1, 2, 4],
    )
    result = export_spec(spec, tmp_path / "m", batch_sizes=[3])
    assert result.manifest.compiled_batch_sizes == (3,)


def test_resolve_spec_by_path_and_by_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import numpy as np\n"
        "from reactantserver.export import ExportSpec\n"
        "def spec():\n"
        "    return ExportSpec(fn=lambda p, x: x * p, params=np.float32(2), "
        "inputs=[('x', 'FP32', [-1, 2])], outputs=['y'], batch_sizes=[1])\n"
        "def not_a_spec():\n"
        "    return 42\n"
    )
    (tmp_path / "my_export_spec_mod.py").write_text(source)
    by_path = resolve_spec(f"{tmp_path / 'my_export_spec_mod.py'}:spec")
    assert by_path.batch_sizes == [1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_spec("my_export_spec_mod:spec").outputs == ["y"]
    with pytest.raises(ValueError) as info:
        resolve_spec("my_export_spec_mod:not_a_spec")
    assert str(info.value) == (
        "my_export_spec_mod:not_a_spec: returned int; expected reactantserver.export.ExportSpec"
    )
    with pytest.raises(ValueError) as info:
        resolve_spec("no_such_module_xyz:spec")
    assert str(info.value) == (
        "no_such_module_xyz: cannot import (No module named 'no_such_module_xyz')"
    )
    with pytest.raises(ValueError) as info:
        resolve_spec("no_colon_here")
    assert str(info.value) == "expected MODULE:CALLABLE, got 'no_colon_here'"


def test_zoo_module_paths_import_inside_their_package() -> None:
    spec = resolve_spec(str(ROOT / "examples" / "zoo" / "double.py") + ":export_spec")
    assert spec.outputs == ["y"]


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reactantserver.cli import main

    out = tmp_path / "double"
    ref = str(ROOT / "examples" / "zoo" / "double.py") + ":export_spec"
    assert main(["export", ref, "--out", str(out), "--batch-sizes", "1,2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:4] == [
        f"exported double -> {out}",
        "  inputs       x FP32 [-1, 16]",
        "  outputs      y FP32 [-1, 16]",
        "  batch sizes  1, 2",
    ]
    assert printed[5] == "  check        max |error| 0 (b=1), 0 (b=2) (rtol=0.0, atol=0.0)"
    assert load_bundle(out).manifest.provenance["source"] == ref
    # A second export to the same place needs --force.
    assert main(["export", ref, "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"reactantserver export: bundle 'double': {out} already exists (use overwrite/--force)\n"
    )
    assert main(["export", ref, "--out", str(out), "--force"]) == 0
    assert main(["export", ref, "--out", str(out), "--batch-sizes", "1,x"]) == 2


def test_cli_export_without_batch_sizes_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: a spec with a batch axis and no batch sizes was answered in manifest
    terms ("-1 needs batching.compiled_batch_sizes"); now the refusal names the flag, and
    nothing is written."""
    from reactantserver.cli import main

    out = tmp_path / "double"
    ref = str(ROOT / "examples" / "zoo" / "double.py") + ":export_spec"
    assert main(["export", ref, "--out", str(out), "--batch-sizes", ""]) == 1
    assert capsys.readouterr().err == (
        "reactantserver export: bundle 'double': inputs[0] ('x', shape [-1, 16]) has a batch "
        "axis but no batch sizes were given to compile it at: pass --batch-sizes 1,4,8 to "
        "reactantserver export (batch_sizes= in Python), or give every axis a size for an "
        "unbatched model\n"
    )
    assert not out.exists()


def test_export_writes_only_the_bundle_it_is_told_to(tmp_path: Path) -> None:
    """With bytecode writing on (as on a user's machine), exporting a spec that lives in a
    package and ships a model.py writes the named bundle directory and nothing else: no
    ``__pycache__`` beside the spec's source, none inside the bundle (the exporter imports
    the bundle's model.py to check it), no leftover temporary directory."""
    import shutil
    import subprocess
    import sys

    source = tmp_path / "src"
    shutil.copytree(
        ROOT / "examples" / "zoo", source / "zoo", ignore=shutil.ignore_patterns("__pycache__")
    )
    before = {p for p in tmp_path.rglob("*")}
    out = tmp_path / "repo" / "u8"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reactantserver.cli",
            "export",
            f"{source / 'zoo' / 'uint8_classifier.py'}:export_spec",
            "--out",
            str(out),
            "--batch-sizes",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")} - {
        p.relative_to(tmp_path) for p in before
    }
    assert written == {
        Path("repo"),
        Path("repo/u8"),
        Path("repo/u8/manifest.yaml"),
        Path("repo/u8/model.jaxexport"),
        Path("repo/u8/weights.safetensors"),
        Path("repo/u8/model.py"),
    }


def test_loading_a_bundle_writes_nothing_into_it(
    tmp_path: Path, zoo_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing a bundle's model.py (the exporter's check, every server load) leaves no
    ``__pycache__`` in the bundle, even where Python would write one."""
    import shutil

    monkeypatch.setattr("sys.dont_write_bytecode", False)
    bundle = tmp_path / "uint8_classifier"
    shutil.copytree(zoo_repo / "uint8_classifier", bundle)
    before = sorted(p.name for p in bundle.iterdir())
    assert load_bundle(bundle).hooks is not None
    assert sorted(p.name for p in bundle.iterdir()) == before

"""Scanning a repository, loading bundles and their weights and hooks (JAX-free).

The bundles here are synthetic: the scan never opens the artifact (the runtime does),
so any bytes stand in for it, and the weights are real safetensors files.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reactantserver.bundle import (
    Bundle,
    find_bundles,
    load_bundle,
    scan_repository,
    signature,
    write_weights,
)
from reactantserver.errors import BundleError, ConfigError, ExecutionFailed, InvalidArgument
from reactantserver.hooks import Hooks, load_hooks, run_postprocess, run_preprocess

MANIFEST = """\
format_version: 1
name: {declared}
inputs:
  - {{name: x, datatype: FP32, shape: [-1, 3]}}
outputs:
  - {{name: y, datatype: FP32, shape: [-1, 3]}}
batching:
  compiled_batch_sizes: [1, 4]
"""

META = """\
format_version: 1
kind: meta
calls: [a]
client_inputs:
  - {name: x, datatype: FP32, shape: [-1, 3]}
client_outputs:
  - {name: y, datatype: FP32, shape: [-1, 3]}
"""


def make_bundle(
    root: Path, name: str, *, declared: str = "whatever", model_py: str | None = None
) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "manifest.yaml").write_text(MANIFEST.format(declared=declared))
    (path / "model.jaxexport").write_bytes(b"stand-in")
    # Argument order deliberately differs from the alphabetical order safetensors stores.
    write_weights(
        path / "weights.safetensors",
        [("z_scale", np.full((3,), 2.0, np.float32)), ("a_bias", np.arange(3, dtype=np.float32))],
    )
    if model_py is not None:
        (path / "model.py").write_text(model_py)
    return path


def test_bundles_are_named_after_their_directory(tmp_path: Path) -> None:
    make_bundle(tmp_path, "alpha", declared="something-else")
    result = scan_repository(tmp_path)
    assert list(result.bundles) == ["alpha"]
    bundle = result.bundles["alpha"]
    assert bundle.name == "alpha"
    assert bundle.manifest.declared_name == "something-else"
    assert bundle.compiled_batch_sizes == (1, 4)
    assert bundle.weights_nbytes == 24


def test_scan_skips_hidden_directories_plain_dirs_and_files(tmp_path: Path) -> None:
    make_bundle(tmp_path, "alpha")
    make_bundle(tmp_path, ".alpha.export-1234")  # the exporter's temporary directory
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("not a bundle")
    result = scan_repository(tmp_path)
    assert list(result.bundles) == ["alpha"] and not result.errors


def test_scan_include_list(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        make_bundle(tmp_path, name)
    assert sorted(scan_repository(tmp_path, include=["a", "c"]).bundles) == ["a", "c"]


def test_scan_several_repositories_first_wins_on_duplicates(tmp_path: Path) -> None:
    make_bundle(tmp_path / "one", "shared")
    make_bundle(tmp_path / "two", "shared")
    make_bundle(tmp_path / "two", "other")
    result = scan_repository([tmp_path / "one", tmp_path / "two"])
    assert sorted(result.bundles) == ["other", "shared"]
    assert result.bundles["shared"].path == tmp_path / "one" / "shared"
    assert str(result.errors["shared"]) == (
        f"bundle 'shared': found in both {tmp_path / 'one'} and {tmp_path / 'two'}; bundle names "
        f"must be unique across model_dirs (serving the one in {tmp_path / 'one'})"
    )


def test_a_missing_repository_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        scan_repository(tmp_path / "nope")
    assert str(info.value) == f"model_dirs: {tmp_path / 'nope'}: not a directory"


def test_weights_come_back_in_argument_order(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path, "alpha"))
    assert [w.name for w in bundle.weight_specs] == ["z_scale", "a_bias"]
    scale, bias = bundle.read_weights()
    np.testing.assert_array_equal(scale, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(bias, [0.0, 1.0, 2.0])


def test_weights_changed_on_disk_are_refused(tmp_path: Path) -> None:
    path = make_bundle(tmp_path, "alpha")
    bundle = load_bundle(path)
    write_weights(
        path / "weights.safetensors",
        [("z_scale", np.zeros((4,), np.float32)), ("a_bias", np.zeros((3,), np.float32))],
    )
    with pytest.raises(BundleError) as info:
        bundle.read_weights()
    assert str(info.value) == (
        "bundle 'alpha': weights.safetensors: tensor 'z_scale' changed on disk: now "
        "float32[4], loaded as float32[3]"
    )


def test_weights_file_is_readable_like_the_other_bundle_files(tmp_path: Path) -> None:
    path = make_bundle(tmp_path, "alpha")
    mode = stat.S_IMODE((path / "weights.safetensors").stat().st_mode)
    assert mode == stat.S_IMODE((path / "manifest.yaml").stat().st_mode)


def test_signature_tracks_visible_files(tmp_path: Path) -> None:
    path = make_bundle(tmp_path, "alpha")
    before = signature(path)
    assert [entry[0] for entry in before] == [
        "manifest.yaml",
        "model.jaxexport",
        "weights.safetensors",
    ]
    (path / ".model.py.swp").write_text("editor noise")
    assert signature(path) == before
    (path / "model.py").write_text("")
    assert signature(path) != before
    assert signature(tmp_path / "gone") == ()


def test_meta_bundle_needs_an_async_run(tmp_path: Path) -> None:
    path = tmp_path / "pipe"
    path.mkdir()
    (path / "manifest.yaml").write_text(META)
    (path / "model.py").write_text("async def run(inputs, ctx):\n    return inputs\n")
    bundle = load_bundle(path)
    assert bundle.is_meta and bundle.hooks is not None and bundle.hooks.run is not None
    assert bundle.weight_specs == () and bundle.read_weights() == []

    (path / "model.py").write_text("def run(inputs, ctx):\n    return inputs\n")
    with pytest.raises(BundleError) as info:
        load_bundle(path)
    assert str(info.value) == (
        "bundle 'pipe': model.py: run: expected `async def run(inputs, ctx)`, got a plain function"
    )
    (path / "model.py").write_text("x = 1\n")
    with pytest.raises(BundleError) as info:
        load_bundle(path)
    assert str(info.value) == (
        "bundle 'pipe': model.py: a kind: meta bundle must define `async def run(inputs, ctx)`"
    )


def test_hooks_must_be_plain_functions(tmp_path: Path) -> None:
    path = make_bundle(
        tmp_path, "alpha", model_py="async def preprocess(inputs):\n    return inputs\n"
    )
    with pytest.raises(BundleError) as info:
        load_bundle(path)
    assert str(info.value) == (
        "bundle 'alpha': model.py: preprocess: expected a plain (sync) function, got `async def`"
    )


def test_model_py_calling_sys_exit_is_a_bundle_error(tmp_path: Path) -> None:
    path = make_bundle(tmp_path, "alpha", model_py="import sys\nsys.exit(3)\n")
    with pytest.raises(BundleError) as info:
        load_bundle(path)
    assert str(info.value) == "bundle 'alpha': model.py: import failed: SystemExit: 3 (line 2)"


def test_reloading_model_py_sees_new_code(tmp_path: Path) -> None:
    file = tmp_path / "model.py"
    file.write_text("def preprocess(inputs):\n    return {'v': 1}\n")
    first = load_hooks("m", file, kind="model")
    file.write_text("def preprocess(inputs):\n    return {'v': 2}\n")
    second = load_hooks("m", file, kind="model")
    assert first.preprocess is not None and second.preprocess is not None
    assert first.preprocess({}) == {"v": 1}
    assert second.preprocess({}) == {"v": 2}
    assert first.module_name != second.module_name


# --- running hooks on a request --------------------------------------------------------------


def _bundle_with_hooks(tmp_path: Path, source: str) -> tuple[Bundle, Hooks | None]:
    bundle = load_bundle(make_bundle(tmp_path, "alpha", model_py=source))
    return bundle, bundle.hooks


def test_without_hooks_tensors_pass_through(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path, "alpha"))
    x = {"x": np.zeros((2, 3), np.float32)}
    assert run_preprocess("alpha", bundle.hooks, x, bundle.inputs, 2) is x
    assert run_postprocess("alpha", bundle.hooks, x, bundle.outputs, 2) is x


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "def preprocess(inputs):\n    raise ValueError('not an image')\n",
            "model 'alpha': preprocess rejected the request: ValueError: not an image",
        ),
    ],
)
def test_preprocess_raising_refuses_the_request(tmp_path: Path, source: str, message: str) -> None:
    bundle, hooks = _bundle_with_hooks(tmp_path, source)
    with pytest.raises(InvalidArgument) as info:
        run_preprocess("alpha", hooks, {"x": np.zeros((2, 3), np.float32)}, bundle.inputs, 2)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "return [1]",
            "model 'alpha': model.py preprocess returned list, expected a dict of numpy arrays",
        ),
        (
            "return {'z': inputs['x']}",
            "model 'alpha': model.py preprocess returned no tensor 'x' (returned: z)",
        ),
        (
            "return {'x': inputs['x'].astype('float64')}",
            "model 'alpha': model.py preprocess returned 'x' as float64, expected FP32 (float32)",
        ),
        (
            "return {'x': inputs['x'][:1]}",
            "model 'alpha': model.py preprocess returned 'x' with shape [1, 3], expected [2, 3]",
        ),
        (
            "return {'x': inputs['x'], 'extra': inputs['x']}",
            "model 'alpha': model.py preprocess returned undeclared tensors: extra",
        ),
    ],
)
def test_a_wrong_preprocess_result_fails_the_request(
    tmp_path: Path, body: str, message: str
) -> None:
    bundle, hooks = _bundle_with_hooks(tmp_path, f"def preprocess(inputs):\n    {body}\n")
    with pytest.raises(ExecutionFailed) as info:
        run_preprocess("alpha", hooks, {"x": np.zeros((2, 3), np.float32)}, bundle.inputs, 2)
    assert str(info.value) == message


def test_postprocess_raising_is_an_execution_failure(tmp_path: Path) -> None:
    bundle, hooks = _bundle_with_hooks(tmp_path, "def postprocess(outputs):\n    return 1 / 0\n")
    with pytest.raises(ExecutionFailed) as info:
        run_postprocess("alpha", hooks, {"y": np.zeros((2, 3), np.float32)}, bundle.outputs, 2)
    assert (
        str(info.value) == "model 'alpha': postprocess failed: ZeroDivisionError: division by zero"
    )


def test_bundle_and_hooks_modules_import_without_jax() -> None:
    code = (
        "import sys, reactantserver.bundle, reactantserver.hooks\n"
        "print(any(m == 'jax' or m.startswith('jax.') for m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"


def test_find_bundles_names_the_directories_that_are_no_bundle(tmp_path: Path) -> None:
    """A visible directory without a manifest.yaml is no bundle, and is named as such
    (hidden ones and files are not); with an allowlist, only the names on it."""
    repo = tmp_path / "repo"
    for name in ("good", "notes", ".hidden"):
        (repo / name).mkdir(parents=True)
    (repo / "good" / "manifest.yaml").write_text("format_version: 1\n")
    (repo / "README").write_text("not a directory\n")
    listing = find_bundles([repo])
    assert list(listing.paths) == ["good"] and listing.unbundled == (repo / "notes",)
    assert find_bundles([repo], include=("good",)).unbundled == ()
    assert find_bundles([repo], include=("notes",)).unbundled == (repo / "notes",)

"""Broken bundles are refused with an exact message, and never stop the others.

Each case starts from a good zoo bundle, breaks one thing and states the message an
operator must see. JAX-free refusals happen when the repository is scanned; those that
need the artifact's signature (argument order, dtypes, arity, shapes) happen when the
runtime loads the bundle. In both phases the good bundles load regardless.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from safetensors.numpy import load_file, save_file

from reactantserver.bundle import scan_repository
from reactantserver.errors import BundleError

Break = Callable[[Path], None]


def _yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = None
    return yaml


def edit_manifest(fn: Callable[[dict[str, Any]], None]) -> Break:
    def apply(path: Path) -> None:
        data = _yaml().load((path / "manifest.yaml").read_text())
        fn(data)
        with (path / "manifest.yaml").open("w") as f:
            _yaml().dump(data, f)

    return apply


def write_text(name: str, text: str) -> Break:
    return lambda path: (path / name).write_text(text)


def remove(name: str) -> Break:
    return lambda path: (path / name).unlink()


def rewrite_weights(
    order: Callable[[list[str]], list[str]] | None, drop: str | None = None
) -> Break:
    """Rewrite weights.safetensors with a changed argument_order (None: no metadata)."""

    def apply(path: Path) -> None:
        file = path / "weights.safetensors"
        from safetensors import safe_open

        with safe_open(str(file), framework="numpy") as f:
            names = json.loads(f.metadata()["argument_order"])
        tensors = load_file(str(file))
        if drop is not None:
            del tensors[drop]
            names.remove(drop)
        meta = None if order is None else {"argument_order": json.dumps(order(names))}
        save_file(tensors, str(file), metadata=meta)

    return apply


def chain(*steps: Break) -> Break:
    def apply(path: Path) -> None:
        for step in steps:
            step(path)

    return apply


def _set(keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted path such as ``inputs.0.datatype`` in manifest data."""

    def fn(data: dict[str, Any]) -> None:
        *head, last = keys.split(".")
        node: Any = data
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return fn


def _delete(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.pop(key)


DATATYPES = "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16"

#: (bundle name, source zoo bundle, how to break it, exact message) -- refused by the scan.
SCAN_CASES: list[tuple[str, str, Break, str]] = [
    (
        "missing_weights",
        "double",
        remove("weights.safetensors"),
        "weights.safetensors: file not found (manifest key 'weights')",
    ),
    (
        "missing_artifact",
        "double",
        remove("model.jaxexport"),
        "model.jaxexport: file not found (manifest key 'artifact')",
    ),
    (
        "unknown_datatype",
        "double",
        edit_manifest(_set("inputs.0.datatype", "FLOAT")),
        f"manifest.yaml:7: inputs[0].datatype: expected one of {DATATYPES}, got 'FLOAT'",
    ),
    (
        "batch_size_zero",
        "double",
        edit_manifest(_set("batching.compiled_batch_sizes", [0, 4])),
        "manifest.yaml:3: batching.compiled_batch_sizes[0]: expected a positive integer, got 0",
    ),
    (
        "duplicate_batch_size",
        "double",
        edit_manifest(_set("batching.compiled_batch_sizes", [1, 4, 4])),
        "manifest.yaml:3: batching.compiled_batch_sizes[2]: duplicate batch size 4",
    ),
    (
        "typo_key",
        "double",
        edit_manifest(_set("batching", {"compiled_batch_size": [1, 4]})),
        "manifest.yaml:3: batching.compiled_batch_size: unknown key; expected one of "
        "compiled_batch_sizes (did you mean 'compiled_batch_sizes'?)",
    ),
    (
        "format_version",
        "double",
        edit_manifest(_set("format_version", 2)),
        "manifest.yaml:5: format_version: expected 1, got 2",
    ),
    (
        "missing_outputs",
        "double",
        edit_manifest(_delete("outputs")),
        "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in "
        "argument order)",
    ),
    (
        "bytes_on_device",
        "double",
        edit_manifest(_set("inputs.0.datatype", "BYTES")),
        "manifest.yaml:7: inputs[0].datatype: BYTES is allowed only on "
        "client_inputs/client_outputs of a bundle with a model.py",
    ),
    (
        "no_batch_axis",
        "double",
        edit_manifest(_set("inputs.0.shape", [4, 16])),
        "manifest.yaml:9: inputs[0].shape: expected -1 on axis 0 (the batch axis) because "
        "batching.compiled_batch_sizes is set, got [4, 16]",
    ),
    (
        "variable_axis",
        "double",
        edit_manifest(_set("inputs.0.shape", [-1, -1])),
        "manifest.yaml:9: inputs[0].shape[1]: variable axes (-1 outside the batch axis) are not "
        "supported on executable tensors in format 1; export one bundle per shape",
    ),
    (
        "client_inputs_without_model_py",
        "double",
        edit_manifest(
            _set("client_inputs", [{"name": "x", "datatype": "UINT8", "shape": [-1, 16]}])
        ),
        "manifest.yaml:4: client_inputs: allowed only in a bundle with a model.py (none found)",
    ),
    (
        "invalid_yaml",
        "double",
        write_text("manifest.yaml", "format_version: 1\ninputs: [\n"),
        "manifest.yaml:3: not valid YAML: expected the node content, but found '<stream end>' "
        "(column 1)",
    ),
    (
        "no_argument_order",
        "double",
        rewrite_weights(None),
        "weights.safetensors: __metadata__.argument_order: required key is missing (a JSON "
        "list of tensor names in the artifact's weight-argument order)",
    ),
    (
        "argument_order_unknown_name",
        "double",
        rewrite_weights(lambda names: ["scale", "bias"]),
        "weights.safetensors: __metadata__.argument_order[1]: 'bias' is not a tensor in the file",
    ),
    (
        "argument_order_incomplete",
        "mlp",
        rewrite_weights(lambda names: names[:-1]),
        "weights.safetensors: __metadata__.argument_order: tensors in the file but not in the "
        "list: head.w",
    ),
    (
        "hook_raises_at_import",
        "double",
        write_text("model.py", "import numpy as np\n\nraise RuntimeError('no drivers here')\n"),
        "model.py: import failed: RuntimeError: no drivers here (line 3)",
    ),
    (
        "hook_syntax_error",
        "double",
        write_text("model.py", "def preprocess(inputs):\n    return {\n"),
        "model.py: import failed: SyntaxError: '{' was never closed (line 2)",
    ),
    (
        "hook_not_a_function",
        "double",
        write_text("model.py", "preprocess = 42\n"),
        "model.py: preprocess: expected a function, got int",
    ),
    (
        "client_inputs_without_preprocess",
        "uint8_classifier",
        write_text("model.py", "def postprocess(outputs):\n    return outputs\n"),
        "model.py: client_inputs differ from inputs, so model.py must define "
        "preprocess(inputs) to convert them; it does not",
    ),
]

#: Refused when the runtime loads them (the artifact's signature is needed).
LOAD_CASES: list[tuple[str, str, Break, str]] = [
    (
        "wrong_argument_order",
        "mlp",
        rewrite_weights(lambda names: [names[1], names[0], *names[2:]]),
        "model.jaxexport: argument 1 (weight 'dense1.w', entry 0 of argument_order in "
        "weights.safetensors): the artifact takes float32 (64,), weights.safetensors holds "
        "float32 (32, 64); is argument_order right?",
    ),
    (
        "dtype_mismatch",
        "mlp",
        edit_manifest(_set("inputs.0.datatype", "FP16")),
        "model.jaxexport: argument 0 (input 'features'): the artifact takes float32, the "
        "manifest declares FP16",
    ),
    (
        "artifact_arity_mismatch",
        "mlp",
        rewrite_weights(lambda names: names, drop="head.w"),
        "model.jaxexport: the artifact takes 7 arguments, but the manifest declares 1 input and "
        "weights.safetensors holds 5 weights (6 arguments in all)",
    ),
    (
        "output_count_mismatch",
        "mlp",
        edit_manifest(lambda d: d["outputs"].pop()),
        "model.jaxexport: the artifact returns 2 results, but the manifest declares 1 output",
    ),
    (
        "output_shape_mismatch",
        "mlp",
        edit_manifest(_set("outputs.0.shape", [-1, 11])),
        "model.jaxexport: result 0 (output 'logits'): the artifact returns shape (b, 10), the "
        "manifest declares [-1, 11]",
    ),
    (
        "unbatched_manifest_for_batched_artifact",
        "double",
        chain(
            edit_manifest(_set("batching.compiled_batch_sizes", [])),
            edit_manifest(_set("inputs.0.shape", [4, 16])),
            edit_manifest(_set("outputs.0.shape", [4, 16])),
        ),
        "model.jaxexport: argument 0 (input 'x'): the artifact takes shape (b, 16), the manifest "
        "declares [4, 16]",
    ),
]

GOOD = ("double", "mlp")


@pytest.fixture(scope="module")
def broken_repo(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("broken") / "repo"
    repo.mkdir()
    for name in GOOD:
        shutil.copytree(zoo_repo / name, repo / name)
    for name, source, breaker, _ in SCAN_CASES + LOAD_CASES:
        shutil.copytree(zoo_repo / source, repo / name)
        breaker(repo / name)
    return repo


def test_at_least_twelve_distinct_ways_to_break_a_bundle() -> None:
    assert len(SCAN_CASES) + len(LOAD_CASES) >= 12


def test_scan_refuses_each_broken_bundle_with_its_exact_message(broken_repo: Path) -> None:
    result = scan_repository(broken_repo)
    for name, _, _, message in SCAN_CASES:
        assert name in result.errors, f"{name} was not refused"
        assert str(result.errors[name]) == f"bundle {name!r}: {message}"
        assert result.errors[name].bundle == name
    assert set(result.errors) == {c[0] for c in SCAN_CASES}


def test_scan_loads_the_good_bundles_despite_the_broken_ones(broken_repo: Path) -> None:
    result = scan_repository(broken_repo)
    assert set(result.bundles) == {*GOOD, *(c[0] for c in LOAD_CASES)}


def test_load_refuses_each_mismatched_artifact_and_loads_the_rest(
    broken_repo: Path, zoo_runtime: Any
) -> None:
    result = scan_repository(broken_repo)
    loaded, errors = {}, {}
    for name, bundle in result.bundles.items():
        try:
            loaded[name] = zoo_runtime.load(bundle, sizes=bundle.compiled_batch_sizes[:1])
        except BundleError as exc:
            errors[name] = str(exc)
    assert set(loaded) == set(GOOD)
    for name, _, _, message in LOAD_CASES:
        assert errors[name] == f"bundle {name!r}: {message}"


def test_corrupt_artifact_is_refused_at_load(
    zoo_repo: Path, tmp_path: Path, zoo_runtime: Any
) -> None:
    from reactantserver.bundle import load_bundle

    shutil.copytree(zoo_repo / "double", tmp_path / "garbled")
    (tmp_path / "garbled" / "model.jaxexport").write_bytes(b"this is not a flatbuffer")
    bundle = load_bundle(tmp_path / "garbled")
    with pytest.raises(BundleError) as info:
        zoo_runtime.load(bundle)
    # The tail is the deserializer's own words; the head is ours and stable.
    assert str(info.value).startswith(
        "bundle 'garbled': model.jaxexport: not a serialized jax.export artifact ("
    )
    assert str(info.value).endswith("); re-export the bundle")


def test_artifact_for_another_platform_is_refused(
    zoo_repo: Path, tmp_path: Path, zoo_runtime: Any
) -> None:
    """An artifact exported for cuda only cannot run on a CPU worker."""
    from reactantserver.bundle import load_bundle
    from reactantserver.export import export_spec

    spec = load_double_spec()
    out = tmp_path / "cuda_only"
    # The exporter's own check runs on the CPU, so export for both and then pretend:
    # rewrite the artifact with a cuda-only export of the same function.
    export_spec(spec, out, batch_sizes=[1])
    import jax
    from jax import export

    (b,) = export.symbolic_shape("b")
    exp = export.export(jax.jit(lambda x, s: s * x), platforms=("cuda",))(
        jax.ShapeDtypeStruct((b, 16), "float32"), jax.ShapeDtypeStruct((), "float32")
    )
    (out / "model.jaxexport").write_bytes(exp.serialize())
    with pytest.raises(BundleError) as info:
        zoo_runtime.load(load_bundle(out))
    assert str(info.value) == (
        "bundle 'cuda_only': model.jaxexport: exported for cuda, but this worker runs on cpu; "
        "re-export with that platform included"
    )


def load_double_spec() -> Any:
    from conftest import load_build_repo

    return load_build_repo().ZOO["double"].export_spec()

"""manifest.yaml parsing: the rules, exact messages, and properties over generated manifests.

JAX-free: everything here runs on plain data.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import bundle_manifest_data, bundle_yaml_junk

from reactantserver.bundle import (
    FORMAT_VERSION,
    TensorSpec,
    dump_manifest,
    manifest_from_data,
    parse_manifest,
)
from reactantserver.errors import BundleError

MLP = """\
format_version: 1
kind: model
description: a classifier
inputs:
  - {name: features, datatype: FP32, shape: [-1, 32]}
outputs:
  - {name: logits, datatype: FP32, shape: [-1, 10]}
  - {name: probabilities, datatype: FP32, shape: [-1, 10]}
batching:
  compiled_batch_sizes: [32, 1, 8]
provenance:
  exporter: reactantserver 0.1.0
"""


def _error(text: str, *, has_model_py: bool = False, name: str = "m") -> str:
    with pytest.raises(BundleError) as info:
        parse_manifest(name, text, has_model_py=has_model_py)
    return str(info.value)


def test_a_model_manifest_parses_with_defaults() -> None:
    m = parse_manifest("mlp", MLP, has_model_py=False)
    assert m.kind == "model"
    assert m.format_version == FORMAT_VERSION
    assert m.inputs == (TensorSpec("features", "FP32", (-1, 32)),)
    assert [o.name for o in m.outputs] == ["logits", "probabilities"]
    assert m.compiled_batch_sizes == (1, 8, 32)  # sorted
    assert m.batched and m.max_batch_size == 32
    assert (m.artifact, m.weights) == ("model.jaxexport", "weights.safetensors")
    assert m.client_inputs is None and m.effective_client_inputs == m.inputs
    assert m.provenance == {"exporter": "reactantserver 0.1.0"}


def test_an_unbatched_model_has_fixed_shapes() -> None:
    text = MLP.replace("[-1, 32]", "[4, 32]").replace("[-1, 10]", "[4, 10]")
    text = text.replace("compiled_batch_sizes: [32, 1, 8]", "compiled_batch_sizes: []")
    m = parse_manifest("mlp", text, has_model_py=False)
    assert not m.batched and m.max_batch_size == 0
    assert m.inputs[0].shape == (4, 32)


def test_a_meta_manifest() -> None:
    text = """\
format_version: "1"
kind: meta
calls: [detector, classifier]
client_inputs:
  - {name: image, datatype: BYTES, shape: [-1]}
client_outputs:
  - {name: boxes, datatype: FP32, shape: [-1, 4]}
"""
    m = parse_manifest("pipeline", text, has_model_py=True)
    assert m.kind == "meta"
    assert m.calls == ("detector", "classifier")
    assert m.inputs == () and m.artifact is None and m.weights is None
    assert m.effective_client_inputs[0].datatype == "BYTES"


@pytest.mark.parametrize(
    ("text", "has_model_py", "problems"),
    [
        (
            "",
            False,
            (
                "manifest.yaml:1: the file is empty; expected a mapping with format_version, kind, ...",
            ),
        ),
        (
            "- 1\n- 2\n",
            False,
            ("manifest.yaml:1: expected a mapping, got a list",),
        ),
        (
            "kind: model\n",
            False,
            (
                "manifest.yaml:1: format_version: required key is missing (expected 1)",
                "manifest.yaml:1: inputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
            ),
        ),
        (
            "format_version: true\n",
            False,
            (
                "manifest.yaml:1: format_version: expected 1, got True",
                "manifest.yaml:1: inputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
            ),
        ),
        (
            "format_version: 1\nkind: job\n",
            False,
            ("manifest.yaml:2: kind: expected one of model, meta, got 'job'",),
        ),
        (
            "format_version: 1\nkind: meta\ncalls: []\n",
            False,
            (
                "manifest.yaml:1: client_inputs: required key is missing (a kind: meta bundle declares its tensors)",
                "manifest.yaml:1: client_outputs: required key is missing (a kind: meta bundle declares its tensors)",
                "manifest.yaml:2: kind: a kind: meta bundle needs a model.py (none found)",
            ),
        ),
        (
            "format_version: 1\nkind: meta\nclient_outputs: []\n",
            True,
            (
                "manifest.yaml:1: client_inputs: required key is missing (a kind: meta bundle declares its tensors)",
                "manifest.yaml:3: client_outputs: expected at least one tensor, got an empty list",
            ),
        ),
        (
            "format_version: 1\nkind: meta\ninputs: []\n",
            True,
            (
                "manifest.yaml:1: client_inputs: required key is missing (a kind: meta bundle declares its tensors)",
                "manifest.yaml:1: client_outputs: required key is missing (a kind: meta bundle declares its tensors)",
                "manifest.yaml:3: inputs: not allowed in a kind: meta bundle",
            ),
        ),
        (
            "format_version: 1\ncalls: [a]\n",
            False,
            (
                "manifest.yaml:1: inputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: calls: not allowed in a kind: model bundle",
            ),
        ),
        (
            "format_version: 1\nkind: meta\ncalls: [m]\nclient_inputs: [{name: x, datatype: FP32, shape: [1]}]\nclient_outputs: [{name: y, datatype: FP32, shape: [1]}]\n",
            True,
            ("manifest.yaml:3: calls[0]: a meta model cannot call itself",),
        ),
        (
            "format_version: 1\ninputs: []\noutputs: []\n",
            False,
            (
                "manifest.yaml:2: inputs: expected at least one tensor, got an empty list",
                "manifest.yaml:3: outputs: expected at least one tensor, got an empty list",
            ),
        ),
        (
            "format_version: 1\ninputs: x\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs: expected a list of tensors ({name, datatype, shape}), got 'x'",
            ),
        ),
        (
            "format_version: 1\ninputs: [{name: x, datatype: FP32}]\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs[0].shape: required key is missing",
            ),
        ),
        (
            "format_version: 1\ninputs: [{name: x, datatype: FP32, shape: [2], dims: 1}]\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs[0].dims: unknown key; expected one of name, datatype, shape",
            ),
        ),
        (
            "format_version: 1\ninputs: [{name: x, datatype: FP32, shape: [0]}]\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs[0].shape[0]: expected a positive extent or -1, got 0",
            ),
        ),
        (
            "format_version: 1\ninputs: [{name: x, datatype: FP32, shape: [-1]}]\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs[0].shape[0]: -1 needs batching.compiled_batch_sizes (this bundle is unbatched, so every axis of an executable tensor is fixed)",
            ),
        ),
        (
            "format_version: 1\ninputs: [{name: x, datatype: FP32, shape: [2]}, {name: x, datatype: FP32, shape: [2]}]\n",
            False,
            (
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: inputs[1].name: duplicate tensor name 'x'",
            ),
        ),
        (
            "format_version: 1\nartifact: ../elsewhere.bin\ninputs: [{name: x, datatype: FP32, shape: [2]}]\noutputs: [{name: y, datatype: FP32, shape: [2]}]\n",
            False,
            (
                "manifest.yaml:2: artifact: expected a file name inside the bundle directory, got '../elsewhere.bin'",
            ),
        ),
        (
            "format_version: 1\nbatching: {compiled_batch_sizes: [true]}\n",
            False,
            (
                "manifest.yaml:1: inputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: batching.compiled_batch_sizes[0]: expected a positive integer, got True",
            ),
        ),
        (
            "format_version: 1\nprovenance: [a]\n",
            False,
            (
                "manifest.yaml:1: inputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:1: outputs: required key is missing (the executable's tensors, in argument order)",
                "manifest.yaml:2: provenance: expected a mapping, got a list",
            ),
        ),
    ],
)
def test_invalid_manifests_are_refused_exactly(
    text: str, has_model_py: bool, problems: tuple[str, ...]
) -> None:
    """Every problem of a manifest, each once, in file order, with its line: a missing
    key at the line of the mapping that lacks it."""
    assert _error(text, has_model_py=has_model_py).splitlines() == [
        f"bundle 'm': {p}" for p in problems
    ]


def test_batched_client_tensors_need_the_batch_axis() -> None:
    text = MLP + "client_inputs:\n  - {name: image, datatype: BYTES, shape: [3]}\n"
    assert _error(text, has_model_py=True) == (
        "bundle 'm': manifest.yaml:14: client_inputs[0].shape: expected -1 on axis 0 (the batch "
        "axis) because batching.compiled_batch_sizes is set, got [3]"
    )


def test_client_tensors_may_have_variable_axes_and_bytes() -> None:
    text = MLP + "client_inputs:\n  - {name: image, datatype: BYTES, shape: [-1, -1]}\n"
    m = parse_manifest("m", text, has_model_py=True)
    assert m.client_inputs == (TensorSpec("image", "BYTES", (-1, -1)),)


@given(bundle_manifest_data())
@settings(max_examples=150, deadline=None)
def test_valid_manifests_parse_and_round_trip_through_yaml(
    case: tuple[dict[str, Any], bool],
) -> None:
    """Every manifest the rules allow parses, and dumping then re-parsing it is lossless."""
    data, has_model_py = case
    manifest = manifest_from_data("m", data, has_model_py=has_model_py)
    again = parse_manifest("m", dump_manifest(manifest), has_model_py=has_model_py)
    assert again == manifest


def _mutations(data: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Replace, delete or add one key anywhere in the manifest."""

    def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [prefix] if prefix else []
        if isinstance(node, dict):
            for k, v in node.items():
                out += paths(v, (*prefix, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += paths(v, (*prefix, i))
        return out

    @st.composite
    def mutate(draw: st.DrawFn) -> dict[str, Any]:
        d = copy.deepcopy(data)
        path = draw(st.sampled_from(paths(d)))
        parent: Any = d
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(bundle_yaml_junk)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(bundle_yaml_junk)
        return d

    return mutate()


@given(bundle_manifest_data().flatmap(lambda c: st.tuples(_mutations(c[0]), st.just(c[1]))))
@settings(max_examples=300, deadline=None)
def test_any_corruption_is_a_bundle_error_or_a_valid_manifest(
    case: tuple[dict[str, Any], bool],
) -> None:
    """Whatever one edit does to a manifest, parsing never fails with anything but a
    BundleError naming manifest.yaml (no KeyError, TypeError, ... leaks to the scanner)."""
    data, has_model_py = case
    try:
        manifest_from_data("m", data, has_model_py=has_model_py)
    except BundleError as exc:
        assert str(exc).startswith("bundle 'm': manifest.yaml: ")


def test_every_problem_of_a_manifest_is_reported_at_once() -> None:
    """The issue's manifest: an unknown key and two bad datatypes are one load's report
    (it used to take three edits and three loads to see them), each with its line and,
    where a known name is close, what was probably meant."""
    text = """\
format_version: 1
kind: model
compiled_batch_size: [1, 4]
inputs:
  - {name: x, datatype: FP23, shape: [-1, 16]}
  - {name: y, datatype: FP32, shape: [-1, 16]}
outputs:
  - {name: z, datatype: float, shape: [-1, 16]}
batching: {compiled_batch_sizes: [1, 4]}
"""
    types = "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16"
    assert _error(text).splitlines() == [
        "bundle 'm': manifest.yaml:3: compiled_batch_size: unknown key; expected one of "
        "format_version, kind, name, description, inputs, outputs, client_inputs, "
        "client_outputs, batching, artifact, weights, provenance, calls",
        f"bundle 'm': manifest.yaml:5: inputs[0].datatype: expected one of {types}, got "
        "'FP23' (did you mean 'FP32'?)",
        f"bundle 'm': manifest.yaml:8: outputs[0].datatype: expected one of {types}, got 'float'",
    ]
    fixed = text.replace("compiled_batch_size: [1, 4]\n", "").replace("FP23", "FP32")
    assert parse_manifest("m", fixed.replace("float", "FP32"), has_model_py=False).batched


@given(
    bundle_manifest_data().flatmap(
        lambda case: st.tuples(
            st.just(case),
            st.sets(
                st.sampled_from(
                    [
                        (key, i)
                        for key in ("inputs", "outputs", "client_inputs", "client_outputs")
                        for i in range(len(case[0].get(key) or []))
                    ]
                ),
                min_size=1,
            ),
        )
    )
)
@settings(max_examples=100, deadline=None)
def test_each_bad_datatype_is_reported_once_whatever_else_is_bad(
    drawn: tuple[tuple[dict[str, Any], bool], set[tuple[str, int]]],
) -> None:
    """However many tensors of a valid manifest get a datatype no server knows, the load
    reports each of them -- one line per tensor, naming its key path -- and nothing else."""
    (data, has_model_py), broken = drawn
    data = copy.deepcopy(data)
    for key, i in broken:
        data[key][i]["datatype"] = "NOPE"
    with pytest.raises(BundleError) as info:
        manifest_from_data("m", data, has_model_py=has_model_py)
    lines = str(info.value).splitlines()
    assert len(lines) == len(broken)
    for key, i in broken:
        assert sum(f"manifest.yaml: {key}[{i}].datatype: expected one of" in x for x in lines) == 1

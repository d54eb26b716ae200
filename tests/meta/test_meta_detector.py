"""The worked example: the two-stage detector served as one meta model.

``examples/detector/build.py`` writes its three bundles once per module. The server's
answer over gRPC is compared with the same glue (the bundle's own ``model.py``
``pipeline``) run in-process against the same compiled stages, called the way the
worker calls them (zero-padded to the smallest compiled batch size that holds the
rows): same programs, same inputs, hence bit-identical.

The glue's numpy parts (non-maximum suppression, crops) are checked on their own with
Hypothesis: they are what a meta bundle author writes, and they are easy to get subtly
wrong.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from conftest import EXAMPLES, load_file
from hypothesis import given
from hypothesis import strategies as st
from strategies import detector_proposals

DETECTOR = EXAMPLES / "detector"


#: The meta bundle's model.py (plain numpy: importable without JAX).
glue = load_file("reactantserver_example_detector_glue", DETECTOR / "detector" / "model.py")


# ---------------------------------------------------------------------------- the glue


def _order(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    candidates = np.flatnonzero(scores >= threshold)
    return [int(i) for i in candidates[np.argsort(-scores[candidates], kind="stable")]]


@given(detector_proposals(), st.sampled_from([0.0, 0.25, 0.5, 0.9]))
def test_select_is_greedy_nms(proposals: tuple[Any, Any], threshold: float) -> None:
    """Kept boxes pass the threshold, come best first, overlap each other by at most the
    IoU threshold, number at most TOP_K; and every candidate left out was suppressed by a
    better kept box (or TOP_K was reached)."""
    boxes, scores = proposals
    kept = [int(i) for i in glue.select(boxes, scores, threshold)]
    assert len(kept) == len(set(kept)) <= glue.TOP_K
    assert all(scores[i] >= threshold for i in kept)
    assert all(scores[a] >= scores[b] for a, b in itertools.pairwise(kept))
    for n, i in enumerate(kept):
        if n + 1 < len(kept):
            assert (glue.iou(boxes[i], boxes[kept[n + 1 :]]) <= glue.IOU_THRESHOLD).all()
    if len(kept) < glue.TOP_K:
        order = _order(boxes, scores, threshold)
        for c in order:
            if c in kept:
                continue
            better = [k for k in kept if order.index(k) < order.index(c)]
            assert better and (glue.iou(boxes[c], boxes[better]) > glue.IOU_THRESHOLD).any()


def test_crop_of_the_whole_image_samples_pixel_centres() -> None:
    image = np.random.default_rng(0).random((64, 64, 3), dtype=np.float32)
    boxes = np.array([[0, 0, 64, 64], [8, 16, 24, 48]], np.float32)
    crops = glue.crop(image, boxes)
    assert crops.shape == (2, glue.CROP, glue.CROP, 3) and crops.dtype == np.float32
    np.testing.assert_array_equal(crops[0], image[2::4, 2::4])
    np.testing.assert_array_equal(crops[1], image[8:24, 17:48:2])


# ---------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def detector_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = load_file("reactantserver_example_detector_build", DETECTOR / "build.py")
    out = tmp_path_factory.mktemp("detector") / "repo"
    assert build.build(out) == {
        "detector_backbone": "exported",
        "detector_classifier": "exported",
        "detector": "copied",
    }
    return out


@pytest.fixture(scope="module")
def served(detector_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from worker_harness import running_worker, worker_config

    config = worker_config(
        detector_repo, cache_dir=tmp_path_factory.mktemp("jaxcache"), metrics=False
    )
    with running_worker(config) as address:
        yield address


@pytest.fixture(scope="module")
def in_process(detector_repo: Path, zoo_runtime: Any) -> Any:
    """``infer(model, inputs)`` over the compiled stages, padded as the worker pads."""
    from reactantserver.bundle import load_bundle

    stages = {}
    for name in ("detector_backbone", "detector_classifier"):
        bundle = load_bundle(detector_repo / name)
        stages[name] = (
            bundle,
            zoo_runtime.load(bundle),
            zoo_runtime.to_device(bundle.read_weights()),
        )
    calls: list[tuple[str, int]] = []

    async def infer(model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        bundle, loaded, weights = stages[model]
        rows = len(next(iter(inputs.values())))
        size = min(s for s in bundle.compiled_batch_sizes if s >= rows)
        args = []
        for spec in bundle.inputs:
            arr = inputs[spec.name]
            pad = np.zeros((size - rows, *arr.shape[1:]), arr.dtype)
            args.append(np.concatenate([arr, pad]))
        outs = loaded.execute(args, weights)
        calls.append((model, size))
        return {s.name: o[:rows] for s, o in zip(bundle.outputs, outs, strict=True)}

    infer.calls = calls  # type: ignore[attr-defined]
    return infer


def _request(image: np.ndarray, threshold: float) -> list[Any]:
    import tritonclient.grpc as grpcclient

    a = grpcclient.InferInput("image", list(image.shape), "FP32")
    a.set_data_from_numpy(image)
    b = grpcclient.InferInput("score_threshold", [1], "FP32")
    b.set_data_from_numpy(np.array([threshold], np.float32))
    return [a, b]


OUTPUTS = ("boxes", "scores", "labels", "label_scores")


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "threshold"), [(0, 0.5), (1, 0.6), (2, 0.0), (3, 1.01)])
def test_the_detector_answers_what_the_pipeline_computes_in_process(
    served: Any, in_process: Any, seed: int, threshold: float
) -> None:
    import tritonclient.grpc as grpcclient

    image = np.random.default_rng(seed).random((64, 64, 3), dtype=np.float32)
    inputs = {"image": image, "score_threshold": np.array([threshold], np.float32)}
    want = trio.run(glue.pipeline, inputs, in_process)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    try:
        before = client.get_inference_statistics("detector_classifier").model_stats[0]
        result = client.infer("detector", _request(image, threshold))
        after = client.get_inference_statistics("detector_classifier").model_stats[0]
    finally:
        client.close()
    for name in OUTPUTS:
        got = result.as_numpy(name)
        assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
        np.testing.assert_array_equal(got, want[name])  # same programs: bit-identical
    detections = len(want["boxes"])
    assert detections <= glue.TOP_K
    if threshold > 1:
        assert detections == 0
        assert after.execution_count == before.execution_count  # stage two never called
    else:
        assert detections > 0
        assert after.inference_count - before.inference_count == detections  # one sub-call
        assert after.execution_count - before.execution_count == 1


def test_the_docs_quote_the_example_files_as_they_are() -> None:
    """Blocks marked ``<!-- meta-doc: PATH -->`` in docs/meta_models.md are PATH verbatim."""
    import re

    page = (EXAMPLES.parent / "docs" / "meta_models.md").read_text()
    quoted = re.findall(r"<!-- meta-doc: (\S+) -->\n```[a-z]*\n(.*?)```", page, re.S)
    assert quoted, "docs/meta_models.md quotes no example file"
    for path, body in quoted:
        assert (EXAMPLES.parent / path).read_text() == body, path

"""model.py of the ``detector`` meta bundle: the glue between the detector's two stages.

``run(inputs, ctx)`` is what the server calls for each request; it runs on the
request's own task, and each ``ctx.infer`` is a sub-call that goes through the
scheduler like any request (ahead of fresh work, with this request's deadline).

1. stage one, ``detector_backbone``: the image (as a batch of one) -> 64 candidate
   boxes with objectness scores;
2. glue, in numpy: drop boxes scoring below ``score_threshold``, greedy non-maximum
   suppression (IoU > 0.5 with a better box suppresses), keep the best ``TOP_K``, and
   cut each kept box out of the image, resized to 16x16 (nearest neighbour);
3. stage two, ``detector_classifier``: all crops in *one* sub-call (a batch of up to
   8 rows) -> logits; softmax -> label and its probability.

The glue is written against a plain ``infer(model, inputs)`` coroutine
(``pipeline``), so the very same code also runs in-process against the compiled
stages (the test that checks the server's answer does exactly that).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

TOP_K = 8
IOU_THRESHOLD = 0.5
CROP = 16

Infer = Callable[[str, Mapping[str, np.ndarray]], Awaitable[Mapping[str, np.ndarray]]]


async def run(inputs: dict[str, np.ndarray], ctx: Any) -> dict[str, np.ndarray]:
    return await pipeline(inputs, ctx.infer)


async def pipeline(inputs: Mapping[str, np.ndarray], infer: Infer) -> dict[str, np.ndarray]:
    image = inputs["image"]
    threshold = float(inputs["score_threshold"][0])
    proposals = await infer("detector_backbone", {"images": image[None]})
    boxes = proposals["boxes"][0]
    scores = proposals["scores"][0]
    keep = select(boxes, scores, threshold)
    boxes, scores = boxes[keep], scores[keep]
    if len(keep) == 0:  # nothing to classify: stage two is not called at all
        return {
            "boxes": boxes,
            "scores": scores,
            "labels": np.zeros(0, np.int32),
            "label_scores": np.zeros(0, np.float32),
        }
    logits = (await infer("detector_classifier", {"crops": crop(image, boxes)}))["logits"]
    probabilities = softmax(logits)
    labels = np.argmax(probabilities, axis=-1)
    return {
        "boxes": boxes,
        "scores": scores,
        "labels": labels.astype(np.int32),
        "label_scores": probabilities[np.arange(len(labels)), labels].astype(np.float32),
    }


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one ``[y0, x0, y1, x1]`` box with each of ``others``."""
    y0 = np.maximum(box[0], others[:, 0])
    x0 = np.maximum(box[1], others[:, 1])
    y1 = np.minimum(box[2], others[:, 2])
    x1 = np.minimum(box[3], others[:, 3])
    inter = np.clip(y1 - y0, 0, None) * np.clip(x1 - x0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0).astype(np.float32)


def select(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the kept boxes, best first: threshold, greedy NMS, at most ``TOP_K``."""
    candidates = np.flatnonzero(scores >= threshold)
    # Stable: equal scores keep anchor order, so the result is fully deterministic.
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    kept: list[int] = []
    while order.size and len(kept) < TOP_K:
        best = int(order[0])
        kept.append(best)
        rest = order[1:]
        order = rest[iou(boxes[best], boxes[rest]) <= IOU_THRESHOLD]
    return np.asarray(kept, dtype=np.int64)


def crop(image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Each box cut out of ``image`` [H, W, C] and resized to CROP x CROP (nearest)."""
    height, width = image.shape[:2]
    steps = (np.arange(CROP, dtype=np.float32) + np.float32(0.5)) / np.float32(CROP)
    ys = boxes[:, 0:1] + steps[None, :] * (boxes[:, 2:3] - boxes[:, 0:1])  # [n, CROP]
    xs = boxes[:, 1:2] + steps[None, :] * (boxes[:, 3:4] - boxes[:, 1:2])
    rows = np.clip(np.floor(ys).astype(np.int64), 0, height - 1)
    cols = np.clip(np.floor(xs).astype(np.int64), 0, width - 1)
    return np.ascontiguousarray(image[rows[:, :, None], cols[:, None, :]], dtype=np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (z / z.sum(axis=-1, keepdims=True)).astype(np.float32)

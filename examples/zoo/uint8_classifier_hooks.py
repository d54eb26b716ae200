"""model.py of the ``uint8_classifier`` bundle (copied there by the exporter).

Clients send raw 8-bit RGB images; the executable wants normalised float32. The
hooks run on the request's task in the server, in plain numpy:

* ``preprocess``: ``image`` UINT8 [n, 32, 32, 3] -> ``pixels`` FP32, scaled to [0, 1]
  and standardised per channel with the CIFAR-10 statistics;
* ``postprocess``: ``logits`` -> ``probabilities`` (softmax) and ``label`` (argmax).
"""

from __future__ import annotations

import numpy as np

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def preprocess(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    image = inputs["image"]
    pixels = (image.astype(np.float32) / np.float32(255.0) - MEAN) / STD
    return {"pixels": pixels.astype(np.float32)}


def postprocess(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    logits = outputs["logits"].astype(np.float32)
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return {
        "probabilities": (z / z.sum(axis=-1, keepdims=True)).astype(np.float32),
        "label": np.argmax(logits, axis=-1).astype(np.int32),
    }

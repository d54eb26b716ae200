"""model.py of the BYTES stand-ins ``simple_string`` and ``simple_identity`` (examples/triton).

``simple_string``: the client's ``INPUT0``/``INPUT1`` are BYTES elements holding decimal
integers; ``preprocess`` parses them into the INT32 tensors the program adds and
subtracts, ``postprocess`` writes the sums and differences back as decimal strings.

``simple_identity``: the program sees each element as one row of ``WIDTH + 1`` int32
values (its length, then its bytes, zero-padded) and returns the rows unchanged;
``postprocess`` cuts each element back to its length. An element longer than ``WIDTH``
bytes is refused (a ValueError here is the client's input refused: INVALID_ARGUMENT).

One ``model.py`` serves both: each hook looks at the tensor names it is given.
"""

from __future__ import annotations

import numpy as np

WIDTH = 64


def preprocess(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "INPUT1" in inputs:  # simple_string
        return {name: _numbers(inputs[name], name) for name in ("INPUT0", "INPUT1")}
    return {"ROWS": _rows(inputs["INPUT0"])}


def postprocess(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "ROWS_OUT" in outputs:  # simple_identity
        return {"OUTPUT0": _elements(outputs["ROWS_OUT"])}
    return {name: _strings(outputs[name]) for name in ("OUTPUT0", "OUTPUT1")}


def _numbers(elements: np.ndarray, name: str) -> np.ndarray:
    try:
        values = [int(bytes(e)) for e in elements.ravel()]
    except ValueError:
        raise ValueError(f"{name}: every element must be a decimal integer") from None
    return np.asarray(values, dtype=np.int32).reshape(elements.shape)


def _strings(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.shape, dtype=object)
    for index, value in np.ndenumerate(values):
        out[index] = str(int(value)).encode()
    return out


def _rows(elements: np.ndarray) -> np.ndarray:
    rows = np.zeros((*elements.shape, WIDTH + 1), dtype=np.int32)
    for index, element in np.ndenumerate(elements):
        data = bytes(element)
        if len(data) > WIDTH:
            raise ValueError(f"INPUT0: an element holds {len(data)} bytes, at most {WIDTH} fit")
        rows[index][0] = len(data)
        rows[index][1 : 1 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return rows


def _elements(rows: np.ndarray) -> np.ndarray:
    out = np.empty(rows.shape[:-1], dtype=object)
    for index in np.ndindex(out.shape):
        row = rows[index]
        out[index] = row[1 : 1 + int(row[0])].astype(np.uint8).tobytes()
    return out

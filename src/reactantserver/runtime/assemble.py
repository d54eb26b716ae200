"""Batch data assembly for executors: gather requests into one padded batch, split results.

Every tensor of a coalescable model is batched on axis 0 (the wire's row-major
order puts the batch first), so a batch of requests with ``r_1 .. r_k`` rows run at
compiled size ``B >= sum(r)`` is, for each input name::

    [ request 1 rows | request 2 rows | ... | request k rows | zero padding ]   (B rows)

``gather`` allocates the ``B``-row buffer once (uninitialised), copies each request
into its slice -- the only copy of the input data -- and zeroes just the padding
tail. A single request that already fills ``B`` is passed through without a copy.
``scatter`` cuts each output back into per-request *views* (no copy); the padding
rows are simply never looked at.

Inputs within one batch must agree on dtype and on every axis but the first: the
coalescing window only spans one ``group`` (shape variant), and the transport has
already validated each request against the manifest, so a mismatch here is a bug
upstream and raises ``ValueError`` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def request_rows(inputs: Mapping[str, np.ndarray]) -> int:
    """The batch extent of one request: axis 0 of its tensors, which must agree."""
    rows: int | None = None
    for a in inputs.values():  # a plain loop: every request asks once
        extent = a.shape[0] if a.ndim else -1
        if extent < 0 or (rows is not None and extent != rows):
            rows = -1
            break
        rows = extent
    if rows is None or rows < 0:
        extents = {name: a.shape[0] if a.ndim else -1 for name, a in inputs.items()}
        raise ValueError(f"every input needs the same leading (batch) axis; got {extents}")
    return rows


def gather(
    requests: Sequence[Mapping[str, np.ndarray]],
    size: int,
    rows: Sequence[int] | None = None,
) -> Mapping[str, np.ndarray]:
    """One ``size``-row array per input name: the requests' rows in order, zero-padded.
    ``rows``: each request's rows where the caller knows them (the executor: counted at
    admission by :func:`request_rows`), else counted here."""
    if not requests:
        raise ValueError("gather needs at least one request")
    if rows is None:
        rows = [request_rows(r) for r in requests]
    total = sum(rows)
    if total > size:
        raise ValueError(f"{total} rows do not fit in a batch of {size}")
    first = requests[0]
    if len(requests) == 1 and total == size:
        return first  # its own arrays, read only
    out: dict[str, np.ndarray] = {}
    for name, model in first.items():
        dtype, tail = model.dtype, model.shape[1:]
        arrays = []
        for index, inputs in enumerate(requests):
            array = inputs.get(name)
            if array is None:
                raise ValueError(f"request {index} of the batch has no input {name!r}")
            if array.dtype != dtype or array.shape[1:] != tail:
                raise ValueError(
                    f"input {name!r}: request {index} has {array.dtype}{list(array.shape)}, "
                    f"request 0 has {model.dtype}{list(model.shape)}; they cannot share a batch"
                )
            arrays.append(array)
        buf = np.empty((size, *tail), dtype=dtype)
        np.concatenate(arrays, out=buf[:total])  # one copy of every row, in one call
        if total < size:
            buf[total:] = 0
        out[name] = buf
    return out


def scatter(outputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Per-request views of each output: request ``i`` gets its ``rows[i]`` rows (a lone
    request whose outputs have exactly its rows gets them whole)."""
    if len(rows) == 1 and all(a.ndim and a.shape[0] == rows[0] for a in outputs.values()):
        return [dict(outputs)]
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] < total:
            raise ValueError(
                f"output {name!r} has shape {list(array.shape)}; "
                f"expected at least {total} rows on axis 0"
            )
    result: list[dict[str, np.ndarray]] = []
    offset = 0
    for n in rows:
        result.append({name: array[offset : offset + n] for name, array in outputs.items()})
        offset += n
    return result

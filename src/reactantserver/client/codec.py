"""ModelInfer tensors, client side: numpy arrays in, numpy arrays out, few copies.

Sans-IO: these functions turn arrays into the request of :mod:`.wire` and its response
back into arrays; :mod:`reactantserver.client.core` sends and receives them.

Requests
--------
Each input's datatype comes from its numpy dtype (``tensors.from_numpy_dtype``: ``object``,
``str`` and ``bytes`` arrays are BYTES). A fixed-width input travels in
``raw_input_contents`` as a ``memoryview`` of the C-contiguous array: it is not copied
until :mod:`.wire` joins the message, once. BYTES inputs are length-prefixed with
``tensors.serialize_bytes``. An input placed in shared memory carries only the region's
name, offset and byte size.

Responses
---------
:mod:`.wire` leaves each ``raw_output_contents`` entry as a ``memoryview`` slice of the
received buffer, and :func:`decode_outputs` views it with
``np.frombuffer(...).reshape(shape)``: an output costs no copy after the socket read, and
is read-only. Outputs the server wrote into a shared-memory region are numpy views on
that region (writable, valid until the region is reused). Output ``i`` owns raw entry
``i`` (the Triton convention, which this server follows, keeping an empty entry for a
shared-memory output); a response with fewer entries is read the original system's way,
one entry per inline output in order.

A response that contradicts itself (bytes that do not match the shape, a malformed
message) is the server's fault and raises ``ExecutionFailed`` (INTERNAL), naming the
output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from reactantserver import tensors
from reactantserver.errors import ExecutionFailed, InvalidArgument

from .coerce import as_array
from .wire import (
    InferRequestWire,
    InferResponseWire,
    InputWire,
    OutputWire,
    ParamValue,
    RequestedOutputWire,
)

# Parameter names of the system shared-memory data plane (as in reactantserver.inferio).
SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"


@attrs.frozen
class Placement:
    """A window of a registered shared-memory region holding (or receiving) one tensor."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, ParamValue]:
        return {SHM_REGION: self.region, SHM_OFFSET: self.offset, SHM_BYTE_SIZE: self.byte_size}


# ------------------------------------------------------------------------------ inputs


def wire_array(name: str, value: Any) -> tuple[str, np.ndarray]:
    """``(datatype, array)`` for an input value: C-contiguous, native byte order."""
    arr = as_array(name, value)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    try:
        datatype = tensors.from_numpy_dtype(arr.dtype)
    except InvalidArgument as exc:
        raise InvalidArgument(f"input {name!r}: {exc}") from None
    if datatype != "BYTES" and not arr.flags.c_contiguous:
        # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
        arr = arr.copy(order="C")
    return datatype, arr


def tensor_bytes(datatype: str, arr: np.ndarray) -> bytes | memoryview:
    """The raw-contents encoding of ``arr``: a view of its buffer (BYTES: encoded)."""
    if datatype == "BYTES":
        return tensors.serialize_bytes(arr.reshape(-1))
    # reshape(-1) of a C-contiguous array is a view; the uint8 view makes len() == nbytes
    # and works for every dtype, ml_dtypes' bfloat16 included.
    return arr.reshape(-1).view(np.uint8).data


def encode_request(
    model: str,
    inputs: Mapping[str, Any],
    *,
    outputs: Sequence[str] | None = None,
    request_id: str = "",
    input_placements: Mapping[str, Placement] | None = None,
    output_placements: Mapping[str, Placement] | None = None,
) -> InferRequestWire:
    """The ModelInferRequest for ``inputs`` (name -> array-like).

    Inputs named in ``input_placements`` are sent as shared-memory references (their
    bytes must already be in the region); the others inline. ``outputs`` names the
    outputs to return, in order (``None``: all of them, in the model's order); those in
    ``output_placements`` are written by the server into the region.
    """
    in_shm = input_placements or {}
    out_shm = output_placements or {}
    request = InferRequestWire(model, id=request_id)
    for name, value in inputs.items():
        placement = in_shm.get(name)
        datatype, arr = wire_array(name, value)
        if placement is not None:
            request.inputs.append(InputWire(name, datatype, arr.shape, placement.parameters()))
            continue
        request.inputs.append(InputWire(name, datatype, arr.shape))
        request.raw.append(tensor_bytes(datatype, arr))
    if outputs is None and out_shm:
        raise ValueError("output placements need the outputs named explicitly")
    for name in outputs or ():
        placement = out_shm.get(name)
        request.outputs.append(
            RequestedOutputWire(name, placement.parameters() if placement is not None else None)
        )
    return request


# ----------------------------------------------------------------------------- outputs


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def array_from_bytes(
    datatype: str, shape: Sequence[int], data: bytes | memoryview, *, where: str
) -> np.ndarray:
    """View ``data`` as a tensor of ``datatype`` and ``shape`` (BYTES: decoded)."""
    try:
        count = tensors.element_count(shape, what=where)
        if datatype == "BYTES":
            return tensors.deserialize_bytes(data, count, what=where).reshape(shape)
        dtype = tensors.to_numpy_dtype(datatype)
    except InvalidArgument as exc:
        raise ExecutionFailed(f"the server's answer is unreadable: {exc}") from None
    nbytes = data.nbytes if isinstance(data, memoryview) else len(data)
    if nbytes != count * dtype.itemsize:
        raise ExecutionFailed(
            f"{where}: the server sent {nbytes} bytes for shape {_shape_text(shape)} of "
            f"{datatype} ({count * dtype.itemsize} expected)"
        )
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)


def _from_typed(tensor: OutputWire, where: str) -> np.ndarray:
    field = tensors.TYPED_CONTENTS_FIELD.get(tensor.datatype)
    shape = tuple(tensor.shape)
    values = getattr(tensor.contents, field) if field is not None and tensor.contents else []
    try:
        count = tensors.element_count(shape, what=where)
    except InvalidArgument as exc:
        raise ExecutionFailed(f"the server's answer is unreadable: {exc}") from None
    if field is None or len(values) != count:
        raise ExecutionFailed(f"{where}: the server sent no readable contents")
    if tensor.datatype == "BYTES":
        arr = np.empty(len(values), dtype=object)
        arr[:] = [bytes(v) for v in values]
        return arr.reshape(shape)
    return np.asarray(values, dtype=tensors.to_numpy_dtype(tensor.datatype)).reshape(shape)


#: Reads an output the server wrote at a placement: ``(placement, datatype, shape)``.
ShmReader = Callable[[Placement, str, Sequence[int]], np.ndarray]


def _placement(tensor: OutputWire, where: str) -> Placement:
    region = tensor.parameters.get(SHM_REGION)
    offset = tensor.parameters.get(SHM_OFFSET, 0)
    size = tensor.parameters.get(SHM_BYTE_SIZE)
    if not isinstance(region, str) or type(offset) is not int or type(size) is not int:
        raise ExecutionFailed(f"{where}: incomplete shared-memory parameters in the answer")
    return Placement(region, offset, size)


def decode_outputs(
    response: InferResponseWire, *, read_shm: ShmReader | None = None
) -> dict[str, np.ndarray]:
    """Output name -> array, in the order the server answered."""
    raw = response.raw
    aligned = len(raw) == len(response.outputs)
    next_inline = 0
    out: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(response.outputs):
        where = f"model {response.model_name!r}: output {tensor.name!r}"
        shape = tuple(tensor.shape)
        if SHM_REGION in tensor.parameters:
            if read_shm is None:
                raise ExecutionFailed(f"{where}: answered in shared memory, but none was offered")
            out[tensor.name] = read_shm(_placement(tensor, where), tensor.datatype, shape)
            continue
        index = i if aligned else next_inline
        next_inline += 1
        if index < len(raw):
            out[tensor.name] = array_from_bytes(tensor.datatype, shape, raw[index], where=where)
        else:
            out[tensor.name] = _from_typed(tensor, where)
    return out


def output_nbytes(datatype: str, shape: Sequence[int]) -> int | None:
    """Bytes of a fixed-width output of ``shape``; ``None`` when that cannot be known."""
    if datatype == "BYTES" or any(d < 0 for d in shape):
        return None
    try:
        return tensors.byte_size(datatype, shape)
    except InvalidArgument:
        return None

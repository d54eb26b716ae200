"""Request I/O for ModelInfer: decode and validate a request, encode its response.

JAX-free and sans-IO: the functions here are given the request, the model's
client-facing ``TensorSpec``\\ s, the shared-memory registry and the current time, and
return plain values. Nothing is queued until :func:`decode_request` has returned, so
every request that reaches the scheduler is well formed.

Requests and responses are the lean records of :mod:`reactantserver.records` (the
codec, :mod:`reactantserver.protocol.codec`, decodes ModelInfer bytes straight into
them, and writes the response record straight to bytes): parameters are plain values,
raw contents are ``memoryview`` slices of the received buffer. A betterproto ``ModelInferRequest`` (tests, direct
callers) is accepted too and goes through the same codec first, so both are validated
by exactly the same code.

Where an input's bytes come from (per tensor, in this order of precedence)
--------------------------------------------------------------------------
1. **System shared memory**: the tensor's parameters name a registered region
   (``shared_memory_region``, string), an offset inside it (``shared_memory_offset``,
   int64, default 0) and a byte count (``shared_memory_byte_size``, int64, required).
   The bytes are read (after the byte count is checked against the shape) into a buffer
   the server owns: one copy, the price of never mapping a file the client can truncate
   (see :mod:`reactantserver.shm`).
2. **raw_input_contents**: one entry per input that is *not* in shared memory, in the
   order of ``inputs``; either every such input has an entry or none does (Triton's
   rule). Viewed with ``np.frombuffer`` over the received message: no copy at all.
3. **Typed contents** (``contents.fp32_contents`` ...), the list chosen by the datatype;
   FP16 and BF16 have none and must come raw or through shared memory.

BYTES tensors are decoded from the KServe length-prefixed encoding in cases 1 and 2,
from ``contents.bytes_contents`` in case 3.

Validation (every failure is ``InvalidArgument`` unless noted; messages start with
``model 'NAME': input 'X':`` and say what was expected and what arrived)
------------------------------------------------------------------------------------
unknown or duplicated inputs, missing inputs, datatype, rank (at most :data:`MAX_RANK`;
then the declared rank), negative extents, fixed extents (``-1`` in the declaration
matches any extent), byte counts against the shape (computed overflow-safe with
``tensors.byte_size``), typed contents beside ``raw_input_contents`` (checked first, in
Triton's words), raw contents all-or-none, typed contents element count, field
and integer range, shared-memory parameter types and bounds (an unknown region is
``FailedPrecondition``), unknown or duplicated requested outputs, unsupported
parameters (``classification``, sequence batching), negative timeouts.

A request of a layout the codec knows (``codec.Layout``: the same bytes but for the raw
contents) whose checks depend on nothing else -- no parameters anywhere, every input
raw and fixed-width -- is checked once per model version: the layout keeps the result
(the inputs' names, dtypes and shapes, the outputs), and a later request of it gets its
arrays viewed at those shapes with no check repeated, since none could come out
otherwise (``tests/worker/test_inferio.py`` holds the two paths to the same calls and
the same refusals).

The deadline
------------
The request's deadline is the earliest of the gRPC deadline (given, already converted to
an absolute ``trio.current_time()`` value), ``now`` + the ``timeout`` parameter (int64
microseconds: what ``tritonclient`` sends for ``infer(..., timeout=)``) and ``now`` +
the ``reactant_timeout_ns`` parameter (int64 nanoseconds, the original system's name).
Zero means "no timeout", as in Triton. The scheduler's EDF discipline reads it.

Outputs
-------
Outputs are returned in the order requested (all of the model's, in declaration order,
when none are requested). An output with shared-memory parameters is written in place
into the region, echoed with ``shared_memory_byte_size`` set to the bytes written, and
gets an *empty* entry in ``raw_output_contents``: Triton keeps one raw entry per output
so that entry ``i`` belongs to output ``i``, and ``tritonclient`` indexes them that way
(leaving the entry out, as the original system did, shifts every later inline output
onto the wrong bytes). Its region is checked at decode time and again when the result is
written (it may have been unregistered, or its object changed, meanwhile: then
FAILED_PRECONDITION). Every other output is
handed to the codec as a ``memoryview`` of the (C-contiguous) result array, so writing
the response message is its one copy. A model returning a missing output, a
wrong dtype or a shape outside its declaration is a server bug, reported as
``ExecutionFailed`` (INTERNAL) with a message naming the output.

Why one module of this size: decoding and encoding one RPC share the tensor checks and
the shared-memory rules, and every check has its own precise message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import attrs
import numpy as np

from reactantserver import tensors
from reactantserver.bundle.manifest import TensorSpec
from reactantserver.errors import BatchTooLarge, ExecutionFailed, InvalidArgument, quoted
from reactantserver.protocol import inference as pb
from reactantserver.protocol.codec import from_message
from reactantserver.records import (
    InferRequest,
    InferResponse,
    OutputTensor,
    ParamValue,
    TensorContents,
)
from reactantserver.shm import SharedMemoryRegistry

#: Highest tensor rank accepted from the wire (numpy's own limit is 64).
MAX_RANK = 32

#: Request parameter read by tritonclient's ``timeout=``: int64 microseconds.
PARAM_TIMEOUT_US = "timeout"
#: Request parameter of the original system: int64 nanoseconds, relative.
PARAM_TIMEOUT_NS = "reactant_timeout_ns"
SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"
#: Request parameters of Triton features this server does not have.
_SEQUENCE_PARAMS = ("sequence_id", "sequence_start", "sequence_end")

_ALL_TYPED_FIELDS = tuple(dict.fromkeys(tensors.TYPED_CONTENTS_FIELD.values()))
#: Typed lists whose wire type is wider than some datatypes using them.
_NARROWED = {"INT8", "INT16", "UINT8", "UINT16"}


@attrs.frozen
class ShmTarget:
    """A window of a registered shared-memory region named by a tensor's parameters."""

    region: str
    offset: int
    byte_size: int


@attrs.frozen
class RequestedOutput:
    """One output to return: its declaration and, optionally, where to write it."""

    spec: TensorSpec
    shm: ShmTarget | None = None


@attrs.frozen(eq=False)
class InferCall:
    """A decoded, validated ModelInfer request, ready to be queued."""

    model: str
    #: The request's ``id``, echoed in the response.
    id: str
    #: Input name -> array of the declared dtype and a shape inside the declaration.
    inputs: Mapping[str, np.ndarray]
    #: What to return, in the order to return it.
    outputs: tuple[RequestedOutput, ...]
    #: Absolute ``trio.current_time()`` by which the answer is due; ``inf`` for none.
    deadline: float
    #: Whose shared-memory regions it names (its outputs are written there too).
    owner: str = ""

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple([o.spec.name for o in self.outputs])


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _names(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(s.name for s in specs)


# ------------------------------------------------------------------------------ parameters


#: The protocol's name for each plain parameter type (int covers int64 and uint64).
_KIND: dict[type, str] = {
    bool: "bool_param",
    int: "int64_param",
    str: "string_param",
    float: "double_param",
}


def _kind(value: ParamValue) -> str:
    return "no value" if value is None else _KIND[type(value)]


#: The types :func:`_param` reads.
_P = TypeVar("_P", int, str)


def _param(params: Mapping[str, ParamValue], key: str, kind: type[_P], where: str) -> _P | None:
    """Parameter ``key`` of type ``kind`` (None when absent); any other type is refused."""
    if key not in params:
        return None
    value = params[key]
    # bool is an int subclass in Python, but a different parameter on the wire.
    if type(value) is not kind:
        name = _KIND[kind]
        article = "an" if name[0] in "aeiou" else "a"
        raise InvalidArgument(
            f"{where}: parameter {quoted(key)} must be {article} {name}, got {_kind(value)}"
        )
    return value


def _shm_target(params: Mapping[str, ParamValue], where: str) -> ShmTarget | None:
    if not params:
        return None  # the usual case: a tensor sent inline, without parameters
    region = _param(params, SHM_REGION, str, where)
    offset = _param(params, SHM_OFFSET, int, where)
    size = _param(params, SHM_BYTE_SIZE, int, where)
    if region is None:
        if offset is not None or size is not None:
            raise InvalidArgument(
                f"{where}: {SHM_OFFSET}/{SHM_BYTE_SIZE} given without {SHM_REGION}"
            )
        return None
    if size is None:
        raise InvalidArgument(f"{where}: {SHM_REGION} {quoted(region)} needs {SHM_BYTE_SIZE}")
    offset = 0 if offset is None else offset
    if offset < 0 or size < 0:
        raise InvalidArgument(
            f"{where}: shared memory offset and byte size must be >= 0 "
            f"(got offset={offset}, byte_size={size})"
        )
    return ShmTarget(region, offset, size)


def request_deadline(
    params: Mapping[str, ParamValue], where: str, *, now: float, deadline: float
) -> float:
    """The earliest of ``deadline`` and the request's timeout parameters, absolute."""
    if not params:
        return deadline
    for key, unit in ((PARAM_TIMEOUT_US, 1e-6), (PARAM_TIMEOUT_NS, 1e-9)):
        value = _param(params, key, int, where)
        if value is None or value == 0:
            continue
        if value < 0:
            raise InvalidArgument(f"{where}: parameter {quoted(key)} must be >= 0, got {value}")
        deadline = min(deadline, now + value * unit)
    return deadline


# ---------------------------------------------------------------------------------- inputs


def _check_shape(spec: TensorSpec, shape: Sequence[int], where: str) -> None:
    if len(shape) > MAX_RANK:
        raise InvalidArgument(f"{where}: rank {len(shape)} exceeds the limit of {MAX_RANK}")
    # Bound the extents themselves, not only their product: an empty tensor such as
    # [0, 2**62] holds nothing, yet numpy (rightly) refuses to create it. (One pass for
    # both; at most MAX_RANK extents, so the product stays small enough to compute.)
    extent = 1
    negative = False
    for d in shape:
        if d > 1:
            extent *= d
        elif d < 0:
            negative = True
    if negative:
        raise InvalidArgument(f"{where}: shape {_shape_text(shape)} has a negative extent")
    if not tensors.shape_matches(spec.shape, shape):
        raise InvalidArgument(
            f"{where}: expected shape {_shape_text(spec.shape)}, got {_shape_text(shape)}"
        )
    if extent > tensors.MAX_BYTES:
        raise InvalidArgument(f"{where}: shape {_shape_text(shape)} is too large")


def _from_typed(
    spec: TensorSpec, contents: TensorContents, shape: tuple[int, ...], where: str
) -> np.ndarray:
    field = tensors.TYPED_CONTENTS_FIELD.get(spec.datatype)
    if field is None:
        raise InvalidArgument(
            f"{where}: {spec.datatype} has no typed contents field; "
            "send it in raw_input_contents or shared memory"
        )
    others = [f for f in _ALL_TYPED_FIELDS if f != field and getattr(contents, f)]
    if others:
        raise InvalidArgument(
            f"{where}: datatype {spec.datatype} takes contents.{field}, "
            f"got contents.{', contents.'.join(others)}"
        )
    values = getattr(contents, field)
    count = tensors.element_count(shape, what=where)
    if len(values) != count:
        raise InvalidArgument(
            f"{where}: contents.{field} holds {len(values)} elements, "
            f"shape {_shape_text(shape)} needs {count}"
        )
    if spec.datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = [bytes(v) for v in values]
        return arr.reshape(shape)
    dtype = spec.numpy_dtype
    if spec.datatype in _NARROWED and count:
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidArgument(
                f"{where}: contents.{field} holds values outside the range of {spec.datatype} "
                f"[{info.min}, {info.max}]"
            )
        return wide.astype(dtype).reshape(shape)
    return np.asarray(values, dtype=dtype).reshape(shape)


def _from_buffer(
    spec: TensorSpec,
    buf: bytes | memoryview | np.ndarray,
    shape: tuple[int, ...],
    where: str,
    *,
    shm: bool,
) -> np.ndarray:
    """View ``buf`` as the tensor (fixed width: no copy; BYTES: decoded elements)."""
    have = len(buf) if isinstance(buf, bytes) else buf.nbytes
    if spec.datatype != "BYTES":
        dtype = spec.numpy_dtype
        if tensors.element_count(shape, what=where) * dtype.itemsize != have:
            _check_byte_size(spec, shape, have, where, shm=shm)  # says what is wrong
        return np.frombuffer(buf, dtype=dtype).reshape(shape)
    # BYTES: elements of their own lengths.
    source = "shared memory" if shm else "raw contents"
    count = tensors.element_count(shape, what=where)
    # Every element takes at least its 4-byte length: check before allocating the
    # object array, whose size the (hostile) shape alone would otherwise decide.
    if count > have // 4:
        raise InvalidArgument(
            f"{where}: {source} hold {have} bytes, too few for {count} BYTES elements "
            "(each needs a 4-byte length)"
        )
    data = buf.data if isinstance(buf, np.ndarray) else buf
    return tensors.deserialize_bytes(data, count, what=f"{where}: {source}").reshape(shape)


def _check_byte_size(
    spec: TensorSpec, shape: tuple[int, ...], have: int, where: str, *, shm: bool
) -> None:
    need = tensors.byte_size(spec.datatype, shape, what=where)
    if have != need:
        got = f"{SHM_BYTE_SIZE} is {have}" if shm else f"raw contents hold {have} bytes"
        raise InvalidArgument(
            f"{where}: {got}, shape {_shape_text(shape)} of {spec.datatype} needs {need}"
        )


def decode_request(
    request: InferRequest | pb.ModelInferRequest,
    *,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    registry: SharedMemoryRegistry,
    now: float,
    deadline: float = math.inf,
    owner: str = "",
    batch_sizes: Sequence[int] = (),
) -> InferCall:
    """Validate ``request`` against the model's client-facing tensors and decode it.

    ``now`` and ``deadline`` are ``trio.current_time()`` values: the arrival time and
    the gRPC deadline (``inf`` when the client set none). ``owner``: whose shared-memory
    regions the request may name (the caller's; :mod:`reactantserver.shm`).
    ``batch_sizes``: a batched model's compiled sizes, so that an input in shared memory
    with more rows than the largest is refused before a byte of it is read (empty: no
    batch axis to check).
    """
    if not isinstance(request, InferRequest):
        request = from_message(request)
    layout = request.layout
    if layout is not None:  # a layout seen before (codec.Layout): checked already?
        known: _Checked | None = layout.checked.get(id(inputs))
        if (
            known is not None
            and known.inputs is inputs
            and known.outputs is outputs
            and known.batch_sizes == batch_sizes
        ):
            raw = request.raw_input_contents
            return InferCall(
                model=request.model_name,
                id=request.id,
                inputs={
                    name: np.frombuffer(raw[i], dtype=dtype).reshape(shape)
                    for i, (name, dtype, shape) in enumerate(known.arrays)
                },
                outputs=known.requested,
                deadline=deadline,
                owner=owner,
            )
    call = _decode_request(request, inputs, outputs, registry, now, deadline, owner, batch_sizes)
    if layout is not None and _checks_once(request):
        if len(layout.checked) >= _CHECKED_VERSIONS:
            layout.checked.clear()
        arrays = call.inputs
        layout.checked[id(inputs)] = _Checked(
            inputs,
            outputs,
            tuple(batch_sizes),
            tuple((t.name, arrays[t.name].dtype, arrays[t.name].shape) for t in request.inputs),
            call.outputs,
        )
    return call


class _Checked(NamedTuple):
    """What ``decode_request`` found of a layout against one model version."""

    #: The version's tensors and compiled sizes (the key; kept, so no id is reused).
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    batch_sizes: tuple[int, ...]
    #: Each raw input's name, dtype and shape, in the request's order.
    arrays: tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]
    #: The outputs to return.
    requested: tuple[RequestedOutput, ...]


#: Model versions one layout keeps its checks for (a reload makes a new one).
_CHECKED_VERSIONS = 8


def _checks_once(request: InferRequest) -> bool:
    """Whether what ``decode_request`` checks of ``request`` is a function of its layout
    and the model version alone: no parameters anywhere (timeouts, shared memory,
    sequence or classification settings), every input in the raw contents, none of them
    BYTES (their elements are decoded from the contents)."""
    if request.parameters or not request.raw_input_contents:
        return False
    for tensor in request.inputs:
        if tensor.parameters or tensor.contents is not None or tensor.datatype == "BYTES":
            return False
    return not any(wanted.parameters for wanted in request.outputs)


def _decode_request(
    request: InferRequest,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    registry: SharedMemoryRegistry,
    now: float,
    deadline: float,
    owner: str,
    batch_sizes: Sequence[int],
) -> InferCall:
    """``decode_request``'s checks, all of them, in order."""
    model = request.model_name
    prefix = f"model {quoted(model)}"
    if request.parameters:
        for key in _SEQUENCE_PARAMS:
            if key in request.parameters:
                raise InvalidArgument(
                    f"{prefix}: parameter {quoted(key)}: sequence batching is not supported"
                )
    due = request_deadline(request.parameters, prefix, now=now, deadline=deadline)

    declared = {s.name: s for s in inputs}
    raw = request.raw_input_contents
    if raw:
        inline = [t for t in request.inputs if SHM_REGION not in t.parameters]
        # Checked before the counts: a request that sends both kinds is told that, not
        # that its raw entries are one short (Triton's words, so its clients recognise it).
        for tensor in inline:
            if tensor.contents is not None:
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents "
                    f"for {tensor.name!r} for model {model!r}; send every inline input "
                    "in raw_input_contents, or every one in its typed contents"
                )
        if len(raw) != len(inline):
            raise InvalidArgument(
                f"{prefix}: raw_input_contents has {len(raw)} entries but {len(inline)} inputs "
                "are sent inline (not in shared memory); give every inline input an entry, "
                "or none"
            )
    next_raw = 0
    arrays: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        where = f"{prefix}: input {quoted(tensor.name)}"
        spec = declared.get(tensor.name)
        if spec is None:
            raise InvalidArgument(
                f"{where}: unknown input; the model's inputs are {_names(inputs)}"
            )
        if tensor.name in arrays:
            raise InvalidArgument(f"{where}: given more than once")
        if tensor.datatype != spec.datatype:
            raise InvalidArgument(
                f"{where}: expected datatype {spec.datatype}, got {tensor.datatype or 'none'}"
            )
        shape = tuple(tensor.shape)
        _check_shape(spec, shape, where)
        contents = tensor.contents
        target = _shm_target(tensor.parameters, where)
        if target is not None:
            if contents is not None:
                raise InvalidArgument(f"{where}: both contents and shared memory are set")
            if batch_sizes and shape and shape[0] > max(batch_sizes):
                # Before reading: the scheduler would refuse it after (issue 41: four such
                # requests on a sparse 256 MiB region read 1 GiB on the loop first).
                raise BatchTooLarge(model, shape[0], batch_sizes)
            if spec.datatype != "BYTES":
                # Check the size against the shape before reading anything.
                _check_byte_size(spec, shape, target.byte_size, where, shm=True)
            data = registry.read(target.region, target.offset, target.byte_size, owner)
            arrays[tensor.name] = _from_buffer(spec, data, shape, where, shm=True)
        elif raw:  # (contents is None: checked above)
            arrays[tensor.name] = _from_buffer(spec, raw[next_raw], shape, where, shm=False)
            next_raw += 1
        elif contents is not None:
            arrays[tensor.name] = _from_typed(spec, contents, shape, where)
        elif tensors.element_count(shape, what=where) == 0:
            arrays[tensor.name] = np.empty(shape, dtype=spec.numpy_dtype)
        else:
            raise InvalidArgument(
                f"{where}: no data; send raw_input_contents, contents or shared memory parameters"
            )
    missing = [s.name for s in inputs if s.name not in arrays]
    if missing:
        raise InvalidArgument(
            f"{prefix}: missing input{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)}; the model's inputs are {_names(inputs)}"
        )

    return InferCall(
        model=model,
        id=request.id,
        inputs=arrays,
        outputs=_requested_outputs(request, outputs, registry, prefix, owner),
        deadline=due,
        owner=owner,
    )


#: ``_every_output``'s answers by the identity of the model's outputs (kept alive here, so
#: an identity is never reused while cached), cleared past ``_EVERY_OUTPUT_MODELS``.
_EVERY_OUTPUT: dict[int, tuple[Sequence[TensorSpec], tuple[RequestedOutput, ...]]] = {}
_EVERY_OUTPUT_MODELS = 4096


def _every_output(outputs: Sequence[TensorSpec]) -> tuple[RequestedOutput, ...]:
    """Every output, in order, for a request that names none (most): one tuple per model
    version's outputs, made once (``RequestedOutput`` is immutable)."""
    entry = _EVERY_OUTPUT.get(id(outputs))
    if entry is not None and entry[0] is outputs:
        return entry[1]
    every = tuple([RequestedOutput(spec) for spec in outputs])
    if len(_EVERY_OUTPUT) >= _EVERY_OUTPUT_MODELS:
        _EVERY_OUTPUT.clear()
    _EVERY_OUTPUT[id(outputs)] = (outputs, every)
    return every


def _requested_outputs(
    request: InferRequest,
    outputs: Sequence[TensorSpec],
    registry: SharedMemoryRegistry,
    prefix: str,
    owner: str,
) -> tuple[RequestedOutput, ...]:
    if not request.outputs:
        return _every_output(outputs)
    declared = {s.name: s for s in outputs}
    chosen: list[RequestedOutput] = []
    seen: set[str] = set()
    for wanted in request.outputs:
        where = f"{prefix}: output {quoted(wanted.name)}"
        spec = declared.get(wanted.name)
        if spec is None:
            raise InvalidArgument(
                f"{where}: unknown output; the model's outputs are {_names(outputs)}"
            )
        if wanted.name in seen:
            raise InvalidArgument(f"{where}: requested more than once")
        seen.add(wanted.name)
        if "classification" in wanted.parameters:
            raise InvalidArgument(f"{where}: the classification parameter is not supported")
        target = _shm_target(wanted.parameters, where)
        if target is not None:
            # Fail now, before queueing, if the region is unknown, stale or the window is
            # outside it; all of it is checked again when the result is written.
            registry.check(target.region, target.offset, target.byte_size, owner)
        chosen.append(RequestedOutput(spec, target))
    return tuple(chosen)


# --------------------------------------------------------------------------------- outputs


def _checked_output(call: InferCall, spec: TensorSpec, value: Any) -> np.ndarray:
    if value is None:
        raise ExecutionFailed(f"{_output_where(call, spec)}: the model returned no such output")
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if spec.datatype == "BYTES":
        ok = arr.dtype.kind in ("O", "S", "U")
    else:
        ok = arr.dtype == spec.numpy_dtype
    if not ok:
        raise ExecutionFailed(
            f"{_output_where(call, spec)}: the model returned dtype {arr.dtype}, but declares "
            f"{spec.datatype}"
        )
    if not tensors.shape_matches(spec.shape, arr.shape):
        raise ExecutionFailed(
            f"{_output_where(call, spec)}: the model returned shape {_shape_text(arr.shape)}, "
            f"but declares {_shape_text(spec.shape)}"
        )
    return arr


def _output_where(call: InferCall, spec: TensorSpec) -> str:
    return f"model {call.model!r}: output {spec.name!r}"


def _write_shm(
    arr: np.ndarray,
    spec: TensorSpec,
    target: ShmTarget,
    registry: SharedMemoryRegistry,
    where: str,
    owner: str,
) -> int:
    """Write ``arr`` into the target window; return the bytes written."""
    data: bytes | np.ndarray
    if spec.datatype == "BYTES":
        data = tensors.serialize_bytes(arr.ravel())
        nbytes = len(data)
    else:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        nbytes = arr.nbytes
    if nbytes > target.byte_size:
        raise InvalidArgument(
            f"{where}: {nbytes} bytes do not fit in {SHM_BYTE_SIZE}={target.byte_size} of "
            f"shared memory region {quoted(target.region)}"
        )
    return registry.write(target.region, target.offset, data, owner)


def encode_response(
    call: InferCall,
    results: Mapping[str, Any],
    *,
    model_version: str,
    registry: SharedMemoryRegistry,
) -> InferResponse:
    """The ModelInferResponse for ``call`` given the model's ``results`` by output name."""
    response = InferResponse(call.model, model_version, call.id)
    for wanted in call.outputs:
        spec = wanted.spec
        arr = _checked_output(call, spec, results.get(spec.name))
        tensor = OutputTensor(spec.name, spec.datatype, list(arr.shape))
        if wanted.shm is not None:
            where = _output_where(call, spec)
            written = _write_shm(arr, spec, wanted.shm, registry, where, call.owner)
            tensor.parameters = {
                SHM_REGION: pb.InferParameter(string_param=wanted.shm.region),
                SHM_OFFSET: pb.InferParameter(int64_param=wanted.shm.offset),
                SHM_BYTE_SIZE: pb.InferParameter(int64_param=written),
            }
            response.raw_output_contents.append(b"")
        elif spec.datatype == "BYTES":
            response.raw_output_contents.append(tensors.serialize_bytes(arr.ravel()))
        else:
            # Row-major bytes without a copy when the array is C-contiguous (the usual
            # case); the codec's join is then the one copy.
            response.raw_output_contents.append(
                np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
            )
        response.outputs.append(tensor)
    return response

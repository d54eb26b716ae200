"""The plain records every layer speaks in: ModelInfer requests and responses, call
context, per-model statistics, repository and control answers.

Theory of operation
-------------------
This is a leaf module: it imports no transport, no runtime, no protocol (betterproto)
code and no JAX, only ``attrs``, the histogram snapshot and the config's residency
name. Everything above it -- the policies, the runtime's executor, the meta runner,
the RPC service, the worker -- may exchange these records without pulling in the
layers above them (``tests/project/test_layers.py`` checks it in a fresh interpreter).

Two families live here:

* **ModelInfer, lean.** :class:`InferRequest` and :class:`InferResponse` (and their
  parts) are what the hand-written codec (``transport.codec``) decodes wire bytes into
  and encodes from, and what ``inferio`` validates: slotted classes with plain values
  (parameters are ``bool``/``int``/``str``/``float``/``None``, raw contents are
  ``memoryview`` slices of the received buffer). They are mutable while one call
  builds them and never shared between calls.
* **Answers and statistics.** Frozen attrs records: what the model host reports
  (:class:`IndexEntry`, :class:`ControlStatus`, :class:`ExecutionStatistics`...), what
  the service counts (:class:`RequestStatistics`, :class:`ServiceStatistics`). The
  service turns them into protocol messages; the metrics collector reads them.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping
from typing import Any, Literal, SupportsBytes

import attrs

from .config.schema import Residency
from .histogram import HistogramSnapshot

__all__ = [
    "REPORTED_VERSION",
    "Answer",
    "BatchStatistics",
    "CallContext",
    "CompactResult",
    "ControlStatus",
    "Duration",
    "ExecutionStatistics",
    "IndexEntry",
    "InferRequest",
    "InferResponse",
    "InputTensor",
    "ModelControlInfo",
    "OutputTensor",
    "ParamValue",
    "RequestStatistics",
    "RequestedOutput",
    "ServiceStatistics",
    "TensorContents",
]

#: The version a model reports (ModelMetadata, ModelStatistics, ModelInfer's response).
#: Bundles are unversioned -- one version per name, replaced in place -- and Triton numbers
#: a model's versions from 1; its tools read the field as an integer (perf_analyzer stops
#: on an empty one), so the one version is "1".
REPORTED_VERSION = "1"

# ------------------------------------------------------------------------ one call


@attrs.frozen
class CallContext:
    """What the transport knows about one call beyond its request message."""

    #: Absolute ``trio.current_time()`` of the gRPC deadline; ``inf`` when none was sent.
    deadline: float = math.inf
    #: The client's address, e.g. ``127.0.0.1:50312`` (for logs).
    peer: str = ""
    #: Whose shared-memory regions the call may see, use and remove
    #: (:mod:`reactantserver.transport.core.auth`, rule 4).
    owner: str = ""


#: A parameter's value: bool, int (int64 or uint64), str, float; None when unset.
ParamValue = bool | int | str | float | None


class TensorContents:
    """``InferTensorContents``: typed elements, flattened in row-major order.

    Numeric lists are ``array.array``\\ s (``np.asarray`` views them without a loop);
    ``bool_contents`` holds 0 and 1.
    """

    __slots__ = ("bool_contents", "bytes_contents", "fp32_contents", "fp64_contents",
                 "int64_contents", "int_contents", "uint64_contents", "uint_contents")  # fmt: skip

    def __init__(self) -> None:
        self.bool_contents = array("B")
        self.int_contents = array("i")
        self.int64_contents = array("q")
        self.uint_contents = array("I")
        self.uint64_contents = array("Q")
        self.fp32_contents = array("f")
        self.fp64_contents = array("d")
        self.bytes_contents: list[bytes] = []


class InputTensor:
    """``ModelInferRequest.InferInputTensor``."""

    __slots__ = ("contents", "datatype", "name", "parameters", "shape")

    def __init__(
        self,
        name: str = "",
        datatype: str = "",
        shape: list[int] | None = None,
        parameters: dict[str, ParamValue] | None = None,
        contents: TensorContents | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape: list[int] = [] if shape is None else shape
        self.parameters: dict[str, ParamValue] = {} if parameters is None else parameters
        #: Typed contents; ``None`` when the field was not sent.
        self.contents = contents


class RequestedOutput:
    """``ModelInferRequest.InferRequestedOutputTensor``."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str = "", parameters: dict[str, ParamValue] | None = None) -> None:
        self.name = name
        self.parameters: dict[str, ParamValue] = {} if parameters is None else parameters


class InferRequest:
    """``ModelInferRequest``, as the codec decodes it."""

    __slots__ = ("id", "inputs", "layout", "model_name", "model_version", "outputs",
                 "parameters", "raw_input_contents")  # fmt: skip

    def __init__(self) -> None:
        self.model_name = ""
        self.model_version = ""
        self.id = ""
        self.parameters: dict[str, ParamValue] = {}
        self.inputs: list[InputTensor] = []
        self.outputs: list[RequestedOutput] = []
        #: Slices of the received buffer, one per raw input.
        self.raw_input_contents: list[memoryview | bytes] = []
        #: The layout the codec knows the message by (``codec.Layout``: its bytes but for
        #: the raw tensors), or None. Requests of one layout share everything but their
        #: raw contents, so a decoded request is read, never changed.
        self.layout: Any = None


class OutputTensor:
    """``ModelInferResponse.InferOutputTensor`` (outputs are always sent raw).

    ``parameters`` values are serialized ``InferParameter`` messages: anything whose
    ``bytes()`` is the message's wire form (a betterproto ``InferParameter``), so that
    this record needs no protocol code.
    """

    __slots__ = ("datatype", "name", "parameters", "shape")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        parameters: Mapping[str, SupportsBytes] | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.parameters: Mapping[str, SupportsBytes] = parameters or {}


class InferResponse:
    """``ModelInferResponse``, as the codec encodes it."""

    __slots__ = ("id", "model_name", "model_version", "outputs", "raw_output_contents")

    def __init__(self, model_name: str, model_version: str = "", id: str = "") -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.outputs: list[OutputTensor] = []
        #: One entry per output, in order (empty for an output written to shared memory).
        self.raw_output_contents: list[bytes | memoryview] = []


class Answer:
    """Where the outcome of one begun ModelInfer request goes: settled exactly once.

    The request path is *begin -> wait -> finish*: the caller begins a request
    synchronously, handing the host an ``Answer``; whoever ends the request -- the
    dispatch loop for a finished batch, a hook or meta task, a refusal at a version gate,
    shutdown -- settles it with :meth:`resolve` or :meth:`fail` and the answer calls
    ``wake()`` once. What ``wake`` does is the waiter's business: the gRPC transport
    resolves an asyncio future (the handler awaits it on the host loop), Trio callers
    set a ``trio.Event``. A waiter that gives up (client cancel) *withdraws* the request
    through the host instead, and then nobody settles it.
    """

    __slots__ = ("error", "settled", "value", "wake")

    def __init__(self, wake: Callable[[], object]) -> None:
        self.wake = wake
        self.settled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def resolve(self, value: Any) -> None:
        self._settle()
        self.value = value
        self.wake()

    def fail(self, error: BaseException) -> None:
        self._settle()
        self.error = error
        self.wake()

    def _settle(self) -> None:
        if self.settled:
            raise RuntimeError("a request was answered twice (a bug in its owner)")
        self.settled = True

    def result(self) -> Any:
        """The value, or raise the error (with a fresh traceback: one executor error may
        be shared by every request of a batch)."""
        if self.error is not None:
            raise self.error.with_traceback(None)
        if not self.settled:
            raise RuntimeError("the request has not been answered yet")
        return self.value


# ------------------------------------------------------------------------ statistics


@attrs.frozen
class Duration:
    """A count of events and their accumulated duration, nanoseconds."""

    count: int = 0
    ns: int = 0

    def plus(self, seconds: float) -> Duration:
        return Duration(self.count + 1, self.ns + max(0, round(seconds * 1e9)))


@attrs.frozen
class BatchStatistics:
    """Executions at one batch size."""

    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()


@attrs.frozen
class ExecutionStatistics:
    """The device side of one model's statistics, as the host counts it."""

    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    #: Batch rows inferred (a request of 8 rows counts 8).
    inference_count: int = 0
    #: Device executions (a coalesced batch counts 1).
    execution_count: int = 0
    batches: tuple[BatchStatistics, ...] = ()


@attrs.frozen
class RequestStatistics:
    """The request side of one model's statistics, as the service counts it."""

    success: Duration = Duration()
    fail: Duration = Duration()
    #: Wall-clock time of the last success, ms since the Unix epoch; 0 = never.
    last_inference_ms: int = 0
    #: ModelInfer latency from receipt to answer (every outcome), seconds, in
    #: ``histogram.LATENCY_BUCKETS``; ``None`` before the model's first request.
    latency: HistogramSnapshot | None = None
    #: Finished ModelInfer calls by status code name (``OK``, ``INVALID_ARGUMENT``, ...).
    by_status: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen
class ServiceStatistics:
    """A snapshot of the service's own counters, for the metrics collector."""

    #: ModelInfer calls being served now.
    in_flight: int
    #: ``endpoints.max_concurrent_requests`` (0 = uncapped).
    max_concurrent_requests: int
    #: ModelInfer calls refused because the cap was reached.
    shed_total: int
    #: (RPC name, status name) -> calls that ended with that status, e.g.
    #: ``("ModelInfer", "OK")``.
    rpcs: Mapping[tuple[str, str], int]


# ------------------------------------------------------------------ repository, control


@attrs.frozen
class IndexEntry:
    """One model of the repository, for RepositoryIndex."""

    name: str
    version: str = ""
    #: ``READY``, ``UNAVAILABLE``, ``LOADING`` or ``UNLOADING`` (Triton's states).
    state: str = "READY"
    reason: str = ""


@attrs.frozen
class ModelControlInfo:
    """One model as the control plane sees it (``reactant_control.ModelStatus``)."""

    name: str
    residency: Residency
    device_resident: bool = False
    host_resident: bool = False
    weight_nbytes: int = 0
    weight: float = 1.0
    queue_depth: int = 0
    total_compute_seconds: float = 0.0
    requests_served: int = 0
    dispatch_count: int = 0
    max_batch_size: int = 0
    batch_input_name: str = ""
    #: 1-based position of the batch axis in the wire shape; 0 = none.
    batch_axis: int = 0
    rows_served: int = 0


@attrs.frozen
class ControlStatus:
    """The worker as the control plane sees it (``ModelControlStatusResponse``)."""

    residency_mode: Literal["self_managed", "externally_managed"]
    discipline: str
    models: tuple[ModelControlInfo, ...] = ()
    weight_cache_max_bytes: int = 0


@attrs.frozen
class CompactResult:
    reloaded_models: int = 0
    resident_bytes_after: int = 0

"""One served model version: its bundle, its compiled programs and its counters.

A ``ServedModel`` is what the worker's model table maps a name to. It is created
when a bundle has been compiled, and it is *immutable in what it serves*: a new
version of the same model is a new ``ServedModel`` that replaces the old one in the
table atomically. Requests carry the object they were admitted with as their
scheduler ``group``, so a batch never mixes versions and the executor runs each
request on the version that admitted it -- which is what lets a reload swap
versions under load without failing anything already queued.

The counters here are the device side of Triton's ModelStatistics (queue time,
input assembly, execution, output slicing, rows and executions per batch size);
they are updated on the event loop thread by the executor after each batch.

Hashable by identity: the lifecycle policy, the weight provider and the scheduler's
batch groups all key a version by the object itself.

JAX-free: the compiled program is held as an opaque ``LoadedModel``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .bundle import Bundle
from .config import ModelSchedConfig
from .histogram import ROW_BUCKETS, Histogram, HistogramSnapshot
from .host import BundleFacts
from .records import BatchStatistics, Duration, ExecutionStatistics

if TYPE_CHECKING:
    from .bundle.manifest import TensorSpec
    from .load_config import Override
    from .runtime import LoadedModel


def _ns(seconds: float) -> int:
    """A duration as the statistics count it: whole nanoseconds, never negative."""
    return max(0, round(seconds * 1e9))


class _BatchCounters:
    """One batch size's executions and their nanoseconds, counted in place (an execution
    adds to plain ints; ``statistics`` makes the records)."""

    __slots__ = ("executions", "infer_ns", "input_ns", "output_ns")

    def __init__(self) -> None:
        self.executions = 0
        self.input_ns = self.infer_ns = self.output_ns = 0


class ServedModel(BundleFacts):
    """A compiled bundle as clients and the scheduler see it."""

    def __init__(
        self,
        bundle: Bundle,
        loaded: LoadedModel,
        sched: ModelSchedConfig,
        *,
        platform: str,
        generation: int,
        max_queue_depth: int,
        readiness: Callable[[ServedModel], tuple[bool, str]] | None = None,
        override: Override | None = None,
        batch_sizes: Sequence[int] | None = None,
    ) -> None:
        self.bundle = bundle
        self.loaded = loaded
        #: Scheduling values: the node configuration's, or those of ``override``.
        self.sched = sched
        #: The ``config`` of the RepositoryModelLoad that built this version (None: none);
        #: ``sched`` and ``compiled_batch_sizes`` already say what it changed.
        self.override = override
        self._batch_sizes = tuple(batch_sizes) if batch_sizes is not None else None
        self._platform = platform
        #: Increases by one each time this name is (re)loaded; logged on swaps.
        self.generation = generation
        self._max_queue_depth = max_queue_depth
        #: Extra readiness condition the worker imposes (explicit mode: device residency).
        self._readiness = readiness
        # The bundle's facts every request reads, read once (a bundle never changes;
        # each is otherwise a chain of three or four properties).
        self._name = bundle.name
        self._client_inputs = bundle.client_inputs
        self._client_outputs = bundle.client_outputs
        self._batched = bundle.batched
        self._input_names = tuple(s.name for s in bundle.inputs)
        self._output_names = tuple(s.name for s in bundle.outputs)
        #: Requests queued and their nanoseconds; every execution's input, infer and
        #: output nanoseconds (``_all``; ``_per_size`` by padded size).
        self._queued = self._queue_ns = 0
        self._all = _BatchCounters()
        self._rows = 0
        self._per_size: dict[int, _BatchCounters] = {}
        self._batch_rows = Histogram(ROW_BUCKETS)
        #: Seconds per compiled batch size measured by the warm-up (the scheduler's
        #: initial cost estimates); set once by the worker right after the warm-up.
        self.warmup_costs: Mapping[int, float] = {}

    # -------------------------------------------------------------- HostedModel

    @property
    def platform(self) -> str:
        return self._platform

    @property
    def compiled_batch_sizes(self) -> Sequence[int]:
        """The compiled sizes this version batches at: the bundle's, or those a load's
        ``config`` preferred (``dynamic_batching.preferred_batch_size``)."""
        if self._batch_sizes is not None:
            return self._batch_sizes
        return self.bundle.compiled_batch_sizes

    @property
    def max_batch_size(self) -> int:
        largest = self.bundle.manifest.max_batch_size
        cap = self.sched.max_batch_size
        return min(largest, cap) if cap and largest else largest

    @property
    def max_queue_depth(self) -> int:
        return self._max_queue_depth

    @property
    def parameters(self) -> Mapping[str, str]:
        return {
            "weight": f"{self.sched.weight:g}",
            "residency": self.sched.residency or "default",
            "generation": str(self.generation),
        }

    def ready(self) -> tuple[bool, str]:
        """Compiled versions are ready unless the worker's extra condition says otherwise."""
        return self._readiness(self) if self._readiness is not None else (True, "")

    def statistics(self) -> ExecutionStatistics:
        every = self._all
        return ExecutionStatistics(
            queue=Duration(self._queued, self._queue_ns),
            compute_input=Duration(every.executions, every.input_ns),
            compute_infer=Duration(every.executions, every.infer_ns),
            compute_output=Duration(every.executions, every.output_ns),
            inference_count=self._rows,
            execution_count=every.executions,
            batches=tuple(
                BatchStatistics(
                    size,
                    Duration(c.executions, c.input_ns),
                    Duration(c.executions, c.infer_ns),
                    Duration(c.executions, c.output_ns),
                )
                for size, c in sorted(self._per_size.items())
            ),
        )

    def batch_rows_histogram(self) -> HistogramSnapshot:
        """Rows per execution (before padding) so far."""
        return self._batch_rows.snapshot()

    # ------------------------------------------------------------------ executor

    @property
    def name(self) -> str:
        return self._name

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self._client_inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self._client_outputs

    @property
    def batched(self) -> bool:
        return self._batched

    @property
    def input_names(self) -> tuple[str, ...]:
        """Executable inputs in the artifact's argument order."""
        return self._input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        return self._output_names

    @property
    def hooks(self) -> Any:
        return self.bundle.hooks

    def record_batch(
        self,
        size: int,
        queue_seconds: Sequence[float],
        rows: int,
        input_seconds: float,
        infer_seconds: float,
        output_seconds: float,
    ) -> None:
        """Account one successful execution of ``rows`` rows at padded ``size``."""
        self._queued += len(queue_seconds)
        self._queue_ns += sum(map(_ns, queue_seconds))
        self._rows += rows
        self._batch_rows.observe(rows)
        ns_in, ns_infer, ns_out = _ns(input_seconds), _ns(infer_seconds), _ns(output_seconds)
        counters = self._per_size.get(size)
        if counters is None:
            counters = self._per_size[size] = _BatchCounters()
        for c in (self._all, counters):
            c.executions += 1
            c.input_ns += ns_in
            c.infer_ns += ns_infer
            c.output_ns += ns_out

    def __repr__(self) -> str:
        return f"<ServedModel {self.name!r} generation={self.generation}>"

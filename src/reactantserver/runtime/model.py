"""A compiled model: one executable per compiled batch size, executed synchronously.

Theory of operation
-------------------
A ``LoadedModel`` is immutable after construction: a map from batch size to compiled
executable (key ``0`` = the single fixed-shape program of an unbatched model) plus the
bundle it came from. It owns no weights. The weight cache owns device copies of the
weights and passes them in, so one compiled model can run whichever copy is resident
and residency decisions never touch compiled code.

``execute`` is synchronous and thread-safe (the executables are, and nothing here
mutates), meant to be called from the scheduler's worker thread with inputs already
padded to a compiled size. It checks each input's dtype and shape first: JAX would
otherwise silently cast a float64 array to float32, or fail with a message about
"args[0]" that says nothing about the model. Outputs come back as numpy arrays via
``np.asarray``: on the CPU backend that is a zero-copy, read-only view of the
device buffer; on a GPU it is the one unavoidable device-to-host copy.

A failed execution is ``ExecutionFailed`` (INTERNAL), except when the device ran out of
memory for the batch's buffers: that is capacity, not a bug, and becomes
``ResourceExhausted`` with the settings to change (``device_errors.py``), logged once
per failed batch for the operator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bundle import Bundle
from ..errors import ExecutionFailed, InvalidArgument
from .compile import CompileReport
from .device_errors import execution_out_of_memory, is_out_of_memory

if TYPE_CHECKING:
    from jax.stages import Compiled

log = logging.getLogger("reactantserver.runtime")

#: Executable key of an unbatched model's single program.
UNBATCHED = 0
#: Warm-up: a program whose timed run is faster than this (seconds) runs ``REPEATS``
#: more times, and the fastest run is its cost.
REPEAT_BELOW = 0.01
REPEATS = 4


class LoadedModel:
    """A bundle compiled for every one of its batch sizes."""

    def __init__(
        self,
        bundle: Bundle,
        executables: Mapping[int, Compiled],
        reports: Sequence[CompileReport],
    ) -> None:
        self.bundle = bundle
        self.name = bundle.name
        self._executables = dict(executables)
        #: Compile seconds and cache state per size, in size order.
        self.compile_reports: tuple[CompileReport, ...] = tuple(reports)
        self._inputs = bundle.inputs
        self._n_weights = len(bundle.weight_specs)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Compiled batch sizes, ascending; ``(0,)`` for an unbatched model."""
        return tuple(sorted(self._executables))

    @property
    def compile_seconds(self) -> float:
        return sum(r.seconds for r in self.compile_reports)

    def input_shapes(self, size: int) -> list[tuple[int, ...]]:
        """Concrete input shapes of the program for ``size``."""
        if size == UNBATCHED:
            return [spec.shape for spec in self._inputs]
        return [spec.with_batch(size) for spec in self._inputs]

    def _size_of(self, inputs: Sequence[np.ndarray]) -> int:
        if len(inputs) != len(self._inputs):
            raise InvalidArgument(
                f"model {self.name!r}: expected {len(self._inputs)} inputs "
                f"({', '.join(s.name for s in self._inputs)}), got {len(inputs)}"
            )
        size = UNBATCHED
        if self.bundle.batched:
            first = inputs[0]
            size = int(first.shape[0]) if first.ndim else -1
            if size not in self._executables:
                raise InvalidArgument(
                    f"model {self.name!r}: input {self._inputs[0].name!r} has {size} rows, which is "
                    f"not a compiled batch size ({', '.join(map(str, self.sizes))}); pad to one"
                )
        for arr, spec, shape in zip(inputs, self._inputs, self.input_shapes(size), strict=True):
            if arr.dtype != spec.numpy_dtype or tuple(arr.shape) != shape:
                raise InvalidArgument(
                    f"model {self.name!r}: input {spec.name!r} is {arr.dtype}{list(arr.shape)}, "
                    f"the program for batch size {size} takes {spec.numpy_dtype}{list(shape)}"
                )
        return size

    def execute(
        self, inputs: Sequence[np.ndarray], device_weights: Sequence[Any]
    ) -> list[np.ndarray]:
        """Run the program matching the inputs' batch size; outputs in manifest order."""
        size = self._size_of(inputs)
        if len(device_weights) != self._n_weights:
            raise InvalidArgument(
                f"model {self.name!r}: expected {self._n_weights} weight arrays, got "
                f"{len(device_weights)}"
            )
        import jax

        try:
            results = self._executables[size](*inputs, *device_weights)
            return [np.asarray(r) for r in jax.tree.leaves(results)]
        except Exception as exc:
            what = f"batch size {size}" if size else "its fixed shapes"
            if is_out_of_memory(exc):
                error = execution_out_of_memory(self.name, what, exc)
                log.warning("%s", error)
                raise error from exc
            raise ExecutionFailed(
                f"model {self.name!r}: execution at {what} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def zeros(self, size: int) -> list[np.ndarray]:
        """Zero inputs for the program of ``size``."""
        return [
            np.zeros(shape, dtype=spec.numpy_dtype)
            for spec, shape in zip(self._inputs, self.input_shapes(size), strict=True)
        ]

    def warmup(self, device_weights: Sequence[Any]) -> dict[int, float]:
        """Run every size on zeros; seconds of a steady-state run per size.

        The first run of each program pays one-time costs (thunk setup, first
        allocations), so it is not timed; the second is. A program that runs in under
        :data:`REPEAT_BELOW` seconds runs :data:`REPEATS` more times and the fastest
        counts: at startup the machine is busy compiling the other models, and a tiny
        program's one timed run is mostly that noise (the scheduler decides from this
        whether the program may run inline on the dispatch loop).
        """
        seconds: dict[int, float] = {}
        for size in self.sizes:
            zeros = self.zeros(size)
            self.execute(zeros, device_weights)
            best = self._timed_run(zeros, device_weights)
            if best < REPEAT_BELOW:
                for _ in range(REPEATS):
                    best = min(best, self._timed_run(zeros, device_weights))
            seconds[size] = best
        return seconds

    def _timed_run(self, inputs: Sequence[np.ndarray], device_weights: Sequence[Any]) -> float:
        start = time.perf_counter()
        self.execute(inputs, device_weights)
        return time.perf_counter() - start

    def __repr__(self) -> str:
        return f"<LoadedModel {self.name!r} sizes={list(self.sizes)}>"

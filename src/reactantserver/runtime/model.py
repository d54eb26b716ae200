"""A compiled model: one executable per compiled batch size; launched, then fetched.

Theory of operation
-------------------
A ``LoadedModel`` is immutable after construction: a map from batch size to compiled
executable (key ``0`` = the single fixed-shape program of an unbatched model) plus the
bundle it came from. It owns no weights. The weight cache owns device copies of the
weights and passes them in, so one compiled model can run whichever copy is resident
and residency decisions never touch compiled code.

An execution is two halves, both synchronous and thread-safe (the executables are,
and nothing here mutates), called with inputs already padded to a compiled size:

* ``launch`` checks each input's dtype and shape (JAX would otherwise silently cast a
  float64 array to float32, or fail with a message about "args[0]" that says nothing
  about the model), moves the inputs to the device and calls the program, which JAX
  dispatches asynchronously: it returns device arrays as soon as the program is queued
  on the device's stream.
* ``fetch`` waits for the outputs and returns them as numpy arrays.

``execute`` is ``fetch(launch(...))``: the depth-1 dispatch loop and the warm-up use it;
the pipelined loop (``scheduler.pipeline_depth`` > 1) launches batch N+1 on one thread
while another thread fetches batch N.

One transfer each way: :func:`output_path`
------------------------------------------
How the bytes move is decided once per runtime from the platform and the device's
addressable memory kinds, by :func:`output_path`:

* ``zero_copy`` (the CPU backend): numpy inputs go straight to the program and
  ``np.asarray`` of an output is a zero-copy, read-only view of the device buffer --
  exactly the path every CPU figure in docs/benchmarks.md was measured on.
* ``pinned_host`` (a device that offers ``pinned_host`` memory: CUDA): the program is
  compiled with its outputs in pinned host memory (``out_shardings=
  SingleDeviceSharding(device, memory_kind="pinned_host")``, ``compile.py``), so the
  device-to-host copy is part of the program itself.
* ``copy_async`` (a device without pinned host memory): each output's copy to the host
  is started at launch (``copy_to_host_async``), so it runs while the next batch is
  launched.

Inputs: on every path the numpy inputs are handed straight to the compiled program,
whose call (JAX's C++ dispatch) moves them to the device. Until issue 40 the CUDA paths
put them first in one ``jax.device_put`` of the list; on the H100 (2026-11-27, commit
a9bcaaa, ``benchmarks/gpu/measurements/h100-2026-11-27``) that execute cost 1.38x
(resnet) and 1.57x (mlp_wide) the round trip of the same program handed numpy straight,
with its outputs in pinned host memory -- the put is a Python-level dispatch of its own
before the program's. ``bench_gpu_batch.py`` measures both ways side by side
(``pinned-host output`` against ``pinned, inputs put``) and CUDA's path as this module
runs it (``ours`` on a GPU, ``ours, pinned path`` on the CPU).

Why ``pinned_host`` wins where it is offered (NVIDIA H200, 2026-11-27, commit a02cdcc,
``../shared/measurements/gpu-h200-2026-11-27``): one execution of a 4096-wide MLP at
batch 1 costs 0.48 ms when each output is fetched with a blocking copy before the next
call; 0.20-0.27 ms with the output compiled into pinned host memory (0.20 ms p50 one at
a time, 0.25-0.27 ms in a stream of 1,000); 0.23 ms with two in flight and
``copy_to_host_async`` -- about the same, but only with two in flight (0.34 ms with
pinned host output *and* an async copy on top), whereas the pinned-host program gets
there one at a time too, so it also serves a depth-1 loop and an idle device well, and
it costs no extra call per output. JAX's own dispatch floor there is about 0.23-0.33 ms.
A program whose pinned-host compile fails falls back to ``copy_async`` (logged).

A failed execution is ``ExecutionFailed`` (INTERNAL), except when the device ran out of
memory for the batch's buffers: that is capacity, not a bug, and becomes
``ResourceExhausted`` with the settings to change (``device_errors.py``), logged once
per failed batch for the operator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
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

#: How one execution's inputs reach the device and its outputs the host (module docstring).
OutputPath = Literal["zero_copy", "pinned_host", "copy_async"]


def output_path(platform: str, memory_kinds: Iterable[str]) -> OutputPath:
    """The transfer strategy for a device of ``platform`` offering ``memory_kinds``
    (``device.addressable_memories()``' kinds): ``zero_copy`` on the CPU, ``pinned_host``
    where the device offers pinned host memory, else ``copy_async``."""
    if platform == "cpu":
        return "zero_copy"
    return "pinned_host" if "pinned_host" in set(memory_kinds) else "copy_async"


#: How a program returns its outputs: one array, a flat tuple or list of them, or any
#: other tree (flattened with ``jax.tree.leaves``).
OutputForm = Literal["leaf", "sequence", "tree"]


def _output_form(executable: Any) -> OutputForm:
    """From a compiled program's ``out_tree`` (JAX's tree of its outputs): ``leaf`` for
    one array, ``sequence`` for a tuple or list of arrays (every node but the root a
    leaf), ``tree`` otherwise or when the program says nothing (a test's fake)."""
    tree = getattr(executable, "out_tree", None)
    if tree is None:
        return "tree"
    nodes, leaves = tree.num_nodes, tree.num_leaves
    if nodes == 1 and leaves == 1:
        return "leaf"
    if nodes == leaves + 1:
        return "sequence"  # or a dict of arrays: the call checks the type it returns
    return "tree"


@attrs.frozen
class Launched:
    """A launched execution: the program is queued on the device, its outputs pending."""

    size: int
    #: The program's outputs (device arrays, or pinned host arrays), in manifest order.
    outputs: list[Any]


class LoadedModel:
    """A bundle compiled for every one of its batch sizes."""

    def __init__(
        self,
        bundle: Bundle,
        executables: Mapping[int, Compiled],
        reports: Sequence[CompileReport],
        *,
        paths: Mapping[int, OutputPath] | None = None,
    ) -> None:
        self.bundle = bundle
        self.name = bundle.name
        self._executables = dict(executables)
        #: The transfer path of each size's program (default: ``zero_copy``).
        self.paths: dict[int, OutputPath] = {
            size: (paths or {}).get(size, "zero_copy") for size in self._executables
        }
        #: Compile seconds and cache state per size, in size order.
        self.compile_reports: tuple[CompileReport, ...] = tuple(reports)
        self._inputs = bundle.inputs
        self._n_weights = len(bundle.weight_specs)
        #: What each size's program takes, input by input: (numpy dtype, shape), worked
        #: out once (``_size_of`` checks every launch against it).
        self._takes: dict[int, tuple[tuple[Any, tuple[int, ...]], ...]] = {
            size: tuple(
                (spec.numpy_dtype, tuple(shape))
                for spec, shape in zip(self._inputs, self.input_shapes(size), strict=True)
            )
            for size in self._executables
        }
        self._n_inputs = len(self._inputs)
        #: How each size's program returns its outputs (:func:`_output_form`).
        self._forms: dict[int, OutputForm] = {
            size: _output_form(exe) for size, exe in self._executables.items()
        }

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
        if len(inputs) != self._n_inputs:
            raise InvalidArgument(
                f"model {self.name!r}: expected {len(self._inputs)} inputs "
                f"({', '.join(s.name for s in self._inputs)}), got {len(inputs)}"
            )
        size = UNBATCHED
        if self.bundle.batched:
            first = inputs[0]
            size = int(first.shape[0]) if first.ndim else -1
        takes = self._takes.get(size)
        if takes is None:
            raise InvalidArgument(
                f"model {self.name!r}: input {self._inputs[0].name!r} has {size} rows, which is "
                f"not a compiled batch size ({', '.join(map(str, self.sizes))}); pad to one"
            )
        for arr, (dtype, shape) in zip(inputs, takes, strict=True):
            if arr.dtype != dtype or arr.shape != shape:
                self._mismatch(inputs, size)
        return size

    def _mismatch(self, inputs: Sequence[np.ndarray], size: int) -> None:
        """Raise for the first input that is not what the program for ``size`` takes."""
        for arr, spec, (dtype, shape) in zip(inputs, self._inputs, self._takes[size], strict=True):
            if arr.dtype != dtype or arr.shape != shape:
                raise InvalidArgument(
                    f"model {self.name!r}: input {spec.name!r} is {arr.dtype}{list(arr.shape)}, "
                    f"the program for batch size {size} takes {spec.numpy_dtype}{list(shape)}"
                )

    def execute(
        self, inputs: Sequence[np.ndarray], device_weights: Sequence[Any]
    ) -> list[np.ndarray]:
        """Run the program matching the inputs' batch size; outputs in manifest order.
        ``fetch(launch(...))``, without the ``Launched`` in between (the inline pass of
        the host loop calls it once a request: docs/benchmarks.md, "Where a request's CPU
        goes at one in flight")."""
        size, outputs = self._call(inputs, device_weights)
        try:
            return [np.asarray(r) for r in outputs]
        except Exception as exc:
            raise self._failed(size, exc) from exc

    def launch(self, inputs: Sequence[np.ndarray], device_weights: Sequence[Any]) -> Launched:
        """Check the inputs and queue the program on them (its call moves them to the
        device); returns without waiting for it (see the module docstring)."""
        return Launched(*self._call(inputs, device_weights))

    def _call(
        self, inputs: Sequence[np.ndarray], device_weights: Sequence[Any]
    ) -> tuple[int, list[Any]]:
        """``launch``'s work: the batch size it ran at and the program's outputs (not
        waited for), flat, in manifest order."""
        size = self._size_of(inputs)
        if len(device_weights) != self._n_weights:
            raise InvalidArgument(
                f"model {self.name!r}: expected {self._n_weights} weight arrays, got "
                f"{len(device_weights)}"
            )
        try:
            # numpy straight to the program on every path: its call moves them (module
            # docstring, "inputs").
            out = self._executables[size](*inputs, *device_weights)
            form = self._forms[size]
            if form == "leaf":
                outputs = [out]
            elif form == "sequence" and type(out) in (tuple, list):
                outputs = list(out)
            else:
                import jax

                outputs = jax.tree.leaves(out)
            if self.paths[size] == "copy_async":
                for output in outputs:
                    output.copy_to_host_async()
            return size, outputs
        except Exception as exc:
            raise self._failed(size, exc) from exc

    def fetch(self, launched: Launched) -> list[np.ndarray]:
        """Wait for a launched execution's outputs: numpy arrays, in manifest order."""
        try:
            return [np.asarray(r) for r in launched.outputs]
        except Exception as exc:
            raise self._failed(launched.size, exc) from exc

    def _failed(self, size: int, exc: Exception) -> Exception:
        """What a failed launch or fetch raises: ``ResourceExhausted`` when the device ran
        out of memory (logged once), else ``ExecutionFailed``. Errors of an asynchronous
        execution surface at ``fetch``."""
        what = f"batch size {size}" if size else "its fixed shapes"
        if is_out_of_memory(exc):
            error = execution_out_of_memory(self.name, what, exc)
            log.warning("%s", error)
            return error
        return ExecutionFailed(
            f"model {self.name!r}: execution at {what} failed: {type(exc).__name__}: {exc}"
        )

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

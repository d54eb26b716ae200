"""Out of device memory: recognising it, and the errors callers get instead.

Theory of operation
-------------------
XLA reports an allocation it cannot satisfy as a ``RESOURCE_EXHAUSTED`` status, which
JAX raises as ``jax.errors.JaxRuntimeError`` (``jaxlib.xla_extension.XlaRuntimeError``
in older jaxlibs; both are ``RuntimeError``) with the status name first::

    RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.

That is what the BFC allocator says when its arena (``runtime.mem_fraction`` of the
device) has no free chunk large enough: for a weight transfer (``jax.device_put``) and
for an execution's buffers alike. With ``runtime.preallocate: false`` the arena grows
on demand, and when the CUDA driver itself refuses (another process took the memory)
the text names ``CUDA_ERROR_OUT_OF_MEMORY`` or says "out of memory". We match on the
text, not on the class, because the class moved between jaxlib versions; this module
imports no JAX.

Running out of device memory is neither the client's mistake nor our bug: it is
capacity. It is answered with RESOURCE_EXHAUSTED (clients retry it with backoff, and a
retry after the cache has made room may well succeed) and a message that says which
setting an operator can change. Any other device failure stays ``ExecutionFailed``
(INTERNAL).
"""

from __future__ import annotations

from ..errors import ResourceExhausted

__all__ = ["execution_out_of_memory", "first_line", "is_out_of_memory", "load_out_of_memory"]

#: Substrings (compared case-insensitively) of the errors XLA and CUDA raise when out
#: of device memory.
_MARKERS = ("resource_exhausted", "out of memory", "cuda_error_out_of_memory")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (XLA appends pages of allocator dumps)."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device (or its allocator) refusing an allocation.

    Only ``RuntimeError`` qualifies: that is what JAX raises for XLA statuses. A host
    ``MemoryError`` (numpy could not allocate a host copy) is a different problem.
    """
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _MARKERS)


def load_out_of_memory(model: str, nbytes: int, exc: BaseException) -> ResourceExhausted:
    """A weight load that ran out of device memory even with every idle copy freed."""
    return ResourceExhausted(
        f"model {model!r}: the device is out of memory for its weights ({nbytes} bytes), "
        f"even with every idle model's weights freed ({first_line(exc)}); it does not fit "
        "next to the pinned models and the memory executions use: raise "
        "runtime.mem_fraction, pin fewer models, or serve it on a larger device"
    )


def execution_out_of_memory(model: str, what: str, exc: BaseException) -> ResourceExhausted:
    """An execution that ran out of device memory for its buffers (activations, inputs,
    outputs, workspace)."""
    return ResourceExhausted(
        f"model {model!r}: the device ran out of memory executing at {what} "
        f"({first_line(exc)}); cached weights leave too little room for this batch: raise "
        "runtime.weight_cache_wiggle_fraction or lower runtime.weight_cache_fraction (or "
        f"cap the batch with scheduler.models.{model}.max_batch_size)"
    )

"""Ahead-of-time compilation per batch size, and the persistent compilation cache.

Theory of operation
-------------------
One artifact with a symbolic batch axis serves every compiled size: for each size
``n`` we lower ``jax.jit(exported.call)`` at the concrete argument shapes (inputs with
``n`` rows, weights at their own shapes) and compile it. The weights are arguments of
the compiled program, so the same executable runs whichever copy of the weights the
weight cache hands it.

JAX's persistent compilation cache (``jax_compilation_cache_dir``) stores each
compiled executable on disk keyed by the program, the compile options and the
device, so a restart with the same ``cache_dir`` loads executables instead of
compiling them. We set the minimum compile time and entry size to zero so that even
small models are cached (the default skips compiles under one second).

Whether a compile was served from the cache is read from JAX's own monitoring
events (``/jax/compilation_cache/cache_hits`` and ``.../cache_misses``), which JAX
records synchronously on the compiling thread: a process-wide listener appends them
to a thread-local list only while a ``compile_at`` call on that thread is watching,
so concurrent compiles on other threads never mix their reports. No event at all
means the persistent cache was not consulted (``off``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from jax import Device
    from jax.export import Exported
    from jax.stages import Compiled

log = logging.getLogger("reactantserver.runtime")

#: ``hit``/``miss``: the persistent cache served the compile or not; ``off``: it was not
#: consulted; ``shared``: no compile at all, the program of another loaded bundle with
#: the same artifact was reused (``programs.py``).
CacheState = Literal["hit", "miss", "off", "shared"]

_HIT = "/jax/compilation_cache/cache_hits"
_MISS = "/jax/compilation_cache/cache_misses"

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


@attrs.frozen
class CompileReport:
    """How long one (model, batch size) took to compile and whether the cache served it."""

    model: str
    #: The compiled batch size; 0 for the single program of an unbatched model.
    batch_size: int
    seconds: float
    cache: CacheState


def _listener(event: str, **_: Any) -> None:
    events = getattr(_local, "events", None)
    if events is not None:
        events.append(event)


def _install_listener() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        from jax import monitoring

        monitoring.register_event_listener(_listener)
        _installed = True


@contextmanager
def _watch_cache_events() -> Iterator[list[str]]:
    _install_listener()
    events: list[str] = []
    previous = getattr(_local, "events", None)
    _local.events = events
    try:
        yield events
    finally:
        _local.events = previous


def configure_cache(cache_dir: str | Path | None) -> None:
    """Point JAX's persistent compilation cache at ``cache_dir`` (empty/None: off)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if cache_dir:
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_enable_compilation_cache", True)
        cc.set_cache_dir(str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    else:
        jax.config.update("jax_enable_compilation_cache", False)
        jax.config.update("jax_compilation_cache_dir", None)
    # JAX decides once per process whether the cache is in use; make it decide
    # again with the settings above (matters when a process starts a second
    # runtime, as tests and the benchmark do). The reset is needed even when JAX
    # holds no cache (a compile with the cache off still fixed the decision), and it
    # then logs "Resetting cache at <empty>." at INFO on every healthy start: that
    # record alone is dropped (the runtime's own start line says where the cache is).
    jax_cache_log = logging.getLogger("jax._src.compilation_cache")
    jax_cache_log.addFilter(_not_a_reset)
    try:
        cc.reset_cache()
    finally:
        jax_cache_log.removeFilter(_not_a_reset)


def _not_a_reset(record: logging.LogRecord) -> bool:
    """False for JAX's "Resetting cache at ..." record (``configure_cache``)."""
    return not record.getMessage().startswith("Resetting cache at")


def compile_at(
    model: str,
    exported: Exported,
    arg_specs: Sequence[Any],
    batch_size: int,
    *,
    output_memory: tuple[Device, str] | None = None,
) -> tuple[Compiled, CompileReport]:
    """Compile ``exported`` at the concrete ``arg_specs`` and report how it went.

    ``output_memory`` ``(device, kind)``: every output of the program lands in that memory
    of ``device`` (``pinned_host``: the device-to-host copy becomes part of the program;
    ``model.py``'s ``output_path``)."""
    import jax

    if output_memory is None:
        jitted = jax.jit(exported.call)
    else:
        from jax.sharding import SingleDeviceSharding

        device, kind = output_memory
        jitted = jax.jit(
            exported.call, out_shardings=SingleDeviceSharding(device, memory_kind=kind)
        )
    with _watch_cache_events() as events:
        start = time.perf_counter()
        compiled = jitted.lower(*arg_specs).compile()
        seconds = time.perf_counter() - start
    cache: CacheState = "hit" if _HIT in events else "miss" if _MISS in events else "off"
    report = CompileReport(model=model, batch_size=batch_size, seconds=seconds, cache=cache)
    log.info(
        "compiled %s at batch size %s in %.3f s (persistent cache: %s)",
        model,
        batch_size if batch_size else "- (unbatched)",
        seconds,
        cache,
    )
    return compiled, report

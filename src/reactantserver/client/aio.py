"""The async client, for asyncio and for Trio.

``AsyncClient`` has the methods of the blocking :class:`~.sync.Client` as coroutines. It
binds to the async library of its first call (detected with ``sniffio``):

* **asyncio**: the engine runs directly on the caller's loop -- no thread, no hop. The
  client then belongs to that loop (its connection does); using it from another
  loop is an error.
* **Trio**: the engine runs on a private asyncio loop thread and each call is awaited
  with :func:`._loop.trio_await`; cancelling the Trio task cancels the call.

Either way one connection serves every call, concurrent calls included. Close it with
``async with`` or :meth:`AsyncClient.close`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np

from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb

from ._loop import LoopThread, trio_await
from .core import Core, TlsArg
from .records import ClientStatistics, ModelMetadata, RegionStatus, RepositoryModel, ServerMetadata
from .retry import RetryPolicy
from .shm import KEY_PREFIX, SharedMemoryRegion
from .sync import CLEANUP_TIMEOUT

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Make = Callable[[Core], Coroutine[Any, Any, _T]]


class AsyncClient:
    """An async client for one server; see :class:`~.sync.Client` for the arguments."""

    def __init__(
        self,
        url: str = "127.0.0.1:8080",
        *,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        seed: int | None = None,
        tls: TlsArg = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self._core = Core(url, timeout=timeout, retry=retry, seed=seed, tls=tls, metadata=metadata)
        self._library: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: LoopThread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncClient {self._core.target}{' closed' if self._closed else ''}>"

    @property
    def url(self) -> str:
        return self._core.target

    def statistics(self) -> ClientStatistics:
        return self._core.statistics()

    async def _run(self, make: _Make[_T]) -> _T:
        if self._closed:
            raise RuntimeError("the client is closed")
        import sniffio

        library = sniffio.current_async_library()
        if self._library is None:
            self._library = library
            if library == "asyncio":
                self._loop = asyncio.get_running_loop()
            elif library == "trio":
                self._thread = LoopThread()
                # A client dropped without close() still stops its thread and connection.
                self._finalizer = weakref.finalize(self, self._thread.close, self._core.close)
        if library != self._library:
            raise RuntimeError(
                f"this AsyncClient was first used under {self._library}; create another "
                f"one for {library}"
            )
        if library == "asyncio":
            if asyncio.get_running_loop() is not self._loop:
                raise RuntimeError(
                    "this AsyncClient belongs to another asyncio loop (its connection "
                    "does); create one per loop"
                )
            return await make(self._core)
        if library == "trio":
            assert self._thread is not None
            return await trio_await(self._thread.submit(make(self._core)))
        raise RuntimeError(f"AsyncClient runs under asyncio or Trio, not {library}")

    async def close(self) -> None:
        """Close the connection (and the loop thread under Trio); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            import trio

            await trio.to_thread.run_sync(self._finalizer)
        elif self._loop is not None:
            self._core.close()

    async def _cleanup(self, make: Callable[[], Awaitable[None]]) -> None:
        """Run cleanup even in a cancelled Trio scope (bounded by its own timeout)."""
        if self._library == "trio":
            import trio

            with trio.CancelScope(shield=True):
                await make()
        else:
            await make()

    # ------------------------------------------------------------------ inference

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        shm: SharedMemoryRegion | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs``; see :meth:`Client.infer <.sync.Client.infer>`."""
        return await self._run(
            lambda core: core.infer(
                model, inputs, outputs, timeout=timeout, shm=shm, request_id=request_id
            )
        )

    # ------------------------------------------------------------------ health, metadata

    async def is_server_live(self, *, timeout: float | None = None) -> bool:
        return await self._run(lambda core: core.server_live(timeout))

    async def is_server_ready(self, *, timeout: float | None = None) -> bool:
        return await self._run(lambda core: core.server_ready(timeout))

    async def is_model_ready(self, name: str, *, timeout: float | None = None) -> bool:
        return await self._run(lambda core: core.model_ready(name, timeout))

    async def server_metadata(self, *, timeout: float | None = None) -> ServerMetadata:
        return await self._run(lambda core: core.server_metadata(timeout))

    async def model_metadata(self, name: str, *, timeout: float | None = None) -> ModelMetadata:
        return await self._run(lambda core: core.model_metadata(name, timeout))

    async def model_config(self, name: str, *, timeout: float | None = None) -> pb.ModelConfig:
        return await self._run(lambda core: core.model_config(name, timeout))

    async def model_statistics(
        self, name: str = "", *, timeout: float | None = None
    ) -> list[pb.ModelStatistics]:
        return await self._run(lambda core: core.model_statistics(name, timeout))

    # ------------------------------------------------------------------ repository

    async def repository_index(
        self, *, ready: bool = False, timeout: float | None = None
    ) -> list[RepositoryModel]:
        return await self._run(lambda core: core.repository_index(ready, timeout))

    async def load_model(self, name: str, *, timeout: float | None = None) -> None:
        await self._run(lambda core: core.load_model(name, timeout))

    async def unload_model(self, name: str, *, timeout: float | None = None) -> None:
        await self._run(lambda core: core.unload_model(name, timeout))

    # ------------------------------------------------------------------ shared memory

    @asynccontextmanager
    async def shared_memory(
        self,
        nbytes: int,
        *,
        name: str | None = None,
        mode: int = 0o600,
        prefix: str = KEY_PREFIX,
        timeout: float | None = None,
    ) -> AsyncIterator[SharedMemoryRegion]:
        """A registered region for the ``async with`` block; see ``Client.shared_memory``."""
        region = SharedMemoryRegion(nbytes, name=name, mode=mode, prefix=prefix)
        try:
            await self.register_shared_memory(region, timeout=timeout)
            try:
                yield region
            finally:
                await self._cleanup(lambda: self._unregister_quietly(region.name))
        finally:
            region.close()

    async def _unregister_quietly(self, name: str) -> None:
        try:
            await self._run(lambda core: core.unregister(name, CLEANUP_TIMEOUT, retry=False))
        except Exception as exc:
            log.warning("could not unregister shared memory region %r: %s", name, exc)

    async def register_shared_memory(
        self, region: SharedMemoryRegion, *, timeout: float | None = None
    ) -> None:
        await self._run(lambda core: core.register(region, timeout))

    async def unregister_shared_memory(
        self, name: str = "", *, timeout: float | None = None
    ) -> None:
        await self._run(lambda core: core.unregister(name, timeout))

    async def shared_memory_status(
        self, name: str = "", *, timeout: float | None = None
    ) -> list[RegionStatus]:
        return await self._run(lambda core: core.shared_memory_status(name, timeout))

    async def same_ipc_namespace(self, *, timeout: float | None = None) -> bool:
        return await self._run(lambda core: core.same_ipc_namespace(timeout))

    # ------------------------------------------------------------------ control service

    async def control_status(
        self, *, timeout: float | None = None
    ) -> cpb.ModelControlStatusResponse:
        return await self._run(lambda core: core.control_status(timeout))

    async def set_model_residency(
        self, name: str, residency: str, *, timeout: float | None = None
    ) -> str:
        return await self._run(lambda core: core.set_model_residency(name, residency, timeout))

    async def set_model_policy(
        self, name: str, *, weight: float | None = None, timeout: float | None = None
    ) -> None:
        await self._run(lambda core: core.set_model_policy(name, weight, timeout))

    async def compact_memory(
        self, reload_models: Sequence[str] = (), *, timeout: float | None = None
    ) -> cpb.CompactMemoryResponse:
        return await self._run(lambda core: core.compact_memory(reload_models, timeout))

"""The blocking client: every RPC as a plain method call.

``Client`` runs its engine (:class:`~.core.Core`) on a private asyncio loop thread and
blocks the calling thread until each call is answered. It is safe to share between
threads: calls from several threads run concurrently over the one connection.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb

from ._loop import LoopThread
from .core import Core, TlsArg
from .records import ClientStatistics, ModelMetadata, RegionStatus, RepositoryModel, ServerMetadata
from .retry import RetryPolicy
from .shm import KEY_PREFIX, SharedMemoryRegion

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Budget of the unregister call made when a ``shared_memory`` block exits.
CLEANUP_TIMEOUT = 5.0


class Client:
    """A blocking client for one reactantserver (or any KServe V2 gRPC server).

    ``url`` is ``host:port`` (``grpc://`` or ``http://`` prefixes are accepted).
    ``timeout`` is the default budget of every call in seconds (``None``: no deadline);
    each method's own ``timeout`` overrides it. ``retry`` says how RESOURCE_EXHAUSTED and
    UNAVAILABLE are retried (default: twice, full jitter, about a second apart); ``seed``
    makes the jitter reproducible. ``tls``: a :class:`ClientTls` (``ca_file``, and
    ``cert_file``/``key_file`` for mutual TLS, ``server_name`` when the certificate names
    another host), an ``ssl.SSLContext``, or ``True`` for the system's CAs (a
    ``grpcs://`` URL means ``True``). ``metadata``: headers sent with every call, such as
    a restricted API group's key (``{"admin-key": key}``).

    Use it as a context manager, or call :meth:`close`.
    """

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
        self._thread = LoopThread()
        # A client dropped without close() still stops its thread and connection.
        self._finalizer = weakref.finalize(self, self._thread.close, self._core.close)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self._core.target}{' closed' if self._thread.closed else ''}>"

    @property
    def url(self) -> str:
        return self._core.target

    def close(self) -> None:
        """Close the connection and stop the client's loop thread (idempotent)."""
        self._finalizer()

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._thread.run(coro)

    def statistics(self) -> ClientStatistics:
        """Calls, attempts, retries and failures so far (see ``ClientStatistics``)."""
        return self._core.statistics()

    # ------------------------------------------------------------------ inference

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        shm: SharedMemoryRegion | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` (name -> array); the outputs by name.

        Each input's datatype is its numpy dtype's (``object``/``str``/``bytes`` arrays are
        BYTES). ``outputs`` picks outputs and their order (default: all, in the model's
        order). Inline outputs are read-only arrays over the received bytes.

        With ``shm`` (a region from :meth:`shared_memory`), inputs and outputs travel
        through the region: inputs already inside it (``region.empty``,
        ``region.write_inputs``) are sent by reference, others are copied in once, and the
        outputs returned are views of the region, valid until the region's next
        ``infer``. ``timeout`` bounds the whole call, retries included.
        """
        return self._run(
            self._core.infer(
                model, inputs, outputs, timeout=timeout, shm=shm, request_id=request_id
            )
        )

    # ------------------------------------------------------------------ health, metadata

    def is_server_live(self, *, timeout: float | None = None) -> bool:
        return self._run(self._core.server_live(timeout))

    def is_server_ready(self, *, timeout: float | None = None) -> bool:
        return self._run(self._core.server_ready(timeout))

    def is_model_ready(self, name: str, *, timeout: float | None = None) -> bool:
        """Whether ``name`` is loaded and ready (``False`` for an unknown model)."""
        return self._run(self._core.model_ready(name, timeout))

    def server_metadata(self, *, timeout: float | None = None) -> ServerMetadata:
        return self._run(self._core.server_metadata(timeout))

    def model_metadata(self, name: str, *, timeout: float | None = None) -> ModelMetadata:
        """Inputs and outputs of ``name`` in wire order, ``-1`` for variable extents."""
        return self._run(self._core.model_metadata(name, timeout))

    def model_config(self, name: str, *, timeout: float | None = None) -> pb.ModelConfig:
        """Triton's ``ModelConfig`` for ``name`` (the generated message)."""
        return self._run(self._core.model_config(name, timeout))

    def model_statistics(
        self, name: str = "", *, timeout: float | None = None
    ) -> list[pb.ModelStatistics]:
        """Triton's per-model statistics (every loaded model when ``name`` is empty)."""
        return self._run(self._core.model_statistics(name, timeout))

    # ------------------------------------------------------------------ repository

    def repository_index(
        self, *, ready: bool = False, timeout: float | None = None
    ) -> list[RepositoryModel]:
        """The server's models (only the ready ones with ``ready=True``)."""
        return self._run(self._core.repository_index(ready, timeout))

    def load_model(self, name: str, *, timeout: float | None = None) -> None:
        """Load (or reload) bundle ``name`` from the server's repository."""
        self._run(self._core.load_model(name, timeout))

    def unload_model(self, name: str, *, timeout: float | None = None) -> None:
        """Unload ``name`` once its in-flight requests are answered."""
        self._run(self._core.unload_model(name, timeout))

    # ------------------------------------------------------------------ shared memory

    @contextmanager
    def shared_memory(
        self,
        nbytes: int,
        *,
        name: str | None = None,
        mode: int = 0o600,
        prefix: str = KEY_PREFIX,
        timeout: float | None = None,
    ) -> Iterator[SharedMemoryRegion]:
        """A new shared-memory region of ``nbytes``, registered for the ``with`` block.

        The object's key is ``prefix`` + a unique tail: the server's
        ``endpoints.shm_key_prefix`` (``/reactantserver-`` by default) must allow it.
        On exit -- normal or by an exception -- the region is unregistered (best effort:
        a server that went away has forgotten it anyway) and the object unlinked.
        """
        region = SharedMemoryRegion(nbytes, name=name, mode=mode, prefix=prefix)
        try:
            self.register_shared_memory(region, timeout=timeout)
            try:
                yield region
            finally:
                try:
                    self._run(self._core.unregister(region.name, CLEANUP_TIMEOUT, retry=False))
                except Exception as exc:
                    log.warning(
                        "could not unregister shared memory region %r: %s", region.name, exc
                    )
        finally:
            region.close()

    def register_shared_memory(
        self, region: SharedMemoryRegion, *, timeout: float | None = None
    ) -> None:
        """Register ``region`` with the server (replacing a registration of the same name)."""
        self._run(self._core.register(region, timeout))

    def unregister_shared_memory(self, name: str = "", *, timeout: float | None = None) -> None:
        """Unregister region ``name``; every region when ``name`` is empty."""
        self._run(self._core.unregister(name, timeout))

    def shared_memory_status(
        self, name: str = "", *, timeout: float | None = None
    ) -> list[RegionStatus]:
        """Registered regions (all of them when ``name`` is empty), sorted by name."""
        return self._run(self._core.shared_memory_status(name, timeout))

    def same_ipc_namespace(self, *, timeout: float | None = None) -> bool:
        """Whether the server can map shared memory this process creates."""
        return self._run(self._core.same_ipc_namespace(timeout))

    # ------------------------------------------------------------------ control service

    def control_status(self, *, timeout: float | None = None) -> cpb.ModelControlStatusResponse:
        """``ModelControlStatus``: residency mode, discipline, and every model's state."""
        return self._run(self._core.control_status(timeout))

    def set_model_residency(
        self, name: str, residency: str, *, timeout: float | None = None
    ) -> str:
        """Set ``name``'s residency (``unpinned``, ``system`` or ``device``; explicit mode)."""
        return self._run(self._core.set_model_residency(name, residency, timeout))

    def set_model_policy(
        self, name: str, *, weight: float | None = None, timeout: float | None = None
    ) -> None:
        """Change ``name``'s fair-share ``weight`` (``None`` leaves it)."""
        self._run(self._core.set_model_policy(name, weight, timeout))

    def compact_memory(
        self, reload_models: Sequence[str] = (), *, timeout: float | None = None
    ) -> cpb.CompactMemoryResponse:
        """Free the device weight buffers that are not pinned; reload ``reload_models``."""
        return self._run(self._core.compact_memory(reload_models, timeout))

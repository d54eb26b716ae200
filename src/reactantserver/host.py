"""The seam between the RPCs and the worker: ``ModelHost`` and ``HostedModel``.

Theory of operation
-------------------
``reactantserver.service`` implements every RPC over a :class:`ModelHost`; the worker
implements it over the runtime, the scheduler and the model lifecycle, and the tests'
fake hosts implement it over a handful of scripted models. The host speaks only the
plain records of :mod:`reactantserver.records`, never protocol messages, so this
module -- like ``records`` -- is a leaf: no transport, runtime, betterproto or JAX.

A request's path through a host is *begin -> wait -> finish*: ``begin`` admits it
synchronously and the host settles the request's :class:`~reactantserver.records.Answer`
later (the worker: from its dispatch loop). What the service relies on is stated on
each method: errors are the categories of :mod:`reactantserver.errors`, deadlines are
absolute ``trio.current_time()`` values, and ``get``, ``begin`` and ``withdraw`` never
block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .bundle.manifest import TensorSpec
from .config.schema import Residency
from .load_config import Override
from .records import (
    REPORTED_VERSION,
    Answer,
    CompactResult,
    ControlStatus,
    ExecutionStatistics,
    IndexEntry,
)

if TYPE_CHECKING:
    from .bundle import Bundle

__all__ = ["BundleFacts", "HostedModel", "ModelHost"]


class HostedModel(Protocol):
    """A loaded model, as the host presents it to clients."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str:
        """The version reported to clients (``records.REPORTED_VERSION``: bundles are
        unversioned)."""
        ...

    @property
    def platform(self) -> str:
        """Backend identifier reported as ``platform``/``backend`` (e.g. ``jax_cpu``)."""
        ...

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        """Client-facing inputs, wire order shapes, ``-1`` on batch/variable axes."""
        ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def max_batch_size(self) -> int:
        """Largest compiled batch size lowered by the per-model cap; 0 = unbatched."""
        ...

    @property
    def compiled_batch_sizes(self) -> Sequence[int]: ...

    @property
    def max_queue_depth(self) -> int: ...

    @property
    def parameters(self) -> Mapping[str, str]:
        """Free-form facts published in ModelConfig.parameters (weight, residency)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """(ready, reason when not)."""
        ...

    def statistics(self) -> ExecutionStatistics: ...


class BundleFacts:
    """The part of :class:`HostedModel` a loaded model reads off its ``bundle`` alone:
    its name, the version clients see and the client-facing tensors. A served model
    (:class:`~reactantserver.models.ServedModel`) and a meta model
    (:class:`~reactantserver.meta.MetaModel`) build on it and add the rest."""

    bundle: Bundle

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def version(self) -> str:
        return REPORTED_VERSION

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self.bundle.client_inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self.bundle.client_outputs


class ModelHost(Protocol):
    """What the worker provides behind the RPCs. Errors are ``reactantserver.errors``."""

    @property
    def backend(self) -> str:
        """``cpu`` or ``cuda``."""
        ...

    @property
    def device_ordinal(self) -> int: ...

    def readiness(self) -> tuple[bool, str]:
        """(ready to take inference requests, reason when not)."""
        ...

    def get(self, name: str) -> HostedModel:
        """The model serving as ``name`` now; raises ``NotFound`` (or ``Unavailable``
        while it loads) otherwise. A lookup only: nothing is admitted."""
        ...

    def index(self) -> Sequence[IndexEntry]: ...

    def begin(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        deadline: float,
        answer: Answer,
    ) -> object:
        """Admit one validated request, synchronously; a handle for :meth:`withdraw`.

        Raises the refusal (``NotFound``, ``Unavailable``, ``ResourceExhausted``...) at
        once. Otherwise the host owns the request until it settles ``answer`` exactly
        once -- with at least the named outputs as numpy arrays (object arrays for
        BYTES), or with the error -- and it settles it by ``deadline`` (absolute
        ``trio.current_time()``) at the latest while the request is still queued.
        May be called from Trio or, when Trio runs as asyncio's guest, from an asyncio
        handler on the same thread.
        """
        ...

    def withdraw(self, handle: object) -> None:
        """The caller gave up on a begun request (synchronous): it will not run if it
        has not started, its result is dropped otherwise, and ``answer`` is never
        settled after this."""
        ...

    async def load(self, name: str, override: Override | None = None) -> None:
        """RepositoryModelLoad: load (or reload) ``name``, with a ``config`` override
        (``reactantserver.load_config``) applied to the version it builds."""
        ...

    async def unload(self, name: str) -> None: ...

    def control_status(self) -> ControlStatus: ...

    async def set_residency(self, name: str, target: Residency) -> Residency:
        """Apply a residency target; return the model's residency afterwards."""
        ...

    async def set_policy(self, name: str, weight: float) -> None:
        """Set the fair-share weight of ``name``; the service has checked it
        (``scheduling.check_weight``)."""
        ...

    async def compact(self, reload: Sequence[str]) -> CompactResult: ...

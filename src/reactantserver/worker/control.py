"""The control RPCs: RepositoryModelLoad / Unload and the worker control service.

Theory of operation
-------------------
:class:`ControlPlane` answers what a control plane asks of one worker, per
``model_control_mode`` (docs/lifecycle.md has the table):

* **RepositoryModelLoad / Unload** -- explicit mode only (FAILED_PRECONDITION otherwise,
  naming the mode). A load of a model whose files did not change does nothing, so a
  control plane may repeat it; a bundle that fails to load is INVALID_ARGUMENT with the
  reason while any older version keeps serving. Both go through the lifecycle driver, one
  operation at a time, and return when it is done.
* **ModelControlStatus** -- every mode: one :class:`~reactantserver.records.ModelControlInfo`
  per compiled model serving (residency from the weight provider, weight, queue and
  compute from the scheduler), meta models listed as one unit with their callees.
* **SetModelResidency** -- explicit mode only: the weight provider moves the version.
* **SetModelPolicy** -- every mode: the fair-share weight, live. It lives in the
  scheduler's entry for the name, so it survives version swaps; an unload drops the entry
  and a later load starts from the configuration.
* **CompactMemory** -- every mode; every named model must be loaded (else NOT_FOUND).

A meta model has no weights or queue of its own: the model RPCs act on the models it
calls (``MetaGlue.targets``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..bundle import find_bundles, signature
from ..config import ServerConfig
from ..config.schema import Residency
from ..errors import FailedPrecondition, InvalidArgument, NotFound
from ..lifecycle import ModelVersions
from ..load_config import Override
from ..meta import weakest_residency
from ..models import ServedModel
from ..records import CompactResult, ControlStatus, ModelControlInfo
from ..runtime.weight_provider import WeightProvider
from ..scheduling import Scheduler, SchedulerStatistics
from ..threads import ThreadRunner
from .build import Version
from .lifecycle import LifecycleDriver
from .metas import MetaGlue

__all__ = ["ControlPlane"]

# One logger for the whole worker package (operators filter on "reactantserver.worker").
log = logging.getLogger(__package__)


class ControlPlane:
    """The control RPCs over the worker's parts (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        versions: ModelVersions[Version],
        scheduler: Scheduler,
        weights: WeightProvider,
        lifecycle: LifecycleDriver,
        metas: MetaGlue,
        *,
        thread: ThreadRunner,
    ) -> None:
        self._config = config
        self._versions = versions
        self._scheduler = scheduler
        self._weights = weights
        self._lifecycle = lifecycle
        self._metas = metas
        self._thread = thread

    # ---------------------------------------------------------------- repository

    async def load(self, name: str, override: Override | None = None) -> None:
        """RepositoryModelLoad (explicit mode), with the ``config`` override, if any."""
        self._require_explicit("RepositoryModelLoad")
        path = await self._thread(self._find_bundle_dir, name)
        current = self._versions.current.get(name)
        if current is not None:
            now = await self._thread(signature, path)
            same = override == (current.override if isinstance(current, ServedModel) else None)
            if now == current.bundle.signature and same:
                log.info("model %r: load asked, files and config unchanged; nothing to do", name)
                return
        if await self._lifecycle.load(name, path, override=override) is None:
            error = self._versions.record(name).error
            # (the service says "failed to load NAME:" before it)
            raise InvalidArgument(str(error))

    async def unload(self, name: str) -> None:
        """RepositoryModelUnload (explicit mode)."""
        self._require_explicit("RepositoryModelUnload")
        await self._lifecycle.unload(name)

    def _require_explicit(self, rpc: str) -> None:
        mode = self._config.model_control_mode
        if mode == "explicit":
            return
        why = (
            "the repository watcher loads, reloads and unloads models as their files change"
            if mode == "dynamic"
            else "the model set is fixed at startup"
        )
        raise FailedPrecondition(
            f"{rpc} needs model_control_mode: explicit; this worker runs in {mode} mode, "
            f"where {why}"
        )

    def _find_bundle_dir(self, name: str) -> Path:
        """The directory of bundle ``name`` in ``model_dirs`` (the first one wins)."""
        path = find_bundles(self._config.model_dirs, include=(name,)).paths.get(name)
        if path is None:
            raise NotFound(
                f"model {name!r} is not in the model repository "
                f"({', '.join(self._config.model_dirs)})"
            )
        return path

    # ------------------------------------------------------------ control service

    def status(self, scheduler: SchedulerStatistics | None = None) -> ControlStatus:
        """ModelControlStatus; ``scheduler`` is a snapshot already taken (else one is)."""
        stats = (scheduler or self._scheduler.statistics()).policy.models
        infos = []
        for name, served in sorted(self._versions.current.items()):
            if not isinstance(served, ServedModel):
                continue
            s = stats.get(name)
            batched = served.batched
            infos.append(
                ModelControlInfo(
                    name=name,
                    residency=self._weights.floor(served),
                    device_resident=self._weights.is_resident(served),
                    host_resident=self._weights.host_resident(served),
                    weight_nbytes=served.bundle.weights_nbytes,
                    weight=s.weight if s else served.sched.weight,
                    queue_depth=s.queue_depth if s else 0,
                    total_compute_seconds=s.compute_seconds if s else 0.0,
                    requests_served=s.requests if s else 0,
                    dispatch_count=s.dispatches if s else 0,
                    max_batch_size=served.max_batch_size,
                    batch_input_name=served.inputs[0].name if batched and served.inputs else "",
                    batch_axis=1 if batched else 0,
                    rows_served=s.rows if s else 0,
                )
            )
        return ControlStatus(
            residency_mode=(
                "externally_managed"
                if self._config.model_control_mode == "explicit"
                else "self_managed"
            ),
            discipline=self._config.scheduler.discipline,
            models=self._metas.control_view(infos),
            # The on-demand budget (the LRU's cap); 0 with the cache off.
            weight_cache_max_bytes=self._weights.on_demand_budget,
        )

    async def set_residency(self, name: str, target: Residency) -> Residency:
        """SetModelResidency: explicit mode only (the control plane owns residency)."""
        targets = self._metas.targets(name, "SetModelResidency")
        if self._config.model_control_mode != "explicit":
            raise FailedPrecondition(
                "SetModelResidency needs model_control_mode: explicit; this worker runs in "
                f"{self._config.model_control_mode} mode, where it manages residency itself"
            )
        # A meta model's target applies to each model it calls (one target for a model).
        after = []
        for served in targets:
            floor = await self._weights.set_floor(served, target)
            log.info("model %r: residency is %s", served.name, floor)
            after.append(floor)
        return weakest_residency(after)

    async def set_policy(self, name: str, weight: float) -> None:
        """SetModelPolicy, every mode (the weight was checked by the service)."""
        for served in self._metas.targets(name, "SetModelPolicy"):
            # A meta model's weight goes to each model it calls.
            self._scheduler.set_weight(served.name, weight)
            log.info("model %r: weight set to %g", served.name, weight)

    async def compact(self, reload: Sequence[str]) -> CompactResult:
        """CompactMemory, every mode; every named model must be loaded (else NOT_FOUND)."""
        named = [served for name in reload for served in self._metas.targets(name, "CompactMemory")]
        models = list(dict.fromkeys(named))  # a meta model and its callee may both be named
        reloaded, resident = await self._weights.compact(models)
        return CompactResult(reloaded_models=reloaded, resident_bytes_after=resident)

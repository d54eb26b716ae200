"""Building a version: a checked bundle in, a ``ServedModel`` (or ``MetaModel``) out.

Theory of operation
-------------------
:class:`VersionBuilder` does the slow part of a load, off the event loop, while the
current version (if any) keeps serving:

1. **Compile** the artifact at every compiled batch size (``Runtime.load``, in a worker
   thread) -- unless only the weights changed: weights are arguments of the programs,
   never baked in, so a new version whose manifest, artifact file and weight layout
   (names, dtypes, shapes) are those of the serving one reuses its compiled programs.
2. **Place the weights** with the weight provider (``add``: a host copy, or a device load
   for a ``residency: device`` model).
3. **Warm up**: every compiled size runs once on zeros; the seconds per size seed the
   scheduler's costs (``ServedModel.warmup_costs``), and with the cache on the startup
   warm-ups are its probe. A warm-up that fails frees the version's weights again.

A ``kind: meta`` bundle has nothing to compile or place: the meta glue checks what it
calls (:meth:`~reactantserver.worker.metas.MetaGlue.check_calls`) and it is ready.

Every version gets the next *generation* number (logged on swaps, published in
ModelConfig's parameters). Nothing here decides whether the version serves: the lifecycle
driver reports the result to ``ModelVersions``.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import attrs
import trio

from ..bundle import Bundle, Signature
from ..config import ModelSchedConfig, ServerConfig
from ..errors import InvalidArgument
from ..load_config import Override
from ..messages import model_config
from ..meta import MetaModel
from ..models import ServedModel
from ..runtime import LoadedModel, Runtime
from ..runtime.weight_provider import WeightProvider
from ..threads import ThreadRunner
from .metas import MetaGlue

__all__ = ["Version", "VersionBuilder", "batching_of"]

# One logger for the whole worker package (operators filter on "reactantserver.worker").
log = logging.getLogger(__package__)

#: A model version as the lifecycle policy tracks it.
Version = ServedModel | MetaModel


def batching_of(version: Version) -> Hashable | None:
    """What ``ModelVersions`` compares on a swap: the compiled sizes and the batch axis
    (``None``: a meta model, no scheduler entry, no device memory)."""
    if isinstance(version, MetaModel):
        return None
    return (tuple(version.compiled_batch_sizes), version.batched)


class VersionBuilder:
    """Builds versions of models (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        runtime: Runtime,
        weights: WeightProvider,
        metas: MetaGlue,
        *,
        thread: ThreadRunner,
    ) -> None:
        self._config = config
        self._runtime = runtime
        self._weights = weights
        self._metas = metas
        self._thread = thread
        self._generation = 0
        self._explicit = config.model_control_mode == "explicit"

    async def build(
        self, bundle: Bundle, current: Version | None, override: Override | None = None
    ) -> Version:
        """The new version of ``bundle.name``; ``current`` is the version serving now;
        ``override`` a load's ``config`` (checked against the bundle here).

        Raises a ``ReactantError`` (``BundleError``, ``InvalidArgument`` for an override
        the bundle cannot honour, ...) when the bundle cannot serve.
        """
        if override is not None and bundle.is_meta:
            raise InvalidArgument(
                f"config: model {bundle.name!r} is a meta model, which has no scheduling "
                "of its own to configure; configure the models it calls"
            )
        if bundle.is_meta:
            await self._metas.check_calls(bundle)
            self._generation += 1
            return MetaModel(
                bundle, generation=self._generation, callee_problem=self._metas.callee_problem
            )
        sched = self._config.scheduler.for_model(bundle.name)
        sizes = None
        if override is not None:  # before anything is compiled: a refusal costs nothing
            sched, sizes = self._overridden(bundle, sched, override)
        loaded = _reusable_programs(bundle, current)
        if loaded is None:
            loaded = await self._thread(self._runtime.load, bundle)
        else:
            log.info(
                "model %r: only the weights changed; reusing the compiled programs", bundle.name
            )
        self._generation += 1
        served = ServedModel(
            bundle,
            loaded,
            sched,
            platform=f"jax_{self._runtime.backend}",
            generation=self._generation,
            max_queue_depth=self._config.scheduler.max_queue_depth,
            readiness=self._resident_readiness if self._explicit else None,
            override=override,
            batch_sizes=sizes,
        )
        await self._weights.add(served)
        try:
            served.warmup_costs = await self._weights.warm_up(served)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._weights.remove(served)  # never leak a failed version's weights
            raise
        return served

    def _overridden(
        self, bundle: Bundle, sched: ModelSchedConfig, override: Override
    ) -> tuple[ModelSchedConfig, tuple[int, ...]]:
        """The version's scheduling values under ``override`` (``load_config``): checked
        against what the model's ModelConfig says without it."""
        backend = self._runtime.backend
        as_configured = ServedModel(
            bundle,
            None,  # type: ignore[arg-type]  # (read for its ModelConfig only)
            sched,
            platform=f"jax_{backend}",
            generation=self._generation,
            max_queue_depth=self._config.scheduler.max_queue_depth,
        )
        reported = model_config(
            as_configured, backend=backend, device_ordinal=self._config.gpu or 0
        ).to_dict()
        resolved = override.resolve(
            reported,
            compiled=bundle.compiled_batch_sizes,
            batched=bundle.manifest.max_batch_size > 0,
            max_batch_size=as_configured.max_batch_size,
        )
        weight = resolved.weight if resolved.weight is not None else sched.weight
        cap = resolved.max_batch_size
        return attrs.evolve(sched, max_batch_size=cap, weight=weight), resolved.batch_sizes

    def _resident_readiness(self, served: ServedModel) -> tuple[bool, str]:
        """Explicit mode: a model serves only while its weights are on the device."""
        if self._weights.is_resident(served):
            return True, ""
        return False, (
            "its weights are not on the device (explicit mode: the control plane makes it "
            "resident with SetModelResidency)"
        )


def _reusable_programs(bundle: Bundle, current: Version | None) -> LoadedModel | None:
    """The serving version's compiled programs, when ``bundle`` can run on them.

    Weights are arguments of the programs, never baked in: a new version whose manifest,
    artifact file and weight layout (names, dtypes, shapes) are those of the serving one
    differs only in weight values, and needs no compilation (the warm-up still runs, on
    the new weights).
    """
    if not isinstance(current, ServedModel):
        return None
    before = current.bundle
    artifact = bundle.manifest.artifact

    def entry(sig: Signature) -> tuple[str, int, int] | None:
        return next((e for e in sig if e[0] == artifact), None)

    same = (
        before.manifest == bundle.manifest
        and before.weight_specs == bundle.weight_specs
        and entry(before.signature) == entry(bundle.signature) is not None
    )
    return current.loaded if same else None

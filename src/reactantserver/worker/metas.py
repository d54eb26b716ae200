"""The worker's side of meta models: what a meta model may call, and how it is listed.

``reactantserver.meta`` runs a meta request (the gate, the glue, its sub-calls); this
module is what the worker adds around it, over the one table of model versions
(``ModelVersions``), where meta and compiled versions live side by side:

* :meth:`MetaGlue.check_calls` refuses, at load, a meta model whose ``calls`` name a meta
  model, loaded or only on disk (read cheaply, first directory wins). A callee that is
  merely missing is no load error: the meta model is listed and stays not ready, saying
  which callee it waits for.
* :meth:`MetaGlue.callee_problem` is what ``MetaModel.ready()`` asks per callee: dictionary
  reads only, so readiness is computed when asked and needs no bookkeeping as models come
  and go.
* ModelControlStatus lists each meta model as one unit (:meth:`MetaGlue.control_view`:
  footprint and compute of the models it calls, which are then not listed on their own),
  and the model control RPCs (:meth:`MetaGlue.targets`) act on its callees.

See docs/meta_models.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..bundle import Bundle, find_bundles
from ..config import ServerConfig
from ..errors import BundleError, FailedPrecondition
from ..lifecycle import ModelState, ModelVersions
from ..meta import MetaModel, declared_kind, meta_control_info
from ..models import ServedModel
from ..records import ModelControlInfo
from ..threads import ThreadRunner

__all__ = ["MetaGlue"]


class MetaGlue:
    """Meta models in the worker's table of versions (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        versions: ModelVersions[ServedModel | MetaModel],
        *,
        thread: ThreadRunner,
    ) -> None:
        self._dirs = config.model_dirs
        self._versions = versions
        self._thread = thread

    async def check_calls(self, bundle: Bundle) -> None:
        """``BundleError`` when a ``calls`` entry names a meta model, loaded or on disk."""
        current = self._versions.current
        on_disk = [c for c in bundle.manifest.calls if c not in current]
        disk_kinds = await self._thread(self._declared_kinds, on_disk)
        for i, callee in enumerate(bundle.manifest.calls):
            if isinstance(current.get(callee), MetaModel) or disk_kinds.get(callee) == "meta":
                raise BundleError(
                    bundle.name,
                    f"manifest.yaml: calls[{i}]: {callee!r} is a kind: meta model; a meta "
                    "model may call compiled models only (inline the other glue instead)",
                )

    def _declared_kinds(self, names: Sequence[str]) -> dict[str, str | None]:
        """The manifest ``kind`` of each named bundle on disk (a thread; first dir wins)."""
        paths = find_bundles(self._dirs, include=names).paths if names else {}
        return {name: declared_kind(Path(path)) for name, path in paths.items()}

    def callee_problem(self, callee: str) -> str | None:
        """Why a meta model cannot call ``callee`` now (``None``: it can)."""
        version = self._versions.current.get(callee)
        if isinstance(version, MetaModel):
            return f"its callee {callee!r} is a meta model; meta models call compiled models only"
        if version is None:
            state = self._versions.state(callee)
            if state is ModelState.UNLOADED:
                return f"its callee {callee!r} is not loaded"
            return f"its callee {callee!r} is not loaded ({state.value})"
        ready, reason = version.ready()
        return None if ready else f"its callee {callee!r} is not ready: {reason}"

    def control_view(self, infos: Sequence[ModelControlInfo]) -> tuple[ModelControlInfo, ...]:
        """ModelControlStatus's view (docs/protocol.md): each meta model listed as one unit
        -- footprint and compute of the models it calls -- and those callees not listed on
        their own, so a placement tool moves them together."""
        metas = [v for v in self._versions.current.values() if isinstance(v, MetaModel)]
        if not metas:
            return tuple(infos)
        by_name = {info.name: info for info in infos}
        hidden = {callee for meta in metas for callee in meta.calls}
        out = [info for info in infos if info.name not in hidden]
        for meta in metas:
            subs = [by_name[c] for c in meta.calls if c in by_name]
            out.append(meta_control_info(meta, subs))
        return tuple(sorted(out, key=lambda info: info.name))

    def targets(self, name: str, rpc: str) -> list[ServedModel]:
        """The compiled models a control RPC naming ``name`` acts on: the model itself, or
        for a meta model the models it calls (those loaded now; at least one)."""
        model = self._versions.serving(name)
        if isinstance(model, ServedModel):
            return [model]
        current = self._versions.current
        subs = [v for c in model.calls if isinstance(v := current.get(c), ServedModel)]
        if not subs:
            raise FailedPrecondition(
                f"{rpc}: meta model {name!r} acts through the models it calls "
                f"({', '.join(model.calls) or 'none declared'}), and none is loaded"
            )
        return subs

"""A loaded meta model as clients and the control plane see it.

:class:`MetaModel` implements ``HostedModel`` for a ``kind: meta`` bundle: no artifact,
no weights, no queue. Its readiness is computed when asked, from a callback the worker
gives it (every callee must be a loaded, ready, compiled model), so models coming and
going change it without any bookkeeping. The control plane lists it as one unit with
the models it calls (:func:`meta_control_info`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..bundle import MANIFEST_FILE, Bundle
from ..bundle.manifest import load_yaml
from ..config.schema import Residency
from ..errors import BundleError
from ..host import BundleFacts
from ..records import Duration, ExecutionStatistics, ModelControlInfo

__all__ = [
    "META_PLATFORM",
    "MetaModel",
    "declared_kind",
    "meta_control_info",
    "weakest_residency",
]

#: ``platform``/``backend`` reported for meta models (ModelMetadata, ModelConfig).
META_PLATFORM = "meta"


class MetaModel(BundleFacts):
    """A loaded ``kind: meta`` bundle, as clients see it (implements ``HostedModel``).

    ``callee_problem(name)`` is asked at ``ready()`` time for each declared callee and
    returns why it cannot be called now (``None`` when it can).
    """

    def __init__(
        self,
        bundle: Bundle,
        *,
        generation: int,
        callee_problem: Callable[[str], str | None],
    ) -> None:
        if not bundle.is_meta or bundle.hooks is None or bundle.hooks.run is None:
            raise BundleError(bundle.name, "not a kind: meta bundle with a model.py run()")
        self.bundle = bundle
        self.generation = generation
        self.run_fn: Callable[..., Any] = bundle.hooks.run
        self._callee_problem = callee_problem
        self._queue = Duration()
        self._infer = Duration()
        #: Completed sub-calls and the time spent inside them (queueing included).
        self.sub_calls = Duration()

    # -------------------------------------------------------------- HostedModel

    @property
    def platform(self) -> str:
        return META_PLATFORM

    @property
    def max_batch_size(self) -> int:
        # One request is one run of the glue: nothing is coalesced across requests.
        return 0

    @property
    def compiled_batch_sizes(self) -> Sequence[int]:
        return ()

    @property
    def max_queue_depth(self) -> int:
        return 0

    @property
    def calls(self) -> tuple[str, ...]:
        return self.bundle.manifest.calls

    @property
    def parameters(self) -> Mapping[str, str]:
        return {
            "kind": "meta",
            "calls": ",".join(self.calls),
            "generation": str(self.generation),
        }

    def ready(self) -> tuple[bool, str]:
        for callee in self.calls:
            problem = self._callee_problem(callee)
            if problem is not None:
                return False, problem
        return True, ""

    def statistics(self) -> ExecutionStatistics:
        """Gate waits as ``queue``, successful runs of the glue as ``compute_infer``.

        A meta request is one "row" and one "execution": it has no batch. The device
        time of its sub-calls is in the callees' own statistics.
        """
        return ExecutionStatistics(
            queue=self._queue,
            compute_infer=self._infer,
            inference_count=self._infer.count,
            execution_count=self._infer.count,
        )

    def record_sub_call(self, seconds: float) -> None:
        self.sub_calls = self.sub_calls.plus(seconds)

    def record_run(self, gate_seconds: float, run_seconds: float) -> None:
        """Account one successful request: its wait at the gate and its run time."""
        self._queue = self._queue.plus(gate_seconds)
        self._infer = self._infer.plus(run_seconds)

    def __repr__(self) -> str:
        return f"<MetaModel {self.name!r} generation={self.generation}>"


#: Residency floors from the least to the most resident.
_RESIDENCY_ORDER: tuple[Residency, ...] = ("unpinned", "system", "device")


def weakest_residency(floors: Sequence[Residency]) -> Residency:
    """The least resident of ``floors``: a pipeline is as resident as its weakest stage."""
    return min(floors, key=_RESIDENCY_ORDER.index) if floors else "unpinned"


def meta_control_info(meta: MetaModel, subs: Sequence[ModelControlInfo]) -> ModelControlInfo:
    """A meta model as ModelControlStatus lists it, from its loaded callees' entries.

    Footprint and residency are those of the callees (weights summed, the weakest
    residency, resident only when all are); compute is the time inside its sub-calls;
    a meta request is one row and has no batch axis (docs/protocol.md).
    """
    served = meta.statistics().execution_count
    return ModelControlInfo(
        name=meta.name,
        residency=weakest_residency([s.residency for s in subs]),
        device_resident=bool(subs) and all(s.device_resident for s in subs),
        host_resident=bool(subs) and all(s.host_resident for s in subs),
        weight_nbytes=sum(s.weight_nbytes for s in subs),
        weight=max((s.weight for s in subs), default=1.0),
        queue_depth=sum(s.queue_depth for s in subs),
        total_compute_seconds=meta.sub_calls.ns / 1e9,
        requests_served=served,
        dispatch_count=meta.sub_calls.count,
        max_batch_size=0,
        rows_served=served,
    )


def declared_kind(path: Path) -> str | None:
    """The ``kind`` a bundle directory's manifest declares (None if unreadable).

    Cheap on purpose (no validation, no model.py import): the worker uses it to refuse
    a meta model that calls a meta bundle which is on disk but not loaded yet.
    """
    try:
        text = (path / MANIFEST_FILE).read_text(encoding="utf-8")
        data = load_yaml(path.name, text)
    except (OSError, UnicodeDecodeError, BundleError):
        return None
    if not isinstance(data, Mapping):
        return None
    kind = data.get("kind", "model")
    return kind if isinstance(kind, str) else None

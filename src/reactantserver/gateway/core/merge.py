"""One answer from many: how the gateway combines what its workers answered.

Pure functions over the protocol's messages, one per fanned-out RPC; the proxy sends a
request to every worker that answers probes and hands the answers here. They are written
so that the result reads as if one server held every replica:

``merge_statistics``  ModelStatistics summed per (model, version): counts and nanoseconds
                      add, ``last_inference`` is the latest, batch statistics add per batch
                      size, response statistics per key; memory usage entries are listed
                      per worker (they describe different devices).
``merge_index``       RepositoryIndex as the union of the workers' models: a model is READY
                      when any worker has it ready (that worker can serve it); otherwise it
                      keeps the state and the reasons every worker gave, each reason prefixed
                      with the worker's name.
``merge_shm_status``  SystemSharedMemoryStatus: the union of the regions by name (the gateway
                      registers every region on every worker, so they agree).
``merge_compaction``  CompactMemory: models reloaded and resident bytes, summed.

Invariants (``tests/test_gateway_merge.py``): merging one answer returns an equal answer;
merging is independent of the order of the answers; every counter of the result is the sum
of the workers' counters.
"""

from __future__ import annotations

from collections.abc import Sequence

from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb


def _add(a: pb.StatisticDuration, b: pb.StatisticDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=a.count + b.count, ns=a.ns + b.ns)


_INFER_FIELDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")
_RESPONSE_FIELDS = (
    "compute_infer",
    "compute_output",
    "success",
    "fail",
    "empty_response",
    "cancel",
)


def _sum_fields(target: object, source: object, fields: Sequence[str]) -> None:
    for field in fields:
        setattr(target, field, _add(getattr(target, field), getattr(source, field)))


def _copy(message: pb.ModelStatistics) -> pb.ModelStatistics:
    return pb.ModelStatistics().parse(bytes(message))


def merge_statistics(answers: Sequence[pb.ModelStatisticsResponse]) -> pb.ModelStatisticsResponse:
    """Sum the workers' statistics per (model, version); models sorted by name."""
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    batches: dict[tuple[str, str], dict[int, pb.InferBatchStatistics]] = {}
    for answer in answers:
        for stats in answer.model_stats:
            key = (stats.name, stats.version)
            into = merged.get(key)
            if into is None:
                merged[key] = _copy(stats)
                batches[key] = {b.batch_size: b for b in merged[key].batch_stats}
                continue
            into.last_inference = max(into.last_inference, stats.last_inference)
            into.inference_count += stats.inference_count
            into.execution_count += stats.execution_count
            _sum_fields(into.inference_stats, stats.inference_stats, _INFER_FIELDS)
            by_size = batches[key]
            for batch in stats.batch_stats:
                have = by_size.get(batch.batch_size)
                if have is None:
                    by_size[batch.batch_size] = pb.InferBatchStatistics().parse(bytes(batch))
                else:
                    _sum_fields(have, batch, _BATCH_FIELDS)
            into.memory_usage = [*into.memory_usage, *stats.memory_usage]
            for index, response in stats.response_stats.items():
                have_r = into.response_stats.get(index)
                if have_r is None:
                    into.response_stats[index] = response
                else:
                    _sum_fields(have_r, response, _RESPONSE_FIELDS)
    out = []
    for key in sorted(merged):
        stats = merged[key]
        stats.batch_stats = [batches[key][size] for size in sorted(batches[key])]
        out.append(stats)
    return pb.ModelStatisticsResponse(model_stats=out)


def merge_index(
    answers: Sequence[tuple[str, pb.RepositoryIndexResponse]],
) -> pb.RepositoryIndexResponse:
    """The union of ``(worker name, answer)``s; see the module docstring for the states."""
    entries: dict[str, list[tuple[str, pb.RepositoryIndexResponseModelIndex]]] = {}
    for worker, answer in answers:
        for entry in answer.models:
            entries.setdefault(entry.name, []).append((worker, entry))
    models = []
    for name in sorted(entries):
        seen = entries[name]
        version = next((e.version for _, e in seen if e.version), "")
        if any(e.state == "READY" for _, e in seen):
            models.append(
                pb.RepositoryIndexResponseModelIndex(name=name, version=version, state="READY")
            )
            continue
        states = sorted({e.state for _, e in seen if e.state})
        state = states[0] if len(states) == 1 else "UNAVAILABLE"
        reason = "; ".join(f"{worker}: {e.reason}" for worker, e in seen if e.reason)
        models.append(
            pb.RepositoryIndexResponseModelIndex(
                name=name, version=version, state=state, reason=reason
            )
        )
    return pb.RepositoryIndexResponse(models=models)


def merge_shm_status(
    answers: Sequence[pb.SystemSharedMemoryStatusResponse],
) -> pb.SystemSharedMemoryStatusResponse:
    regions: dict[str, pb.SystemSharedMemoryStatusResponseRegionStatus] = {}
    for answer in answers:
        for name, region in answer.regions.items():
            regions.setdefault(name, region)
    return pb.SystemSharedMemoryStatusResponse(regions=dict(sorted(regions.items())))


def merge_compaction(answers: Sequence[cpb.CompactMemoryResponse]) -> cpb.CompactMemoryResponse:
    return cpb.CompactMemoryResponse(
        reloaded_models=sum(a.reloaded_models for a in answers),
        resident_bytes_after=sum(a.resident_bytes_after for a in answers),
    )

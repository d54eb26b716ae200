"""The service's translations between plain records and protocol messages.

The model host and the service's own counters speak the records of
:mod:`reactantserver.records`; the RPCs answer with betterproto messages. Every
translation lives here, so :mod:`reactantserver.service` reads as the list of RPCs and
what each one asks the host. Nothing here has state or does I/O: each function builds one
message from records (``model_config``, ``model_statistics``, ``model_status``), and the
residency tables map the control protocol's enum to the config's residency names both
ways.
"""

from __future__ import annotations

from collections.abc import Sequence

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config.schema import Residency
from reactantserver.host import HostedModel
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.records import Duration, ModelControlInfo, RequestStatistics

__all__ = [
    "RESIDENCY_FROM_PROTO",
    "RESIDENCY_TO_PROTO",
    "duration",
    "enum_name",
    "model_config",
    "model_statistics",
    "model_status",
    "tensor_metadata",
]


def duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


_RESIDENCY_NAMES: dict[Residency, str] = {
    "unpinned": "UNPINNED",
    "system": "PINNED_SYSTEM",
    "device": "PINNED_DEVICE",
}
RESIDENCY_TO_PROTO = {k: cpb.Residency.from_string(v) for k, v in _RESIDENCY_NAMES.items()}
RESIDENCY_FROM_PROTO: dict[int, Residency] = {int(v): k for k, v in RESIDENCY_TO_PROTO.items()}


def _data_type(datatype: str) -> pb.DataType:
    # Triton's config enum calls BYTES "TYPE_STRING"; every other name is TYPE_<datatype>.
    return pb.DataType.from_string("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")


def tensor_metadata(spec: TensorSpec) -> pb.ModelMetadataResponseTensorMetadata:
    return pb.ModelMetadataResponseTensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
    )


def sizes_used(sizes: Sequence[int], cap: int) -> list[int]:
    """The compiled sizes a batch of at most ``cap`` rows is padded to: every size up to
    ``cap``, and the smallest above it when ``cap`` is not one of them."""
    below = [s for s in sorted(sizes) if s <= cap]
    above = [s for s in sorted(sizes) if s > cap][:1]
    return below + (above if not below or below[-1] < cap else [])


def model_config(model: HostedModel, *, backend: str, device_ordinal: int) -> pb.ModelConfig:
    """``ModelConfig`` for ``model`` as docs/protocol.md specifies."""
    tensors = (*model.inputs, *model.outputs)
    # Triton's convention drops the batch axis from dims when max_batch_size > 0, which is
    # only truthful when every tensor has one; otherwise report full shapes.
    batched = model.max_batch_size > 0 and all(t.shape and t.shape[0] == -1 for t in tensors)
    skip = 1 if batched else 0
    config = pb.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend=model.platform,
        version_policy=pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=1)),
        max_batch_size=model.max_batch_size if batched else 0,
        input=[
            pb.ModelInput(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[skip:]))
            for t in model.inputs
        ],
        output=[
            pb.ModelOutput(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[skip:]))
            for t in model.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=model.name,
                count=1,
                kind=pb.ModelInstanceGroupKind.from_string(
                    "KIND_GPU" if backend == "cuda" else "KIND_CPU"
                ),
                gpus=[device_ordinal] if backend == "cuda" else [],
            )
        ],
        parameters={k: pb.ModelParameter(string_value=v) for k, v in model.parameters.items()},
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=False),
    )
    if batched and model.compiled_batch_sizes:
        config.dynamic_batching = pb.ModelDynamicBatching(
            preferred_batch_size=sizes_used(model.compiled_batch_sizes, model.max_batch_size),
            max_queue_delay_microseconds=0,
            default_queue_policy=pb.ModelQueuePolicy(max_queue_size=model.max_queue_depth),
        )
    return config


def model_statistics(model: HostedModel, requests: RequestStatistics) -> pb.ModelStatistics:
    """Triton's ``ModelStatistics``: the service's request side plus the host's device side."""
    device = model.statistics()
    return pb.ModelStatistics(
        name=model.name,
        version=model.version,
        last_inference=requests.last_inference_ms,
        inference_count=device.inference_count,
        execution_count=device.execution_count,
        inference_stats=pb.InferStatistics(
            success=duration(requests.success),
            fail=duration(requests.fail),
            queue=duration(device.queue),
            compute_input=duration(device.compute_input),
            compute_infer=duration(device.compute_infer),
            compute_output=duration(device.compute_output),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=duration(b.compute_input),
                compute_infer=duration(b.compute_infer),
                compute_output=duration(b.compute_output),
            )
            for b in device.batches
        ],
    )


def model_status(info: ModelControlInfo) -> cpb.ModelStatus:
    return cpb.ModelStatus(
        name=info.name,
        residency=RESIDENCY_TO_PROTO[info.residency],
        device_resident=info.device_resident,
        host_resident=info.host_resident,
        weight_nbytes=info.weight_nbytes,
        weight=info.weight,
        queue_depth=info.queue_depth,
        total_compute_seconds=info.total_compute_seconds,
        requests_served=info.requests_served,
        dispatch_count=info.dispatch_count,
        max_batch_size=info.max_batch_size,
        batch_input_name=info.batch_input_name,
        batch_axis=info.batch_axis,
        rows_served=info.rows_served,
    )


def enum_name(enum_type: type[cpb.Residency], value: int) -> str:
    try:
        return enum_type(value).name or str(value)
    except ValueError:
        return str(int(value))

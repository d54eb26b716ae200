"""Hypothesis strategies shared by the test suite, one headed section per area.

Each section belongs to the area named in its heading; append new sections at the end
rather than editing someone else's.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from reactantserver.protocol import inference as _ip
from reactantserver.tensors import DATATYPES

# ============================================================================================
# Protocol messages (tests/project/test_proto.py, tests/transport/test_reflection.py)
# ============================================================================================

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
_NAMES = st.text(min_size=0, max_size=12)
_KSERVE_DATATYPES = st.sampled_from(DATATYPES)


def infer_parameters() -> st.SearchStrategy[_ip.InferParameter]:
    """One InferParameter with exactly one oneof member set (default values included)."""
    return st.one_of(
        st.builds(_ip.InferParameter, bool_param=st.booleans()),
        st.builds(_ip.InferParameter, int64_param=_INT64),
        st.builds(_ip.InferParameter, string_param=_NAMES),
        # NaN never equals itself, which would make round-trip equality meaningless.
        st.builds(_ip.InferParameter, double_param=st.floats(allow_nan=False)),
        st.builds(_ip.InferParameter, uint64_param=_UINT64),
    )


def _parameter_maps() -> st.SearchStrategy[dict[str, _ip.InferParameter]]:
    return st.dictionaries(_NAMES, infer_parameters(), max_size=3)


def infer_tensor_contents() -> st.SearchStrategy[_ip.InferTensorContents]:
    """Typed contents; every list may be used (the codec, not the wire, picks one)."""
    return st.builds(
        _ip.InferTensorContents,
        bool_contents=st.lists(st.booleans(), max_size=4),
        int_contents=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4),
        int64_contents=st.lists(_INT64, max_size=4),
        uint_contents=st.lists(st.integers(0, 2**32 - 1), max_size=4),
        uint64_contents=st.lists(_UINT64, max_size=4),
        fp32_contents=st.lists(st.floats(width=32, allow_nan=False), max_size=4),
        fp64_contents=st.lists(st.floats(allow_nan=False), max_size=4),
        bytes_contents=st.lists(st.binary(max_size=8), max_size=4),
    )


def model_infer_requests() -> st.SearchStrategy[_ip.ModelInferRequest]:
    """Arbitrary (not necessarily valid for any model) ModelInferRequest messages."""
    inputs = st.builds(
        _ip.ModelInferRequestInferInputTensor,
        name=_NAMES,
        datatype=_KSERVE_DATATYPES,
        shape=st.lists(st.integers(-1, 2**40), max_size=4),
        parameters=_parameter_maps(),
        contents=infer_tensor_contents(),
    )
    outputs = st.builds(
        _ip.ModelInferRequestInferRequestedOutputTensor,
        name=_NAMES,
        parameters=_parameter_maps(),
    )
    return st.builds(
        _ip.ModelInferRequest,
        model_name=_NAMES,
        model_version=_NAMES,
        id=_NAMES,
        parameters=_parameter_maps(),
        inputs=st.lists(inputs, max_size=3),
        outputs=st.lists(outputs, max_size=3),
        raw_input_contents=st.lists(st.binary(max_size=16), max_size=3),
    )


# ============================================================================================
# On-demand weights (tests/weights/test_weights_*.py)
# ============================================================================================

#: Model names the weight-cache state machine draws from; few, so models collide and churn.
WEIGHT_MODEL_NAMES = ("a", "b", "c", "d", "e")


def weight_budgets() -> st.SearchStrategy[int]:
    """On-demand budgets in bytes, 0 included (the "no room" warning case)."""
    return st.integers(min_value=0, max_value=600)


def weight_sizes() -> st.SearchStrategy[int]:
    """Model weight sizes: mostly a fraction of the budget range, sometimes larger than it
    (the oversize case), sometimes 0 (a model without weights)."""
    return st.one_of(st.integers(1, 250), st.integers(251, 900), st.just(0))


def weight_floors() -> st.SearchStrategy[str | None]:
    """Residency floors as a config gives them (``None`` = the default)."""
    return st.sampled_from([None, "unpinned", "system", "device"])


# ============================================================================================
# Configuration (tests/config/test_config_properties.py)
# ============================================================================================


def config_names() -> st.SearchStrategy[str]:
    """Worker and model names as the config rules accept them."""
    return st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)


def _config_paths() -> st.SearchStrategy[str]:
    # No ':' -- INFERENCE_SERVER_MODEL_DIRS is a colon-separated list.
    return st.from_regex(r"/[a-z0-9_]{1,8}(/[a-z0-9_.-]{1,8}){0,2}", fullmatch=True)


def _fractions(*, exclude_min: bool = False, exclude_max: bool = False) -> st.SearchStrategy[float]:
    return st.floats(0, 1, exclude_min=exclude_min, exclude_max=exclude_max)


def _positive() -> st.SearchStrategy[float]:
    return st.floats(min_value=1e-3, max_value=1e6)


def server_configs() -> st.SearchStrategy[object]:
    """Valid ``ServerConfig`` records: every value within the rules of config/rules.py."""
    from reactantserver.config import (
        EndpointsConfig,
        ModelSchedConfig,
        RuntimeConfig,
        SchedulerConfig,
        ServerConfig,
    )
    from reactantserver.config.schema import BACKENDS, CONTROL_MODES, DISCIPLINES, RESIDENCIES

    runtime = st.builds(
        RuntimeConfig,
        backend=st.sampled_from(BACKENDS),
        allow_cpu_fallback=st.booleans(),
        mem_fraction=_fractions(exclude_min=True),
        preallocate=st.booleans(),
        weight_cache_fraction=_fractions(),
        weight_cache_wiggle_fraction=_fractions(exclude_max=True),
        arena_bytes=st.integers(0, 2**40),
        weight_prefetch=st.booleans(),
    )
    model = st.builds(
        ModelSchedConfig,
        weight=_positive(),
        residency=st.none() | st.sampled_from(RESIDENCIES),
        max_batch_size=st.integers(0, 1024),
    )
    scheduler = st.builds(
        SchedulerConfig,
        discipline=st.sampled_from(DISCIPLINES),
        ema_halflife_seconds=_positive(),
        max_queue_depth=st.integers(1, 10**6),
        dispatch_timeout_seconds=_positive(),
        compaction_interval=st.integers(0, 1000),
        cost_ema_alpha=_fractions(exclude_min=True),
        recency_penalty_cap=_fractions(exclude_min=True),
        meta_concurrency=st.integers(1, 64),
        models=st.dictionaries(config_names(), model, max_size=3),
    )
    ports = st.tuples(st.integers(1, 65535), st.integers(0, 65535)).filter(lambda p: p[0] != p[1])
    endpoints = ports.flatmap(
        lambda p: st.builds(
            EndpointsConfig,
            host=st.sampled_from(["127.0.0.1", "0.0.0.0", "::", "worker-a"]),
            port=st.just(p[0]),
            metrics_port=st.just(p[1]),
            max_concurrent_requests=st.integers(0, 10**4),
            max_message_bytes=st.integers(1, 2**31),
            max_connections=st.integers(1, 10**5),
            max_concurrent_streams=st.integers(1, 2**31 - 1),
            handshake_timeout_seconds=_positive(),
            idle_timeout_seconds=_positive(),
            max_shm_regions=st.integers(1, 10**4),
        )
    )
    return st.builds(
        ServerConfig,
        name=config_names(),
        model_dirs=st.lists(_config_paths(), max_size=3, unique=True).map(tuple),
        models_include=st.lists(config_names(), max_size=3, unique=True).map(tuple),
        cache_dir=st.just("") | _config_paths(),
        model_control_mode=st.sampled_from(CONTROL_MODES),
        model_poll_seconds=_positive(),
        gpu=st.none() | st.integers(0, 16),
        runtime=runtime,
        scheduler=scheduler,
        endpoints=endpoints,
    )


# ============================================================================================
# Bundles: manifest.yaml (tests/bundle/test_bundle_manifest.py)
# ============================================================================================

_BUNDLE_FIXED_DATATYPES = tuple(d for d in DATATYPES if d != "BYTES")


def bundle_tensor_names() -> st.SearchStrategy[str]:
    return st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=10)


def bundle_tensors(
    *, batched: bool, client: bool, min_size: int = 1
) -> st.SearchStrategy[list[dict[str, object]]]:
    """Valid tensor entries of a manifest section (unique names, wire-order shapes).

    Executable tensors of a batched model carry -1 on axis 0 and fixed extents
    elsewhere; client tensors may also have variable axes and BYTES.
    """
    datatypes = _BUNDLE_FIXED_DATATYPES + (("BYTES",) if client else ())
    extent = st.integers(1, 64) | (st.just(-1) if client else st.nothing())
    rest = st.lists(extent, max_size=3)
    shape = rest.map(lambda r: [-1, *r]) if batched else rest
    entry = st.fixed_dictionaries({"datatype": st.sampled_from(datatypes), "shape": shape})
    return st.lists(
        st.tuples(bundle_tensor_names(), entry),
        min_size=min_size,
        max_size=4,
        unique_by=lambda t: t[0],
    ).map(lambda items: [{"name": n, **e} for n, e in items])


@st.composite
def bundle_manifest_data(draw: st.DrawFn) -> tuple[dict[str, object], bool]:
    """A valid manifest as plain data, and whether its bundle has a model.py."""
    kind = draw(st.sampled_from(["model", "meta"]))
    has_model_py = True if kind == "meta" else draw(st.booleans())
    data: dict[str, object] = {"format_version": draw(st.sampled_from([1, "1", "1.0"]))}
    if draw(st.booleans()):
        data["kind"] = kind
    elif kind == "meta":
        data["kind"] = "meta"
    if draw(st.booleans()):
        data["description"] = draw(st.text(max_size=30))
    if kind == "meta":
        data["client_inputs"] = draw(bundle_tensors(batched=False, client=True))
        data["client_outputs"] = draw(bundle_tensors(batched=False, client=True))
        calls = draw(st.lists(bundle_tensor_names(), max_size=3, unique=True))
        data["calls"] = [c for c in calls if c != "m"]
        return data, has_model_py
    sizes = draw(st.lists(st.integers(1, 512), max_size=4, unique=True))
    batched = bool(sizes)
    if sizes or draw(st.booleans()):
        data["batching"] = {"compiled_batch_sizes": sizes}
    data["inputs"] = draw(bundle_tensors(batched=batched, client=False))
    data["outputs"] = draw(bundle_tensors(batched=batched, client=False))
    if has_model_py and draw(st.booleans()):
        data["client_inputs"] = draw(bundle_tensors(batched=batched, client=True))
    if has_model_py and draw(st.booleans()):
        data["client_outputs"] = draw(bundle_tensors(batched=batched, client=True))
    if draw(st.booleans()):
        data["provenance"] = {"exporter": "test", "seed": draw(st.integers(0, 9))}
    return data, has_model_py


#: Arbitrary YAML-representable junk to put where a manifest expects something else.
bundle_yaml_junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


# ============================================================================================
# Request I/O: ModelInfer decode and encode (tests/worker/test_inferio.py)
# ============================================================================================

#: Fixed-width KServe datatypes (BF16 left out: its numpy dtype comes from ml_dtypes).
INFERIO_FIXED_DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
)


@st.composite
def inferio_wire_arrays(draw: st.DrawFn) -> tuple[str, object]:
    """(datatype, numpy array) of a fixed-width datatype, rank 0-3, extents 0-4."""
    import numpy as np
    from hypothesis.extra.numpy import arrays

    datatype = draw(st.sampled_from(INFERIO_FIXED_DATATYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = {"BOOL": np.bool_}.get(datatype, np.dtype(datatype.lower().replace("fp", "float")))
    return datatype, draw(arrays(dtype, shape))


#: Extents a hostile peer may send: small, negative, or absurdly large.
#: Mostly small, so that some requests are well formed and reach the deeper checks.
inferio_hostile_extents = (
    st.integers(0, 6)
    | st.integers(0, 6)
    | st.integers(0, 6)
    | st.one_of(
        st.sampled_from([-1, -3, 2**20, 2**40, 2**62, 2**63 - 1]), st.integers(-(2**63), 2**63 - 1)
    )
)


@st.composite
def inferio_hostile_inputs(draw: st.DrawFn) -> dict[str, object]:
    """One input tensor as a hostile peer might send it: shape, datatype, bytes, shm.

    ``raw`` is ``None`` (no raw contents), bytes, or ``"exact"``: the test then sends as
    many bytes as the shape needs when that is small, so that well-formed requests occur.
    The mix is skewed (mostly FP32, rank 3, small extents, one data source) so that a
    fair share of requests passes the early checks and reaches the later ones.
    """
    rank3 = st.lists(inferio_hostile_extents, min_size=3, max_size=3)
    shape = draw(
        rank3 if draw(st.integers(0, 3)) else st.lists(inferio_hostile_extents, max_size=40)
    )
    datatype = "FP32" if draw(st.integers(0, 3)) else draw(st.sampled_from(["INT8", "BYTES", ""]))
    source = draw(st.sampled_from(["raw", "raw", "typed", "shm", "none", "mixed"]))
    raw: object = None
    typed: object = None
    shm: object = None
    if source in ("raw", "mixed"):
        raw = draw(st.just("exact") | st.binary(max_size=48))
    if source in ("typed", "mixed"):
        typed = draw(st.lists(st.floats(allow_nan=False, width=32), max_size=8))
    if source in ("shm", "mixed"):
        shm = draw(
            st.tuples(
                st.sampled_from(["r", "r", "unknown"]),
                st.none() | st.integers(0, 1024) | _INT64,
                st.just("exact") | st.none() | _INT64,
            )
        )
    return {"datatype": datatype, "shape": shape, "raw": raw, "typed": typed, "shm": shm}


# ============================================================================================
# Scheduling (tests/scheduling/test_sched_*.py)
# ============================================================================================

#: Compiled batch sizes a scheduled model may have; () is one any-batch program.
sched_batch_sizes = st.sampled_from([(), (1,), (2, 4), (1, 2, 4, 8), (1, 2, 4, 8), (1, 3), (4, 8)])


@st.composite
def sched_models(draw: st.DrawFn) -> dict[str, object]:
    """Keyword arguments of ``SchedulingPolicy.add_model`` (everything but the name)."""
    sizes = draw(sched_batch_sizes)
    return {
        "compiled_batch_sizes": sizes,
        "coalescable": draw(st.sampled_from([True, True, True, False])) if sizes else False,
        "weight": draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0])),
        "max_batch_size": draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4])),
    }


@st.composite
def sched_fleets(draw: st.DrawFn, max_models: int = 6) -> list[tuple[float, float]]:
    """``(weight, cost of a dispatch)`` per model: weights 1..4, costs 1 ms .. 100 ms.

    Costs are drawn on a log scale so that spreads up to 100x are common.
    """
    n = draw(st.integers(2, max_models))
    weights = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    exponents = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    return [(float(w), 0.001 * 10**e) for w, e in zip(weights, exponents, strict=True)]


# ============================================================================================
# Model lifecycle (tests/lifecycle/test_lifecycle.py)
# ============================================================================================

#: Bundle names of a small repository, so the same names recur across polls.
lifecycle_names = st.sampled_from(["a", "b", "c"])


@st.composite
def lifecycle_signatures(draw: st.DrawFn) -> tuple[tuple[str, int, int], ...]:
    """A bundle signature drawn from a few versions, so versions repeat and revert."""
    version = draw(st.integers(0, 2))
    return (("manifest.yaml", 100, 1), ("weights.safetensors", 64, 10 + version))


@st.composite
def repository_polls(draw: st.DrawFn) -> list[dict[str, tuple[tuple[str, int, int], ...]]]:
    """Successive repository views (name -> signature); views often repeat the previous
    one, as a settled repository does between edits."""
    polls: list[dict[str, tuple[tuple[str, int, int], ...]]] = []
    for _ in range(draw(st.integers(1, 12))):
        if polls and draw(st.booleans()):
            polls.append(dict(polls[-1]))
        else:
            polls.append(draw(st.dictionaries(lifecycle_names, lifecycle_signatures())))
    return polls


# ============================================================================================
# Model versions (tests/lifecycle/test_lifecycle_versions.py)
# ============================================================================================

#: How a built version batches, as ``ModelVersions.loaded`` is told: compiled sizes and
#: whether there is a batch axis, or ``None`` for a meta model (no scheduler entry, no
#: device memory). Two compiled layouts, so replacements both keep and change batching.
version_batchings = st.sampled_from([((1, 8), True), ((1, 8), True), ((4, 16), True), None])


# ============================================================================================
# Meta models: the example detector's glue (tests/meta/test_meta_detector.py)
# ============================================================================================


@st.composite
def detector_proposals(draw: st.DrawFn, max_boxes: int = 24) -> tuple[object, object]:
    """``(boxes [n, 4] as y0, x0, y1, x1; scores [n])``, float32, inside a 64x64 image.

    Coordinates come from a coarse grid so that equal scores, identical boxes and
    IoUs of exactly 0.5 all occur, as well as zero-area boxes.
    """
    import numpy as np

    n = draw(st.integers(0, max_boxes))
    corner = st.integers(0, 32).map(lambda v: 2.0 * v)
    size = st.integers(0, 16).map(lambda v: 2.0 * v)
    rows = draw(st.lists(st.tuples(corner, corner, size, size), min_size=n, max_size=n))
    boxes = np.array(
        [[y, x, min(y + h, 64.0), min(x + w, 64.0)] for y, x, h, w in rows], np.float32
    ).reshape(n, 4)
    scores = draw(st.lists(st.integers(0, 20).map(lambda v: v / 20), min_size=n, max_size=n))
    return boxes, np.array(scores, np.float32)


# ============================================================================================
# Client: ModelInfer encode/decode on the client side (tests/client/test_client_unit.py)
# ============================================================================================


@st.composite
def client_arrays(draw: st.DrawFn) -> object:
    """A numpy array a caller might pass to ``Client.infer``: any fixed-width KServe dtype
    (rank 0-3), sometimes non-contiguous or big-endian, or a BYTES array of ``bytes``/``str``.
    """
    import numpy as np

    if draw(st.integers(0, 5)) == 0:
        items = draw(st.lists(st.binary(max_size=8) | st.text(max_size=4), max_size=5))
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return arr
    _, arr = draw(inferio_wire_arrays())
    layout = draw(st.sampled_from(["plain", "transposed", "strided", "big-endian"]))
    if layout == "transposed" and arr.ndim >= 2:
        return arr.T
    if layout == "strided" and arr.ndim >= 1:
        return np.repeat(arr, 2, axis=0)[::2]
    if layout == "big-endian" and arr.dtype.itemsize > 1:
        return arr.astype(arr.dtype.newbyteorder(">"))
    return arr


def client_input_maps() -> st.SearchStrategy[dict[str, object]]:
    """Input name -> array, 0-4 inputs with distinct names."""
    return st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6), client_arrays(), max_size=4)


#: A request or tensor parameter as the client writes it (plain Python values).
client_parameter_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)


def client_infer_responses() -> st.SearchStrategy[_ip.ModelInferResponse]:
    """Arbitrary ModelInferResponse messages (shapes may be negative, contents typed)."""
    outputs = st.builds(
        _ip.ModelInferResponseInferOutputTensor,
        name=_NAMES,
        datatype=_KSERVE_DATATYPES,
        shape=st.lists(_INT64, max_size=4),
        parameters=st.dictionaries(_NAMES, infer_parameters(), max_size=3),
        contents=infer_tensor_contents(),
    )
    return st.builds(
        _ip.ModelInferResponse,
        model_name=_NAMES,
        model_version=_NAMES,
        id=_NAMES,
        parameters=st.dictionaries(_NAMES, infer_parameters(), max_size=3),
        outputs=st.lists(outputs, max_size=3),
        raw_output_contents=st.lists(st.binary(max_size=16), max_size=3),
    )


# ============================================================================================
# The lean ModelInfer codec (tests/worker/test_codec.py)
# ============================================================================================


def _codec_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def codec_unknown_field(draw: st.DrawFn, depth: int = 0) -> bytes:
    """One well-formed field with a number no ModelInfer message uses (so any parser
    must skip it), of any wire type, groups (nested up to twice) included."""
    number = draw(st.integers(min_value=8, max_value=2**29 - 1))
    wire = draw(st.sampled_from([0, 1, 2, 5] + ([3] if depth < 2 else [])))
    tag = _codec_varint(number << 3 | wire)
    if wire == 0:
        return tag + _codec_varint(draw(_UINT64))
    if wire == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        payload = draw(st.binary(max_size=12))
        return tag + _codec_varint(len(payload)) + payload
    inner = draw(st.lists(codec_unknown_field(depth + 1), max_size=2))
    return tag + b"".join(inner) + _codec_varint(number << 3 | 4)


@st.composite
def codec_responses(draw: st.DrawFn) -> object:
    """A lean ``InferResponse``: outputs of any name, datatype and shape (negative
    extents included), some with shared-memory parameters, one raw entry per output
    (bytes, or a memoryview of a numpy array as ``inferio`` produces)."""
    import numpy as np

    from reactantserver.records import InferResponse, OutputTensor

    response = InferResponse(draw(_NAMES), draw(_NAMES), draw(_NAMES))
    for _ in range(draw(st.integers(0, 3))):
        parameters = draw(st.dictionaries(_NAMES, infer_parameters(), max_size=3) | st.just({}))
        shape = draw(st.lists(_INT64, max_size=4))
        response.outputs.append(
            OutputTensor(draw(_NAMES), draw(_KSERVE_DATATYPES), shape, parameters)
        )
        raw = draw(st.binary(max_size=24))
        if draw(st.booleans()):
            response.raw_output_contents.append(np.frombuffer(raw, np.uint8).data)
        else:
            response.raw_output_contents.append(raw)
    return response


# ============================================================================================
# The gateway's sans-IO core (tests/gateway/test_gateway_*.py)
# ============================================================================================

_GW_MODELS = ("alpha", "beta", "gamma", "delta", "eps")


@st.composite
def gateway_tables(draw: st.DrawFn, max_workers: int = 4, max_models: int = 4) -> object:
    """A RouteTable: 1..max_workers ready workers, each model served by a non-empty subset,
    with per-replica max batch sizes (0 = unknown) and a batch axis."""
    from reactantserver.gateway.core.table import ModelSnapshot, WorkerSnapshot, build_table

    n = draw(st.integers(1, max_workers))
    workers = [f"10.0.0.{i}:8080" for i in range(n)]
    models = _GW_MODELS[: draw(st.integers(1, max_models))]
    serving: dict[str, list[ModelSnapshot]] = {w: [] for w in workers}
    for model in models:
        chosen = draw(st.lists(st.sampled_from(workers), min_size=1, max_size=n, unique=True))
        for w in chosen:
            serving[w].append(
                ModelSnapshot(
                    name=model,
                    max_batch_size=draw(st.sampled_from((0, 1, 4, 8))),
                    batch_input_name="x",
                    batch_axis=1,
                )
            )
    return build_table(
        None,
        [
            WorkerSnapshot(address=w, discipline="fifo", models=tuple(ms))
            for w, ms in serving.items()
        ],
    )


@st.composite
def pack_problems(
    draw: st.DrawFn, max_models: int = 7, max_workers: int = 4, budgets: bool = True
) -> tuple[list[object], list[object], object]:
    """(demands, workers, policy) for the packer: loads, weight bytes, budgets (0 = unlimited),
    per-model replica counts including ``all``."""
    from reactantserver.gateway.core.packing import ModelDemand, PackPolicy, WorkerCapacity

    names = [f"m{i}" for i in range(draw(st.integers(1, max_models)))]
    demands = [
        ModelDemand(
            name=name,
            rate=draw(st.sampled_from((0.0, 1.0, 2.5, 10.0, 40.0))),
            cost=draw(st.sampled_from((0.001, 0.004, 0.01, 0.03))),
            nbytes=draw(st.integers(0, 400)),
        )
        for name in names
    ]
    workers = [
        WorkerCapacity(
            address=f"w{i}:80",
            budget=draw(st.sampled_from((0, 300, 600, 1000))) if budgets else 0,
        )
        for i in range(draw(st.integers(1, max_workers)))
    ]
    replica_choice = st.one_of(st.integers(1, 5), st.just("all"))
    policy = PackPolicy(
        default_replicas=draw(replica_choice),
        replicas=draw(st.dictionaries(st.sampled_from(names), replica_choice, max_size=3)),
        hysteresis=draw(st.sampled_from((0.0, 0.1, 0.5))),
        forbid_memory_oversubscription=draw(st.booleans()),
    )
    return demands, workers, policy


# ============================================================================================
# Node supervisor (tests/node/test_node_restart.py)
# ============================================================================================


@st.composite
def child_runs(draw: st.DrawFn, max_runs: int = 30) -> list[float]:
    """How long each successive run of a crashing child lasted, in seconds: mostly quick
    crashes, sometimes a run past the 60 s stability mark, sometimes right at it."""
    quick = st.floats(min_value=0.0, max_value=59.9, allow_nan=False)
    long = st.floats(min_value=60.0, max_value=3600.0, allow_nan=False)
    return draw(st.lists(st.one_of(quick, quick, quick, long, st.just(60.0)), max_size=max_runs))


# ============================================================================================
# The gRPC wire: message framing, the fault log, fuzzed HTTP/2 (tests/transport/test_wire_*.py)
# ============================================================================================


def grpc_prefix(length: int, flags: int = 0) -> bytes:
    """The 5-byte gRPC message prefix: flags byte, 4-byte big-endian length."""
    return bytes([flags]) + length.to_bytes(4, "big")


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` split at arbitrary points into DATA payloads (empty ones included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def grpc_message_streams(limit: int, *, max_messages: int = 4) -> st.SearchStrategy[bytes]:
    """Well-formed request bodies: messages of at most ``limit`` bytes, back to back."""
    payload = st.binary(max_size=min(limit, 64))
    return st.lists(payload, max_size=max_messages).map(
        lambda ms: b"".join(grpc_prefix(len(m)) + m for m in ms)
    )


def wire_garbage(limit: int) -> st.SearchStrategy[bytes]:
    """Bytes a hostile client might send as a request body: prefixes that lie about the
    length (over and under the limit), unknown flags, truncations, plain noise."""
    prefix = st.builds(
        grpc_prefix,
        st.one_of(st.integers(0, limit), st.integers(limit + 1, 2**32 - 1)),
        st.sampled_from([0, 0, 0, 1, 2, 0x80, 0xFF]),
    )
    piece = st.one_of(prefix, st.binary(max_size=16), prefix.map(lambda p: p[:3]))
    return st.lists(piece, max_size=6).map(b"".join)


def fault_reports() -> st.SearchStrategy[list[tuple[object, float]]]:
    """(fault kind, seconds since the previous report) sequences for the fault log."""
    from reactantserver.transport.core.limits import Fault

    return st.lists(
        st.tuples(
            st.sampled_from(list(Fault)[:4]),
            st.floats(min_value=0, max_value=20, allow_nan=False, allow_infinity=False),
        ),
        max_size=40,
    )


def grpc_timeouts() -> st.SearchStrategy[str]:
    """``grpc-timeout`` values, valid and not: digits (0 to 9 of them) and any unit."""
    digits = st.text(alphabet="0123456789", min_size=0, max_size=9)
    unit = st.sampled_from(["H", "M", "S", "m", "u", "n", "s", "x", "", " "])
    noise = st.text(max_size=6)
    return st.one_of(st.builds(lambda d, u: d + u, digits, unit), noise)


#: What a fuzzed request's body is made of (``tests/transport/test_wire_fuzz.py`` builds the bytes).
WIRE_BODY_KINDS = (
    "infer",
    "echo",
    "empty_message",
    "garbage",
    "oversize",
    "compressed",
    "cut",
    "protobuf_noise",
    "nothing",
)
WIRE_PATHS = ("live", "infer", "config", "unknown", "reflection")
WIRE_HEADER_VARIANTS = (
    "plain",
    "timeout",
    "timeout_zero",
    "timeout_tiny",
    "timeout_bad",
    "gzip",
    "content_type",
    "get",
    "no_te",
    "bad_bin_metadata",
)


def h2_actions() -> st.SearchStrategy[list[tuple[object, ...]]]:
    """A session of a polite HTTP/2 client (h2's state machine) that misbehaves in gRPC:
    streams opened with odd headers, bodies of every kind, resets, pings, settings,
    window updates, unknown frame types, all interleaved."""
    stream = st.integers(0, 7)  # an index into the streams opened so far
    body = st.tuples(st.sampled_from(WIRE_BODY_KINDS), st.binary(max_size=24))
    actions = st.one_of(
        st.tuples(
            st.just("open"),
            st.sampled_from(WIRE_PATHS),
            st.sampled_from(WIRE_HEADER_VARIANTS),
            body,
            st.booleans(),
        ),
        st.tuples(st.just("data"), stream, body, st.booleans()),
        st.tuples(st.just("end"), stream),
        st.tuples(st.just("reset"), stream, st.sampled_from([0, 1, 2, 8, 0xB])),
        st.tuples(st.just("ping"), st.binary(min_size=8, max_size=8)),
        st.tuples(
            st.just("settings"),
            st.sampled_from([0x4, 0x5, 0x3, 0x6]),
            st.integers(16384, 2**20),
        ),
        st.tuples(st.just("window"), st.integers(1, 2**20)),
        st.tuples(st.just("unknown"), st.integers(0x0B, 0xFF), st.binary(max_size=16)),
    )
    return st.lists(actions, min_size=1, max_size=10)


def raw_frames() -> st.SearchStrategy[list[tuple[object, ...]]]:
    """Raw HTTP/2 frames of any type, flags, stream id and payload -- most of them
    nonsense -- with now and then a well-formed request's HEADERS or DATA among them."""
    stream_id = st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1])
    nonsense = st.tuples(
        st.just("frame"),
        st.one_of(st.integers(0, 0xC), st.sampled_from([0x10, 0xFA, 0xFF])),
        st.integers(0, 0xFF),
        stream_id,
        st.binary(max_size=32),
    )
    request = st.tuples(st.just("request"), st.sampled_from([1, 3, 5, 7]), st.booleans())
    message = st.tuples(
        st.just("message"), st.sampled_from([1, 3, 5, 7]), st.binary(max_size=16), st.booleans()
    )
    length_lie = st.tuples(
        st.just("lie"), st.sampled_from([0x0, 0x1, 0x9, 0x4]), stream_id, st.integers(0, 2**24 - 1)
    )
    return st.lists(st.one_of(nonsense, request, message, length_lie), min_size=1, max_size=8)


# ============================================================================================
# Configuration faults (tests/config/test_config_properties.py)
# ============================================================================================

#: A node file as lines, each either fixed text or a choice ``(valid, faulty, message)``:
#: every faulty variant is wrong at its own key, in a way no other variant depends on.
#: The message is what ``load_node`` must report for it (after ``node.yaml:LINE: ``).
CONFIG_FAULT_FILE: tuple[str | tuple[str, str, str], ...] = (
    "model_repo: /m",
    ("base_port: 8001", "base_port: 0", "base_port: expected a port in 1..65535; got 0"),
    (
        "metrics_base_port: 8002",
        "metrics_base_port: 70000",
        "metrics_base_port: expected a port in 1..65535, or 0 for off; got 70000",
    ),
    (
        "gpus: 0",
        "colour: blue",
        "colour: unknown key; expected one of model_repo, base_port, metrics_base_port, gpus, "
        "global, workers, models, gateway",
    ),
    "global:",
    (
        "  model_poll_seconds: 2.0",
        "  model_poll_seconds: soon",
        "global.model_poll_seconds: expected a number; got 'soon'",
    ),
    "  runtime:",
    (
        "    mem_fraction: 0.5",
        "    mem_fraction: 1.5",
        "global.runtime.mem_fraction: expected a number in (0, 1]; got 1.5",
    ),
    "  scheduler:",
    (
        "    discipline: fifo",
        "    discipline: fiar",
        "global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    ),
    (
        "    max_queue_depth: 8",
        "    max_queue_depth: 0",
        "global.scheduler.max_queue_depth: expected an integer >= 1; got 0",
    ),
    (
        "    meta_concurrency: 2",
        "    meta_concurency: 2",
        "global.scheduler.meta_concurency: unknown key; expected one of discipline, "
        "ema_halflife_seconds, max_queue_depth, dispatch_timeout_seconds, compaction_interval, "
        "cost_ema_alpha, recency_penalty_cap, meta_concurrency, inline_max_seconds, pipeline_depth, models (did you mean "
        "meta_concurrency?)",
    ),
    "  endpoints:",
    (
        "    host: 127.0.0.1",
        "    host: ''",
        "global.endpoints.host: expected a non-empty string; got ''",
    ),
    "workers:",
    (
        "  - name: w0",
        "  - name: w 0",
        "workers[0].name: expected a name of letters, digits, '.', '_' and '-'; got 'w 0'",
    ),
    ("    port: 9000", "    port: x", "workers[0].port: expected an integer; got 'x'"),
)

CONFIG_FAULTS: tuple[int, ...] = tuple(
    i for i, line in enumerate(CONFIG_FAULT_FILE) if isinstance(line, tuple)
)


def config_fault_sets() -> st.SearchStrategy[frozenset[int]]:
    """Which lines of ``CONFIG_FAULT_FILE`` take their faulty variant (any subset)."""
    return st.frozensets(st.sampled_from(CONFIG_FAULTS))


# ============================================================================================
# Client array-likes (tests/client/test_client_coerce.py)
# ============================================================================================

#: The fixed-width datatypes an array-like can be converted to (BYTES takes text only).
NUMERIC_DATATYPES: tuple[str, ...] = tuple(d for d in DATATYPES if d != "BYTES")


@st.composite
def client_array_likes(draw: st.DrawFn) -> tuple[list[object], str]:
    """A flat Python list of one kind of number -- bools, ints (int64 range) or floats
    (NaN, infinities and subnormals included) -- and a datatype to convert it to. Values
    cluster around the edges that decide the rules: type ranges, 2**24 and 2**53, 0/1."""
    target = draw(st.sampled_from(NUMERIC_DATATYPES))
    kind = draw(st.sampled_from(["bool", "int", "float"]))
    edges = [0, 1, -1, 2, 127, 128, 255, 256, 2**15, 2**16, 2**24 + 1, 2**31, 2**32, 2**53 + 1]
    if kind == "bool":
        item: st.SearchStrategy[object] = st.booleans()
    elif kind == "int":
        item = st.integers(-(2**63), 2**63 - 1) | st.sampled_from(edges + [-e for e in edges])
    else:
        item = (
            st.floats(width=64)
            | st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.5, 1e39, 1e-50, 65504.0, 70000.0, 1e-8])
            | st.sampled_from(edges).map(float)
        )
    return draw(st.lists(item, min_size=1, max_size=6)), target


# ---------------------------------------------------------------- h2lean (tests/h2/test_h2lean.py)

#: Client stream ids: mostly odd and increasing in use; 2 is a server-only (even) id.
_h2_sids = st.sampled_from([1, 1, 3, 3, 5, 7, 2])
_h2_settings = st.lists(
    st.sampled_from(
        [
            (0x4, 0),  # INITIAL_WINDOW_SIZE: shifts every open stream's send window
            (0x4, 1_000_000),
            (0x4, 2**31 - 1),
            (0x4, 2**31),  # invalid: FLOW_CONTROL_ERROR
            (0x5, 32768),  # MAX_FRAME_SIZE
            (0x5, 100),  # invalid: PROTOCOL_ERROR
            (0x1, 0),  # HEADER_TABLE_SIZE
            (0x2, 1),  # ENABLE_PUSH from a client: allowed
            (0x2, 7),  # invalid
            (0x3, 10),  # MAX_CONCURRENT_STREAMS
            (0x99, 5),  # unknown: ignored
        ]
    ),
    max_size=3,
)
_h2_actions = st.one_of(
    st.tuples(
        st.just("headers"),
        _h2_sids,
        st.booleans(),
        st.none() | st.tuples(st.sampled_from([0, 1, 3]), st.integers(0, 255), st.booleans()),
        st.sampled_from([[], [("grpc-timeout", "1S")], [("x-a", "b" * 40)]]),
    ),
    st.tuples(
        st.just("data"),
        _h2_sids,
        st.sampled_from([0, 5, 100, 16_000]),
        st.booleans(),
        st.sampled_from([0, 0, 3]),
    ),
    st.tuples(st.just("rst"), _h2_sids, st.sampled_from([0, 8, 2])),
    st.tuples(
        st.just("window"),
        st.sampled_from([0, 0, 1, 3, 9]),
        st.sampled_from([1, 1000, 2**31 - 1, 0]),
    ),
    st.tuples(st.just("settings"), _h2_settings),
    st.tuples(st.just("settings_ack")),
    st.tuples(st.just("ping"), st.booleans()),
    st.tuples(st.just("priority"), _h2_sids, st.sampled_from([0, 1, 3])),
    st.tuples(st.just("push"), st.sampled_from([1, 3])),
    st.tuples(st.just("goaway"), st.sampled_from([0, 2])),
    st.tuples(st.just("unknown")),
    st.tuples(st.sampled_from(["answer", "reset"]), st.sampled_from([1, 3, 5, 7])),
)
#: Frame bodies a malformed frame is made of: short, long, and the values the rules turn
#: on (a zero or oversized WINDOW_UPDATE increment, a reserved bit, a promised stream id
#: that is odd or zero, a pad length as long as the body).
_h2_raw_bodies = st.binary(max_size=13) | st.sampled_from(
    [
        b"",
        bytes(4),
        b"\x80\x00\x00\x01",
        b"\x7f\xff\xff\xff",
        b"\x00\x00\x00\x02",
        b"\x00\x00\x00\x03",
        bytes(5),
        b"\x00\x00\x00\x01\x0f",
        bytes(8),
        b"\x00\x00\x00\x05\x00\x00\x00\x02hi",
        b"\x00\x04\x00\x00\xff\xff",
        b"\x00\x04\x00\x00\xff\xff\x00\x05",
        b"\x05abc",
        b"\x04abcd",
        b"\x00\x03abc",
        b"\x00\x09ab",
    ]
)
#: Malformed frames of every type (tests/h2/test_h2lean.py): any type byte, flag byte and
#: stream id with bodies of the wrong size or content; HEADERS frames built from a valid
#: header block with padding and priority fields that may not fit; and header blocks split
#: across CONTINUATIONs, interleaved with another frame, left open, or flooding.
_h2_malformed = st.one_of(
    st.tuples(
        st.just("frame"),
        st.sampled_from([0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9, 0xA, 0x10, 0xFF]),
        st.sampled_from([0, 0, 0x1, 0x4, 0x8, 0x9, 0x20, 0xFF]),
        st.sampled_from([0, 0, 1, 3, 2]),
        _h2_raw_bodies,
    ),
    st.tuples(
        st.just("headers_raw"),
        _h2_sids | st.just(0),
        st.sampled_from([0x4, 0x5, 0xC, 0x24, 0x2C, 0x2D, 0x0, 0x8, 0x20, 0xFF]),
        st.none() | st.sampled_from([0, 1, 4, 30, 200, 255]),  # the pad-length byte
        st.sampled_from([0, 3, 5, 5]),  # how many priority bytes are there
        st.sampled_from([0, 1, 3]),  # the stream depended on
        st.booleans(),  # the block itself, or none
        st.sampled_from([0, 0, 1, 4]),  # padding bytes present
    ),
    st.tuples(
        st.just("block"),
        _h2_sids,
        st.booleans(),  # END_STREAM
        st.booleans(),  # PRIORITY
        st.sampled_from([0, 0, 2]),  # padding
        st.sampled_from([1, 1, 2, 3, 63, 64]),  # CONTINUATIONs
        st.sampled_from(
            [
                *(None, None, "ping", "bad_ping", "data", "headers"),
                *("other_stream", "unknown", "open", "big"),
            ]
        ),
    ),
)
_h2_actions = _h2_actions | _h2_malformed


@st.composite
def h2_client_scripts(draw: st.DrawFn) -> list[list[tuple[object, ...]]]:
    """Reads of a client session: each read a few actions (frames, or server actions
    between them). A polite request/answer cycle is mixed in so that most scripts open
    streams and exercise their states before misbehaving."""
    polite = [[("headers", sid, False, None, []), ("data", sid, 5, True, 0)] for sid in (1, 3)] + [
        [("answer", 1)]
    ]
    reads = draw(st.lists(st.lists(_h2_actions, min_size=1, max_size=4), max_size=10))
    if draw(st.booleans()):
        reads = polite + reads
    return reads


# ============================================================================================
# The client's HTTP/2 connection (tests/client/test_client_channel.py)
# ============================================================================================


@st.composite
def message_sends(draw: st.DrawFn) -> tuple[list[list[bytes]], list[int]]:
    """Messages to send on one stream, each as the pieces it is given in (some empty),
    and the frame sizes to cut them into (cycled; within HTTP/2's default 16 KiB)."""
    piece = st.binary(min_size=0, max_size=3000)
    messages = draw(st.lists(st.lists(piece, min_size=1, max_size=5), min_size=1, max_size=4))
    frames = draw(st.lists(st.integers(1, 16384), min_size=1, max_size=6))
    return messages, frames


# ============================================================================================
# Energy attribution (tests/energy/test_energy.py)
# ============================================================================================

#: Models of the energy schedules; "never" is never run, so it must never be charged.
ENERGY_MODELS = ("a", "b", "c")


@st.composite
def energy_schedules(draw: st.DrawFn) -> list[tuple[str, str, float]]:
    """A device's timeline: ``("run", model, seconds)`` executions, ``("idle", "", seconds)``
    gaps and ``("sample", "", 0.0)`` counter reads, in order; the first step is a sample
    (the baseline) and so is the last."""
    seconds = st.floats(min_value=0.001, max_value=5.0, allow_nan=False)
    step = st.one_of(
        st.tuples(st.just("run"), st.sampled_from(ENERGY_MODELS), seconds),
        st.tuples(st.just("idle"), st.just(""), seconds),
        st.tuples(st.just("sample"), st.just(""), st.just(0.0)),
    )
    middle = draw(st.lists(step, min_size=0, max_size=40))
    return [("sample", "", 0.0), *middle, ("sample", "", 0.0)]


# ============================================================================================
# The host-contention model of the fleet simulator (tests/planning/test_fleet_host.py)
# ============================================================================================


def host_jobs() -> st.SearchStrategy[list[tuple[float, str, float, float]]]:
    """Jobs for a host: (submitted at, thread, core-seconds of work, width in cores)."""
    return st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.01),
            st.sampled_from(["loop", "device", "copy", "gateway"]),
            st.floats(min_value=0.0, max_value=0.005),
            st.floats(min_value=0.25, max_value=2.0),
        ),
        min_size=1,
        max_size=20,
    )


# ============================================================================================
# The planner's search (tests/planning/test_planning_search.py)
# ============================================================================================


def plan_verdicts() -> st.SearchStrategy[tuple[list[bool], int]]:
    """Verdicts of fleets 1..n (any pattern: monotone or not) and a start in 1..n."""
    return st.lists(st.booleans(), min_size=1, max_size=40).flatmap(
        lambda v: st.tuples(st.just(v), st.integers(min_value=1, max_value=len(v)))
    )


# ============================================================================================
# Requests other than ModelInfer, screened before betterproto (tests/worker/test_screen.py)
# ============================================================================================


def _repository_parameters() -> st.SearchStrategy[_ip.ModelRepositoryParameter]:
    return st.one_of(
        st.builds(_ip.ModelRepositoryParameter, bool_param=st.booleans()),
        st.builds(_ip.ModelRepositoryParameter, int64_param=_INT64),
        st.builds(_ip.ModelRepositoryParameter, string_param=_NAMES),
        st.builds(_ip.ModelRepositoryParameter, bytes_param=st.binary(max_size=8)),
    )


def screened_requests() -> st.SearchStrategy[object]:
    """Requests of the small RPCs: strings, varints of both signs, fixed-width doubles,
    a map of oneof messages, a repeated string list, an enum."""
    from reactantserver.protocol import reactant_control as _cp

    return st.one_of(
        st.builds(_ip.ServerLiveRequest),
        st.builds(_ip.ModelReadyRequest, name=_NAMES, version=_NAMES),
        st.builds(
            _ip.SystemSharedMemoryRegisterRequest,
            name=_NAMES,
            key=_NAMES,
            offset=_UINT64,
            byte_size=_UINT64,
        ),
        st.builds(_ip.RepositoryIndexRequest, repository_name=_NAMES, ready=st.booleans()),
        st.builds(
            _ip.RepositoryModelLoadRequest,
            repository_name=_NAMES,
            model_name=_NAMES,
            parameters=st.dictionaries(_NAMES, _repository_parameters(), max_size=2),
        ),
        st.builds(
            _cp.SetModelPolicyRequest,
            name=_NAMES,
            has_weight=st.booleans(),
            weight=st.floats(allow_nan=False),
        ),
        st.builds(
            _cp.SetModelResidencyRequest, name=_NAMES, target=st.sampled_from(list(_cp.Residency))
        ),
        st.builds(_cp.CompactMemoryRequest, reload_models=st.lists(_NAMES, max_size=4)),
    )

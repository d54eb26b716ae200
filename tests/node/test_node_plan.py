"""The node plan: workers and devices, ports, child environments, threads, roles, files.

The plan is a pure function of the node file, the environment, the detected devices and
the CPUs; these tests give it each of them and read the frozen ``NodePlan`` back. The
files it writes are loaded back with the same loaders the children use, so what a child
runs is exactly what the plan says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from reactantserver.config import load_gateway, load_node, resolve_worker
from reactantserver.errors import ConfigError
from reactantserver.node.plan import NodePlan, cpu_ranges, cpu_shares, plan_node, worker_threads

U0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
U1 = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
U2 = "GPU-77777777-0000-1111-2222-333344445555"
SMI = "".join(f"GPU {i}: NVIDIA H100 (UUID: {u})\n" for i, u in enumerate((U0, U1, U2)))
PY = "/usr/bin/python3"


def node_file(tmp_path: Path, text: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "models").mkdir(exist_ok=True)  # the model_repo every node file names
    return path


def plan(
    path: Path,
    env: Mapping[str, str] | None = None,
    *,
    smi: str | None = SMI,
    cpus: int = 32,
) -> NodePlan:
    environment = dict(env or {})
    return plan_node(
        load_node(path, environment),
        environment,
        runtime_dir="/run/rs",
        cpus=list(range(cpus)),
        python=PY,
        nvidia_smi=lambda _: smi,
        dev_nodes=lambda: [],
    )


CUDA = "model_repo: models\nglobal:\n  runtime: {backend: cuda}\n"


# --- threads and CPUs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(32, 2, 16), (1, 4, 1), (64, 2, 16), (8, 3, 2), (2, 2, 1), (16, 1, 16), (40, 1, 16)],
)
def test_thread_budget_is_the_share_of_cores_capped_at_16(
    cores: int, workers: int, threads: int
) -> None:
    assert worker_threads(cores, workers) == threads


def test_cpu_shares_are_disjoint_and_cover_every_cpu() -> None:
    assert cpu_shares(list(range(32)), 2) == [tuple(range(16)), tuple(range(16, 32))]
    assert cpu_shares([0], 4) == [(0,), (0,), (0,), (0,)]
    assert cpu_shares([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    assert cpu_shares([4, 5, 6, 9], 3) == [(4, 5), (6,), (9,)]
    assert cpu_ranges((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


# --- a GPU node --------------------------------------------------------------------------------


def test_gpus_auto_gives_one_worker_per_gpu_each_seeing_only_its_own(tmp_path: Path) -> None:
    path = node_file(tmp_path, CUDA + "base_port: 8080\nmetrics_base_port: 9100\n")
    p = plan(path)
    assert p.role == "all"
    assert p.detection.source == "nvidia-smi -L"
    assert [c.name for c in p.children] == ["gateway", "worker0", "worker1", "worker2"]
    workers = [c for c in p.children if c.kind == "worker"]
    assert [w.device for w in workers] == [U0, U1, U2]
    assert [w.grpc for w in workers] == ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082"]
    assert [w.metrics for w in workers] == ["127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102"]
    assert [w.threads for w in workers] == [10, 10, 10]
    assert [w.cpus for w in workers] == [
        tuple(range(0, 11)),
        tuple(range(11, 22)),
        tuple(range(22, 32)),
    ]
    assert dict(workers[1].env) == {
        "REACTANT_WORKER_NAME": "worker1",
        "CUDA_VISIBLE_DEVICES": U1,
        "REACTANT_WORKER_THREADS": "10",
        "OMP_NUM_THREADS": "10",
        "OPENBLAS_NUM_THREADS": "10",
        "MKL_NUM_THREADS": "10",
        "PYTHONUNBUFFERED": "1",
        # Behind the node's gateway: trusts it by the key the supervisor makes per run.
        "INFERENCE_SERVER_ENDPOINTS_GATEWAY_KEY_ENV": "REACTANT_NODE_GATEWAY_KEY",
    }
    assert workers[1].argv == (
        PY, "-m", "reactantserver.cli", "serve", "/run/rs/node.yaml",
        "--worker", "worker1", "--log-level", "info",
    )  # fmt: skip
    assert workers[1].grace_seconds == 15.0
    gateway = p.children[0]
    assert gateway.argv == (PY, "-m", "reactantserver.cli", "gateway", "/run/rs/gateway.yml")
    assert gateway.grace_seconds == 10.0
    assert (gateway.grpc, gateway.metrics) == ("0.0.0.0:8001", "0.0.0.0:8002")
    assert (p.public_grpc, p.public_metrics) == ("0.0.0.0:8001", "0.0.0.0:8002")
    assert p.gateway is not None
    assert p.gateway.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082")
    assert p.gateway.worker_names == ("worker0", "worker1", "worker2")
    assert p.gateway.metrics_endpoints == ("127.0.0.1:9100", "127.0.0.1:9101", "127.0.0.1:9102")
    assert math.isinf(p.gateway.startup_wait_seconds)
    assert sorted(p.files) == ["/run/rs/gateway.yml", "/run/rs/node.yaml"]


def test_the_written_files_are_what_the_children_run(tmp_path: Path) -> None:
    """Load the written node.yaml and gateway.yml exactly as the children will (with
    their environment) and compare with the plan: same workers, same ports, paths
    anchored at the original file's directory, the device in a header comment."""
    path = node_file(
        tmp_path,
        "model_repo: models\nbase_port: 7000\nglobal:\n  cache_dir: cache\n"
        "  runtime: {backend: cuda}\n  scheduler: {discipline: fifo}\n"
        "workers:\n  - {name: a, gpu: 1, scheduler: {max_queue_depth: 8}}\n  - {name: b, gpu: 0}\n"
        "models:\n  m: [a]\n"
        "gateway:\n  scheduling: {mode: lpt_packing}\n  listen: {grpc: '0.0.0.0:9001'}\n",
    )
    p = plan(path, {"INFERENCE_SERVER_SCHEDULER_META_CONCURRENCY": "3"})
    out = tmp_path / "run"
    out.mkdir()
    for name, text in p.files.items():
        (out / Path(name).name).write_text(text)
    written = (out / "node.yaml").read_text()
    assert f"#   a: CUDA_VISIBLE_DEVICES={U1}\n#   b: CUDA_VISIBLE_DEVICES={U0}\n" in written
    node = load_node(out / "node.yaml")
    for child in p.children:
        if child.kind == "worker":
            env = {"INFERENCE_SERVER_SCHEDULER_META_CONCURRENCY": "3", **child.env}
            cfg = resolve_worker(node, None, env)
            assert cfg == child.config
            assert cfg.cache_dir == str(tmp_path / "cache")
            assert cfg.model_dirs == (str(tmp_path / "models"),)
            assert cfg.gpu is None  # each child sees one device, at ordinal 0
            assert cfg.scheduler.meta_concurrency == 3
    a = resolve_worker(node, "a", {})
    assert a.scheduler.max_queue_depth == 8
    assert a.scheduler.discipline == "fifo"
    assert a.scheduler.models["m"].residency == "device"
    # (the gateway child runs with the key the supervisor makes: plan.NODE_KEY_VAR)
    assert load_gateway(out / "gateway.yml", {"REACTANT_NODE_GATEWAY_KEY": "k"}) == p.gateway
    assert p.gateway.worker_client.key_env == "REACTANT_NODE_GATEWAY_KEY"
    assert p.gateway is not None
    assert p.gateway.scheduling.mode == "lpt_packing"
    assert p.gateway.listen.grpc == "0.0.0.0:9001"


def test_explicit_workers_take_devices_by_position_or_gpu(tmp_path: Path) -> None:
    path = node_file(tmp_path, CUDA + "workers:\n  - {name: a, gpu: 2}\n  - {name: b}\n")
    p = plan(path)
    assert [(c.name, c.device) for c in p.children if c.kind == "worker"] == [
        ("a", U2),
        ("b", U1),
    ]
    assert p.notes == ("1 device(s) found by nvidia-smi -L have no worker",)


def test_more_workers_than_devices_is_an_error(tmp_path: Path) -> None:
    text = CUDA + "workers:\n  - {name: a}\n  - {name: b}\n  - {name: c}\n  - {name: d}\n"
    with pytest.raises(ConfigError) as info:
        plan(node_file(tmp_path, text))
    assert str(info.value) == (
        f"{tmp_path / 'node.yaml'}:4: workers: expected at most 3 workers, one per device "
        "found by nvidia-smi -L; got 4"
    )
    with pytest.raises(ConfigError, match=r"workers\[0\]\.gpu: expected a device index below 1"):
        plan(
            node_file(tmp_path, CUDA + "workers:\n  - {name: a, gpu: 1}\n"), {"REACTANT_GPUS": "1"}
        )


def test_reactant_gpus_and_gpus_lists_pass_uuids_and_ordinals(tmp_path: Path) -> None:
    path = node_file(tmp_path, CUDA + "gpus: [1, 0]\n")
    assert [c.device for c in plan(path).children if c.kind == "worker"] == ["1", "0"]
    p = plan(path, {"REACTANT_GPUS": f"{U2},{U0}"})
    assert [c.device for c in p.children if c.kind == "worker"] == [U2, U0]
    assert p.detection.source == f"REACTANT_GPUS={U2},{U0}"


def test_a_cuda_node_without_a_device_names_every_source_tried(tmp_path: Path) -> None:
    path = node_file(tmp_path, CUDA)
    with pytest.raises(ConfigError) as info:
        plan(path, smi=None)
    assert str(info.value) == (
        f"{path}: no GPU found for a CUDA node (worker0 runs runtime.backend: cuda); tried "
        "REACTANT_GPUS unset; gpus: auto; CUDA_VISIBLE_DEVICES unset; nvidia-smi -L not on "
        "PATH or failed; no /dev/nvidiaN device nodes. Give the container the GPUs (docker "
        "run --gpus all, or the NVIDIA runtime), name them in REACTANT_GPUS or gpus:, or set "
        "runtime.backend: cpu"
    )


def test_reactant_gpus_0_makes_a_cuda_node_fall_back_only_where_allowed(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CUDA), {"REACTANT_GPUS": "0"})
    assert [(c.name, c.device, c.env["CUDA_VISIBLE_DEVICES"]) for c in p.children] == [
        ("worker0", None, "")
    ]
    assert p.notes == ("REACTANT_GPUS=0: a CPU node; the cuda workers fall back to the CPU",)
    strict = CUDA.replace("{backend: cuda}", "{backend: cuda, allow_cpu_fallback: false}")
    with pytest.raises(ConfigError) as info:
        plan(node_file(tmp_path, strict), {"REACTANT_GPUS": "0"})
    assert str(info.value) == (
        "REACTANT_GPUS: REACTANT_GPUS=0 makes this a CPU node, but worker0 run(s) "
        "runtime.backend: cuda with allow_cpu_fallback: false; set backend: cpu, or "
        "allow_cpu_fallback: true"
    )


# --- a CPU node --------------------------------------------------------------------------------


CPU = "model_repo: models\nbase_port: 8100\nmetrics_base_port: 9200\n"


def test_a_cpu_node_never_looks_at_gpus_and_runs_reactant_cpu_workers(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CPU), {"REACTANT_CPU_WORKERS": "3"}, cpus=2)
    assert p.detection.source == "runtime.backend: cpu"
    workers = [c for c in p.children if c.kind == "worker"]
    assert [(w.name, w.env["CUDA_VISIBLE_DEVICES"]) for w in workers] == [
        ("worker0", ""),
        ("worker1", ""),
        ("worker2", ""),
    ]
    assert [w.threads for w in workers] == [1, 1, 1]
    assert [w.cpus for w in workers] == [(0,), (1,), (0,)]
    assert len(plan(node_file(tmp_path, CPU)).children) == 1  # the default: one worker
    listed = plan(
        node_file(tmp_path, CPU + "workers: [{name: a}]\n"), {"REACTANT_CPU_WORKERS": "3"}
    )
    assert [c.name for c in listed.children] == ["a"]
    assert listed.notes == (
        f"REACTANT_CPU_WORKERS ignored: {tmp_path / 'node.yaml'} lists its workers",
    )


#: What the refusal of devices on a CPU node says to change (node, serve, config alike).
TO_FIX = (
    " (for a GPU node set runtime.backend: cuda as well -- global: {runtime: {backend: cuda}} "
    "or INFERENCE_SERVER_RUNTIME_BACKEND=cuda; for a CPU node, gpus: 0)"
)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            CPU,
            {"REACTANT_GPUS": "2"},
            "REACTANT_GPUS: expected 0 (a CPU node), since every worker runs runtime.backend: "
            "cpu; got 2 device(s): 0, 1" + TO_FIX,
        ),
        (
            CPU + "gpus: [0]\n",
            {},
            "node.yaml:4: gpus: expected 0 (a CPU node), since every worker runs "
            "runtime.backend: cpu; got 1 device(s): 0" + TO_FIX,
        ),
        (CPU, {"REACTANT_CPU_WORKERS": "0"}, "REACTANT_CPU_WORKERS: expected an integer >= 1; got 0"),
        (CPU, {"REACTANT_ROLE": "both"}, "REACTANT_ROLE: expected one of all, workers, gateway; got 'both'"),
        (
            CPU,
            {"REACTANT_SUPERVISOR_MAX_RESTARTS": "-1"},
            "REACTANT_SUPERVISOR_MAX_RESTARTS: expected an integer >= 0; got -1",
        ),
        (CPU, {"REACTANT_WORKER_THREADS": "many"}, "REACTANT_WORKER_THREADS: expected an integer >= 1; got 'many'"),
    ],
)  # fmt: skip
def test_conflicts_and_bad_variables_are_errors(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        plan(node_file(tmp_path, text), env)
    assert str(info.value).removeprefix(f"{tmp_path}/") == message


def test_worker_threads_variable_overrides_the_share(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CPU), {"REACTANT_WORKER_THREADS": "3"}, cpus=32)
    assert p.children[0].threads == 3
    assert p.children[0].env["OMP_NUM_THREADS"] == "3"


# --- roles and ports ---------------------------------------------------------------------------


def test_one_worker_binds_the_public_ports_and_no_gateway_runs(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CPU + "global:\n  endpoints: {host: 0.0.0.0}\n"))
    assert [c.name for c in p.children] == ["worker0"]
    worker = p.children[0]
    assert worker.env["INFERENCE_SERVER_ENDPOINTS_PORT"] == "8001"
    assert worker.env["INFERENCE_SERVER_ENDPOINTS_METRICS_PORT"] == "8002"
    assert (worker.grpc, worker.metrics) == ("0.0.0.0:8001", "0.0.0.0:8002")
    assert (p.public_grpc, p.public_metrics) == ("0.0.0.0:8001", "0.0.0.0:8002")
    assert list(p.files) == ["/run/rs/node.yaml"]
    assert p.gateway is None


def test_public_ports_follow_the_gateways_listen_setting(tmp_path: Path) -> None:
    path = node_file(tmp_path, CPU)
    p = plan(path, {"REACTANT_GATEWAY_LISTEN_GRPC": "0.0.0.0:7001"})
    # The sole worker is the node's public endpoint: the gateway's host and ports.
    assert p.children[0].grpc == "0.0.0.0:7001"
    assert p.children[0].metrics == "0.0.0.0:8002"
    (tmp_path / "gateway.yml").write_text("listen:\n  grpc: 127.0.0.1:6001\n  metrics: 0.0.0.0:0\n")
    p = plan(path)  # a gateway.yml beside the node file is the node's gateway configuration
    assert (p.children[0].grpc, p.children[0].metrics) == ("127.0.0.1:6001", "")
    assert p.notes == (f"gateway settings from {tmp_path / 'gateway.yml'}",)


def test_role_workers_runs_only_workers_on_their_own_ports(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CPU), {"REACTANT_ROLE": "workers", "REACTANT_CPU_WORKERS": "2"})
    assert [(c.name, c.grpc, c.metrics) for c in p.children] == [
        ("worker0", "127.0.0.1:8100", "127.0.0.1:9200"),
        ("worker1", "127.0.0.1:8101", "127.0.0.1:9201"),
    ]
    assert "INFERENCE_SERVER_ENDPOINTS_PORT" not in p.children[0].env
    assert p.public_grpc == ""
    single = plan(node_file(tmp_path, CPU), {"REACTANT_ROLE": "workers"})
    assert single.children[0].grpc == "127.0.0.1:8100"  # never the public port


def test_role_gateway_runs_only_the_gateway(tmp_path: Path) -> None:
    p = plan(node_file(tmp_path, CUDA + "gpus: 2\n"), {"REACTANT_ROLE": "gateway"}, smi=None)
    assert [c.name for c in p.children] == ["gateway"]
    assert p.gateway is not None
    assert p.gateway.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081")
    assert list(p.files) == ["/run/rs/gateway.yml"]
    listed = CUDA + "gateway:\n  endpoints: ['w0:8080', 'w1:8080', 'w2:8080']\n"
    p = plan(node_file(tmp_path, listed), {"REACTANT_ROLE": "gateway"}, smi=None)
    assert p.gateway is not None
    assert p.gateway.endpoints == ("w0:8080", "w1:8080", "w2:8080")
    explicit = CUDA + "workers:\n  - {name: a}\n  - {name: b}\n  - {name: c}\n"
    p = plan(node_file(tmp_path, explicit), {"REACTANT_ROLE": "gateway"}, smi=None)
    assert p.gateway is not None
    assert p.gateway.worker_names == ("a", "b", "c")
    with pytest.raises(ConfigError, match=r"^REACTANT_ROLE: expected the gateway's endpoints"):
        plan(node_file(tmp_path, CUDA), {"REACTANT_ROLE": "gateway"}, smi=None)


def test_ports_that_collide_with_the_gateway_are_refused(tmp_path: Path) -> None:
    path = node_file(tmp_path, CPU.replace("8100", "8001"))
    with pytest.raises(ConfigError) as info:
        plan(path, {"REACTANT_CPU_WORKERS": "2"})
    assert str(info.value) == (
        f"{path}:2: base_port: expected a port of its own for worker0's gRPC listener; 8001 "
        "is also the gateway's listen.grpc (change base_port / metrics_base_port, the "
        "gateway's listen:, or the INFERENCE_SERVER_ENDPOINTS_* overrides)"
    )
    with pytest.raises(ConfigError, match="8500 is also worker0's gRPC port"):
        plan(
            node_file(tmp_path, CPU),
            {"REACTANT_CPU_WORKERS": "2", "INFERENCE_SERVER_ENDPOINTS_PORT": "8500"},
        )


def test_a_bad_override_stops_the_node_before_any_child_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^INFERENCE_SERVER_SCHEDULER_DISCIPLINE: expected"):
        plan(node_file(tmp_path, CPU), {"INFERENCE_SERVER_SCHEDULER_DISCIPLINE": "fiar"})


def test_restart_budget_comes_from_the_environment(tmp_path: Path) -> None:
    assert plan(node_file(tmp_path, CPU)).max_restarts == 0
    assert (
        plan(node_file(tmp_path, CPU), {"REACTANT_SUPERVISOR_MAX_RESTARTS": "4"}).max_restarts == 4
    )


def test_the_worker_sizes_its_hook_pool_from_reactant_worker_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the plan sets is read: a worker runs that many model hooks at once (4 when run
    bare), and says so when the variable is not a positive integer."""
    from reactantserver.worker import hook_threads

    assert hook_threads({"REACTANT_WORKER_THREADS": "16"}) == 16
    assert hook_threads({}) == 4
    assert hook_threads({"REACTANT_WORKER_THREADS": "0"}) == 4
    assert "REACTANT_WORKER_THREADS='0' is not a positive integer" in caplog.text


# --- the gateway's expected models --------------------------------------------------------------


def _bundle(repo: Path, name: str) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "manifest.yaml").write_text("format_version: 1\n")


def test_the_gateway_expects_the_models_the_node_assigns(tmp_path: Path) -> None:
    """Every bundle of the repository (a directory without a manifest is no bundle), a
    worker's models_include, and the models: pins: what the gateway answers UNAVAILABLE
    for, not NOT_FOUND, while the workers are down or starting. Written into gateway.yml."""
    path = node_file(
        tmp_path,
        "model_repo: models\ngpus: 0\nglobal:\n  runtime: {backend: cpu}\n"
        "workers:\n  - {name: a}\n  - {name: b, models_include: [iris, extra]}\n"
        "models:\n  pinned: [a]\n",
    )
    for name in ("double", "iris"):
        _bundle(tmp_path / "models", name)
    (tmp_path / "models" / "notes").mkdir()
    p = plan(path)
    assert p.gateway is not None
    assert p.gateway.expected_models == ("double", "extra", "iris", "pinned")
    written = next(text for name, text in p.files.items() if name.endswith("gateway.yml"))
    out = tmp_path / "gateway.yml"
    out.write_text(written)
    assert (
        load_gateway(out, {"REACTANT_NODE_GATEWAY_KEY": "k"}).expected_models
        == p.gateway.expected_models
    )


def test_expected_models_set_for_the_gateway_are_kept(tmp_path: Path) -> None:
    path = node_file(
        tmp_path,
        "model_repo: models\ngpus: 0\nglobal:\n  runtime: {backend: cpu}\n"
        "workers:\n  - {name: a}\n  - {name: b}\ngateway:\n  expected_models: [only]\n",
    )
    _bundle(tmp_path / "models", "double")
    p = plan(path)
    assert p.gateway is not None and p.gateway.expected_models == ("only",)


def test_the_written_node_file_keeps_the_key_and_certificate_files_it_meant(
    tmp_path: Path,
) -> None:
    """Files named relative to the node file still name them from the runtime directory
    (a worker that could not read its key would not start: docs/security.md's example)."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "admin.key").write_text("k\n")
    path = node_file(
        tmp_path,
        CPU + "workers:\n  - {name: a}\n  - {name: b}\nglobal:\n  endpoints:\n"
        "    restricted: [{groups: [control], header: admin-key, key_file: secrets/admin.key}]\n",
    )
    p = plan(path)
    out = tmp_path / "run"
    out.mkdir()
    (out / "node.yaml").write_text(p.files["/run/rs/node.yaml"])
    cfg = resolve_worker(load_node(out / "node.yaml", {}), "a", {})
    assert cfg.endpoints.restricted[0].key_file == str(tmp_path / "secrets" / "admin.key")

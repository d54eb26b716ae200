"""Every example node.yaml / gateway.yml of the seed documents loads and resolves as they say.

The fixtures under tests/fixtures/configs/ are the seeds' examples copied verbatim, one
file each. ``*.node.yaml`` and ``*.gateway.yml`` are whole files; ``*.fragment.yaml`` are
excerpts the seed shows on their own (a ``global:`` block, a ``workers:`` list, the
``models:`` map, a ``scheduler:`` block), which the tests place into a minimal node file
the way the seed describes them.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from reactantserver.config import (
    ModelSchedConfig,
    load_gateway,
    load_node,
    load_server_config,
    materialize_workers,
    resolve_gateway,
    resolve_worker,
    worker_names,
)
from reactantserver.errors import ConfigError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "configs"
REPO = "/var/lib/reactantserver/models"


def fixture(name: str) -> Path:
    return FIXTURES / name


def compose(tmp_path: Path, head: str, *fragments: str, indent_under: str | None = None) -> Path:
    """A node file made of ``head`` and fixture fragments (optionally nested under a key)."""
    parts = [textwrap.dedent(head)]
    for name in fragments:
        text = fixture(name).read_text()
        if indent_under is not None:
            text = f"{indent_under}:\n" + textwrap.indent(text, "  ")
        parts.append(text)
    path = tmp_path / "node.yaml"
    path.write_text("\n".join(parts))
    return path


def test_every_seed_example_is_a_fixture() -> None:
    names = sorted(p.name for p in FIXTURES.iterdir())
    assert names == [
        "seed_distributed.gateway.yml",
        "seed_distributed.node.yaml",
        "seed_global_settings.fragment.yaml",
        "seed_models_pin.fragment.yaml",
        "seed_multinode.gateway.yml",
        "seed_replicas_all.gateway.yml",
        "seed_replicated.gateway.yml",
        "seed_scheduler_models.fragment.yaml",
        "seed_single_gpu.node.yaml",
        "seed_standalone.gateway.yml",
        "seed_top_level_keys.node.yaml",
        "seed_workers.fragment.yaml",
    ]


def test_single_gpu_node() -> None:
    node = load_node(fixture("seed_single_gpu.node.yaml"), env={}, check_paths=False)
    assert node.gpus == "auto"
    assert worker_names(node) == ("worker0",)
    cfg = resolve_worker(node, env={})
    assert cfg.name == "worker0"
    assert cfg.model_dirs == (REPO,)
    assert cfg.cache_dir == "/var/cache/reactantserver"
    assert cfg.runtime.backend == "cuda"
    assert cfg.runtime.mem_fraction == 0.9
    assert cfg.runtime.weight_cache_fraction == 1.0
    assert cfg.runtime.allow_cpu_fallback is True  # not set: the code default
    assert cfg.scheduler.discipline == "fair"
    assert cfg.scheduler.ema_halflife_seconds == 30.0
    assert cfg.scheduler.max_queue_depth == 1024
    assert cfg.endpoints.host == "0.0.0.0"
    assert cfg.endpoints.port == 8080  # base_port + 0
    assert cfg.endpoints.metrics_port == 9100  # metrics_base_port + 0


def test_distributed_node_one_worker_per_gpu() -> None:
    node = load_node(fixture("seed_distributed.node.yaml"), env={}, check_paths=False)
    supervised = materialize_workers(node, 4)
    assert worker_names(supervised) == ("worker0", "worker1", "worker2", "worker3")
    configs = [resolve_worker(supervised, name, env={}) for name in worker_names(supervised)]
    assert [c.endpoints.port for c in configs] == [8080, 8081, 8082, 8083]
    assert [c.endpoints.metrics_port for c in configs] == [9100, 9101, 9102, 9103]
    assert {c.scheduler.discipline for c in configs} == {"fifo"}
    assert {c.model_dirs for c in configs} == {(REPO,)}


def test_distributed_gateway_embedded_in_front_of_the_node() -> None:
    node = materialize_workers(
        load_node(fixture("seed_distributed.node.yaml"), env={}, check_paths=False), 2
    )
    env = {"REACTANT_GATEWAY_FILE": str(fixture("seed_distributed.gateway.yml"))}
    gw = resolve_gateway(node, env=env)
    assert gw.scheduling.mode == "lpt_packing"
    assert gw.scheduling.default_replicas == 1
    assert gw.scheduling.rebalance_compute_seconds == 30.0
    # Taken from the node: workers bind 0.0.0.0, so the gateway reaches them on loopback.
    assert gw.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081")
    assert gw.worker_names == ("worker0", "worker1")
    assert gw.metrics_endpoints == ("127.0.0.1:9100", "127.0.0.1:9101")
    assert math.isinf(gw.startup_wait_seconds)
    # Not set in the file: the gateway defaults of REFERENCE section 7.
    assert gw.listen.grpc == "0.0.0.0:8001"
    assert gw.scheduling.routing_policy == "fill_least"
    assert gw.scheduling.hysteresis == 0.0


def test_lpt_gateway_refuses_the_fair_single_gpu_node(tmp_path: Path) -> None:
    node = materialize_workers(
        load_node(fixture("seed_single_gpu.node.yaml"), env={}, check_paths=False), 2
    )
    env = {"REACTANT_GATEWAY_FILE": str(fixture("seed_distributed.gateway.yml"))}
    with pytest.raises(ConfigError) as err:
        resolve_gateway(node, env=env)
    src = fixture("seed_single_gpu.node.yaml")
    assert str(err.value) == (
        f"{fixture('seed_distributed.gateway.yml')}:3: scheduling.mode: expected workers on "
        f"fifo or edf under lpt_packing; worker0 runs fair (set by global.scheduler.discipline at {src}:16)"
    )


def test_replicated_gateway() -> None:
    gw = load_gateway(
        fixture("seed_replicated.gateway.yml"), env={"REACTANT_GATEWAY_WORKERS": "w0:8080,w1:8081"}
    )
    sched = gw.scheduling
    assert sched.mode == "lpt_packing"
    assert sched.default_replicas == 1
    assert sched.rebalance_compute_seconds == 30.0
    assert sched.routing_fill_factor == 1.0
    assert sched.routing_policy == "fill_rr"
    assert sched.models["resnet50"].replicas == 2
    assert sched.models["resnet50"].fill_mode is None  # inherits routing_fill_mode
    assert gw.endpoints == ("w0:8080", "w1:8081")


def test_replicas_all_gateway() -> None:
    gw = load_gateway(
        fixture("seed_replicas_all.gateway.yml"), env={"REACTANT_GATEWAY_WORKERS": "w0:8080"}
    )
    assert gw.scheduling.mode == "lpt_packing"
    assert gw.scheduling.default_replicas == "all"


def test_multinode_standalone_gateway() -> None:
    gw = load_gateway(fixture("seed_multinode.gateway.yml"), env={})
    assert gw.listen.grpc == "0.0.0.0:8001"
    assert gw.listen.metrics == "0.0.0.0:8002"
    assert gw.scheduling.mode == "lpt_packing"
    assert gw.endpoints == (
        "node1-worker0:8080",
        "node1-worker1:8081",
        "node2-worker0:8080",
        "node2-worker1:8081",
    )
    assert gw.metrics_endpoints == ()  # commented out in the seed


def test_full_gateway_yml() -> None:
    gw = load_gateway(fixture("seed_standalone.gateway.yml"), env={})
    assert gw.grpc.max_recv_msg_bytes == 256 * 1024 * 1024
    assert gw.grpc.max_send_msg_bytes == 256 * 1024 * 1024
    assert gw.grpc.max_concurrent_requests_per_worker == 64
    assert gw.worker_client.request_timeout_seconds == 60.0
    assert gw.worker_client.max_concurrent_streams == 32
    assert (gw.logging.level, gw.logging.format) == ("info", "json")
    assert gw.scheduling.mode == "round_robin"
    assert gw.endpoints == ("worker0:8080", "worker1:8081")


def test_gateway_yml_from_the_file_variable() -> None:
    env = {"REACTANT_GATEWAY_FILE": str(fixture("seed_standalone.gateway.yml"))}
    assert load_gateway(env=env).endpoints == ("worker0:8080", "worker1:8081")


def test_top_level_keys_with_empty_blocks() -> None:
    # `global:`, `workers:`, `models:`, `gateway:` with nothing after them mean "not set".
    node = load_node(fixture("seed_top_level_keys.node.yaml"), env={}, check_paths=False)
    assert node.workers == () and node.models == {} and node.gateway is None
    cfg = resolve_worker(node, env={})
    assert (cfg.name, cfg.endpoints.port, cfg.model_dirs) == ("worker0", 8080, (REPO,))
    assert cfg.runtime.backend == "cpu"  # the code default


def test_global_settings_block(tmp_path: Path) -> None:
    path = compose(tmp_path, f"model_repo: {REPO}\n", "seed_global_settings.fragment.yaml")
    cfg = load_server_config(path, env={}, check_paths=False)
    assert cfg.cache_dir == "/var/cache/reactantserver"
    assert (cfg.model_control_mode, cfg.model_poll_seconds) == ("dynamic", 15.0)
    rt = cfg.runtime
    assert (rt.backend, rt.mem_fraction, rt.preallocate, rt.allow_cpu_fallback) == (
        "cuda",
        0.9,
        True,
        False,
    )
    assert (rt.weight_cache_fraction, rt.weight_cache_wiggle_fraction) == (1.0, 0.1)
    sc = cfg.scheduler
    assert (sc.discipline, sc.ema_halflife_seconds, sc.max_queue_depth) == ("fair", 30.0, 1024)
    assert (sc.dispatch_timeout_seconds, sc.compaction_interval, sc.models) == (30.0, 0, {})
    assert (cfg.endpoints.host, cfg.endpoints.max_concurrent_requests) == ("0.0.0.0", 64)


def test_workers_list_ports_are_base_port_plus_index(tmp_path: Path) -> None:
    path = compose(tmp_path, f"model_repo: {REPO}\nbase_port: 8080\n", "seed_workers.fragment.yaml")
    node = load_node(path, env={}, check_paths=False)
    assert worker_names(node) == ("worker0", "worker1")
    assert resolve_worker(node, "worker0", env={}).endpoints.port == 8080
    assert resolve_worker(node, "worker1", env={}).endpoints.port == 8081
    with pytest.raises(ConfigError) as err:
        resolve_worker(node, env={})
    assert str(err.value) == (
        f"{path}:4: workers: expected a worker name to run, one of worker0, worker1; got none "
        "(reactantserver serve --worker NAME, or REACTANT_WORKER_NAME=NAME)"
    )


def test_models_map_pins_to_device_on_listed_workers(tmp_path: Path) -> None:
    path = compose(
        tmp_path,
        f"model_repo: {REPO}\n",
        "seed_workers.fragment.yaml",
        "seed_models_pin.fragment.yaml",
    )
    node = load_node(path, env={}, check_paths=False)
    w0 = resolve_worker(node, "worker0", env={}).scheduler
    w1 = resolve_worker(node, "worker1", env={}).scheduler
    assert w0.models == {
        "resnet50": ModelSchedConfig(residency="device"),
        "vsq_coral": ModelSchedConfig(residency="device"),
    }
    assert w1.models == {"resnet50": ModelSchedConfig(residency="device")}
    # Unlisted models keep the default (system when the weight cache is on).
    assert w1.for_model("vsq_coral").residency is None


def test_per_model_scheduler_overrides(tmp_path: Path) -> None:
    path = compose(
        tmp_path,
        f"model_repo: {REPO}\n",
        "seed_scheduler_models.fragment.yaml",
        indent_under="global",
    )
    models = load_server_config(path, env={}, check_paths=False).scheduler.models
    assert models["resnet50"] == ModelSchedConfig(weight=2.0, residency="device", max_batch_size=8)
    assert models["yolo"] == ModelSchedConfig(residency="unpinned")

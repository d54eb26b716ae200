"""Environment overrides: applied on top of the node file, checked like the file, named on error."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from reactantserver.config import (
    load_gateway,
    load_node,
    load_server_config,
    materialize_workers,
    resolve_gateway,
    resolve_worker,
)
from reactantserver.config.env import GATEWAY_ENV, WORKER_ENV
from reactantserver.errors import ConfigError

NODE = """\
model_repo: /models
base_port: 8080
metrics_base_port: 9200
global:
  runtime:
    backend: cuda
    weight_cache_fraction: 1.0
  scheduler:
    discipline: fifo
    max_queue_depth: 1024
  endpoints:
    host: 0.0.0.0
workers:
  - name: worker0
  - name: worker1
    scheduler:
      max_queue_depth: 8
"""


@pytest.fixture
def node_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NODE as ``node.yaml`` in the working directory (messages name the file as given)."""
    monkeypatch.chdir(tmp_path)
    path = Path("node.yaml")
    path.write_text(NODE)
    return path


def test_seed_examples_override_resolved_values(node_file: Path) -> None:
    env = {
        "INFERENCE_SERVER_ENDPOINTS_PORT": "9100",
        "INFERENCE_SERVER_RUNTIME_BACKEND": "cpu",
        "INFERENCE_SERVER_RUNTIME_WEIGHT_CACHE_FRACTION": "0.8",
    }
    cfg = load_server_config(node_file, "worker1", env=env, check_paths=False)
    assert cfg.endpoints.port == 9100
    assert cfg.runtime.backend == "cpu"
    assert cfg.runtime.weight_cache_fraction == 0.8
    # Everything else still comes from the file: the global discipline, the worker's own
    # queue depth (deep merge), the derived metrics port.
    assert cfg.scheduler.discipline == "fifo"
    assert cfg.scheduler.max_queue_depth == 8
    assert cfg.endpoints.metrics_port == 9201
    assert cfg.endpoints.host == "0.0.0.0"


def test_top_level_scalars_lists_and_booleans(node_file: Path) -> None:
    env = {
        "INFERENCE_SERVER_MODEL_CONTROL_MODE": "explicit",
        "INFERENCE_SERVER_MODEL_POLL_SECONDS": "2.5",
        "INFERENCE_SERVER_CACHE_DIR": "/tmp/jax-cache",
        "INFERENCE_SERVER_MODEL_DIRS": "/a:/b::/c",
        "INFERENCE_SERVER_MODELS_INCLUDE": "resnet50:yolo",
        "INFERENCE_SERVER_RUNTIME_PREALLOCATE": "off",
        "INFERENCE_SERVER_RUNTIME_ALLOW_CPU_FALLBACK": "No",
        "INFERENCE_SERVER_RUNTIME_WEIGHT_PREFETCH": "yes",
        "INFERENCE_SERVER_GPU": "1",
    }
    cfg = load_server_config(node_file, "worker0", env=env, check_paths=False)
    assert cfg.model_control_mode == "explicit"
    assert cfg.model_poll_seconds == 2.5
    assert cfg.cache_dir == "/tmp/jax-cache"
    assert cfg.model_dirs == ("/a", "/b", "/c")  # empty items dropped
    assert cfg.models_include == ("resnet50", "yolo")
    assert cfg.runtime.preallocate is False
    assert cfg.runtime.allow_cpu_fallback is False
    assert cfg.runtime.weight_prefetch is True
    assert cfg.gpu == 1


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "INFERENCE_SERVER_SCHEDULER_DISCIPLINE",
            "x",
            "INFERENCE_SERVER_SCHEDULER_DISCIPLINE: expected one of fair, fifo, edf; got 'x'",
        ),
        (
            "INFERENCE_SERVER_ENDPOINTS_PORT",
            "80a",
            "INFERENCE_SERVER_ENDPOINTS_PORT: expected an integer; got '80a'",
        ),
        (
            "INFERENCE_SERVER_ENDPOINTS_PORT",
            "70000",
            "INFERENCE_SERVER_ENDPOINTS_PORT: expected a port in 1..65535; got 70000",
        ),
        (
            "INFERENCE_SERVER_ENDPOINTS_METRICS_PORT",
            "8080",
            "INFERENCE_SERVER_ENDPOINTS_METRICS_PORT: expected a port other than the gRPC port; "
            "got 8080 for both (the gRPC port comes from base_port at node.yaml:2)",
        ),
        (
            "INFERENCE_SERVER_RUNTIME_MEM_FRACTION",
            "1.5",
            "INFERENCE_SERVER_RUNTIME_MEM_FRACTION: expected a number in (0, 1]; got 1.5",
        ),
        (
            "INFERENCE_SERVER_RUNTIME_PREALLOCATE",
            "maybe",
            "INFERENCE_SERVER_RUNTIME_PREALLOCATE: expected 1, true, yes, on, 0, false, no or off; "
            "got 'maybe'",
        ),
        (
            "INFERENCE_SERVER_SCHEDULER_DISCIPLIN",
            "fifo",
            "INFERENCE_SERVER_SCHEDULER_DISCIPLIN: unknown variable; did you mean "
            "INFERENCE_SERVER_SCHEDULER_DISCIPLINE?",
        ),
        (
            "INFERENCE_SERVER_FROBNICATE",
            "1",
            "INFERENCE_SERVER_FROBNICATE: unknown variable; no INFERENCE_SERVER_* setting has "
            "this name",
        ),
        (
            "INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE",
            "externally_managed",
            "INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE: removed; use the top-level "
            "model_control_mode instead ('explicit' replaces 'externally_managed'; 'dynamic' and "
            "'static' are self-managed)",
        ),
        (
            "INFERENCE_SERVER_BATCH_POLICY_MAX_BATCH_SIZE",
            "8",
            "INFERENCE_SERVER_BATCH_POLICY_MAX_BATCH_SIZE: removed; batches are coalesced at the "
            "bundle's compiled batch sizes: cap rows per dispatch with "
            "scheduler.models.<name>.max_batch_size and choose the dispatch order with "
            "scheduler.discipline",
        ),
    ],
)
def test_bad_override_is_refused_with_the_variable(
    node_file: Path, var: str, value: str, message: str
) -> None:
    node = load_node(node_file, env={}, check_paths=False)
    with pytest.raises(ConfigError) as err:
        resolve_worker(node, "worker0", env={var: value})
    assert str(err.value) == message
    # load_node checks the environment too, so a bad override fails before any worker starts.
    with pytest.raises(ConfigError) as err:
        load_node(node_file, env={var: value}, check_paths=False)
    assert str(err.value) == message


def test_override_colliding_with_the_file_names_both(tmp_path: Path) -> None:
    # The seed's own example, INFERENCE_SERVER_ENDPOINTS_PORT=9100, against a node whose
    # admin ports start at 9100: worker0 would bind 9100 twice.
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\nmetrics_base_port: 9100\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={"INFERENCE_SERVER_ENDPOINTS_PORT": "9100"}, check_paths=False)
    assert str(err.value) == (
        f"{path}:2: metrics_base_port: expected a port other than the gRPC port; got 9100 for "
        "both (the gRPC port comes from INFERENCE_SERVER_ENDPOINTS_PORT)"
    )


def test_default_environment_is_os_environ(
    node_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_SERVER_SCHEDULER_DISCIPLINE", "edf")
    assert load_server_config(node_file, "worker0", check_paths=False).scheduler.discipline == "edf"


def test_worker_name_from_the_environment(node_file: Path) -> None:
    node = load_node(node_file, env={}, check_paths=False)
    assert resolve_worker(node, env={"REACTANT_WORKER_NAME": "worker1"}).name == "worker1"
    with pytest.raises(ConfigError) as err:
        resolve_worker(node, env={"REACTANT_WORKER_NAME": "worker7"})
    assert str(err.value) == "REACTANT_WORKER_NAME: expected one of worker0, worker1; got 'worker7'"


def test_unrelated_variables_are_ignored(node_file: Path) -> None:
    env = {"PATH": "/bin", "REACTANT_GPUS": "2", "INFERENCE_SERVERX": "1"}
    assert (
        load_server_config(node_file, "worker0", env=env, check_paths=False).endpoints.port == 8080
    )


def test_variable_names_come_from_the_schema() -> None:
    assert WORKER_ENV["INFERENCE_SERVER_SCHEDULER_DISCIPLINE"].path == ("scheduler", "discipline")
    assert WORKER_ENV["INFERENCE_SERVER_MODEL_POLL_SECONDS"].path == ("model_poll_seconds",)
    assert WORKER_ENV["INFERENCE_SERVER_MODELS_INCLUDE"].path == ("models_include",)
    assert "INFERENCE_SERVER_NAME" not in WORKER_ENV  # the name is chosen, not overridden
    assert GATEWAY_ENV["REACTANT_GATEWAY_WORKERS"].path == ("endpoints",)
    assert GATEWAY_ENV["REACTANT_GATEWAY_WORKER_METRICS"].path == ("metrics_endpoints",)
    assert GATEWAY_ENV["REACTANT_GATEWAY_GRPC_MAX_RECV_MSG_BYTES"].path == (
        "grpc",
        "max_recv_msg_bytes",
    )


# --- gateway ---------------------------------------------------------------------------------


def test_gateway_from_the_environment_alone() -> None:
    env = {
        "REACTANT_GATEWAY_WORKERS": "w0:8080, w1:8081,",
        "REACTANT_GATEWAY_WORKER_NAMES": "worker0,worker1",
        "REACTANT_GATEWAY_WORKER_METRICS": "w0:9100,w1:9101",
        "REACTANT_GATEWAY_SCHEDULING_MODE": "lpt_packing",
        "REACTANT_GATEWAY_SCHEDULING_DEFAULT_REPLICAS": "all",
        "REACTANT_GATEWAY_SCHEDULING_FORBID_MEMORY_OVERSUBSCRIPTION": "false",
        "REACTANT_GATEWAY_GRPC_MAX_RECV_MSG_BYTES": "1048576",
        "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS": "inf",
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:18001",
    }
    gw = load_gateway(env=env)
    assert gw.endpoints == ("w0:8080", "w1:8081")
    assert gw.worker_names == ("worker0", "worker1")
    assert gw.metrics_endpoints == ("w0:9100", "w1:9101")
    assert gw.scheduling.mode == "lpt_packing"
    assert gw.scheduling.default_replicas == "all"
    assert gw.scheduling.forbid_memory_oversubscription is False
    assert gw.grpc.max_recv_msg_bytes == 1048576
    assert math.isinf(gw.startup_wait_seconds)
    assert gw.listen.grpc == "127.0.0.1:18001"


def test_gateway_env_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: [a:1]\nscheduling:\n  mode: round_robin\n")
    gw = load_gateway(path, env={"REACTANT_GATEWAY_SCHEDULING_MODE": "least_outstanding"})
    assert gw.scheduling.mode == "least_outstanding"
    assert gw.endpoints == ("a:1",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"REACTANT_GATEWAY_WORKERS": "a:1", "REACTANT_GATEWAY_SCHEDULING_MODE": "packing"},
            "REACTANT_GATEWAY_SCHEDULING_MODE: expected one of round_robin, least_outstanding, "
            "lpt_packing; got 'packing'",
        ),
        (
            {"REACTANT_GATEWAY_WORKERS": "a:1,b"},
            "REACTANT_GATEWAY_WORKERS: expected host:port with a port in 1..65535; got 'b'",
        ),
        (
            {"REACTANT_GATEWAY_WORKERS": ""},
            "REACTANT_GATEWAY_WORKERS: expected at least one worker host:port (endpoints: or "
            "REACTANT_GATEWAY_WORKERS); got none",
        ),
        (
            {},
            "REACTANT_GATEWAY_WORKERS: expected at least one worker host:port (endpoints: or "
            "REACTANT_GATEWAY_WORKERS); got none",
        ),
        (
            {
                "REACTANT_GATEWAY_WORKERS": "a:1",
                "REACTANT_GATEWAY_SCHEDULING_DEFAULT_REPLICAS": "0",
            },
            "REACTANT_GATEWAY_SCHEDULING_DEFAULT_REPLICAS: expected a positive integer or all; "
            "got 0",
        ),
        (
            {"REACTANT_GATEWAY_WORKERS": "a:1", "REACTANT_GATEWAY_SCHEDULING_WORK_BASE": "items"},
            "REACTANT_GATEWAY_SCHEDULING_WORK_BASE: unknown variable; did you mean "
            "REACTANT_GATEWAY_SCHEDULING_WORK_BASIS?",
        ),
        (
            {"REACTANT_GATEWAY_FILE": "/nonexistent/gateway.yml"},
            "REACTANT_GATEWAY_FILE: expected the path of a gateway.yml; got "
            "'/nonexistent/gateway.yml' (no such file)\n"
            "REACTANT_GATEWAY_WORKERS: expected at least one worker host:port (endpoints: or "
            "REACTANT_GATEWAY_WORKERS); got none",
        ),
    ],
)
def test_bad_gateway_override(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_gateway(env=env)
    assert str(err.value) == message


def test_embedded_gateway_mode_from_env_checks_worker_disciplines(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\ngpus: 2\n")
    node = load_node(path, env={}, check_paths=False)
    env = {"REACTANT_GATEWAY_SCHEDULING_MODE": "lpt_packing"}
    with pytest.raises(ConfigError) as err:
        resolve_gateway(node, env=env)
    assert str(err.value) == (
        "REACTANT_GATEWAY_SCHEDULING_MODE: expected workers on fifo or edf under lpt_packing; "
        "worker0 runs fair (by default)"
    )
    # The workers' own override, in the same environment the supervisor hands down, fixes it.
    env["INFERENCE_SERVER_SCHEDULER_DISCIPLINE"] = "fifo"
    gw = resolve_gateway(node, env=env)
    assert gw.scheduling.mode == "lpt_packing"
    assert gw.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081")


def test_embedded_gateway_block_keeps_what_it_sets(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_repo: /m
            global:
              scheduler: {discipline: edf}
              endpoints: {host: "::", max_message_bytes: 1048576}
            gateway:
              grpc:
                max_send_msg_bytes: 2097152
              scheduling:
                mode: lpt_packing
              startup_wait_seconds: 30
            """
        )
    )
    node = materialize_workers(load_node(path, env={}, check_paths=False), 2)
    gw = resolve_gateway(node, env={})
    assert gw.endpoints == ("[::1]:8080", "[::1]:8081")
    assert gw.metrics_endpoints == ()  # the workers have no admin port
    assert gw.grpc.max_recv_msg_bytes == 1048576  # from the workers
    assert gw.grpc.max_send_msg_bytes == 2097152  # from the block
    assert gw.startup_wait_seconds == 30.0
    with pytest.raises(ConfigError) as err:
        resolve_gateway(node, env={"REACTANT_GATEWAY_FILE": str(path)})
    assert str(err.value) == (
        f"REACTANT_GATEWAY_FILE: expected one gateway configuration; {path} already has a "
        "gateway: block (keep one of them)"
    )

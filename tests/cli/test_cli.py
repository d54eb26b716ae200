"""The ``reactantserver`` command line: ``reactantserver config``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reactantserver.cli import main
from reactantserver.config import ServerConfig, dump_config, load_server_config
from reactantserver.config.convert import structure
from reactantserver.config.source import SourceMap

FIXTURES = Path(__file__).parent.parent / "fixtures" / "configs"

NODE = """\
model_repo: models
base_port: 8080
global:
  scheduler:
    discipline: fifo
workers:
  - name: worker0
  - name: worker1
    scheduler:
      max_queue_depth: 8
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command reads os.environ: start every test from one without our variables."""
    for var in list(os.environ):
        if var.startswith(("INFERENCE_SERVER_", "REACTANT_")):
            monkeypatch.delenv(var)


@pytest.fixture
def node_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    Path("models").mkdir()
    Path("node.yaml").write_text(NODE)
    return "node.yaml"


def documents(text: str) -> list[dict[str, object]]:
    return [doc for doc in YAML(typ="safe").load_all(text) if doc is not None]


def test_prints_every_worker(node_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", node_file]) == 0
    out = capsys.readouterr().out
    # First what `reactantserver node` would start here (docs/node.md), then each worker.
    assert out.startswith("# node plan: role all; no device (runtime.backend: cpu)\n")
    assert "\n#   worker1  CUDA_VISIBLE_DEVICES=  gRPC 127.0.0.1:8081  metrics off" in out
    assert "---\n# worker worker0 of node.yaml\nname: worker0\n" in out
    docs = documents(out)
    assert [d["name"] for d in docs] == ["worker0", "worker1"]
    assert [d["endpoints"]["port"] for d in docs] == [8080, 8081]  # type: ignore[index]
    assert [d["scheduler"]["max_queue_depth"] for d in docs] == [1024, 8]  # type: ignore[index]
    assert {d["scheduler"]["discipline"] for d in docs} == {"fifo"}  # type: ignore[index]


def test_prints_one_worker_with_env_applied(
    node_file: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_SERVER_RUNTIME_BACKEND", "cuda")
    assert main(["config", node_file, "--worker", "worker1"]) == 0
    (doc,) = documents(capsys.readouterr().out)
    assert doc["name"] == "worker1"
    assert doc["runtime"]["backend"] == "cuda"  # type: ignore[index]


def test_output_is_the_resolved_config(node_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What the command prints structures back into exactly the worker's ServerConfig."""
    assert main(["config", node_file, "--worker", "worker1"]) == 0
    (doc,) = documents(capsys.readouterr().out)
    expected = load_server_config(node_file, "worker1", env={}, check_paths=False)
    assert structure(ServerConfig, doc, SourceMap().origin) == expected


def test_dump_round_trips_every_seed_node() -> None:
    for path in sorted(FIXTURES.glob("*.node.yaml")):
        cfg = load_server_config(path, env={}, check_paths=False)
        again = structure(ServerConfig, YAML(typ="safe").load(dump_config(cfg)), SourceMap().origin)
        assert again == cfg, path.name


def test_gateway_of_a_node(node_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", node_file, "--gateway"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# gateway of node.yaml\n")
    (doc,) = documents(out)
    assert doc["endpoints"] == ["127.0.0.1:8080", "127.0.0.1:8081"]
    assert doc["worker_names"] == ["worker0", "worker1"]


GATEWAY_BESIDE = """\
listen: {grpc: "127.0.0.1:7001", metrics: "127.0.0.1:7002"}
health_interval_seconds: 2.0
logging: {format: text}
worker_client: {request_timeout_seconds: 30}
scheduling: {mode: least_outstanding}
"""


def test_gateway_of_a_node_reads_the_gateway_yml_beside_it_as_node_does(
    node_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: the command printed defaults and ignored the gateway.yml beside the node
    file, which ``reactantserver node`` runs (5 keys differed). Now it prints exactly the
    gateway the node's plan writes."""
    from reactantserver.node.run import make_plan

    Path("gateway.yml").write_text(GATEWAY_BESIDE)
    assert main(["config", node_file, "--gateway"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# gateway of node.yaml, settings from ")
    (doc,) = documents(out)
    plan = make_plan(node_file, {}, runtime_dir="run")
    assert plan.gateway is not None
    assert doc == YAML(typ="safe").load(dump_config(plan.gateway))
    assert doc["listen"] == {"grpc": "127.0.0.1:7001", "metrics": "127.0.0.1:7002"}
    assert doc["health_interval_seconds"] == 2.0
    assert doc["scheduling"]["mode"] == "least_outstanding"  # type: ignore[index]
    # The node restarts its workers: its gateway waits for them rather than exiting.
    assert doc["wedge_exit_rounds"] == 0


def test_a_node_gateway_exits_when_wedged_only_if_its_node_runs_no_workers(
    node_file: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With REACTANT_ROLE=gateway the workers are someone else's: the wedge exit stays."""
    monkeypatch.setenv("REACTANT_ROLE", "gateway")
    assert main(["config", node_file, "--gateway"]) == 0
    (doc,) = documents(capsys.readouterr().out)
    assert doc["wedge_exit_rounds"] == 3
    # And an explicit value is kept under role all.
    monkeypatch.delenv("REACTANT_ROLE")
    Path("gateway.yml").write_text("wedge_exit_rounds: 5\n")
    assert main(["config", node_file, "--gateway"]) == 0
    (doc,) = documents(capsys.readouterr().out)
    assert doc["wedge_exit_rounds"] == 5


def test_a_gateway_yml_is_recognised(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "seed_multinode.gateway.yml")
    assert main(["config", path]) == 0
    (doc,) = documents(capsys.readouterr().out)
    assert doc["scheduling"]["mode"] == "lpt_packing"  # type: ignore[index]
    assert len(doc["endpoints"]) == 4  # type: ignore[arg-type]


def test_bad_file_prints_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("node.yaml").write_text("model_repo: .\nglobal:\n  scheduler:\n    discipline: fiar\n")
    assert main(["config", "node.yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "node.yaml:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'\n"
    )


def test_bad_environment_exits_2(
    node_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERENCE_SERVER_ENDPOINTS_PORT", "http")
    assert main(["config", node_file]) == 2
    assert capsys.readouterr().err == (
        "INFERENCE_SERVER_ENDPOINTS_PORT: expected an integer; got 'http'\n"
    )


def test_unknown_worker_exits_2(node_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", node_file, "--worker", "worker9"]) == 2
    assert capsys.readouterr().err == (
        "node.yaml:6: workers: expected one of worker0, worker1; got 'worker9'\n"
    )


def test_usage_errors_exit_2(node_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "config" in capsys.readouterr().err
    assert main(["config", node_file, "--worker", "worker0", "--gateway"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["config", str(FIXTURES / "seed_multinode.gateway.yml"), "--worker", "w"]) == 2
    assert "is a gateway.yml, which has no workers" in capsys.readouterr().err


def test_console_script(node_file: str) -> None:
    """The installed ``reactantserver`` script (pyproject's entry point) is this main."""
    script = Path(sys.executable).with_name("reactantserver")
    done = subprocess.run(
        [str(script), "config", node_file, "--worker", "worker0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert documents(done.stdout)[0]["name"] == "worker0"


GPU_ON_A_CPU_NODE = (
    "node.yaml:2: gpus: expected 0 (a CPU node), since every worker runs runtime.backend: cpu; "
    "got 1 device(s): 0 (for a GPU node set runtime.backend: cuda as well -- global: {runtime: "
    "{backend: cuda}} or INFERENCE_SERVER_RUNTIME_BACKEND=cuda; for a CPU node, gpus: 0)\n"
)


@pytest.mark.parametrize(
    "command",
    [
        ["config", "node.yaml"],
        ["config", "node.yaml", "--worker", "worker0"],
        ["config", "node.yaml", "--gateway"],
        ["serve", "node.yaml"],
        ["node", "node.yaml"],
    ],
    ids=" ".join,
)
def test_gpus_1_on_a_cpu_node_is_one_rule_said_the_same_way_by_every_command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    """The tutorial's "on a GPU machine, gpus: 1" with the default backend (cpu): before
    issue 42 ``serve`` started on the CPU without a word, ``node`` refused, ``config``
    printed the refusal as a comment and exited 0. Now each refuses with the same line,
    saying what to change, exit 2, nothing started and nothing on stdout."""
    monkeypatch.chdir(tmp_path)
    Path("models").mkdir()
    Path("node.yaml").write_text("model_repo: models\ngpus: 1\n")
    assert main(command) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == GPU_ON_A_CPU_NODE


def test_gpus_1_with_the_cuda_backend_is_a_gpu_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("models").mkdir()
    Path("node.yaml").write_text(
        "model_repo: models\ngpus: 1\nglobal: {runtime: {backend: cuda}}\n"
    )
    assert main(["config", "node.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "# node plan: role all; devices from gpus: 1: 0\n#   worker0  CUDA_VISIBLE_DEVICES=0"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: there was no ``reactantserver --version``."""
    import reactantserver

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"reactantserver {reactantserver.__version__}\n"


def test_serve_on_a_two_worker_file_names_the_flag(
    node_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", node_file]) == 2
    assert capsys.readouterr().err == (
        "node.yaml:6: workers: expected a worker name to run, one of worker0, worker1; got "
        "none (reactantserver serve --worker NAME, or REACTANT_WORKER_NAME=NAME)\n"
    )

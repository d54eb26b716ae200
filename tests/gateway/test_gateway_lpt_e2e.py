"""lpt_packing end to end: three real CPU workers behind a real gateway (issue 18).

The catalog is the zoo's ``mlp`` and five seeded variants of it at the same width
(``examples/build_repo.py --catalog`` variants, which reuse the template's artifact: one
compilation serves all six). Each worker runs ``fifo`` with the weight cache on and
``runtime.arena_bytes`` chosen so that its on-demand budget holds 4.5 models: the catalog's
weights (6 models) exceed any one worker's budget. The gateway runs
``python -m reactantserver.cli gateway gateway.yml`` in ``lpt_packing`` with
``default_replicas: 1``.

What is shown: every model answers through the gateway exactly what a worker answers
directly (each variant has its own weights, so a mix-up would show); after an operator
repack each model's traffic goes to its placed replica only (the workers' own per-model
inference counters); SetModelPlacement changes routing within the one call (the next
requests reach both new replicas); the grpcurl examples of docs/gateway.md's control-RPC
section, run as written against this gateway, all succeed and take effect; the placement
metrics; SIGTERM stops the gateway with exit 0.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import load_build_repo
from gateway_harness import (
    Process,
    free_port,
    http_get,
    metric,
    start_cli,
    wait_serving,
    wait_until,
)
from test_grpcurl import GRPCURL

from reactantserver.bundle import load_bundle

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ("w0", "w1", "w2")
#: Variants planned; the mlp ones at the default width are built (0, 8, ..., 32: five).
PLANNED = 33
#: A worker's on-demand budget, in models.
BUDGET_MODELS = 4.5


@attrs.define
class Fleet:
    tmp: Path
    models: tuple[str, ...]
    grpc: dict[str, int]
    processes: dict[str, Process] = attrs.field(factory=dict)

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.grpc[name]}"

    def served(self) -> dict[tuple[str, str], int]:
        """(worker, model) -> rows the worker has executed for the model (its own counter)."""
        out = {}
        for w in WORKERS:
            c = grpcclient.InferenceServerClient(self.address(w))
            for s in c.get_inference_statistics("").model_stats:
                if s.name in self.models:
                    out[(w, s.name)] = int(s.inference_count)
            c.close()
        return out


@pytest.fixture(scope="module")
def fleet(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    build_repo = load_build_repo()
    tmp = tmp_path_factory.mktemp("lpt_e2e")
    repo = tmp / "repo"
    repo.mkdir()
    shutil.copytree(zoo_repo / "mlp", repo / "mlp")
    variants = [
        p.name
        for p in build_repo.plan(PLANNED)
        if p.arch == "mlp" and p.seed and p.width == build_repo.ZOO["mlp"].DEFAULT_WIDTH
    ]
    build_repo.build(repo, catalog=PLANNED, only=variants)
    models = ("mlp", *variants)
    nbytes = max(load_bundle(repo / m).weights_nbytes for m in models)
    # on-demand budget = floor(0.9 x arena) on CPU with the default fractions.
    arena = math.ceil(BUDGET_MODELS * nbytes / 0.9)
    grpc = {w: free_port() for w in WORKERS}
    entries = "".join(
        f"  - {{name: {w}, port: {grpc[w]}, metrics_port: {free_port()}}}\n" for w in WORKERS
    )
    node = tmp / "node.yaml"
    node.write_text(
        f"model_repo: {repo}\n"
        "gpus: 0\n"
        f"workers:\n{entries}"
        "global:\n"
        f"  cache_dir: {tmp / 'jaxcache'}\n"
        "  model_control_mode: dynamic\n"
        "  scheduler: {discipline: fifo}\n"
        f"  runtime: {{backend: cpu, arena_bytes: {arena}}}\n"
        "  endpoints: {host: 127.0.0.1, max_concurrent_requests: 256}\n"
    )
    fleet = Fleet(tmp, models, grpc)

    def start(w: str) -> None:
        fleet.processes[w] = start_cli(
            ["serve", str(node), "--worker", w, "--log-level", "warning"], tmp / f"{w}.log"
        )

    try:
        start("w0")  # first alone: the others start from its compilation cache
        wait_all_ready(fleet, "w0")
        for w in WORKERS[1:]:
            start(w)
        for w in WORKERS[1:]:
            wait_all_ready(fleet, w)
        yield fleet
    finally:
        for process in fleet.processes.values():
            if process.alive():
                process.terminate()


def wait_all_ready(fleet: Fleet, w: str) -> None:
    wait_serving(fleet.address(w), fleet.processes[w], timeout=300)
    c = grpcclient.InferenceServerClient(fleet.address(w))
    wait_until(lambda: all(c.is_model_ready(m) for m in fleet.models), 300, f"{w}: every model")
    c.close()


@attrs.define
class Gateway:
    process: Process
    grpc: str
    metrics: str


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Gateway]:
    grpc, admin = free_port(), free_port()
    document = {
        "listen": {"grpc": f"127.0.0.1:{grpc}", "metrics": f"127.0.0.1:{admin}"},
        "endpoints": [fleet.address(w) for w in WORKERS],
        "worker_names": list(WORKERS),
        "health_interval_seconds": 0.5,
        "startup_wait_seconds": 60,
        "logging": {"format": "text"},
        "scheduling": {"mode": "lpt_packing", "default_replicas": 1},
    }
    path = fleet.tmp / "gateway.yml"
    path.write_text(json.dumps(document))
    process = start_cli(["gateway", str(path)], fleet.tmp / "gateway.log")
    gw = Gateway(process, f"127.0.0.1:{grpc}", f"http://127.0.0.1:{admin}")
    try:
        wait_serving(gw.grpc, process, timeout=120)
        yield gw
        assert process.terminate() == 0, process.text()
    finally:
        if process.alive():
            process.kill()


def grpcurl(*args: str) -> Any:
    proc = subprocess.run([GRPCURL, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def status(gw: Gateway) -> dict[str, Any]:
    return grpcurl(
        "-plaintext", gw.grpc, "reactant_control.GatewayControlService/GetSchedulingStatus"
    )


def placement(gw: Gateway) -> dict[str, set[str]]:
    """model -> names of the workers it is placed on."""
    names = {w["address"]: w["name"] for w in status(gw)["workers"]}
    return {m["name"]: {names[a] for a in m.get("workers", [])} for m in status(gw)["models"]}


def inputs(client: grpcclient.InferenceServerClient, model: str, rows: int, seed: int) -> Any:
    (spec,) = client.get_model_metadata(model).inputs
    shape = [rows if int(d) == -1 else int(d) for d in spec.shape]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    inp = grpcclient.InferInput(spec.name, shape, spec.datatype)
    inp.set_data_from_numpy(x)
    return [inp]


def send(gw: Gateway, counts: dict[str, int], rows: int = 1) -> None:
    client = grpcclient.InferenceServerClient(gw.grpc)
    for model, n in counts.items():
        for i in range(n):
            client.infer(model, inputs(client, model, rows, i))
    client.close()


def delta(before: dict[tuple[str, str], int], after: dict[tuple[str, str], int]) -> dict:
    """(worker, model) -> rows executed in between, for those that executed any."""
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
    }


def test_every_model_answers_what_a_worker_answers(fleet: Fleet, gateway: Gateway) -> None:
    through = grpcclient.InferenceServerClient(gateway.grpc)
    direct = grpcclient.InferenceServerClient(fleet.address("w0"))
    outputs = {}
    for model in fleet.models:
        got = through.infer(model, inputs(through, model, 3, 7))
        want = direct.infer(model, inputs(direct, model, 3, 7))
        for out in through.get_model_metadata(model).outputs:
            np.testing.assert_allclose(got.as_numpy(out.name), want.as_numpy(out.name), rtol=1e-5)
        outputs[model] = got.as_numpy("logits")
    # Each variant has its own weights: the answers differ, so a mix-up would show.
    assert len({o.tobytes() for o in outputs.values()}) == len(fleet.models)
    through.close()
    direct.close()


def test_traffic_goes_to_the_placed_replicas(fleet: Fleet, gateway: Gateway) -> None:
    send(gateway, {m: 4 for m in fleet.models})  # something measured for the repack
    done = grpcurl(
        "-plaintext", "-d", '{"waitSeconds": 30}', gateway.grpc,
        "reactant_control.GatewayControlService/Repack",
    )  # fmt: skip
    assert done["completed"] is True
    placed = placement(gateway)
    assert set(placed) == set(fleet.models)
    assert all(len(ws) == 1 for ws in placed.values())
    loads = status(gateway)["workers"]
    # The weights fit: 6 models over 3 workers whose budgets hold 4.5 each.
    assert not any(w.get("oversubscribed") for w in loads)
    assert sum(int(w["assignedWeightBytes"]) for w in loads) > max(
        int(w["weightBudgetBytes"]) for w in loads
    )  # the catalog exceeds any one worker's budget
    before = fleet.served()
    send(gateway, {m: 5 for m in fleet.models}, rows=2)
    moved = delta(before, fleet.served())
    expected = {(next(iter(placed[m])), m): 10 for m in fleet.models}
    assert moved == expected

    text = http_get(f"{gateway.metrics}/metrics")[1]
    for m, (w,) in ((m, tuple(ws)) for m, ws in placed.items()):
        assert metric(text, "gateway_placement_weight", model=m, worker=w) == 1.0
        assert metric(text, "gateway_model_replicas", model=m) == 1
        assert metric(text, "gateway_model_fill_quantum", model=m, worker=w) == 32
    assert metric(text, "gateway_repacks_total", trigger="startup") == 1
    assert metric(text, "gateway_repacks_total", trigger="operator") >= 1
    assert metric(text, "gateway_workers_oversubscribed") == 0


def test_set_model_placement_changes_routing_within_the_call(
    fleet: Fleet, gateway: Gateway
) -> None:
    assert len(placement(gateway)["mlp"]) == 1
    answer = grpcurl(
        "-plaintext", "-d", '{"name": "mlp", "replicas": 2, "fillFactor": 0.125}', gateway.grpc,
        "reactant_control.GatewayControlService/SetModelPlacement",
    )  # fmt: skip
    names = {w["address"]: w["name"] for w in status(gateway)["workers"]}
    now = {names[a] for a in answer["model"]["workers"]}
    assert len(now) == 2
    assert answer["model"]["fillQuantum"] == {a: "4" for a in answer["model"]["workers"]}
    before = fleet.served()
    send(gateway, {"mlp": 6}, rows=4)  # Q = 4 rows: the runs alternate
    moved = delta(before, fleet.served())
    assert moved == {(w, "mlp"): 12 for w in now}, moved


def docs_grpcurl_examples() -> list[list[str]]:
    """The grpcurl command lines of docs/gateway.md's control-RPC section, as argv."""
    text = (ROOT / "docs" / "gateway.md").read_text()
    section = text.split("### The control RPCs", 1)[1]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None
    commands: list[str] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        else:  # a continuation: after a backslash, or inside a quoted argument
            commands[-1] += "\n" + line
    return [shlex.split(c.replace("\\\n", " ")) for c in commands]


def test_the_docs_grpcurl_examples_work(fleet: Fleet, gateway: Gateway) -> None:
    examples = docs_grpcurl_examples()
    assert [argv[-1].rsplit("/", 1)[1] for argv in examples] == [
        "GetSchedulingStatus",
        "SetSchedulingPolicy",
        "SetModelPlacement",
        "Repack",
    ]
    answers = []
    for argv in examples:
        assert argv[0] == "grpcurl"
        args = [gateway.grpc if a == "localhost:8001" else a for a in argv[1:]]
        answers.append(grpcurl(*args))
    got_status, policy, model, repack = answers
    assert got_status["policy"]["defaultReplicas"] == 1
    assert (policy["policy"]["hysteresis"], policy["policy"]["defaultReplicas"]) == (0.1, 2)
    assert len(model["model"]["workers"]) == 2 and model["model"]["name"] == "mlp"
    assert repack["completed"] is True
    # default_replicas 2 now applies: every model on two workers, none oversubscribed
    # (4 models of 4.5 per worker).
    after = status(gateway)
    assert all(len(m["workers"]) == 2 for m in after["models"])
    assert not any(w.get("oversubscribed") for w in after["workers"])
    assert int(after["policy"]["generation"]) > int(got_status["policy"]["generation"])

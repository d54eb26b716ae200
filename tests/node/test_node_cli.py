"""``reactantserver node`` as an operator runs it: a subprocess with real CPU workers.

A module-scoped repository holds only the zoo's ``double`` bundle, so a worker is ready
a few seconds after it starts. Every wait is bounded and generous (the machine is
shared); nothing asserts on wall-clock speed.

Invariants checked here: a one-worker node serves on the public ports; a worker killed
with SIGKILL is restarted after the 1 s backoff and serves again; SIGTERM under load
answers every call the node accepted and leaves no child behind, exit 0; a restart budget
that runs out stops the node with exit 1 and says why; a SIGKILLed supervisor takes its
workers with it (the kernel's parent-death signal); two workers with role ``workers``
each answer on their own port; and with role ``all`` two workers answer through the
embedded gateway on the public port (once the gateway exists). A child that cannot start
for a reason a restart does not change (a worker's or the gateway's port taken: exit 78)
stops the node at once with its line and status 78.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from conftest import load_build_repo
from tritonclient.utils import InferenceServerException
from worker_harness import free_port


@pytest.fixture(scope="module")
def double_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("node") / "repo"
    load_build_repo().build(out, only=("double",))
    return out


def node_yaml(tmp_path: Path, repo: Path, *, extra: str = "") -> tuple[Path, dict[str, int]]:
    # base_port + 1 / metrics_base_port + 1 must be free too: pairs of free ports.
    ports = {
        "base": _free_pair(),
        "metrics": _free_pair(),
        "grpc": free_port(),
        "admin": free_port(),
    }
    path = tmp_path / "node.yaml"
    path.write_text(
        f"model_repo: {repo}\n"
        f"base_port: {ports['base']}\n"
        f"metrics_base_port: {ports['metrics']}\n"
        "gpus: 0\n"
        "global:\n"
        "  model_control_mode: static\n"
        "  runtime: {backend: cpu}\n"
        "gateway:\n"
        f"  listen: {{grpc: '127.0.0.1:{ports['grpc']}', metrics: '127.0.0.1:{ports['admin']}'}}\n"
        + extra
    )
    return path, ports


def _free_pair() -> int:
    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@contextmanager
def taken(port: int) -> Iterator[None]:
    """``127.0.0.1:port`` held by a listener meanwhile (another process on the port)."""
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        yield


class Node:
    """A running ``reactantserver node`` subprocess and its log."""

    def __init__(self, path: Path, env: dict[str, str], tmp_path: Path) -> None:
        self.log_path = tmp_path / "node.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reactantserver.cli", "node", str(path),
             "--runtime-dir", str(tmp_path / "run")],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    def text(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, pattern: str, *, count: int = 1, timeout: float = 120.0) -> list[str]:
        """The groups of the first ``count`` matches of ``pattern`` in the log."""

        def logged() -> bool:
            exited = self.proc.poll() is not None  # before reading: its last lines are in
            if len(re.findall(pattern, self.text())) >= count:
                return True
            assert not exited, f"node exited {self.proc.returncode}:\n{self.text()}"
            return False

        wait_until(logged, timeout, lambda: f"{pattern!r} x{count} in the log:\n{self.text()}")
        return re.findall(pattern, self.text())

    def pid(self, name: str, nth: int = 1) -> int:
        return int(self.wait_for(rf"started {name} \(pid (\d+)\)", count=nth)[nth - 1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextmanager
def running_node(path: Path, tmp_path: Path, **env: str) -> Iterator[Node]:
    node = Node(path, {**os.environ, **env}, tmp_path)
    try:
        yield node
    finally:
        node.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout, f"{pids} gone")


def wait_ready(url: str, node: Node, timeout: float = 120.0) -> None:
    client = grpcclient.InferenceServerClient(url)

    def ready() -> bool:
        try:
            if client.is_server_ready():
                return True
        except InferenceServerException:
            pass
        assert node.proc.poll() is None, node.text()
        return False

    try:
        wait_until(ready, timeout, lambda: f"{url} ready:\n{node.text()}")
    finally:
        client.close()


X = np.arange(16, dtype=np.float32).reshape(1, 16)


def infer(url: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        out = client.infer("double", [tensor]).as_numpy("y")
        assert out is not None
        return out
    finally:
        client.close()


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_one_worker_serves_the_public_ports_restarts_and_drains(
    double_repo: Path, tmp_path: Path
) -> None:
    path, ports = node_yaml(tmp_path, double_repo)
    public = f"127.0.0.1:{ports['grpc']}"
    with running_node(path, tmp_path) as node:
        first = node.pid("worker0")
        wait_ready(public, node)
        np.testing.assert_array_equal(infer(public), 2 * X)
        assert http(f"http://127.0.0.1:{ports['admin']}/readyz")[0] == 200
        assert http(f"http://127.0.0.1:{ports['admin']}/healthz")[0] == 200
        assert "started gateway" not in node.text()  # one worker: no gateway child

        # SIGKILL the worker: restarted after the 1 s backoff, and the node serves again.
        os.kill(first, signal.SIGKILL)
        node.wait_for(r"worker0 killed by SIGKILL")
        node.wait_for(r"restarting worker0 in 1 s \(restart 1 in a row\)")
        second = node.pid("worker0", nth=2)
        assert second != first
        wait_ready(public, node)
        np.testing.assert_array_equal(infer(public), 2 * X)

        # SIGTERM under load: every call accepted is answered; nothing left; exit 0.
        outcomes, unexpected = _load_until_sigterm(public, node)
        rc = node.proc.wait(60)
        assert rc == 0, node.text()
        assert unexpected == [], unexpected
        assert outcomes["ok"] > 0
        wait_gone([first, second])
        text = node.text()
        assert "[worker0] " in text and "received SIGTERM: draining" in text
        assert "node stopped (exit status 0)" in text


def _load_until_sigterm(url: str, node: Node) -> tuple[Counter[str], list[str]]:
    """Eight clients call ``double`` in a loop; SIGTERM goes to the supervisor once every
    client has been answered (so each holds a connection the node accepted) and calls
    succeed. A call started before SIGTERM must be answered or cleanly refused as
    "shutting down"; after it, a vanished connection (UNAVAILABLE) is fine too. A call
    refused its *connection* once SIGTERM was sent is fine whenever it started: the node
    takes no new connections while it drains, and such a call never reached it."""
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    sigterm_at: list[float] = []
    answered: set[int] = set()

    def load() -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        while not stop.is_set():
            started = time.monotonic()
            try:
                out = client.infer("double", [tensor]).as_numpy("y")
                kind = "ok" if out is not None and np.array_equal(out, 2 * X) else "wrong"
            except InferenceServerException as exc:
                status, message = str(exc.status()), exc.message() or ""
                before = not sigterm_at or started < sigterm_at[0]
                if status == "StatusCode.UNAVAILABLE" and "shutting down" in message:
                    kind = "refused"
                elif status == "StatusCode.UNAVAILABLE" and not before:
                    kind = "connection gone"
                elif (
                    status == "StatusCode.UNAVAILABLE"
                    and sigterm_at
                    and "Connection refused" in message
                ):
                    # Started before SIGTERM, but sent only once the draining node had
                    # closed its listener (grpc sends a call after a GOAWAY on a new
                    # connection): the node never got it.
                    kind = "connection refused"
                else:
                    kind = "error"
                    with lock:
                        unexpected.append(f"{status}: {message}")
            with lock:
                outcomes[kind] += 1
                if kind == "ok":
                    answered.add(threading.get_ident())
            if kind != "ok":
                time.sleep(0.01)  # real-clock: a client's pause before it tries again
        client.close()

    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: outcomes["ok"] >= 20 and len(answered) == len(threads),
        what=lambda: f"load before SIGTERM: {outcomes}, {len(answered)} clients answered",
    )
    sigterm_at.append(time.monotonic())
    node.proc.send_signal(signal.SIGTERM)
    node.proc.wait(60)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert outcomes["wrong"] == 0
    return outcomes, unexpected


@pytest.mark.slow
def test_two_workers_answer_on_their_own_ports_and_die_with_the_supervisor(
    double_repo: Path, tmp_path: Path
) -> None:
    """Role ``workers``: no gateway; worker *i* on base_port + i. Then the supervisor is
    SIGKILLed, more than 10 s after the workers started (a parent-death signal tied to a
    short-lived spawning thread would have killed them by then), and takes them along."""
    path, ports = node_yaml(tmp_path, double_repo)
    with running_node(path, tmp_path, REACTANT_ROLE="workers", REACTANT_CPU_WORKERS="2") as node:
        pids = [node.pid("worker0"), node.pid("worker1")]
        started = time.monotonic()
        for i in range(2):
            url = f"127.0.0.1:{ports['base'] + i}"
            wait_ready(url, node)
            np.testing.assert_array_equal(infer(url), 2 * X)
            assert http(f"http://127.0.0.1:{ports['metrics'] + i}/readyz")[0] == 200
        assert "started gateway" not in node.text()
        outlive = 11.0 - (time.monotonic() - started)  # the 10 s a spawning thread lives
        time.sleep(max(0.0, outlive))  # real-clock: an absence (nobody dies) over 10 real s
        assert all(alive(pid) for pid in pids)
        assert node.text().count("started worker") == 2  # nobody died in between
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(30)
        wait_gone(pids)


@pytest.mark.slow
def test_an_exhausted_restart_budget_stops_the_node_with_status_1(
    double_repo: Path, tmp_path: Path
) -> None:
    """Every worker start crashes (a ``sitecustomize`` that ends any process with
    ``REACTANT_WORKER_NAME`` set, status 3: a crash, not a configuration error); with a
    budget of 1 restart the second failure in a row stops the node: exit 1 and a line that
    says why."""
    path, _ = node_yaml(tmp_path, double_repo)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('REACTANT_WORKER_NAME'):\n    os._exit(3)\n"
    )
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    env = {
        "REACTANT_ROLE": "workers",
        "REACTANT_SUPERVISOR_MAX_RESTARTS": "1",
        "PYTHONPATH": pythonpath,
    }
    with running_node(path, tmp_path, **env) as node:
        rc = node.proc.wait(180)
        text = node.text()
    assert rc == 1, text
    assert "worker0 exited with status 3" in text
    assert "restarting worker0 in 1 s (restart 1 in a row)" in text
    assert (
        "worker0 failed 2 times in a row; REACTANT_SUPERVISOR_MAX_RESTARTS=1 allows 1 "
        "restart(s): stopping the node" in text
    )
    assert text.count("started worker0") == 2


@pytest.mark.slow
def test_a_worker_whose_port_is_taken_stops_the_node_at_once(
    double_repo: Path, tmp_path: Path
) -> None:
    """A taken port is no crash: the worker exits 78 (EX_CONFIG) with one line, and the
    node stops at once with that line and status 78, without a restart."""
    path, ports = node_yaml(tmp_path, double_repo)
    with taken(ports["base"]), running_node(path, tmp_path, REACTANT_ROLE="workers") as node:
        rc = node.proc.wait(180)
        text = node.text()
    assert rc == 78, text
    line = f"reactantserver serve: cannot listen for gRPC on 127.0.0.1:{ports['base']}: address"
    # Repeated by the supervisor, as an error.
    assert re.search(rf"ERROR +reactantserver\.node: worker0: {re.escape(line)}", text), text
    assert "worker0 exited with status 78, a configuration or environment error" in text
    assert "restarting" not in text and text.count("started worker0") == 1


@pytest.mark.slow
def test_a_gateway_whose_public_port_is_taken_stops_the_node_at_once(
    double_repo: Path, tmp_path: Path
) -> None:
    """The issue's node: two workers and the gateway, the public port held by another
    process. The gateway exits 78 with its one line; the node repeats it, stops the
    workers it started and exits 78 -- no restart loop."""
    path, ports = node_yaml(tmp_path, double_repo)
    with taken(ports["grpc"]), running_node(path, tmp_path, REACTANT_CPU_WORKERS="2") as node:
        pids = [node.pid("worker0"), node.pid("worker1")]
        rc = node.proc.wait(180)
        text = node.text()
    assert rc == 78, text
    line = (
        f"reactantserver gateway: cannot listen for gRPC on 127.0.0.1:{ports['grpc']}: "
        "address already in use (change listen.grpc"
    )
    assert re.search(rf"ERROR +reactantserver\.node: gateway: {re.escape(line)}", text), text
    assert "gateway exited with status 78" in text and "a restart would fail the same way" in text
    assert "restarting gateway" not in text and text.count("started gateway") == 1
    assert "node stopped (exit status 78)" in text
    wait_gone(pids)


def _has_gateway_command() -> bool:
    from reactantserver.cli import build_parser

    actions = [a for a in build_parser()._actions if hasattr(a, "choices") and a.choices]
    return any("gateway" in a.choices for a in actions)


GATEWAY = _has_gateway_command()


@pytest.mark.slow
@pytest.mark.skipif(
    not GATEWAY,
    reason="the `reactantserver gateway` command is not merged yet",
)
def test_two_workers_and_the_gateway_answer_through_the_public_port(
    double_repo: Path, tmp_path: Path
) -> None:
    path, ports = node_yaml(tmp_path, double_repo)
    public = f"127.0.0.1:{ports['grpc']}"
    with running_node(path, tmp_path, REACTANT_CPU_WORKERS="2") as node:
        pids = [node.pid("gateway"), node.pid("worker0"), node.pid("worker1")]
        wait_ready(public, node)
        for _ in range(4):  # round robin: both workers answer
            np.testing.assert_array_equal(infer(public), 2 * X)
        assert http(f"http://127.0.0.1:{ports['admin']}/readyz")[0] == 200
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(60) == 0, node.text()
        wait_gone(pids)


def test_config_shows_the_devices_and_ports_each_worker_would_get(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uuids = ["GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-9f8e7d6c-0000-1111-2222-3333"]
    smi = "".join(f'echo "GPU {i}: NVIDIA H100 (UUID: {u})"\n' for i, u in enumerate(uuids))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
    (bin_dir / "nvidia-smi").chmod(0o755)
    path = tmp_path / "node.yaml"
    path.write_text(
        "model_repo: models\nbase_port: 8080\nmetrics_base_port: 9100\n"
        "global:\n  runtime: {backend: cuda}\n"
    )
    (tmp_path / "models").mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for var in ("REACTANT_GPUS", "CUDA_VISIBLE_DEVICES", "REACTANT_ROLE"):
        env.pop(var, None)
    out = subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "config", str(path)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    head = out.stdout.split("---\n", 1)[0].splitlines()
    assert head[0] == f"# node plan: role all; devices from nvidia-smi -L: {', '.join(uuids)}"
    assert head[1] == "#   gateway  gRPC 0.0.0.0:8001  metrics 0.0.0.0:8002"
    assert head[2].startswith(
        f"#   worker0  CUDA_VISIBLE_DEVICES={uuids[0]}  gRPC 127.0.0.1:8080  metrics 127.0.0.1:9100"
    )
    assert head[3].startswith(
        f"#   worker1  CUDA_VISIBLE_DEVICES={uuids[1]}  gRPC 127.0.0.1:8081  metrics 127.0.0.1:9101"
    )
    assert "#   gateway endpoints: 127.0.0.1:8080, 127.0.0.1:8081" in head
    env["PATH"] = str(tmp_path / "nowhere")  # no nvidia-smi: the plan says why, the rest prints
    out = subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "config", str(path)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.startswith(f"# node plan: none on this machine: {path}: no GPU found")
    assert "# worker worker0 of" in out.stdout


def test_the_container_healthcheck_passes_only_on_a_200_readyz(tmp_path: Path) -> None:
    """``python -m reactantserver.node.healthcheck`` against a tiny HTTP server that says
    503 (compiling) and then 200, and against a port nobody listens on."""
    import http.server

    answer = {"status": 503, "body": b"not ready: compiling"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(answer["status"] if self.path == "/readyz" else 404)
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"

    def check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "reactantserver.node.healthcheck", *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )  # fmt: skip

    try:
        refused = check(url)
        assert refused.returncode == 1
        assert refused.stderr.strip() == "not ready: 503 not ready: compiling"
        answer.update(status=200, body=b"ready")
        assert check(url).returncode == 0
        assert check(REACTANT_HEALTHCHECK_URL=url).returncode == 0
        nobody = check(f"http://127.0.0.1:{free_port()}/readyz")
        assert nobody.returncode == 1
        assert nobody.stderr.startswith("not ready: no answer from http://127.0.0.1:")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_public_port_stays_up_while_both_workers_restart(
    double_repo: Path, tmp_path: Path
) -> None:
    """Issue 42: both workers of a node killed, the embedded gateway wedge-exited (no
    answer for wedge_exit_rounds x health_interval_seconds) while its supervisor was
    already restarting them, and the public port was gone for ~19 s. Now the node's
    gateway waits for the workers its supervisor restarts: the public port keeps
    accepting connections, calls are UNAVAILABLE (retryable) until a worker is back, then
    answered, and the gateway is the one that started. With a 0.2 s probe interval the
    old default would have exited 0.6 s after the kill."""
    path, ports = node_yaml(tmp_path, double_repo, extra="  health_interval_seconds: 0.2\n")
    public = f"127.0.0.1:{ports['grpc']}"
    with running_node(path, tmp_path, REACTANT_CPU_WORKERS="2") as node:
        gateway = node.pid("gateway")
        workers = [node.pid("worker0"), node.pid("worker1")]
        wait_ready(public, node)
        np.testing.assert_array_equal(infer(public), 2 * X)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        node.wait_for(r"worker[01] killed by SIGKILL", count=2)
        seen: Counter[str] = Counter()

        def served() -> bool:
            with socket.create_connection(("127.0.0.1", ports["grpc"]), timeout=10):
                pass  # the public port accepts: never "connection refused"
            try:
                np.testing.assert_array_equal(infer(public), 2 * X)
                return True
            except InferenceServerException as exc:
                assert str(exc.status()) == "StatusCode.UNAVAILABLE", exc
                seen[exc.message() or ""] += 1
                return False

        wait_until(served, 120, node.text)
        assert seen, "no call found both workers away"
        assert any("no worker serving it is ready" in m for m in seen), seen
        node.wait_for(r"started worker0 \(pid", count=2)
        node.wait_for(r"started worker1 \(pid", count=2)
        text = node.text()
        assert alive(gateway) and text.count("started gateway") == 1, text
        assert "exiting to be restarted" not in text
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(60) == 0, node.text()

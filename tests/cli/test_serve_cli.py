"""``reactantserver serve`` as an operator runs it: a subprocess, SIGTERM under load.

The invariant: after SIGTERM the server refuses new calls, answers every call it had
already accepted, and exits 0. Clients keep sending throughout. A call *started before*
SIGTERM was sent must end in a correct answer, or in the server's own clean refusal
("server is shutting down": it reached the server after draining began). A call started
after SIGTERM may also find the connection gone (UNAVAILABLE in any form). Nothing may
end in any other status -- a call cut off mid-flight, INTERNAL, CANCELLED.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from tritonclient.utils import InferenceServerException
from worker_harness import free_port

pytestmark = pytest.mark.slow


def _node_file(tmp_path: Path, repo: Path, port: int) -> Path:
    node = tmp_path / "node.yaml"
    node.write_text(
        f"model_repo: {repo}\n"
        f"base_port: {port}\n"
        "global:\n"
        "  model_control_mode: static\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "  models_include: [double, resnet]\n"
    )
    return node


def test_sigterm_under_load_answers_every_accepted_request(zoo_repo: Path, tmp_path: Path) -> None:
    port = free_port()
    node = _node_file(tmp_path, zoo_repo, port)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reactantserver.cli", "serve", str(node)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"127.0.0.1:{port}"
    try:
        client = grpcclient.InferenceServerClient(url)

        def ready() -> bool:
            try:
                if client.is_server_ready():
                    return True
            except InferenceServerException:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            return False

        wait_until(ready, 120, "the server ready")

        outcomes: Counter[str] = Counter()
        unexpected: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        x = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)

        sigterm_at: list[float] = []

        small = np.ones((1, 16), np.float32)

        def load(tiny: bool) -> None:
            # Both paths of the dispatch loop: ``double`` runs inline on the loop (a tiny
            # program on the CPU), ``resnet`` on the device thread.
            c = grpcclient.InferenceServerClient(url)
            name, output = ("x", "y") if tiny else ("images", "logits")
            data = small if tiny else x
            ii = grpcclient.InferInput(name, list(data.shape), "FP32")
            ii.set_data_from_numpy(data)
            model, shape = ("double", (1, 16)) if tiny else ("resnet", (2, 10))
            while not stop.is_set():
                started = time.monotonic()
                try:
                    out = c.infer(model, [ii]).as_numpy(output)
                    kind = "ok" if out.shape == shape else "bad-shape"
                except InferenceServerException as exc:
                    msg = exc.message() or ""
                    status = str(exc.status())
                    before_sigterm = not sigterm_at or started < sigterm_at[0]
                    if status == "StatusCode.UNAVAILABLE" and "shutting down" in msg:
                        kind = "refused"
                    elif status == "StatusCode.UNAVAILABLE" and not before_sigterm:
                        kind = "connection gone"
                    else:
                        kind = "error"
                        with lock:
                            unexpected.append(f"{status}: {msg}")
                with lock:
                    outcomes[kind] += 1
                if kind != "ok":
                    time.sleep(0.01)  # real-clock: a client's pause before it tries again

        threads = [threading.Thread(target=load, args=(i % 2 == 0,)) for i in range(12)]
        for t in threads:
            t.start()
        wait_until(lambda: outcomes["ok"] >= 12, what=lambda: f"load before SIGTERM: {outcomes}")
        sigterm_at.append(time.monotonic())
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        stop.set()
        for t in threads:
            t.join(30)
        assert rc == 0, (tmp_path / "server.log").read_text()
        assert unexpected == [], unexpected
        assert outcomes["bad-shape"] == 0
        text = (tmp_path / "server.log").read_text()
        assert "received SIGTERM: draining" in text
        assert "worker worker0 stopped" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_refuses_a_bad_node_file_with_every_problem(tmp_path: Path) -> None:
    """Nothing starts (no port is bound, JAX is not imported): one line per problem, the
    missing repository among them, exit status 2, no traceback."""
    node = tmp_path / "node.yaml"
    node.write_text("model_repo: /nowhere\nglobal:\n  scheduler:\n    discipline: fiar\n")
    out = _serve(str(node))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"{node}:1: model_repo: expected a readable directory of model bundles; got "
        "'/nowhere', which does not exist",
        f"{node}:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    ]
    assert out.stdout == ""


def test_a_missing_model_repo_is_one_line_in_config_and_in_serve(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("model_repo: models\n")
    line = (
        f"{node}:1: model_repo: expected a readable directory of model bundles; got 'models' "
        f"({tmp_path / 'models'}), which does not exist\n"
    )
    for command in ("config", "serve"):
        out = subprocess.run(
            [sys.executable, "-m", "reactantserver.cli", command, str(node)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (out.returncode, out.stderr, out.stdout) == (2, line, ""), command


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = tmp_path / "node.yaml"
        node.write_text(
            f"model_repo: {tmp_path}\nbase_port: {free_port()}\nmetrics_base_port: {port}\n"
        )
        out = _serve(str(node))
    assert out.returncode == 78  # EX_CONFIG: a node supervisor does not restart it
    assert out.stderr == (
        f"reactantserver serve: cannot listen for admin HTTP on 127.0.0.1:{port}: address "
        "already in use; another process is listening there (stop it, or choose another port: "
        "INFERENCE_SERVER_ENDPOINTS_METRICS_PORT=PORT in the environment for one run, or in "
        "the node file: base_port / metrics_base_port, or a workers: entry's port / "
        "metrics_port)\n"
    )


def test_the_variables_a_taken_port_names_move_the_ports(tmp_path: Path) -> None:
    """Both ports taken: each line names the variable of its own port, and setting the
    variables it names (as README's quick start does for ``nox -s serve``) moves the
    worker to ports it can listen on."""
    from reactantserver.config import load_server_config
    from reactantserver.startup import listen_problems

    with socket.socket() as grpc, socket.socket() as admin:
        for taken in (grpc, admin):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        ports = [grpc.getsockname()[1], admin.getsockname()[1]]
        node = tmp_path / "node.yaml"
        node.write_text(
            f"model_repo: {tmp_path}\nbase_port: {ports[0]}\nmetrics_base_port: {ports[1]}\n"
        )
        lines = listen_problems(load_server_config(node, env={}))
        named = [line.split("choose another port: ")[1].split("=PORT")[0] for line in lines]
        assert named == [
            "INFERENCE_SERVER_ENDPOINTS_PORT",
            "INFERENCE_SERVER_ENDPOINTS_METRICS_PORT",
        ]
        moved = {var: str(free_port()) for var in named}
        config = load_server_config(node, env=moved)
        assert (config.endpoints.port, config.endpoints.metrics_port) == tuple(
            int(port) for port in moved.values()
        )
        assert listen_problems(config) == []


def test_a_failure_inside_the_running_worker_is_one_line_and_debug_shows_why(
    tmp_path: Path,
) -> None:
    """A configuration problem only the runtime sees (a CUDA backend with no GPU and no
    CPU fallback) is raised from inside Trio's nurseries: one line, exit status 2, and the
    traceback only at --log-level debug."""
    node = tmp_path / "node.yaml"
    node.write_text(
        f"model_repo: {tmp_path}\nbase_port: {free_port()}\nglobal:\n  runtime:\n"
        "    backend: cuda\n    allow_cpu_fallback: false\n"
    )
    out = _serve(str(node))
    assert out.returncode == 2
    assert out.stderr.splitlines()[-2:] == [
        "reactantserver serve: worker worker0: runtime.backend: cuda: no usable GPU (no CUDA "
        "device is visible); set runtime.allow_cpu_fallback: true to run on the CPU instead",
        "reactantserver serve: --log-level debug shows the traceback",
    ]
    assert "Traceback" not in out.stderr and "ExceptionGroup" not in out.stderr
    debug = _serve(str(node), "--log-level", "debug")
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr
    assert "reactantserver serve: worker worker0: runtime.backend: cuda: " in debug.stderr


def test_a_bundle_that_fails_to_load_in_static_mode_is_one_log_line(
    zoo_repo: Path, tmp_path: Path
) -> None:
    """The worker serves the rest; the broken bundle is one ERROR line naming it and what
    is wrong (its artifact is another model's), with the traceback only at debug."""
    repo = tmp_path / "repo"
    shutil.copytree(zoo_repo / "double", repo / "double")
    shutil.copytree(zoo_repo / "double", repo / "broken")
    shutil.copyfile(zoo_repo / "mlp" / "model.jaxexport", repo / "broken" / "model.jaxexport")
    port = free_port()
    node = tmp_path / "node.yaml"
    node.write_text(
        f"model_repo: {repo}\nbase_port: {port}\ngpus: 0\nglobal:\n  model_control_mode: static\n"
    )
    for level in ("info", "debug"):
        log = tmp_path / f"{level}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "reactantserver.cli",
                    "serve",
                    str(node),
                    "--log-level",
                    level,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            try:

                def loaded(proc: subprocess.Popen[bytes] = proc, log: Path = log) -> bool:
                    assert proc.poll() is None, log.read_text()
                    return "startup load done" in log.read_text()

                wait_until(loaded, 120, log.read_text)
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
                assert client.is_model_ready("double") and not client.is_model_ready("broken")
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=60) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = log.read_text()
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert len(errors) == 1, text
        assert errors[0].endswith(
            "reactantserver.worker: model 'broken' failed to load: model.jaxexport: the artifact "
            "takes 7 arguments, but the manifest declares 1 input and weights.safetensors holds "
            "1 weight (2 arguments in all)"
        ), errors[0]
        assert ("Traceback" in text) == (level == "debug"), text

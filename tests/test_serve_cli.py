"""``reactantserver serve`` as an operator runs it: a subprocess, SIGTERM under load.

The invariant: after SIGTERM the server refuses new calls, answers every call it had
already accepted, and exits 0. Clients keep sending throughout. A call *started before*
SIGTERM was sent must end in a correct answer, or in the server's own clean refusal
("server is shutting down": it reached the server after draining began). A call started
after SIGTERM may also find the connection gone (UNAVAILABLE in any form). Nothing may
end in any other status -- a call cut off mid-flight, INTERNAL, CANCELLED.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
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
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)

        outcomes: Counter[str] = Counter()
        unexpected: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        x = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)

        sigterm_at: list[float] = []

        def load() -> None:
            c = grpcclient.InferenceServerClient(url)
            ii = grpcclient.InferInput("images", list(x.shape), "FP32")
            ii.set_data_from_numpy(x)
            while not stop.is_set():
                started = time.monotonic()
                try:
                    out = c.infer("resnet", [ii]).as_numpy("logits")
                    kind = "ok" if out.shape == (2, 10) else "bad-shape"
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
                    time.sleep(0.01)

        threads = [threading.Thread(target=load) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        with lock:
            before = outcomes["ok"]
        assert before > 0, "no request succeeded before SIGTERM"
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


def test_serve_refuses_a_bad_node_file(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("model_repo: /nowhere\nglobal:\n  scheduler:\n    discipline: fiar\n")
    out = subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "serve", str(node)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"{node}:4: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'"
    )

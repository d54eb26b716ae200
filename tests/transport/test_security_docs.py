"""docs/security.md's locked-down node, run: its node.yaml as the page shows it (ports
moved to free ones on loopback, the repository to a built one), certificates made for the
run (``pki/``), the admin key in ``secrets/``; then the page's commands and its table of
what each client gets."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest
from clocks import wait_until
from conftest import load_build_repo
from security_support import X, call, triton, x_input
from test_node_cli import Node, _free_pair
from tls_certs import Pki, make_pki
from tritonclient.utils import InferenceServerException
from worker_harness import free_port

from reactantserver.protocol import inference as pb

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
ADMIN_KEY = "b" * 64
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
INDEX = "/inference.GRPCInferenceService/RepositoryIndex"


def _blocks() -> Iterator[tuple[str, str]]:
    """Each fenced block of the page: (info string, body)."""
    info, body = None, []
    for line in DOC.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if info is None:
                info, body = line[3:].strip(), []
            else:
                yield info, "".join(body)
                info = None
        elif info is not None:
            body.append(line)


def _block(fence: str, first_line: str) -> str:
    for info, body in _blocks():
        if info == fence and body.startswith(first_line):
            return body
    raise AssertionError(f"no {fence!r} block starting {first_line!r} in {DOC}")


@attrs.frozen
class Running:
    node: Node
    grpc: str
    worker: str
    pki: Pki
    directory: Path


@pytest.fixture(scope="module")
def locked_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("locked_node")
    repo = tmp / "models"
    load_build_repo().build(repo, only=("double",))
    pki = make_pki(tmp / "pki", clients=("alice", "ops"))
    (tmp / "secrets").mkdir()
    (tmp / "secrets" / "admin.key").write_text(ADMIN_KEY + "\n")
    base, grpc, admin = _free_pair(), free_port(), free_port()
    text = _block("yaml", "# node.yaml -- a locked-down node")
    for old, new in (
        ("base_port: 8080", f"base_port: {base}"),
        ('"0.0.0.0:8001"', f'"127.0.0.1:{grpc}"'),  # tests reach loopback only
        ('"127.0.0.1:8002"', f'"127.0.0.1:{admin}"'),
    ):
        assert old in text
        text = text.replace(old, new)
    path = tmp / "node.yaml"
    path.write_text(text)
    checked = subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    node = Node(path, {**os.environ, "JAX_PLATFORMS": "cpu"}, tmp)
    try:
        target = f"127.0.0.1:{grpc}"

        def ready() -> bool:
            client = triton(target, pki, "alice")
            try:
                return bool(client.is_model_ready("double"))
            except InferenceServerException:
                return False
            finally:
                client.close()

        wait_until(ready, what="the node's gateway routes double", timeout=240)
        yield Running(node, target, f"127.0.0.1:{base}", pki, tmp)
    finally:
        node.proc.terminate()
        node.proc.wait(60)
        node.close()


def test_the_pages_commands_run(locked_node: Running) -> None:
    """The grpcurl and Python commands of the page, against the node (``node:8001`` being
    wherever the test's node listens)."""
    here = locked_node.directory
    (grpcurl_line, python_lines) = _block("", "grpcurl -cacert").split("\n", 1)
    args = shlex.split(grpcurl_line.replace("node:8001", locked_node.grpc))
    listed = subprocess.run(
        [_grpcurl(), *args[1:]],
        cwd=here, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "inference.GRPCInferenceService" in listed.stdout
    command = shlex.split(python_lines.replace("node:8001", locked_node.grpc))
    assert command[:2] == ["python", "-c"]
    done = subprocess.run([sys.executable, "-c", command[2]], cwd=here, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "'y': array([[2., 2." in done.stdout


def _grpcurl() -> str:
    from test_grpcurl import GRPCURL

    return GRPCURL


def test_what_each_client_gets(locked_node: Running) -> None:
    """The page's table, row by row."""
    target, pki = locked_node.grpc, locked_node.pki
    for client in (triton(target), triton(target, pki)):  # no certificate
        with pytest.raises(InferenceServerException) as caught:
            client.is_server_live()
        assert "UNAVAILABLE" in str(caught.value.status())
        client.close()
    load = bytes(pb.RepositoryModelLoadRequest(model_name="double"))
    alice = triton(target, pki, "alice")
    np.testing.assert_array_equal(alice.infer("double", x_input()).as_numpy("y"), 2 * X)
    alice.close()
    missing = call(target, LOAD, load, pki=pki, client="alice")
    assert missing[0] == "UNAUTHENTICATED" and "'admin-key'" in missing[1]
    # With the key the gateway loads it on its workers, which restrict the group too and
    # pass their own gateway by the node's key.
    with_key = call(
        target, LOAD, load, pki=pki, client="alice", metadata=[("admin-key", ADMIN_KEY)]
    )
    assert with_key[0] == "OK", with_key
    assert call(target, INDEX, pki=pki, client="ops")[0] == "OK"  # the ops certificate
    # On the node, straight to a worker: open groups served, restricted ones want the key.
    worker = locked_node.worker
    direct = triton(worker)
    np.testing.assert_array_equal(direct.infer("double", x_input()).as_numpy("y"), 2 * X)
    direct.close()
    assert call(worker, INDEX)[0] == "UNAUTHENTICATED"
    assert call(worker, INDEX, metadata=[("admin-key", ADMIN_KEY)])[0] == "OK"
    assert call(worker, LOAD, load, metadata=[("admin-key", ADMIN_KEY)])[0] == "OK"
    assert ADMIN_KEY not in locked_node.node.text()  # keys are never logged

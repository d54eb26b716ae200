"""docs/gateway.md's worked example: its two files are valid as written.

The example's commands and output were taken from a real run (two CPU workers and a
gateway); this checks that the files the page shows still load -- the node file with its
two workers and ports, the gateway.yml with the workers it fronts -- so the page cannot
drift from the configuration's rules unnoticed.
"""

from __future__ import annotations

import re
from pathlib import Path

from reactantserver.config import load_gateway, load_node, resolve_worker

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def _block(first_line: str) -> str:
    for body in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S):
        if body.startswith(first_line):
            return str(body)
    raise AssertionError(f"no yaml block starting {first_line!r} in {DOC}")


def test_the_worked_example_files_load(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    node_file = tmp_path / "node.yaml"
    node_file.write_text(_block("# node.yaml -- two CPU workers"))
    gateway_file = tmp_path / "gateway.yml"
    gateway_file.write_text(_block("# gateway.yml -- one endpoint"))
    node = load_node(node_file)
    workers = [resolve_worker(node, name, {}) for name in ("worker0", "worker1")]
    gateway = load_gateway(gateway_file, env={})
    addresses = tuple(f"{w.endpoints.host}:{w.endpoints.port}" for w in workers)
    metrics = tuple(f"{w.endpoints.host}:{w.endpoints.metrics_port}" for w in workers)
    assert gateway.endpoints == addresses
    assert gateway.metrics_endpoints == metrics
    assert gateway.worker_names == ("worker0", "worker1")
    assert gateway.scheduling.mode == "least_outstanding"

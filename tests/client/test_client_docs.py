"""The examples of docs/client.md, run as written against a real worker.

Each ``<!-- doc-test: python -->`` block is executed in a fresh namespace (with the
worker's address in place of ``localhost:8001``), and what it prints must equal the
``<!-- doc-test: output -->`` block that follows it.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_harness import running_worker, worker_config

from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs"
_MARKED = re.compile(r"<!-- doc-test: (?P<what>[a-z]+) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)


def examples() -> list[tuple[str, str]]:
    """(code, expected output) pairs of docs/client.md, in page order."""
    blocks = [(m["what"], m["body"]) for m in _MARKED.finditer((DOCS / "client.md").read_text())]
    pairs = []
    for (kind, code), (next_kind, output) in zip(blocks[::2], blocks[1::2], strict=True):
        assert (kind, next_kind) == ("python", "output")
        pairs.append((code, output))
    return pairs


@pytest.fixture(scope="module")
def served(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerAddress]:
    cache = tmp_path_factory.mktemp("client_docs_cache")
    config = worker_config(zoo_repo, include=("double", "mlp"), cache_dir=cache, metrics=False)
    with running_worker(config) as address:
        yield address


def test_the_page_has_examples() -> None:
    assert len(examples()) >= 8


@pytest.mark.parametrize(
    ("code", "output"),
    examples(),
    ids=[f"example{i}" for i in range(len(examples()))],
)
def test_example(code: str, output: str, served: WorkerAddress) -> None:
    source = code.replace("localhost:8001", f"127.0.0.1:{served.grpc_port}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, "docs/client.md", "exec"), {"__name__": "__main__"})
    assert printed.getvalue() == output

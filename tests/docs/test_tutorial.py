"""docs/tutorial.md, run as written: export, node file, ``nox -s serve``, three clients,
/metrics, a weight change picked up online, Ctrl-C.

The page's blocks are marked with HTML comments the renderer hides, and run in order:

- ``file PATH``: the block is written to PATH;
- ``command``: ``$ ...`` lines run in a shell from the checkout; the lines after them,
  if any, are exactly what they print (timings and the artifact's byte size masked);
- ``serve``: the ``nox -s serve -- ...`` line is run through nox (with ``--no-venv
  --no-install``: the test environment already holds everything, so nothing is
  installed); the lines after it must appear in its output, in that order (timestamps
  and timings masked, the install step aside);
- ``python`` then ``output``: the code runs, and prints exactly the output block;
- ``grpcurl``: the command runs; its JSON answer is the block's, the raw output bytes
  compared as numbers;
- ``metrics``: the command runs and prints exactly the lines shown;
- ``log``: these lines appear in the server's output (within a minute);
- ``stop``: Ctrl-C (SIGINT to nox's process group); nox exits 0 and prints these lines.

``~/iris`` is a temporary directory and the ports are free ones, substituted wherever
the page writes them.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from clocks import wait_until
from nox_harness import ROOT, Running, environment, nox_argv, nox_path
from worker_harness import free_port

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "tutorial.md"
_MARKED = re.compile(r"<!-- doc-test: (?P<what>[^>]*?) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def blocks() -> list[tuple[str, str]]:
    return [(m["what"].strip(), m["body"]) for m in _MARKED.finditer(PAGE.read_text())]


def masked(line: str) -> str:
    """A line with what legitimately varies between runs masked: the log timestamp,
    durations, and the artifact's size (it embeds the path of the exported file)."""
    line = _STAMP.sub("", line.rstrip())
    line = re.sub(r"\d+\.\d+ ?s\b", "N s", line)
    return re.sub(r"artifact \d+ B", "artifact N B", line)


def in_order(expected: list[str], actual: list[str]) -> list[str]:
    """The expected lines missing from ``actual`` as a subsequence (empty: all there)."""
    position = 0
    for index, line in enumerate(expected):
        try:
            position = actual.index(line, position) + 1
        except ValueError:
            return expected[index:]
    return []


class Tutorial:
    """The page's substitutions and the processes it starts."""

    def __init__(self, home: Path, nox_site: Path) -> None:
        self.home = home
        self.port, self.metrics = free_port(), free_port()
        self.env = environment(nox_site)
        self.server: Running | None = None

    def sub(self, text: str) -> str:
        for host in ("localhost", "127.0.0.1"):
            text = text.replace(f"{host}:8001", f"127.0.0.1:{self.port}")
            text = text.replace(f"{host}:8002", f"127.0.0.1:{self.metrics}")
        text = text.replace("base_port: 8001", f"base_port: {self.port}")
        text = text.replace("metrics_base_port: 8002", f"metrics_base_port: {self.metrics}")
        return text.replace("~/iris", str(self.home))

    def shell(self, command: str) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        return done.stdout

    def server_lines(self) -> list[str]:
        assert self.server is not None
        return [masked(line) for line in self.server.text().splitlines()]


@pytest.fixture
def tutorial(tmp_path: Path) -> Iterator[Tutorial]:
    home = tmp_path / "iris"
    home.mkdir()
    page = Tutorial(home, nox_path(tmp_path))
    yield page
    if page.server is not None:
        page.server.close()


def _commands(body: str) -> tuple[list[str], list[str]]:
    lines = body.rstrip("\n").splitlines()
    commands = [line[2:] for line in lines if line.startswith("$ ")]
    return commands, [line for line in lines if not line.startswith("$ ")]


def test_the_page_has_every_step() -> None:
    kinds = [what.split()[0] for what, _ in blocks()]
    assert kinds == [
        "file",
        "command",
        "file",
        "serve",
        "python",
        "output",
        "python",
        "output",
        "grpcurl",
        "metrics",
        "command",
        "log",
        "python",
        "output",
        "stop",
    ]


def test_the_tutorial_as_written(tutorial: Tutorial) -> None:
    marked = blocks()
    pending_code: str | None = None
    for what, raw in marked:
        kind, _, arg = what.partition(" ")
        body = tutorial.sub(raw)
        if kind == "file":
            path = Path(tutorial.sub(arg))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        elif kind == "command":
            commands, expected = _commands(body)
            printed = "".join(tutorial.shell(c) for c in commands)
            if expected:
                assert [masked(x) for x in printed.splitlines()] == [masked(x) for x in expected]
        elif kind == "serve":
            (command,), expected = _commands(body)
            node = str(tutorial.home / "node.yaml")
            assert command == f"nox -s serve -- {node}"
            argv = nox_argv(
                sys.executable,
                "-s",
                "serve",
                "--no-venv",
                "--no-install",
                "--",
                node,
            )
            tutorial.server = Running(argv, tutorial.env, tutorial.home / "serve.log")
            tutorial.server.wait_ready(tutorial.port)
            # Without a virtualenv of its own, the block names this environment's scripts.
            # (relative to the checkout when inside it, as the block shows them)
            here = Path(sys.executable).parent
            relative = os.path.relpath(here, ROOT)
            scripts = (str(here) if relative.startswith("..") else relative) + "/"
            wanted = [
                masked(x.replace(".nox/serve/bin/", scripts))
                for x in expected
                if not x.startswith("nox > [1/3]")
            ]
            assert in_order(wanted, tutorial.server_lines()) == [], tutorial.server.text()
            assert "nox > [1/3] " in tutorial.server.text()
        elif kind == "python":
            pending_code = body
        elif kind == "output":
            assert pending_code is not None
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(pending_code, "docs/tutorial.md", "exec"), {"__name__": "__main__"})
            assert printed.getvalue() == body
            pending_code = None
        elif kind == "grpcurl":
            (command,), expected = _commands(body)
            answer = json.loads(tutorial.shell(command))
            want = json.loads("\n".join(expected))
            got_raw = answer.pop("rawOutputContents")
            want_raw = want.pop("rawOutputContents")
            assert answer == want

            def floats(items: list[str]) -> np.ndarray:
                return np.concatenate(
                    [np.frombuffer(base64.b64decode(x), dtype="<f4") for x in items]
                )

            np.testing.assert_allclose(floats(got_raw), floats(want_raw), atol=1e-6)
        elif kind == "metrics":
            (command,), expected = _commands(body)
            assert tutorial.shell(command).splitlines() == expected
        elif kind == "log":
            wanted = [masked(x) for x in body.splitlines()]
            wait_until(
                lambda wanted=wanted: not in_order(wanted, tutorial.server_lines()),
                what=lambda: tutorial.server.text(),  # type: ignore[union-attr]
            )
        elif kind == "stop":
            assert tutorial.server is not None
            os.killpg(tutorial.server.proc.pid, signal.SIGINT)
            assert tutorial.server.proc.wait(timeout=60) == 0, tutorial.server.text()
            wanted = [masked(x) for x in body.splitlines()]
            assert in_order(wanted, tutorial.server_lines()) == [], tutorial.server.text()
        else:  # pragma: no cover
            raise AssertionError(f"unknown doc-test marker {what!r}")
    assert pending_code is None
    # The tutorial wrote into ~/iris only.
    assert sorted(p.name for p in tutorial.home.iterdir()) == [
        "iris.py",
        "node.yaml",
        "repo",
        "serve.log",  # the test's record of the server's output
    ]

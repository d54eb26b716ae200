"""Every block of docs/*.md, docs/history/*.md and README.md that shows printed output, run
against the page.

The convention (docs pages and README.md)
-----------------------------------------
A fenced block *shows output* when its info string is ``text`` or ``json``, when it is a ``console``
block of output alone, or when one of its ``$ `` commands is followed by what it prints
(a block of commands alone shows none; a block without an info string and without a
``$ `` line is a diagram or a formula). Every such block carries a marker, an HTML
comment (the renderer hides it) on the line right above its opening fence:

``<!-- doc-test: python -->`` over a ``python`` block, then ``<!-- doc-test: output -->``
    over the block right after it: the code runs in a fresh namespace, in-process, and
    must print exactly the output block. ``python continued``: the block goes on from
    the page's python block before it (runs after it, in its namespace).
``<!-- doc-test: command -->``
    each ``$ `` line (with its continuation lines: a trailing ``\\`` or an open quote) runs
    in bash; the lines after it, up to the next ``$ `` line, are exactly what it prints
    (stdout, then stderr). Where both are JSON (grpcurl's answers) they are compared as
    JSON, so a page may fold grpcurl's one-field-per-line arrays; a line of ``...`` alone
    stands for any lines (a long ``describe`` cut short).
``<!-- doc-test: file NAME -->``
    the block is written to ``NAME`` in the page's working directory before any command
    of the page runs (a node file the page shows, then checks).
``<!-- doc-test: skip REASON -->``
    not run, and listed as a skipped test with REASON: measured numbers (timings of one
    machine), a GPU, a deployment of several processes, log excerpts with timestamps.
``<!-- doc-test: elsewhere TEST_FILE -->``
    run by the page's own test module, which reads the block from the page.

Pages whose every marked block a module of their own runs (``OWN_MODULES``: the client
examples against a worker, the tutorial through nox, the exporter's worked example) keep
their own kinds; this module requires only that their output blocks are marked.

Addresses and paths
-------------------
Blocks that name ``localhost:8001`` / ``127.0.0.1:8001`` (and ``:8002``, the metrics port)
run against one worker this module starts in-process on free ports, serving what
``nox -s serve`` serves: the example repository (the zoo and the two-stage detector),
built into a temporary directory. Commands run from a temporary directory holding the
page's files and links to the checkout's top-level entries, so ``python examples/...``
works as from the checkout. ``PATHS`` maps the paths a page names to ones that exist
here, in the code, the commands and the expected output alike.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: docs/history/'s pages (the benchmarks' journal) are held to the same markers: their
#: measured blocks are all ``skip``, so they are listed, never run.
PAGES = [
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "history").glob("*.md")),
    ROOT / "README.md",
]

#: Pages with a test module of their own that runs their marked blocks.
OWN_MODULES = {
    "docs/client.md": "tests/client/test_client_docs.py",
    "docs/tutorial.md": "tests/docs/test_tutorial.py",
    "docs/export.md": "tests/runtime/test_export_docs.py",
}
#: The kinds this module knows.
KINDS = ("python", "output", "command", "file", "skip", "elsewhere")
#: Kinds of blocks another module runs wherever they are (not output: bundle manifests).
FOREIGN_KINDS = {"manifest": "tests/runtime/test_export_docs.py"}
#: Per page: a path the page names -> what the tests use instead: a directory made below
#: the page's working directory when relative; ``{repo}``: the example repository the
#: worker serves.
PATHS: dict[str, dict[str, str]] = {
    "docs/configuration.md": {
        "/var/lib/reactantserver/models": "models",
        "/var/cache/reactantserver": "cache",
    },
    "docs/bundles.md": {"'models/": "'{repo}/"},
    "docs/meta_models.md": {"/srv/models": "models"},
}

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"^<!-- doc-test: (?P<kind>[a-z-]+)(?: (?P<arg>.*?))? -->$")
_SERVER = re.compile(r"\b(?:localhost|127\.0\.0\.1):800[12]\b")


@attrs.frozen
class Block:
    page: str  # relative to the checkout
    line: int  # of the opening fence
    info: str
    body: str
    kind: str | None
    arg: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def shows_output(self) -> bool:
        """``text``; a ``console`` block of output alone; any block with a ``$ `` command
        followed by what it prints (commands alone show no output)."""
        if self.info in ("text", "json"):
            return True
        lines = self.body.splitlines()
        if not any(line.startswith("$ ") for line in lines):
            return self.info == "console"
        return not lines[0].startswith("$ ") or any(out for _, out in commands(self.body))


def page_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].splitlines()
        mark = _MARK.match(before[-1].strip()) if before else None
        found.append(
            Block(
                page=str(page.relative_to(ROOT)),
                line=len(before) + 1,
                info=m["info"].strip(),
                body=m["body"],
                kind=mark["kind"] if mark else None,
                arg=(mark["arg"] or "").strip() if mark else "",
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def ours(kind: str) -> list[Block]:
    """The blocks of ``kind`` this module runs (not those of OWN_MODULES' pages)."""
    return [b for b in all_blocks() if b.kind == kind and b.page not in OWN_MODULES]


def examples() -> list[tuple[Block, Block]]:
    """(python block, output block) pairs, in page order."""
    pairs = []
    for page in PAGES:
        blocks = page_blocks(page)
        for code, after in itertools.pairwise(blocks):
            if code.kind == "python" and code.page not in OWN_MODULES:
                assert after.kind == "output", f"{code.id}: no <!-- doc-test: output --> after it"
                pairs.append((code, after))
    return pairs


def _before(code: Block) -> list[Block]:
    """The python blocks ``code`` continues (``python continued``: it uses their names)."""
    if code.arg != "continued":
        return []
    earlier = [
        b for b in page_blocks(ROOT / code.page) if b.kind == "python" and b.line < code.line
    ]
    assert earlier, f"{code.id}: continues no python block"
    return [*_before(earlier[-1]), earlier[-1]]


# ------------------------------------------------------------------ the convention


def test_every_block_that_shows_output_is_marked() -> None:
    unmarked = [b.id for b in all_blocks() if b.shows_output and b.kind is None]
    assert unmarked == [], (
        "blocks that show output must say how they are checked (tests/docs/test_docs_output.py's "
        f"docstring): {unmarked}"
    )


def test_every_marker_is_known_and_says_why() -> None:
    for block in all_blocks():
        if block.kind is None or block.kind in FOREIGN_KINDS:
            continue
        if block.page in OWN_MODULES and block.kind not in KINDS:
            continue
        assert block.kind in KINDS, f"{block.id}: unknown doc-test kind {block.kind!r}"
        if block.kind in ("skip", "elsewhere", "file") or (
            block.kind == "python" and block.arg not in ("", "continued")
        ):
            assert block.arg, f"{block.id}: <!-- doc-test: {block.kind} --> needs its argument"
        if block.kind == "elsewhere":
            module = ROOT / block.arg
            assert module.is_file(), f"{block.id}: {block.arg} does not exist"
            assert Path(block.page).name in module.read_text(), (
                f"{block.id}: {block.arg} does not read {block.page}"
            )
        if block.kind == "output":
            assert block.shows_output, f"{block.id}: an output block must be text or console"


def test_the_pages_with_modules_of_their_own_have_them() -> None:
    for page, module in OWN_MODULES.items():
        assert Path(page).name in (ROOT / module).read_text(), (page, module)
    for kind, module in FOREIGN_KINDS.items():
        assert f'"{kind}' in (ROOT / module).read_text(), (kind, module)


@pytest.mark.parametrize("block", ours("skip"), ids=lambda b: b.id)
def test_skipped(block: Block) -> None:
    pytest.skip(f"{block.id}: {block.arg}")


# ------------------------------------------------------------------ running them


@pytest.fixture(scope="module")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository ``nox -s serve`` builds: the zoo and the detector."""
    from conftest import load_build_repo

    repo = tmp_path_factory.mktemp("examples") / "repo"
    load_build_repo().build(repo)
    return repo


@pytest.fixture(scope="module")
def served(
    example_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """A worker serving the example repository; the page's addresses -> its own."""
    from worker_harness import running_worker, worker_config

    config = worker_config(example_repo, cache_dir=tmp_path_factory.mktemp("docs_cache"))
    with running_worker(config) as address:
        grpc, metrics = f"127.0.0.1:{address.grpc_port}", f"127.0.0.1:{address.metrics_port}"
        yield {
            "localhost:8001": grpc,
            "127.0.0.1:8001": grpc,
            "localhost:8002": metrics,
            "127.0.0.1:8002": metrics,
        }


def _needs_server(*texts: str) -> bool:
    return any(_SERVER.search(text) for text in texts)


def _substitute(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        text = text.replace(old, new)
    return text


@pytest.fixture
def page_dir(tmp_path: Path) -> Path:
    """A working directory: links to the checkout's top-level entries."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def _table(block: Block, where: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """What to substitute in ``block`` (and the page's files, and the expected output)."""
    table = {}
    for old, new in PATHS.get(block.page, {}).items():
        if "{repo}" in new:
            table[old] = new.format(repo=request.getfixturevalue("example_repo"))
        else:
            (where / new).mkdir(parents=True, exist_ok=True)
            table[old] = str(where / new)
    bodies = [block.body, *(b.body for b in _files(block.page) + _before(block))]
    if _needs_server(*bodies):
        table.update(request.getfixturevalue("served"))
    return table


def _files(page: str) -> list[Block]:
    return [b for b in page_blocks(ROOT / page) if b.kind == "file"]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "output"), examples(), ids=lambda b: b.id)
def test_python_example(
    code: Block, output: Block, page_dir: Path, request: pytest.FixtureRequest
) -> None:
    table = _table(code, page_dir, request)
    import numpy as np

    namespace = {"__name__": "__main__"}
    # np.printoptions: a page may set print options; they must not outlive its example.
    with contextlib.chdir(page_dir), np.printoptions():
        for earlier in _before(code):  # what it continues, its output not compared
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(_substitute(earlier.body, table), earlier.id, "exec"), namespace)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(_substitute(code.body, table), code.id, "exec"), namespace)
    got, want = printed.getvalue(), _substitute(output.body, table)
    assert masked(got) == masked(want), _diff(got, want)


def commands(body: str) -> list[tuple[str, str]]:
    """A console block's (command, expected output) pairs, continuation lines joined."""
    pairs: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") or not _complete(command):
                i += 1
                command = command + "\n" + lines[i]
            pairs.append((command, []))
        else:
            assert pairs, f"output before the first command: {line!r}"
            pairs[-1][1].append(line)
        i += 1
    return [(command, "".join(f"{line}\n" for line in out)) for command, out in pairs]


def _complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:  # an open quote: the command goes on
        return False
    return True


#: What legitimately differs between runs, masked in the output and the page alike.
MASKS = [
    # The simulators say how long the simulation took in real time.
    (re.compile(r"simulated in \d+\.\d+ s\b"), "simulated in N s"),
    # An exporter's summary line: "3 bundles in DIR (10.4 s)".
    (re.compile(r"^(\d+ bundles in .*) \(\d+\.\d+ s\)$", re.M), r"\1 (N s)"),
]


def masked(text: str) -> str:
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def _diff(got: str, want: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        want.splitlines(), got.splitlines(), "the page", "the run", lineterm="", n=1
    )
    return "\n".join(lines)


def _same(got: str, want: str) -> bool:
    got, want = masked(got), masked(want)
    if got.rstrip() == want.rstrip():
        return True
    if any(line.strip() == "..." for line in want.splitlines()):
        # A line of "..." alone (indented as the page likes) stands for any lines.
        pattern = "".join(
            r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"[ \t]*\n"
            for line in want.rstrip().splitlines()
        )
        return re.fullmatch(pattern, got.rstrip() + "\n") is not None
    try:
        return bool(json.loads(got) == json.loads(want))
    except ValueError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("block", ours("command"), ids=lambda b: b.id)
def test_command(block: Block, page_dir: Path, request: pytest.FixtureRequest) -> None:
    table = _table(block, page_dir, request)
    for file in _files(block.page):
        (page_dir / file.arg).write_text(_substitute(file.body, table))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("INFERENCE_SERVER_", "REACTANT_"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["JAX_PLATFORMS"] = "cpu"
    status = 0
    for command, want in commands(block.body):
        done = subprocess.run(
            # Each command in its own shell, which starts with the last one's status
            # (for a page's ``$ echo $?``).
            ["bash", "-c", f"(exit {status}); {_substitute(command, table)}"],
            cwd=page_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        status = done.returncode
        got = done.stdout + done.stderr
        want = _substitute(want, table)
        assert _same(got, want), f"{block.id}: $ {command}\n{_diff(got, want)}"

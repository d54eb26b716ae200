"""The examples in docs/export.md and docs/bundles.md, run as written.

Code blocks are marked with HTML comments the renderer hides:

- ``<!-- doc-test: file NAME -->``: the next block is written to ``NAME``;
- ``<!-- doc-test: command -->``: the next block is one ``$ reactantserver ...`` line,
  run in-process; ``<!-- doc-test: output -->`` is what it must print (the time taken
  and the artifact's byte size may differ);
- ``<!-- doc-test: run NAME -->``: ``$ python NAME`` lines, each followed by the exact
  output of running the file written earlier;
- ``<!-- doc-test: manifest [model.py] -->``: a manifest that must parse (with a
  model.py present when so marked).
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
from pathlib import Path

import pytest
from test_bundle_broken import LOAD_CASES, SCAN_CASES

from reactantserver.bundle import parse_manifest
from reactantserver.errors import BundleError

DOCS = Path(__file__).resolve().parents[2] / "docs"
_MARKED = re.compile(r"<!-- doc-test: (?P<what>[^>]*?) -->\n```[a-z]*\n(?P<body>.*?)```", re.S)


def _stable(line: str) -> str:
    """Mask what legitimately varies between runs: the time taken, and the artifact's
    size (it embeds source locations, so it depends on the path of the exported file)."""
    line = re.sub(r"^  took\s+\d+\.\d\d s$", "  took N s", line)
    return re.sub(r"artifact \d+ B", "artifact N B", line)


def blocks(page: str) -> list[tuple[str, str]]:
    """(marker, body) for every marked block of ``page``, in order."""
    text = (DOCS / page).read_text()
    return [(m["what"].strip(), m["body"]) for m in _MARKED.finditer(text)]


def test_export_worked_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reactantserver.cli import main
    from reactantserver.config import RuntimeConfig
    from reactantserver.runtime import Runtime

    monkeypatch.chdir(tmp_path)
    command_output: list[str] | None = None
    ran = []
    try:
        for marker, body in blocks("export.md"):
            kind, _, arg = marker.partition(" ")
            if kind == "file":
                (tmp_path / arg).write_text(body)
            elif kind == "command":
                (line,) = body.strip().splitlines()
                argv = shlex.split(line.removeprefix("$ "))
                assert argv[0] == "reactantserver"
                assert main(argv[1:]) == 0
                command_output = capsys.readouterr().out.splitlines()
                ran.append("command")
            elif kind == "output":
                assert command_output is not None
                want = body.splitlines()
                assert len(command_output) == len(want)
                for got_line, want_line in zip(command_output, want, strict=True):
                    assert _stable(got_line) == _stable(want_line)
                ran.append("output")
            elif kind == "run":
                # "$ python NAME" lines, each followed by its expected output.
                runs = re.split(r"^\$ python \S+\n", body, flags=re.M)[1:]
                for expected in runs:
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        runpy.run_path(str(tmp_path / arg), run_name="__main__")
                    assert buf.getvalue() == expected
                ran.append(f"run x{len(runs)}")
    finally:
        Runtime.start(RuntimeConfig(backend="cpu"), "")  # the example set a cache dir
    assert ran == ["command", "output", "run x2"]


@pytest.mark.parametrize(
    ("marker", "body"), [(m, b) for m, b in blocks("bundles.md") if m.startswith("manifest")]
)
def test_bundles_page_manifests_parse(marker: str, body: str) -> None:
    assert marker.startswith("manifest")
    manifest = parse_manifest("example", body, has_model_py=marker.endswith("model.py"))
    assert manifest.format_version == "1"


def test_bundles_page_error_messages_are_the_real_ones() -> None:
    text = (DOCS / "bundles.md").read_text()
    listed = re.findall(r"^bundle '([a-z_]+)': (.*)$", text, flags=re.M)
    assert len(listed) >= 10
    known = {name: message for name, _, _, message in SCAN_CASES + LOAD_CASES}
    for name, message in listed:
        assert known[name] == message, name


def test_bundles_page_reports_every_problem_of_its_broken_manifest() -> None:
    """docs/bundles.md's manifest with three mistakes, and the three lines it shows."""
    marked = [
        b for m, b in blocks("bundles.md") if m == "elsewhere tests/runtime/test_export_docs.py"
    ]
    manifest = next(b for b in marked if b.startswith("# models/my-model/manifest.yaml"))
    shown = next(b for b in marked if b.startswith("bundle 'my-model': "))
    with pytest.raises(BundleError) as info:
        parse_manifest("my-model", manifest, has_model_py=False)  # the comment is line 1
    assert str(info.value).splitlines() == shown.splitlines()

"""YAML bombs refused in milliseconds, with one line naming the file and the line.

Issue 41: a 705-byte node.yaml of nested aliases took over 60 s and 1.5-2.4 GiB in
``reactantserver config``; a 640-byte ``provenance`` of 10^6 aliases in a live manifest
69 s and 1.3 GiB; 50,000 nested ``[`` raised RecursionError with a traceback. Every file
the server reads as YAML (node.yaml, gateway.yml, manifest.yaml) goes through
``yaml_lines.load_round_trip``: nesting past MAX_DEPTH and alias expansion past MAX_NODES
are refused before anything is built. No timed assertion: the bombs would take minutes
and gigabytes, so finishing at all (with the suite's memory) is the evidence.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reactantserver.bundle import load_bundle
from reactantserver.bundle.manifest import parse_manifest
from reactantserver.config import load_node
from reactantserver.config.source import read_yaml
from reactantserver.errors import BundleError, ConfigError
from reactantserver.yaml_lines import MAX_DEPTH, MAX_NODES, load_round_trip


def alias_bomb(levels: int = 9, width: int = 9, indent: str = "") -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: it stands
    for ``width ** levels`` values (9 ** 9 = 387 million) in a few hundred bytes."""
    lines = [f"{indent}l0: &l0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


NODE_BOMB = "model_repo: /srv/models\nglobal:\n  scheduler:\n    models:\n" + alias_bomb(
    levels=10, indent="      "
)
EXPANSION = f"refused: the aliases make the file stand for more than {MAX_NODES} values"
NESTING = f"refused: nested deeper than {MAX_DEPTH} levels of mappings and sequences"


def test_the_node_file_alias_bomb_is_one_line_from_config(tmp_path: Path) -> None:
    """The issue's case through the CLI: rc 2 (a configuration error), one line on
    stderr naming node.yaml and the alias's line, no traceback."""
    assert 600 <= len(NODE_BOMB) <= 800
    path = tmp_path / "node.yaml"
    path.write_text(NODE_BOMB)
    done = subprocess.run(
        [sys.executable, "-m", "reactantserver.cli", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{path}:") and EXPANSION in lines[0]
    assert "Traceback" not in done.stderr


def test_fifty_thousand_brackets_are_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /srv/models\nglobal: " + "[" * 50_000 + "\n")
    with pytest.raises(ConfigError) as refused:
        load_node(path)
    assert str(refused.value) == f"{path}:2: {NESTING}"
    path.write_text("model_repo: /srv/models\nglobal:\n" + "  - " * 50_000 + "x\n")
    with pytest.raises(ConfigError) as refused:
        read_yaml(path)
    assert str(refused.value) == f"{path}:3: {NESTING}"


def test_a_manifest_provenance_of_a_million_aliases_is_refused(tmp_path: Path) -> None:
    """The issue's live-manifest case: a 640-byte provenance standing for 10^6 values."""
    provenance = "provenance:\n" + alias_bomb(levels=6, width=10, indent="  ")
    text = f"format_version: 1\nkind: model\n{provenance}"
    with pytest.raises(BundleError) as refused:
        parse_manifest("mlp", text, has_model_py=False)
    assert str(refused.value).startswith("bundle 'mlp': manifest.yaml:")
    assert EXPANSION in str(refused.value) and len(str(refused.value).splitlines()) == 1
    bundle = tmp_path / "mlp"
    bundle.mkdir()
    (bundle / "manifest.yaml").write_text(text)
    with pytest.raises(BundleError, match="refused: the aliases"):
        load_bundle(bundle)
    (bundle / "manifest.yaml").write_text("inputs: " + "[" * 50_000)
    with pytest.raises(BundleError) as deep:
        load_bundle(bundle)
    assert str(deep.value) == f"bundle 'mlp': manifest.yaml:1: {NESTING}"


def test_aliases_within_the_bounds_still_load() -> None:
    """An anchored block merged into others, and a list repeated a few times, load as
    they always did: the bound is on what the aliases stand for, not on aliases."""
    doc = load_round_trip(
        "defaults: &d {weight: 2.0, max_batch_size: 8}\n"
        "a:\n  <<: *d\n  weight: 3.0\n"
        "sizes: &s [1, 2, 4]\n"
        "again: [*s, *s]\n"
    )
    assert dict(doc["a"]) == {"weight": 3.0, "max_batch_size": 8}
    assert [list(x) for x in doc["again"]] == [[1, 2, 4], [1, 2, 4]]
    deep = (
        "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH - 1))
        + "  " * (MAX_DEPTH - 1)
        + "v: 1\n"
    )
    assert load_round_trip(deep) is not None

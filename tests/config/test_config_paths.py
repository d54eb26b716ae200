"""Relative paths in a node file are anchored at the file's directory."""

from __future__ import annotations

from pathlib import Path

from reactantserver.config import load_server_config


def test_relative_paths_resolve_next_to_the_node_file(tmp_path: Path, monkeypatch) -> None:
    conf = tmp_path / "deploy" / "node.yaml"
    conf.parent.mkdir()
    conf.write_text("model_repo: repo\nglobal:\n  cache_dir: ../cache\n")
    monkeypatch.chdir("/")
    cfg = load_server_config(conf, env={}, check_paths=False)
    assert cfg.model_dirs == (str(tmp_path / "deploy" / "repo"),)
    assert cfg.cache_dir == str(tmp_path / "cache")


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    conf = tmp_path / "node.yaml"
    conf.write_text("model_repo: /srv/models\n")
    cfg = load_server_config(conf, env={}, check_paths=False)
    assert cfg.model_dirs == ("/srv/models",)
    assert cfg.cache_dir == ""

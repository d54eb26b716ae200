"""Properties of the configuration layer over generated valid worker configurations."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import attrs
from hypothesis import given
from ruamel.yaml import YAML
from strategies import CONFIG_FAULT_FILE, config_fault_sets, server_configs

from reactantserver.config import NodeConfig, ServerConfig, dump_config, load_node, resolve_worker
from reactantserver.config.convert import structure
from reactantserver.config.env import WORKER_ENV
from reactantserver.config.rules import WORKER_CROSS, WORKER_RULES, problems
from reactantserver.config.source import SourceMap
from reactantserver.errors import ConfigError


def _text(value: Any) -> str:
    """An environment variable's text for a value (as an operator would write it)."""
    if isinstance(value, bool):
        return "yes" if value else "off"
    if isinstance(value, tuple):
        return ":".join(value)
    return repr(value) if isinstance(value, float) else str(value)


def _leaf(cfg: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        cfg = getattr(cfg, str(key))
    return cfg


@given(server_configs())
def test_generated_configs_meet_every_rule(cfg: ServerConfig) -> None:
    """The strategy and the rules agree on what a valid worker is (no false alarms)."""
    assert problems(cfg, WORKER_RULES, WORKER_CROSS, SourceMap().origin) == []


@given(server_configs())
def test_dump_reads_back_as_the_same_config(cfg: ServerConfig) -> None:
    """What ``reactantserver config`` prints is exactly the configuration, not a summary:
    structuring the YAML back gives an equal record."""
    doc = YAML(typ="safe").load(dump_config(cfg))
    assert structure(ServerConfig, doc, SourceMap().origin) == cfg


@given(server_configs())
def test_every_leaf_can_be_set_from_the_environment(cfg: ServerConfig) -> None:
    """Setting every INFERENCE_SERVER_* variable to a config's values reproduces that config
    (all but the name, chosen with --worker, and the per-model map, which has no variables)."""
    env = {}
    for var, setting in WORKER_ENV.items():
        value = _leaf(cfg, setting.path)
        if value is not None:
            env[var] = _text(value)
    resolved = resolve_worker(NodeConfig(model_repo="/unused"), env=env)
    expected = attrs.evolve(cfg, name="worker0", scheduler=attrs.evolve(cfg.scheduler, models={}))
    assert resolved == expected


@given(config_fault_sets())
def test_no_fault_hides_another(faults: frozenset[int]) -> None:
    """However many faults a node file has -- wrong types, unknown keys, values out of
    range, at the top level, in ``global:`` and in a worker entry -- one load reports
    each of them, one line each, in file order, and nothing else: a fault never hides
    the next one, and the repairs made to get past one never produce a false alarm."""
    lines: list[str] = []
    expected: list[str] = []
    for number, line in enumerate(CONFIG_FAULT_FILE, start=1):
        if isinstance(line, str):
            lines.append(line)
            continue
        valid, faulty, message = line
        if number - 1 in faults:
            lines.append(faulty)
            expected.append(f"node.yaml:{number}: {message}")
        else:
            lines.append(valid)
    source = SourceMap("node.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "node.yaml")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        try:
            load_node(path, env={}, check_paths=False)
        except ConfigError as exc:
            reported = [line.replace(path, source.file, 1) for line in exc.problems]
        else:
            reported = []
    assert reported == expected

"""``cost.device_hour`` in node.yaml (a settings block) and gateway.yml (issue 36)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reactantserver.config import load_gateway, load_node, resolve_worker
from reactantserver.config.schema import CostConfig
from reactantserver.errors import ConfigError


def node(tmp_path: Path, text: str) -> Path:
    (tmp_path / "models").mkdir(exist_ok=True)
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: models\ngpus: 0\n" + text)
    return path


def test_unset_by_default(tmp_path: Path) -> None:
    assert resolve_worker(load_node(node(tmp_path, "")), "worker0").cost == CostConfig()
    assert CostConfig().device_hour is None


def test_global_and_per_worker_prices(tmp_path: Path) -> None:
    """A node of mixed GPUs prices each worker's device: global, then the entry's own."""
    text = (
        "global:\n  cost:\n    device_hour: 2.5\n"
        "workers:\n  - name: w0\n  - name: w1\n    cost: {device_hour: 4}\n"
    )
    loaded = load_node(node(tmp_path, text))
    assert resolve_worker(loaded, "w0").cost.device_hour == 2.5
    assert resolve_worker(loaded, "w1").cost.device_hour == 4.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "global:\n  cost:\n    device_hours: 2\n",
            "node.yaml:5: global.cost.device_hours: unknown key; expected one of device_hour "
            "(did you mean device_hour?)",
        ),
        (
            "global:\n  cost:\n    device_hour: -1\n",
            "node.yaml:5: global.cost.device_hour: expected a number >= 0 (the price of one "
            "device-hour); got -1.0",
        ),
        ("global:\n  cost: 3\n", "node.yaml:4: global.cost: expected a mapping; got 3"),
    ],
)
def test_node_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_worker(load_node(node(tmp_path, text)), "worker0")
    assert message in str(caught.value)


def test_gateway_yml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: ['127.0.0.1:1']\ncost:\n  device_hour: 3.1\n")
    assert load_gateway(path).cost == CostConfig(device_hour=3.1)
    path.write_text("endpoints: ['127.0.0.1:1']\ncost:\n  price: 3.1\n")
    with pytest.raises(ConfigError, match=r"gateway.yml:3: cost.price: unknown key"):
        load_gateway(path)


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_SERVER_COST_DEVICE_HOUR", "1.75")
    assert resolve_worker(load_node(node(tmp_path, "")), "worker0").cost.device_hour == 1.75
    monkeypatch.setenv("REACTANT_GATEWAY_COST_DEVICE_HOUR", "0.9")
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: ['127.0.0.1:1']\n")
    assert load_gateway(path).cost.device_hour == 0.9

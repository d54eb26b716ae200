"""The files a node's children read, written into its runtime directory at start.

``materialized_node`` is the node file as the workers run it: every worker listed by
name, ``gpus:`` their count, no worker's ``gpu:`` (each child sees one device, at ordinal
0), ``model_repo``, ``cache_dir`` and the certificate and key files made absolute (the
file lives elsewhere than the original), no ``gateway:`` block (the gateway has its own file), and a header naming each
worker's device. ``gateway_document`` is the embedded gateway's effective configuration.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..config import dump_config
from ..config.dump import to_plain
from ..config.schema import GatewayConfig, NodeConfig, Settings


def _anchor(path: str, base: str) -> str:
    return path if not path or os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


def _anchored_settings(settings: Settings, base: str) -> dict[str, object]:
    plain = to_plain(settings)
    assert isinstance(plain, dict)
    if isinstance(plain.get("cache_dir"), str):
        plain["cache_dir"] = _anchor(plain["cache_dir"], base)
    endpoints = plain.get("endpoints")
    if isinstance(endpoints, dict):  # certificates and key files, as the node file meant
        blocks = [endpoints.get("tls"), endpoints.get("gateway"), *endpoints.get("restricted", ())]
        for block in blocks:
            if not isinstance(block, dict):
                continue
            for key, value in block.items():
                if key.endswith("_file") and isinstance(value, str):
                    block[key] = _anchor(value, base)
    return plain


def materialized_node(node: NodeConfig, devices: Sequence[str | None], source: str) -> str:
    """The node file as the children run it: workers listed, ``gpus:`` the worker count
    (each child sees one device, at ordinal 0), paths absolute, no ``gateway:`` block
    (the gateway has its own file)."""
    file = node.source.file
    base = os.path.dirname(os.path.abspath(file)) if not file.startswith("<") else os.getcwd()
    workers = []
    for entry in node.workers:
        item: dict[str, object] = {"name": entry.name}
        if entry.port is not None:
            item["port"] = entry.port
        if entry.metrics_port is not None:
            item["metrics_port"] = entry.metrics_port
        item.update(_anchored_settings(entry.settings, base))
        workers.append(item)
    doc: dict[str, object] = {
        "model_repo": _anchor(node.model_repo, base),
        "base_port": node.base_port,
        "metrics_base_port": node.metrics_base_port,
        "gpus": 0 if all(d is None for d in devices) else len(devices),
        "global": _anchored_settings(node.global_, base),
        "workers": workers,
    }
    if node.models:
        doc["models"] = to_plain(node.models)
    header = [
        f"# {file} as `reactantserver node` runs it (written at start; edit {file}, not this).",
        f"# Devices from {source}; each worker sees only its own, at ordinal 0:",
    ]
    for entry, device in zip(node.workers, devices, strict=True):
        header.append(
            f"#   {entry.name}: CUDA_VISIBLE_DEVICES={device if device is not None else ''!s}"
        )
    return "\n".join(header) + "\n" + dump_config(doc)


def gateway_document(gateway: GatewayConfig, node_file: str) -> str:
    header = (
        f"# The gateway of {node_file}, as `reactantserver node` runs it (written at start;\n"
        "# endpoints default to the node's workers, startup_wait_seconds to .inf).\n"
    )
    return header + dump_config(gateway)

"""Which device each worker of a node gets: the node's devices decided, then handed out.

``decide_devices`` turns the detection of ``devices`` into the node's device list, with the
rules that depend on the workers: a node whose every worker runs ``runtime.backend: cpu``
is a CPU node without looking at hardware (devices named for it are a conflict); a CUDA
node where nothing finds a device is an error naming every source tried, unless an
operator said ``0`` on purpose and the workers may fall back to the CPU. ``assign`` then
gives worker *i* device *i*, or the one its ``gpu: N`` names; a CPU node has
``REACTANT_CPU_WORKERS`` workers (default 1) unless it lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from ..config.schema import NodeConfig, ServerConfig
from ..config.source import EnvOrigin, Origin, fail, show
from ..errors import ConfigError
from . import devices as devmod
from .devices import Detection

CPU_WORKERS_VAR = "REACTANT_CPU_WORKERS"


def int_var(env: Mapping[str, str], var: str, default: int, least: int) -> int:
    """An integer environment variable of the supervisor (``default`` when unset or empty)."""
    text = env.get(var, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        fail(EnvOrigin(var), f"expected an integer >= {least}; got {show(env[var])}")
    if value < least:
        fail(EnvOrigin(var), f"expected an integer >= {least}; got {value}")
    return value


def _gpus_origin(node: NodeConfig) -> Origin:
    return node.source.origin(("gpus",))


def decide_devices(
    node: NodeConfig,
    env: Mapping[str, str],
    role: Literal["all", "workers", "gateway"],
    configs: Sequence[ServerConfig],
    nvidia_smi: Callable[[Mapping[str, str]], str | None],
    dev_nodes: Callable[[], Iterable[str]],
) -> tuple[Detection, list[str]]:
    notes: list[str] = []
    if role == "gateway":  # no worker runs here: only what an operator declared counts
        found = devmod.detect(
            node.gpus,
            _gpus_origin(node),
            env,
            nvidia_smi=nvidia_smi,
            dev_nodes=dev_nodes,
            hardware=False,
        )
        return found, notes
    if all(cfg.runtime.backend == "cpu" for cfg in configs):
        check_devices_for_backends(node, configs, env)
        return Detection((), "runtime.backend: cpu", (), True), notes
    found = devmod.detect(
        node.gpus, _gpus_origin(node), env, nvidia_smi=nvidia_smi, dev_nodes=dev_nodes
    )
    if found.devices:
        return found, notes
    cuda = [cfg for cfg in configs if cfg.runtime.backend == "cuda"]
    if not found.explicit:
        raise _no_device(node, cuda[0], found)
    strict = [cfg.name for cfg in cuda if not cfg.runtime.allow_cpu_fallback]
    if strict:
        origin = EnvOrigin(devmod.GPUS_VAR) if devmod.GPUS_VAR in env else _gpus_origin(node)
        fail(
            origin,
            f"{found.source} makes this a CPU node, but {', '.join(strict)} run(s) "
            "runtime.backend: cuda with allow_cpu_fallback: false; set backend: cpu, or "
            "allow_cpu_fallback: true",
        )
    notes.append(f"{found.source}: a CPU node; the cuda workers fall back to the CPU")
    return found, notes


def check_devices_for_backends(
    node: NodeConfig, configs: Sequence[ServerConfig], env: Mapping[str, str]
) -> None:
    """The one rule for ``gpus:`` against the workers' backends, which ``reactantserver
    node``, ``serve`` and ``config`` all apply (so all three say the same line, exit 2):
    devices named (``gpus: N`` or a list, or ``REACTANT_GPUS``) while every worker runs
    ``runtime.backend: cpu`` is a contradiction, refused with what to change. (``serve``
    started such a file on the CPU without a word, ``config`` printed the refusal as a
    comment and exited 0, only ``node`` refused: issue 42.)"""
    if not all(cfg.runtime.backend == "cpu" for cfg in configs):
        return
    said = devmod.detect(node.gpus, _gpus_origin(node), env, hardware=False)
    if said.explicit and said.devices:
        origin = EnvOrigin(devmod.GPUS_VAR) if devmod.GPUS_VAR in env else _gpus_origin(node)
        fail(
            origin,
            "expected 0 (a CPU node), since every worker runs runtime.backend: cpu; "
            f"got {len(said.devices)} device(s): {', '.join(said.devices)} (for a GPU node "
            "set runtime.backend: cuda as well -- global: {runtime: {backend: cuda}} or "
            "INFERENCE_SERVER_RUNTIME_BACKEND=cuda; for a CPU node, gpus: 0)",
        )


def _no_device(node: NodeConfig, cfg: ServerConfig, found: Detection) -> Exception:
    return ConfigError(
        f"{node.source.file}: no GPU found for a CUDA node ({cfg.name} runs runtime.backend: "
        f"cuda); tried {'; '.join(found.tried)}. Give the container the GPUs (docker run "
        f"--gpus all, or the NVIDIA runtime), name them in {devmod.GPUS_VAR} or gpus:, or set "
        "runtime.backend: cpu"
    )


def assign(node: NodeConfig, detection: Detection, env: Mapping[str, str]) -> list[str | None]:
    """Each worker's device token (None on a CPU node), in worker order."""
    devices = detection.devices
    if not devices:
        if node.workers:
            if env.get(CPU_WORKERS_VAR, "").strip():
                int_var(env, CPU_WORKERS_VAR, 1, 1)  # still refuse a malformed value
            return [None] * len(node.workers)
        return [None] * int_var(env, CPU_WORKERS_VAR, 1, 1)
    if not node.workers:
        return list(devices)
    if len(node.workers) > len(devices):
        fail(
            node.source.origin(("workers",)),
            f"expected at most {len(devices)} workers, one per device found by "
            f"{detection.source}; got {len(node.workers)}",
        )
    out: list[str | None] = []
    for index, entry in enumerate(node.workers):
        position = entry.gpu if entry.gpu is not None else index
        if position >= len(devices):
            fail(
                node.source.origin(("workers", index, "gpu")),
                f"expected a device index below {len(devices)} ({detection.source} found "
                f"{len(devices)}); got {position}",
            )
        out.append(devices[position])
    return out

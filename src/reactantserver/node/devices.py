"""Which GPUs a node runs on: the detection sources, in order, as small pure functions.

Theory of operation
-------------------
A node runs one worker per device, and each worker is handed its device as the single
token of its own ``CUDA_VISIBLE_DEVICES``. The device list comes from the first source
that says anything, in this order (docs/node.md):

1. ``REACTANT_GPUS``: a count (``2`` -> ordinals 0 and 1; ``0`` = a CPU node), or a
   comma-separated list of ordinals and/or UUIDs (``1,3`` / ``GPU-8a1c...,GPU-77e0...``).
2. the node file's ``gpus:``: ``auto`` (go on), a count, or a list, as above.
3. a ``CUDA_VISIBLE_DEVICES`` already set on the supervisor (a container-level filter):
   one device per token; set but empty means "no device".
4. ``nvidia-smi -L``: every GPU it lists, by UUID (the MIG instances of a GPU split into
   MIG instances, instead of the GPU). UUIDs, not ``nvidia-smi``'s indices: CUDA numbers
   devices fastest-first unless told otherwise, so an index could name another card.
5. ``/dev/nvidiaN`` device nodes, by ordinal.

Ordinals are positions among the devices the supervisor itself can see: when a
``CUDA_VISIBLE_DEVICES`` filter is set on it, ordinal *i* of sources 1 and 2 becomes the
filter's *i*-th token, so a child never escapes the filter it was started under.

Each source is a pure function of text it is given (an environment value, a node-file
value, a command's output, a directory listing); ``detect`` runs them in order with the
two pieces of I/O (running ``nvidia-smi``, listing ``/dev``) injected, so every branch is
tested without a GPU. The result records what each consulted source said, so "no GPU
found" can name every place that was looked at.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from ..config.schema import Gpus
from ..config.source import EnvOrigin, Origin, fail, show

GPUS_VAR = "REACTANT_GPUS"
VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"

#: A device token CUDA_VISIBLE_DEVICES accepts besides an ordinal: a GPU or MIG UUID
#: (full or a unique prefix, as CUDA allows), or a legacy ``MIG-GPU-<uuid>/gi/ci``.
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*$")
_ORDINAL = re.compile(r"^[0-9]+$")
_SMI_GPU = re.compile(r"^GPU (\d+): .*?(?:\(UUID: (\S+)\))?\s*$")
_SMI_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-\S+)\)\s*$")
_DEV_NODE = re.compile(r"^nvidia([0-9]+)$")


@attrs.frozen
class Detection:
    """The devices a node runs on, and how that was decided."""

    #: One ``CUDA_VISIBLE_DEVICES`` token per device, in worker order; empty = no device.
    devices: tuple[str, ...]
    #: The source that decided, as an operator would name it (``REACTANT_GPUS=2``).
    source: str
    #: Every source consulted, in order, with what it said (for messages and the log).
    tried: tuple[str, ...] = ()
    #: Decided by an operator's setting (``REACTANT_GPUS`` / ``gpus:``), not by hardware.
    explicit: bool = False


# --- the sources: text in, device tokens out ---------------------------------------------------


def parse_count_or_list(text: str, origin: Origin) -> tuple[str, ...]:
    """``REACTANT_GPUS`` syntax: a count, or a comma-separated list of ordinals / UUIDs."""
    value = text.strip()
    if _ORDINAL.match(value):
        return tuple(str(i) for i in range(int(value)))
    tokens = [token.strip() for token in value.split(",") if token.strip()]
    if not tokens:
        fail(
            origin,
            "expected a device count (0 = a CPU node) or a comma-separated list of device "
            f"ordinals or UUIDs; got {show(text)}",
        )
    return check_tokens(tokens, origin)


def check_tokens(tokens: Sequence[str], origin: Origin) -> tuple[str, ...]:
    """Device tokens: each an ordinal or a GPU/MIG UUID, none twice."""
    seen: set[str] = set()
    for token in tokens:
        if not (_ORDINAL.match(token) or _UUID.match(token)):
            fail(
                origin,
                "expected device ordinals (0, 1, ...) or UUIDs (GPU-..., MIG-...); "
                f"got {show(token)}",
            )
        if token in seen:
            fail(origin, f"expected each device once; {show(token)} is listed twice")
        seen.add(token)
    return tuple(tokens)


def from_node_gpus(gpus: Gpus, origin: Origin) -> tuple[str, ...] | None:
    """The node file's ``gpus:``; ``None`` for ``auto`` (the next source decides)."""
    if gpus == "auto":
        return None
    if isinstance(gpus, int):
        return tuple(str(i) for i in range(gpus))
    return check_tokens([str(device) for device in gpus], origin)


def from_visible_devices(text: str) -> tuple[str, ...]:
    """A ``CUDA_VISIBLE_DEVICES`` value. As in CUDA, the list ends at the first token that is
    not a device (``-1`` is the usual way to hide every GPU); empty means no device."""
    out: list[str] = []
    for raw in text.split(","):
        token = raw.strip()
        if not (_ORDINAL.match(token) or _UUID.match(token)):
            break
        out.append(token)
    return tuple(out)


def from_nvidia_smi(output: str) -> tuple[str, ...]:
    """The devices of ``nvidia-smi -L``: each GPU's UUID, or its MIG instances' UUIDs when it
    is split into MIG instances (a GPU line without a UUID gives its index)."""
    devices: list[str] = []
    current: str | None = None
    migs: list[str] = []

    def close() -> None:
        if current is not None:
            devices.extend(migs or [current])

    for line in output.splitlines():
        gpu = _SMI_GPU.match(line)
        if gpu:
            close()
            current, migs = gpu.group(2) or gpu.group(1), []
            continue
        mig = _SMI_MIG.match(line)
        if mig and current is not None:
            migs.append(mig.group(1))
    close()
    return tuple(devices)


def from_dev_nodes(names: Iterable[str]) -> tuple[str, ...]:
    """Ordinals of the ``/dev/nvidiaN`` nodes among ``names`` (not ``nvidiactl``, ``-uvm``)."""
    ordinals = sorted(int(m.group(1)) for m in map(_DEV_NODE.match, names) if m)
    return tuple(str(i) for i in ordinals)


def through_filter(
    devices: tuple[str, ...], visible: tuple[str, ...], origin: Origin
) -> tuple[str, ...]:
    """Ordinals among the supervisor's own visible devices, as tokens a child can use."""
    out: list[str] = []
    for device in devices:
        if not _ORDINAL.match(device):
            out.append(device)  # a UUID names one device whatever the filter
            continue
        index = int(device)
        if index >= len(visible):
            fail(
                origin,
                f"expected device ordinals below {len(visible)}, since "
                f"{VISIBLE_VAR}={','.join(visible) or show('')} leaves {len(visible)} "
                f"visible; got {device}",
            )
        out.append(visible[index])
    return tuple(out)


# --- I/O, injected -----------------------------------------------------------------------------


def run_nvidia_smi(env: Mapping[str, str]) -> str | None:
    """``nvidia-smi -L``'s output, or None when it is not on ``PATH`` or fails."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=30, env=dict(env), check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def list_dev() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def detect(
    gpus: Gpus,
    gpus_origin: Origin,
    env: Mapping[str, str],
    *,
    nvidia_smi: Callable[[Mapping[str, str]], str | None] = run_nvidia_smi,
    dev_nodes: Callable[[], Iterable[str]] = list_dev,
    hardware: bool = True,
) -> Detection:
    """Run the sources of the module doc in order; the first that says anything decides.

    ``hardware=False`` stops after the declarative sources (1-3): the node then has
    ``devices=()`` with ``source="none"`` when none of them decided.
    """
    tried: list[str] = []
    visible_set = VISIBLE_VAR in env
    visible = from_visible_devices(env.get(VISIBLE_VAR, ""))

    def decided(devices: tuple[str, ...], source: str, explicit: bool) -> Detection:
        return Detection(devices, source, (*tried, f"{source}: {_said(devices)}"), explicit)

    if GPUS_VAR in env:
        origin = EnvOrigin(GPUS_VAR)
        devices = parse_count_or_list(env[GPUS_VAR], origin)
        if visible_set:
            devices = through_filter(devices, visible, origin)
        return decided(devices, f"{GPUS_VAR}={env[GPUS_VAR].strip()}", True)
    tried.append(f"{GPUS_VAR} unset")

    node_devices = from_node_gpus(gpus, gpus_origin)
    where = f"gpus: {_spell(gpus)}"
    if node_devices is not None:
        if visible_set:
            node_devices = through_filter(node_devices, visible, gpus_origin)
        return decided(node_devices, where, True)
    tried.append(where)

    if visible_set:
        return decided(visible, f"{VISIBLE_VAR}={env[VISIBLE_VAR]}", False)
    tried.append(f"{VISIBLE_VAR} unset")
    if not hardware:
        return Detection((), "none", tuple(tried), False)

    output = nvidia_smi(env)
    if output is not None and from_nvidia_smi(output):
        return decided(from_nvidia_smi(output), "nvidia-smi -L", False)
    tried.append("nvidia-smi -L " + ("not on PATH or failed" if output is None else "lists no GPU"))

    nodes = from_dev_nodes(dev_nodes())
    if nodes:
        return decided(nodes, "/dev/nvidia*", False)
    tried.append("no /dev/nvidiaN device nodes")
    return Detection((), "none", tuple(tried), False)


def _said(devices: tuple[str, ...]) -> str:
    return ", ".join(devices) if devices else "no device (a CPU node)"


def _spell(gpus: Gpus) -> str:
    if isinstance(gpus, tuple):
        return "[" + ", ".join(str(d) for d in gpus) + "]"
    return str(gpus)

"""The node file: load and check it, and resolve one of its workers into a ``ServerConfig``.

Theory of operation
-------------------
``load_node`` reads the YAML (``source``), structures it into a ``NodeConfig``
(``convert``: types, unknown keys, settings-block shapes) and then checks it whole:

1. node rules: worker names, every worker's gRPC and admin port after ``base_port + i`` /
   ``metrics_base_port + i`` resolution (in range, no two alike), ``gpus`` against the
   workers, and the ``models:`` pin map against the worker names;
2. every worker is resolved (without the environment), so each value of ``global:`` and
   of the worker entries meets the worker rules of ``rules`` with its own line;
3. a ``gateway:`` block meets the gateway rules, and under ``lpt_packing`` every worker
   runs ``fifo`` or ``edf``;
4. the ``INFERENCE_SERVER_*`` overrides of the given environment are checked against
   every worker, so a bad override fails at load rather than in one child;
5. every worker's model repository is a readable directory (``paths``; the one check
   that reads the disk, skipped with ``check_paths=False``).

Nothing stops at the first problem: structuring gets past a bad key by dropping it
(``convert.try_structure``), so the node and its workers can still be checked, and
every problem of steps 1-5 is reported at once, one line each, in file order.

Resolving worker *i* (``resolve_worker``) assembles a raw tree, layer over layer, each
value remembering where it came from (``RawTree``):

    defaults  <-  global:  <-  the worker's own keys  <-  models: pins  <-  node-derived
    (name, model_dirs = (model_repo,), port, metrics_port, gpu)  <-  INFERENCE_SERVER_*

Mappings merge key by key (a worker's ``scheduler: {max_queue_depth: 8}`` keeps the
global discipline); lists and scalars replace. The tree is structured into a
``ServerConfig`` and held to the worker rules; any error names the line (or variable)
the offending value came from.

With no ``workers:`` list a node has ``worker0..N-1`` where N is the ``gpus:`` count
(a list's length; 1 for ``auto`` and for a CPU node, ``gpus: 0``). The node supervisor,
which detects the devices behind ``auto``, calls ``materialize_workers(node, count)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from . import env as envmod
from .certs import anchor, gateway_file_problems, worker_file_problems
from .convert import try_structure
from .paths import repository_problems
from .rules import (
    GATEWAY_CROSS,
    GATEWAY_RULES,
    WORKER_CROSS,
    WORKER_RULES,
    at_least,
    duplicates,
    port,
    port_or_off,
    problems,
)
from .rules import name as name_rule
from .schema import LPT_DISCIPLINES, NodeConfig, ServerConfig, WorkerEntry
from .source import (
    EnvOrigin,
    Origin,
    Path,
    Problem,
    RawTree,
    describe,
    fail,
    raise_all,
    read_yaml,
    show,
)


def environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def default_worker_names(count: int) -> tuple[str, ...]:
    """The names of a node's synthesized workers: ``worker0`` .. ``worker{count-1}``."""
    return tuple(f"worker{i}" for i in range(count))


def _synthesized_count(node: NodeConfig) -> int:
    if isinstance(node.gpus, int):
        return max(node.gpus, 1)
    if isinstance(node.gpus, tuple):
        return max(len(node.gpus), 1)
    return 1


def _entries(node: NodeConfig) -> tuple[WorkerEntry, ...]:
    if node.workers:
        return node.workers
    return tuple(WorkerEntry(name=n) for n in default_worker_names(_synthesized_count(node)))


def worker_names(node: NodeConfig) -> tuple[str, ...]:
    """The node's workers, in order: its ``workers:`` list, else one per GPU (see module doc)."""
    return tuple(entry.name for entry in _entries(node))


def _entry_path(node: NodeConfig, index: int) -> Path:
    """Where worker ``index`` is written: its list item, else what made it exist."""
    if node.workers:
        return ("workers", index)
    return ("gpus",) if ("gpus",) in node.source.lines else ()


def _grpc_port(node: NodeConfig, index: int, entry: WorkerEntry) -> tuple[int, Path]:
    if entry.port is not None:
        return entry.port, ("workers", index, "port")
    return node.base_port + index, ("base_port",)


def _metrics_port(node: NodeConfig, index: int, entry: WorkerEntry) -> tuple[int, Path]:
    if entry.metrics_port is not None:
        return entry.metrics_port, ("workers", index, "metrics_port")
    if node.metrics_base_port > 0:
        return node.metrics_base_port + index, ("metrics_base_port",)
    return 0, ("metrics_base_port",)


# --- node rules -------------------------------------------------------------------------------

NODE_RULES = (
    (("base_port",), port),
    (("metrics_base_port",), port_or_off),
    (("workers", "*", "name"), name_rule),
    (("workers", "*", "port"), port),
    (("workers", "*", "metrics_port"), port_or_off),
    (("workers", "*", "gpu"), at_least(0)),
)


def _ports(node: NodeConfig) -> Iterator[tuple[Path, str]]:
    taken: dict[int, str] = {}
    for index, entry in enumerate(_entries(node)):
        for kind, (number, path) in (
            ("gRPC", _grpc_port(node, index, entry)),
            ("metrics", _metrics_port(node, index, entry)),
        ):
            if number == 0 and kind == "metrics":
                continue
            base = path[0]
            derived = base in ("base_port", "metrics_base_port")
            if derived and number > 65535:
                yield (
                    path,
                    (
                        f"expected {base} + {index} ({entry.name}'s {kind} port) <= 65535; "
                        f"got {number}"
                    ),
                )
                continue
            if derived and ("workers", index) in node.source.lines:
                path = ("workers", index)
            if number in taken:
                yield (
                    path,
                    (
                        f"expected a port of its own; {number} would be {entry.name}'s {kind} port "
                        f"and is already {taken[number]}"
                    ),
                )
            taken.setdefault(number, f"{entry.name}'s {kind} port")


def _devices(node: NodeConfig) -> Iterator[tuple[Path, str]]:
    gpus = node.gpus
    if isinstance(gpus, int) and gpus < 0:
        yield ("gpus",), f"expected auto, a GPU count >= 0 (0 = CPU), or a list; got {gpus}"
        return
    if isinstance(gpus, tuple):
        if not gpus:
            yield ("gpus",), "expected at least one device (or gpus: 0 for a CPU node); got []"
        for index, device in enumerate(gpus):
            if isinstance(device, int) and device < 0:
                yield ("gpus", index), f"expected a device ordinal >= 0; got {device}"
            if isinstance(device, str) and not device.strip():
                yield ("gpus", index), "expected a device ordinal or UUID; got ''"
        yield from duplicates(gpus, ("gpus",), "devices")
    if not node.workers or gpus == "auto":
        count = None
    else:
        count = gpus if isinstance(gpus, int) else len(gpus)
    if count is not None:
        if count == 0:
            for index, entry in enumerate(node.workers):
                if entry.gpu is not None:
                    yield (
                        ("workers", index, "gpu"),
                        (f"expected no gpu: on a CPU node (gpus: 0); got {entry.gpu}"),
                    )
        elif len(node.workers) > count:
            yield (
                ("workers",),
                (
                    f"expected at most {count} workers, one per device of gpus:; "
                    f"got {len(node.workers)}"
                ),
            )
        for index, entry in enumerate(node.workers):
            if count and entry.gpu is not None and entry.gpu >= count:
                yield (
                    ("workers", index, "gpu"),
                    (f"expected a device index below {count} (gpus: has {count}); got {entry.gpu}"),
                )
    if count != 0:
        # A worker without gpu: takes the device of its position; two on one device fight
        # over its memory.
        owner: dict[int, str] = {}
        for index, entry in enumerate(node.workers):
            device = entry.gpu if entry.gpu is not None else index
            if device in owner:
                at: Path = (
                    ("workers", index, "gpu") if entry.gpu is not None else ("workers", index)
                )
                yield at, f"expected a device of its own; device {device} is also {owner[device]}'s"
            owner.setdefault(device, entry.name)


_SYNTH_NAME = re.compile(r"^worker(0|[1-9][0-9]*)$")


def _pins(node: NodeConfig) -> Iterator[tuple[Path, str]]:
    names = worker_names(node)
    known = bool(node.workers) or node.gpus != "auto"
    for model, targets in node.models.items():
        at: Path = ("models", model)
        if not targets:
            yield at, "expected at least one worker name; got []"
        yield from duplicates(targets, at, "worker names")
        for index, target in enumerate(targets):
            if known and target not in names:
                yield (*at, index), f"expected one of {', '.join(names)}; got {show(target)}"
            elif not known and not _SYNTH_NAME.match(target):
                yield (
                    (*at, index),
                    (
                        "expected a worker of this node, which runs worker0..N-1, one per GPU "
                        f"(gpus: auto); got {show(target)}"
                    ),
                )


def _node_problems(node: NodeConfig, *, devices: bool = True) -> list[Problem]:
    found = problems(node, NODE_RULES, (), node.source.origin)
    names = [entry.name for entry in node.workers]
    for path, message in duplicates(names, ("workers",), "worker names"):
        found.append(Problem(node.source.origin((*path, "name")), message))
    for rule in (_ports, _devices, _pins) if devices else (_ports, _pins):
        found.extend(Problem(node.source.origin(path), message) for path, message in rule(node))
    return found


# --- one worker ---------------------------------------------------------------------------------


def build_worker(
    node: NodeConfig, index: int, env: Mapping[str, str]
) -> tuple[ServerConfig | None, list[Problem], RawTree]:
    """Resolve worker ``index``: its record (or None) and everything wrong with it."""
    src = node.source
    entry = _entries(node)[index]
    here = _entry_path(node, index)
    tree = RawTree(src.origin(here))
    found: list[Problem] = []

    tree.overlay(node.global_, lambda p: src.origin(("global", *p)))
    if node.workers:
        tree.overlay(entry.settings, lambda p: src.origin(("workers", index, *p)))

    for model, targets in node.models.items():
        if entry.name not in targets:
            continue
        own = _get(entry.settings, ("scheduler", "models", model, "residency"))
        if own is not None and own != "device":
            found.append(
                Problem(
                    src.origin(("workers", index, "scheduler", "models", model, "residency")),
                    f"expected device or nothing, since models: pins {model} to the device on "
                    f"{entry.name}; got {show(own)}",
                )
            )
        tree.set(
            ("scheduler", "models", model, "residency"), "device", src.origin(("models", model))
        )

    tree.set(("name",), entry.name, src.origin((*here, "name") if node.workers else here))
    tree.set(("model_dirs",), [node.model_repo], src.origin(("model_repo",)))
    port, port_at = _grpc_port(node, index, entry)
    tree.set(("endpoints", "port"), port, src.origin(port_at))
    metrics, metrics_at = _metrics_port(node, index, entry)
    if metrics:
        tree.set(("endpoints", "metrics_port"), metrics, src.origin(metrics_at))
    if entry.gpu is not None:
        tree.set(("gpu",), entry.gpu, src.origin((*here, "gpu")))

    envmod.apply(tree, env, envmod.WORKER_PREFIX, envmod.WORKER_ENV, frozenset(), found)

    cfg, structural = try_structure(ServerConfig, tree.data, tree.locate)
    found.extend(structural)
    if cfg is not None:
        cfg = _anchor_paths(cfg, src.file)
        found.extend(problems(cfg, WORKER_RULES, WORKER_CROSS, tree.locate))
    return cfg, found, tree


def build_workers(
    node: NodeConfig, env: Mapping[str, str], found: list[Problem]
) -> list[tuple[ServerConfig, RawTree]]:
    """Every worker of ``node`` that could be built (:func:`build_worker`), with its tree;
    everything wrong with them goes to ``found``."""
    workers = []
    for index in range(len(_entries(node))):
        cfg, wrong, tree = build_worker(node, index, env)
        found.extend(wrong)
        if cfg is not None:
            workers.append((cfg, tree))
    return workers


def _anchor_paths(cfg: ServerConfig, file: str) -> ServerConfig:
    """Relative ``model_repo`` / ``cache_dir`` in a node file mean "next to the file", so
    ``reactantserver serve examples/node.yaml`` works from any working directory; so do
    the certificate and key files."""
    if file.startswith("<"):
        return cfg
    base = os.path.dirname(os.path.abspath(file))

    def here(p: str) -> str:
        return anchor(p, base)

    ep = cfg.endpoints
    endpoints = attrs.evolve(
        ep,
        tls=anchor_tls(ep.tls, base),
        restricted=tuple(attrs.evolve(r, key_file=here(r.key_file)) for r in ep.restricted),
        gateway=attrs.evolve(ep.gateway, key_file=here(ep.gateway.key_file)),
    )
    return attrs.evolve(
        cfg,
        model_dirs=tuple(here(d) for d in cfg.model_dirs),
        cache_dir=here(cfg.cache_dir),
        endpoints=endpoints,
    )


def anchor_tls(tls: Any, base: str) -> Any:
    """A ``tls:`` block (listener or client) with its relative files anchored at ``base``."""
    files = {f.name: anchor(getattr(tls, f.name), base)
             for f in attrs.fields(type(tls)) if f.name.endswith("_file")}  # fmt: skip
    return attrs.evolve(tls, **files)


def anchor_gateway(cfg: Any, file: str) -> Any:
    """A ``GatewayConfig`` with its certificate and key files anchored next to ``file``."""
    if file.startswith("<"):
        return cfg
    base = os.path.dirname(os.path.abspath(file))
    wc = cfg.worker_client
    return attrs.evolve(
        cfg,
        tls=anchor_tls(cfg.tls, base),
        restricted=tuple(
            attrs.evolve(r, key_file=anchor(r.key_file, base)) for r in cfg.restricted
        ),
        worker_client=attrs.evolve(
            wc, tls=anchor_tls(wc.tls, base), key_file=anchor(wc.key_file, base)
        ),
    )


def _get(block: Mapping[str, Any], path: Path) -> Any:
    node: Any = block
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def lpt_problems(
    mode: str, mode_origin: Origin, workers: list[tuple[ServerConfig, RawTree]]
) -> list[Problem]:
    """Under ``lpt_packing`` the gateway places and balances models, so a worker must not
    reorder by share: every worker runs ``fifo`` or ``edf``."""
    if mode != "lpt_packing":
        return []
    for cfg, tree in workers:
        discipline = cfg.scheduler.discipline
        if discipline not in LPT_DISCIPLINES:
            where = tree.locate(("scheduler", "discipline"))
            said = (
                f"set by {describe(where)}"
                if tree.has(("scheduler", "discipline"))
                else "by default"
            )
            return [
                Problem(
                    mode_origin,
                    f"expected workers on fifo or edf under lpt_packing; {cfg.name} runs "
                    f"{discipline} ({said})",
                )
            ]
    return []


def check_node(
    node: NodeConfig,
    env: Mapping[str, str],
    found: Sequence[Problem] = (),
    *,
    check_paths: bool = True,
) -> None:
    """Every check of the module doc, steps 1-5; raises every problem at once.

    ``found`` are problems already found while structuring the node (they cover the keys
    that had to be repaired, so nothing here echoes them).
    """
    gathered = [*found, *_node_problems(node)]
    # Workers as the file configures them: every one that could be built (repaired or
    # not: the repository check needs only model_dirs), and those built cleanly, the only
    # ones a cross-worker rule can judge without echoing a problem already reported.
    effective: list[tuple[ServerConfig, RawTree]] = []
    built: list[tuple[ServerConfig, RawTree]] = []
    for index in range(len(_entries(node))):
        cfg, wrong, tree = build_worker(node, index, {})
        gathered.extend(wrong)
        if cfg is not None:
            effective.append((cfg, tree))
            if not wrong:
                built.append((cfg, tree))
    if node.gateway is not None:

        def locate(path: Path) -> Origin:
            return node.source.origin(("gateway", *path))

        gathered.extend(problems(node.gateway, GATEWAY_RULES, GATEWAY_CROSS, locate))
        if len(built) == len(_entries(node)):
            mode_at = locate(("scheduling", "mode"))
            gathered.extend(lpt_problems(node.gateway.scheduling.mode, mode_at, built))
    if any(var.startswith(envmod.WORKER_PREFIX) for var in env):
        # The overrides are checked against every worker; the repository check then
        # looks at the directories the workers will really use.
        effective = build_workers(node, env, gathered)
    if check_paths:
        for cfg, tree in effective:
            gathered.extend(repository_problems(cfg, tree.get, tree.locate))
        # Files named in global: are the same for every worker: say so once.
        seen: set[tuple[str, str]] = set()
        for cfg, tree in effective:
            for problem in worker_file_problems(cfg, tree.locate, env):
                key = (problem.render(), "")
                if key not in seen:
                    seen.add(key)
                    gathered.append(problem)
        if node.gateway is not None:
            gateway = anchor_gateway(node.gateway, node.source.file)
            gathered.extend(gateway_file_problems(gateway, locate, env))
    raise_all(gathered)


def load_node(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    *,
    check_paths: bool = True,
) -> NodeConfig:
    """Read and check a node file (see the module doc); every problem is reported at once.

    ``env`` (default ``os.environ``) is checked for bad ``INFERENCE_SERVER_*`` overrides
    but not applied: ``resolve_worker`` applies it. ``check_paths=False`` skips the one
    check that reads the disk (``model_repo`` is a readable directory), for a node file
    checked away from the machine it configures.
    """
    data, source = read_yaml(path)
    node, found = try_structure(NodeConfig, data, source.origin)
    if node is None:
        raise_all(found)
    assert node is not None
    node = attrs.evolve(node, source=source)
    check_node(node, environ(env), found, check_paths=check_paths)
    return node


def resolve_worker(
    node: NodeConfig, name: str | None = None, env: Mapping[str, str] | None = None
) -> ServerConfig:
    """One worker of ``node`` as a ``ServerConfig``, environment overrides applied.

    ``name=None`` takes ``REACTANT_WORKER_NAME`` from the environment when set, else the
    node's only worker; with several workers and no name it is an error naming them.
    """
    environment = environ(env)
    names = worker_names(node)
    where = node.source.origin(("workers",) if node.workers else _entry_path(node, 0))
    chosen: Origin = where
    if name is None and environment.get(envmod.WORKER_NAME_VAR):
        name = environment[envmod.WORKER_NAME_VAR]
        chosen = EnvOrigin(envmod.WORKER_NAME_VAR)
    if name is None:
        if len(names) != 1:
            fail(
                where,
                f"expected a worker name to run, one of {', '.join(names)}; got none "
                f"(reactantserver serve --worker NAME, or {envmod.WORKER_NAME_VAR}=NAME)",
            )
        name = names[0]
    if name not in names:
        fail(chosen, f"expected one of {', '.join(names)}; got {show(name)}")
    cfg, found, _ = build_worker(node, names.index(name), environment)
    raise_all(found)
    assert cfg is not None
    return cfg


def materialize_workers(node: NodeConfig, count: int) -> NodeConfig:
    """The node as the supervisor runs it on ``count`` detected devices (workers, for a CPU
    node): with no ``workers:`` list, one worker per device, ``worker0..count-1``; with an
    explicit list, the node itself. The pin map is re-checked against the new names."""
    if node.workers:
        return node
    if count < 1:
        raise ValueError(f"a node runs at least one worker; got count={count}")
    grown = attrs.evolve(
        node, workers=tuple(WorkerEntry(name=n) for n in default_worker_names(count))
    )
    raise_all(_node_problems(grown, devices=False))
    return grown


def load_server_config(
    path: str | os.PathLike[str],
    worker: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    check_paths: bool = True,
) -> ServerConfig:
    """``resolve_worker(load_node(path, env), worker, env)``."""
    return resolve_worker(load_node(path, env, check_paths=check_paths), worker, env)

"""The ``reactantserver`` command.

Each subcommand is two functions: ``_add_<name>(subparsers)`` declares its arguments and
``_run_<name>(args) -> int`` does the work; ``main`` only parses and dispatches, and turns a
``ConfigError`` into its lines (one per problem) on stderr and exit status 2 (the status
argparse uses for a bad command line: both mean "what you asked for is wrong, nothing ran").
Subcommands import what they need inside ``_run_<name>``, so ``reactantserver config``
never imports JAX.

    reactantserver --version
        Print the installed version (what ServerMetadata answers) and exit.

    reactantserver config FILE [--worker NAME | --gateway]
        Check a node file (or a gateway.yml) and print the effective configuration, the
        environment overrides applied: every worker of a node file (or the one --worker
        names), or with --gateway the node's embedded gateway. A gateway.yml is recognised
        by its keys and printed as the gateway it configures.

    reactantserver serve FILE [--worker NAME] [--log-level LEVEL] [--announce]
                         [--grpc-restricted-protocol GROUPS:HEADER=file:PATH|env:VAR]
        Run one worker of a node file: load and compile its model repository, serve the
        KServe V2 gRPC API (and /healthz, /readyz, /metrics when a metrics port is set)
        until SIGINT or SIGTERM, then refuse new calls, answer the calls in flight and
        exit 0 (docs/serving.md). A failure to start is one line per cause on stderr and
        exit status 1; 2 for a configuration problem found late, 78 (EX_CONFIG) for an
        address it cannot listen on (a port in use): neither is cured by a restart;
        ``--log-level debug`` adds the traceback. ``--announce`` reports startup progress
        and ends it with where to reach the worker and three commands to try.

    reactantserver gateway [FILE] [--log-level LEVEL] [--grpc-restricted-protocol ...]
        Run a gateway (docs/gateway.md): one KServe V2 endpoint in front of the workers a
        gateway.yml lists (or REACTANT_GATEWAY_* alone), routing each request to a worker
        serving its model; SIGINT/SIGTERM drain it and exit 0. Exits 1 when no worker has
        answered for wedge_exit_rounds x health_interval_seconds seconds; 78 (EX_CONFIG)
        when it cannot listen on its addresses.

    reactantserver node FILE [--runtime-dir DIR] [--log-level LEVEL]
        Run a whole machine from a node file: detect its GPUs, start one worker per GPU
        (each seeing only its own device) and, for two or more, the gateway in front;
        restart crashed children; on SIGINT/SIGTERM stop them in order and exit 0. A child
        that exits 2 or 78 (a configuration or environment error a restart cannot fix)
        stops the node at once, its error repeated, with its exit status (docs/node.md).

    reactantserver export MODULE:CALLABLE --out DIR [--batch-sizes 1,4,8] [--platforms cpu,cuda]
                          [--force]
        Call CALLABLE (from a dotted module or a path/to/file.py) for an
        ``reactantserver.export.ExportSpec``, export it as the bundle DIR, check the
        artifact against the function, and print a summary (docs/export.md).

    reactantserver report ADDRESS [--interval SECONDS] [--json]
        Scrape a worker's or a gateway's /metrics twice and print, per model, requests/s,
        rows per execution, device seconds per request, joules per inference and cost per
        million requests, and the idle share (docs/monitoring.md).

    reactantserver calibrate BUNDLE_DIR [--out FILE] [--backend cpu|cuda] [--through-gateway]
        Start a worker on a model repository (or one bundle), measure each model at each
        compiled size, its weight loads and what the worker spends on the host's cores, at
        idle, and write a costs file for ``plan`` (docs/planning.md).

    reactantserver plan --traffic FILE|ADDRESS --costs FILE|ADDRESS --device FILE --p99-ms MS
                        [--error-budget FRACTION] [--json]
        The smallest fleet (devices, placement) that serves the traffic at the p99, found
        by simulating fleet sizes, and the next-smaller one with why it fails
        (docs/planning.md). Exit 0 when a fleet meets the goal, 1 when none does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import NodeConfig, ServerConfig

#: Status for a configuration or command-line error (argparse's own is 2 as well).
EXIT_USAGE = 2
#: Status when stdout's reader went away: 128 + SIGPIPE (13), what a shell shows for
#: ``yes`` in ``yes | head``.
EXIT_BROKEN_PIPE = 141


def _add_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "config",
        help="check a node.yaml or gateway.yml and print the effective configuration",
        description=(
            "Check a node file (or a gateway.yml) and print the effective configuration as "
            "YAML, with INFERENCE_SERVER_* / REACTANT_GATEWAY_* environment overrides applied. "
            "A bad configuration prints one 'file:line: key: expected ...' line per problem on "
            "stderr and exits with status 2."
        ),
    )
    parser.add_argument("file", help="node.yaml (or gateway.yml)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--worker", metavar="NAME", help="print only this worker")
    which.add_argument(
        "--gateway",
        action="store_true",
        help="print the gateway embedded in front of the node's workers",
    )
    parser.set_defaults(run=_run_config)


def _run_config(args: argparse.Namespace) -> int:
    from .config import (
        dump_config,
        load_gateway,
        load_node,
        resolve_worker,
        worker_names,
    )
    from .config.gateway import is_gateway_document
    from .config.source import read_yaml

    file: str = args.file
    data, _ = read_yaml(file)
    documents: list[tuple[str, str]] = []
    if is_gateway_document(data):
        if args.worker is not None:
            raise ConfigError(f"{file}: is a gateway.yml, which has no workers (drop --worker)")
        documents.append((f"gateway configured by {file}", dump_config(load_gateway(file))))
    else:
        node = load_node(file)
        _devices_rule(node)
        if args.gateway:
            from .node.plan import node_gateway

            # What ``reactantserver node`` runs: the gateway.yml beside the node file too.
            gateway, beside = node_gateway(node, os.environ)
            title = f"gateway of {file}" + (f", settings from {beside}" if beside else "")
            documents.append((title, dump_config(gateway)))
        else:
            names = [args.worker] if args.worker is not None else list(worker_names(node))
            for name in names:
                cfg = resolve_worker(node, name)
                documents.append((f"worker {cfg.name} of {file}", dump_config(cfg)))
    plain = not (is_gateway_document(data) or args.worker is not None or args.gateway)
    head = _node_plan_comment(file) if plain else ""
    sys.stdout.write(head + "---\n".join(f"# {title}\n{text}" for title, text in documents))
    return 0


def _devices_rule(node: NodeConfig) -> None:
    """``gpus:`` against the workers' backends: the rule ``node``, ``serve`` and ``config``
    share (``node.assign.check_devices_for_backends``), so a contradiction is the same line
    and exit status 2 from each."""
    from .config import resolve_worker, worker_names
    from .node.assign import check_devices_for_backends

    configs = [resolve_worker(node, name) for name in worker_names(node)]
    check_devices_for_backends(node, configs, os.environ)


def _node_plan_comment(file: str) -> str:
    """What ``reactantserver node FILE`` would start on this machine, as YAML comments:
    each worker's device and ports (a plan that cannot be made here says why)."""
    import os

    from .node.report import describe_plan
    from .node.run import RUNTIME_DIR_VAR, make_plan

    env = dict(os.environ)
    directory = env.get(RUNTIME_DIR_VAR) or "<runtime dir>"
    try:
        lines = describe_plan(make_plan(file, env, runtime_dir=directory))
    except ConfigError as exc:
        lines = [f"node plan: none on this machine: {exc}"]
    return "".join(f"# {line}\n" for line in lines) + "---\n"


def _int_list(text: str) -> tuple[int, ...]:
    """``"1,4,8"`` -> ``(1, 4, 8)``; ``""`` -> ``()`` (unbatched)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,4,8, got {text!r}"
        ) from None


def _add_export(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a JAX function and its parameters as a bundle",
        description=(
            "Export the ExportSpec returned by MODULE:CALLABLE as the bundle directory --out "
            "(its name is the model name). The artifact is deserialized and checked against "
            "the original function on random inputs before anything is written; a mismatch "
            "exits with status 1."
        ),
    )
    parser.add_argument(
        "spec",
        metavar="MODULE:CALLABLE",
        help="a dotted module or a path/to/file.py, and a function returning an ExportSpec",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="bundle directory to write")
    parser.add_argument(
        "--batch-sizes",
        type=_int_list,
        default=None,
        metavar="N,N,...",
        help="compiled batch sizes, replacing the spec's ('' exports an unbatched model)",
    )
    parser.add_argument(
        "--platforms",
        default=None,
        metavar="P,P",
        help="lowering platforms, replacing the spec's (default cpu,cuda)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing DIR")
    parser.set_defaults(run=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from .export import run_cli  # imports JAX: only this subcommand pays for it

    platforms = [p for p in args.platforms.split(",") if p] if args.platforms else None
    return run_cli(
        args.spec, args.out, batch_sizes=args.batch_sizes, platforms=platforms, force=args.force
    )


def _add_report(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="per model: requests/s, device time, joules per inference, cost per million",
        description=(
            "Scrape ADDRESS/metrics (a worker's admin port or a gateway's) twice, --interval "
            "seconds apart, and print per model: requests/s, rows per execution, device "
            "seconds per request, joules per inference and cost per million requests, and "
            "the idle share (docs/monitoring.md). Energy the device does not measure is "
            "reported as not measured, never estimated."
        ),
    )
    parser.add_argument("address", metavar="ADDRESS", help="host:port of an admin port")
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the window between the two scrapes (default: 10)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for tools")
    parser.set_defaults(run=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from .energy.report import main as report_main  # no JAX, no trio

    if not args.interval > 0:
        print("--interval must be a number of seconds > 0", file=sys.stderr)
        return EXIT_USAGE
    return report_main(args.address, args.interval, args.json)


def _add_calibrate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure models and the host at idle and write a costs file for plan",
        description=(
            "Start one worker on BUNDLE_DIR (a model repository, or one bundle), measure each "
            "model at each compiled batch size, its weight loads, the worker's host CPU per "
            "request and per execution and the machine's idle cores, and write the costs "
            "file `reactantserver plan --costs` reads (docs/planning.md)."
        ),
    )
    parser.add_argument("bundle_dir", metavar="BUNDLE_DIR", help="a model repository or bundle")
    parser.add_argument("--out", default="costs.yaml", help="costs file to write; - for stdout")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--through-gateway",
        action="store_true",
        help="also start a gateway in front of the worker and measure its CPU per request",
    )
    parser.add_argument(
        "--requests", type=int, default=600, help="requests per host measurement (default 600)"
    )
    parser.add_argument(
        "--cache-dir", help="compilation cache directory (default: a temporary one)"
    )
    parser.set_defaults(run=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    from .planning.command import run_calibrate  # starts a worker process: no JAX here

    return run_calibrate(args)


def _add_plan(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="how many devices for this traffic at this p99, and which models go where",
        description=(
            "Simulate fleets of growing size for the traffic with the measured costs and "
            "print the smallest that meets the p99 and error budget -- its placement, p50, "
            "p99, requests/s, loads, busy share, joules and cost per million requests per "
            "model -- and the next-smaller one with why it fails (docs/planning.md)."
        ),
    )
    parser.add_argument("--traffic", required=True, metavar="FILE|ADDRESS",
                        help="a traffic file, or a live gateway's (or worker's) admin address")  # fmt: skip
    parser.add_argument("--costs", required=True, metavar="FILE|ADDRESS",
                        help="a costs file (reactantserver calibrate), or an admin address")  # fmt: skip
    parser.add_argument("--device", required=True, metavar="FILE", help="the device file")
    parser.add_argument("--p99-ms", type=float, required=True, help="the p99 goal, milliseconds")
    parser.add_argument("--error-budget", type=float, default=0.0, metavar="FRACTION",
                        help="share of requests that may be refused or late (default 0)")  # fmt: skip
    parser.add_argument("--mode", default="lpt_packing",
                        choices=["lpt_packing", "round_robin", "least_outstanding"])  # fmt: skip
    parser.add_argument("--seconds", type=float, default=None,
                        help="simulated window per fleet (default: 20,000 requests, 4-120 s)")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=None,
                        help="simulated warm-up (default 5 s, less for fast traffic)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=10.0,
                        help="seconds between the two scrapes of a --traffic ADDRESS")  # fmt: skip
    parser.add_argument("--save-traffic", metavar="FILE", help="write the recorded traffic")
    parser.add_argument("--save-costs", metavar="FILE", help="write the costs read from ADDRESS")
    parser.add_argument("--top", type=int, default=12, help="models shown per table (default 12)")
    parser.add_argument("--json", action="store_true", help="print JSON for tools")
    parser.set_defaults(run=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from .planning.command import run_plan  # no JAX, no trio

    return run_plan(args)


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run a worker: serve a node file's model repository over gRPC",
        description=(
            "Run one worker of a node file until SIGINT/SIGTERM. The effective configuration "
            "is logged at start; INFERENCE_SERVER_* environment overrides apply."
        ),
    )
    parser.add_argument("file", help="node.yaml")
    parser.add_argument("--worker", metavar="NAME", help="which worker of the node file to run")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: info); debug also shows the traceback of a failure",
    )
    _add_restricted_flag(parser, "endpoints.restricted")
    parser.add_argument(
        "--announce",
        action="store_true",
        help=(
            "for a person at a terminal: log startup progress, then print where the worker "
            "listens and three commands to try (what `nox -s serve` does)"
        ),
    )
    parser.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import logging

    from . import startup
    from .config import load_node, resolve_worker

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    node = load_node(args.file)
    config = resolve_worker(node, args.worker)
    _devices_rule(node)
    if args.restricted:
        import attrs

        restricted = _restricted(config.endpoints.restricted, args.restricted)
        config = attrs.evolve(
            config, endpoints=attrs.evolve(config.endpoints, restricted=restricted)
        )
    taken = startup.listen_problems(config)
    if taken:
        for line in taken:
            print(f"reactantserver serve: {line}", file=sys.stderr)
        return startup.EXIT_CONFIG
    from reactantserver.transport import guest

    try:
        # Trio as the guest of a standard asyncio loop, which hosts the gRPC server.
        guest.run(_serve, config, args.announce)
    except KeyboardInterrupt:
        # Ctrl-C before the worker's own signal handling was in place (the runtime was
        # still starting): nothing was serving yet, so there is nothing to drain.
        print("reactantserver serve: interrupted while starting", file=sys.stderr)
        return 130
    except Exception as exc:
        # One line per cause instead of Trio's nested groups; the whole story at debug.
        logging.getLogger("reactantserver.serve").debug("worker failure", exc_info=exc)
        recheck = partial(startup.listen_problems, config)
        for line in startup.failure_lines(exc, recheck):
            print(f"reactantserver serve: worker {config.name}: {line}", file=sys.stderr)
        if args.log_level != "debug":
            print("reactantserver serve: --log-level debug shows the traceback", file=sys.stderr)
        return startup.exit_status(exc)
    return 0


def _add_restricted_flag(parser: argparse.ArgumentParser, key: str) -> None:
    parser.add_argument(
        "--grpc-restricted-protocol",
        dest="restricted",
        action="append",
        default=[],
        metavar="GROUPS:HEADER=file:PATH|env:VAR",
        help=(
            "restrict API groups (comma-separated: inference, health, metadata, "
            "model-repository, model-config, shared-memory, statistics, trace, logging, "
            f"control, placement) to callers sending HEADER with the key; added to {key} "
            "(docs/security.md); repeatable"
        ),
    )


def _restricted(restricted: Any, flags: list[str]) -> Any:
    """The configuration's restrictions and the flags', or a ConfigError saying why not."""
    from .config.certs import SecretError, with_restrictions

    try:
        return with_restrictions(restricted, flags, os.environ)
    except SecretError as exc:
        raise ConfigError(str(exc)) from None


def _add_gateway(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="run a gateway: one gRPC endpoint in front of several workers",
        description=(
            "Serve the KServe V2 gRPC API in front of the workers of a gateway.yml until "
            "SIGINT/SIGTERM. REACTANT_GATEWAY_* environment overrides apply (without FILE, "
            "REACTANT_GATEWAY_FILE or the variables alone configure it); the effective "
            "configuration is logged at start."
        ),
    )
    parser.add_argument("file", nargs="?", help="gateway.yml")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: gateway.yml's logging.level)",
    )
    _add_restricted_flag(parser, "restricted")
    parser.set_defaults(run=_run_gateway)


def _run_gateway(args: argparse.Namespace) -> int:
    import logging

    from . import startup
    from .config import load_gateway
    from .gateway.app import configure_logging, listen_problems, run

    config = load_gateway(args.file)
    if args.restricted:
        import attrs

        config = attrs.evolve(config, restricted=_restricted(config.restricted, args.restricted))
    configure_logging(config.logging, args.log_level)
    taken = listen_problems(config)
    if taken:
        for line in taken:
            print(f"reactantserver gateway: {line}", file=sys.stderr)
        return startup.EXIT_CONFIG
    try:
        return run(config)
    except KeyboardInterrupt:
        print("reactantserver gateway: interrupted while starting", file=sys.stderr)
        return 130
    except Exception as exc:
        # One line per cause instead of Trio's nested groups; the whole story at debug.
        logging.getLogger("reactantserver.gateway").debug("gateway failure", exc_info=exc)
        for line in startup.failure_lines(exc, partial(listen_problems, config)):
            print(f"reactantserver gateway: {line}", file=sys.stderr)
        return startup.exit_status(exc)


def _add_node(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "node",
        help="run a machine: one worker per GPU, the gateway in front, restarts",
        description=(
            "Supervise a node file's workers (one per detected GPU, each with its own "
            "CUDA_VISIBLE_DEVICES) and, for two or more, the embedded gateway, until "
            "SIGINT/SIGTERM. REACTANT_ROLE, REACTANT_GPUS, REACTANT_CPU_WORKERS, "
            "REACTANT_WORKER_THREADS and REACTANT_SUPERVISOR_MAX_RESTARTS apply "
            "(docs/node.md)."
        ),
    )
    parser.add_argument("file", help="node.yaml")
    parser.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="where to write the files the children read (default: $REACTANT_RUNTIME_DIR, "
        "else a temporary directory)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity of the supervisor and its workers (default: info)",
    )
    parser.set_defaults(run=_run_node)


def _run_node(args: argparse.Namespace) -> int:
    import logging

    from .node import run_node

    logging.basicConfig(
        level=args.log_level.upper(),
        format="[node] %(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    return run_node(args.file, runtime_dir=args.runtime_dir, log_level=args.log_level)


async def _serve(config: ServerConfig, announce: bool) -> None:
    """``worker.serve`` until SIGINT/SIGTERM, with ``announce`` beside it when asked for."""
    import logging

    import trio

    from .worker import WorkerAddress, serve

    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[WorkerAddress]) -> None:
            await serve(config, task_status=task_status)
            nursery.cancel_scope.cancel()  # stopped: nothing left to announce

        address = await nursery.start(run)
        if announce:
            from .announce import announce as tell

            async def presenter() -> None:
                from .transport.security import own_client

                try:
                    tls, keys = own_client(config.endpoints, os.environ)
                    await tell(
                        address.host,
                        address.grpc_port,
                        address.metrics_port,
                        tls=tls,
                        metadata=keys,
                    )
                except Exception as exc:  # a courtesy: it never takes the worker down
                    logging.getLogger("reactantserver.serve").warning(
                        "could not announce the worker (%s); it keeps serving", exc
                    )

            nursery.start_soon(presenter)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="reactantserver",
        description="Serve many compiled JAX models from one GPU over KServe V2 gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"reactantserver {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_config(subparsers)
    _add_serve(subparsers)
    _add_gateway(subparsers)
    _add_node(subparsers)
    _add_export(subparsers)
    _add_report(subparsers)
    _add_calibrate(subparsers)
    _add_plan(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors (and --help) by exiting
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # here, so that a reader gone early is seen below
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # ``reactantserver report ADDRESS | head``: the reader left. End quietly, with
        # the status a shell shows for a tool killed by SIGPIPE; what is still buffered
        # goes to /dev/null, not into a second error at the interpreter's exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

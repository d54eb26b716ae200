"""The ``plan`` and ``calibrate`` subcommands' work (``cli.py`` only declares their flags).

``--traffic`` and ``--costs`` each take a file or the ADDRESS (``host:port`` or a URL) of a
worker's or a gateway's admin port: a file is read and validated (``FILE:LINE: ...``
errors, exit status 2); an address is scraped -- traffic as the window between two scrapes
``--window`` seconds apart, costs from one -- and ``--save-traffic`` / ``--save-costs``
write what was read as a file to plan from again. ``plan`` exits 0 when a fleet meets the
goal, 1 when none up to ``max_devices`` does, 2 for bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import ConfigError
from .costs import Costs, read_costs, render_costs
from .device import read_device
from .fleet import Goal, Run
from .plan import make_plan, plan_json, render_plan
from .traffic import Traffic, read_traffic, render_traffic, traffic_from_metrics

_T = TypeVar("_T")

__all__ = ["default_seconds", "run_calibrate", "run_plan"]

_ADDRESS = re.compile(r"^(https?://)?[A-Za-z0-9_.\-\[\]:]+:\d+/?$")


def _is_address(text: str) -> bool:
    return not Path(text).exists() and bool(_ADDRESS.match(text))


def _fetch(address: str) -> str:
    from ..energy.report import fetch

    return fetch(address)


def _scraped(flag: str, address: str, read: Callable[[], _T]) -> _T:
    """What ``read`` makes of ``address``'s /metrics; a failure is a ConfigError that
    names ``--flag``."""
    try:
        return read()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--{flag} {address}: cannot read its /metrics: {exc}") from None


def _traffic(args: argparse.Namespace) -> Traffic:
    if not _is_address(args.traffic):
        return read_traffic(args.traffic)

    def record() -> Traffic:
        t0 = time.monotonic()
        before = _fetch(args.traffic)
        time.sleep(args.window)
        after = _fetch(args.traffic)
        return traffic_from_metrics(
            before, after, time.monotonic() - t0, source=f"{args.traffic}/metrics"
        )

    traffic = _scraped("traffic", args.traffic, record)
    if args.save_traffic:
        Path(args.save_traffic).write_text(
            render_traffic(traffic, f"recorded from {args.traffic}/metrics over {args.window:g} s")
        )
    return traffic


def _costs(args: argparse.Namespace) -> Costs:
    if not _is_address(args.costs):
        return read_costs(args.costs)
    from .metrics_input import costs_from_metrics

    costs = _scraped(
        "costs",
        args.costs,
        lambda: costs_from_metrics(_fetch(args.costs), source=f"{args.costs}/metrics"),
    )
    if args.save_costs:
        Path(args.save_costs).write_text(
            render_costs(costs, f"read from {args.costs}/metrics (no host figures)")
        )
    return costs


def default_seconds(traffic: Traffic) -> float:
    """The simulated window when ``--seconds`` is not given: 20,000 requests of an open
    loop (its p99 then rests on the 200 slowest), between 4 and 120 s; 20 s of a closed
    loop."""
    if traffic.closed or traffic.rate <= 0:
        return 20.0
    return max(4.0, min(120.0, 20_000 / traffic.rate))


def default_warmup(traffic: Traffic) -> float:
    """The simulated warm-up when ``--warmup`` is not given: 5 s, or 10,000 requests of a
    faster open loop (at least 2 s: every placed model's weights loaded once)."""
    if traffic.closed or traffic.rate <= 0:
        return 5.0
    return max(2.0, min(5.0, 10_000 / traffic.rate))


def run_plan(args: argparse.Namespace) -> int:
    traffic = _traffic(args)
    costs = _costs(args)
    device = read_device(args.device)
    if not args.p99_ms > 0:
        raise ConfigError(f"--p99-ms: expected milliseconds > 0; got {args.p99_ms:g}")
    if not 0 <= args.error_budget < 1:
        raise ConfigError(
            f"--error-budget: expected a fraction in [0, 1) such as 0.001; got {args.error_budget:g}"
        )
    goal = Goal(p99=args.p99_ms / 1e3, error_budget=args.error_budget)
    run = Run(
        warmup=args.warmup if args.warmup is not None else default_warmup(traffic),
        seconds=args.seconds if args.seconds is not None else default_seconds(traffic),
        seed=args.seed,
        mode=args.mode,
    )
    try:
        plan = make_plan(traffic, costs, device, goal, run)
    except ValueError as exc:
        raise ConfigError(f"plan: {exc}") from None
    if args.json:
        print(plan_json(plan))
    else:
        if costs.backend == "metrics":
            print(
                f"note: costs from {costs.source}: no host figures, so the host's cores are "
                "assumed never to slow a worker (reactantserver calibrate measures them)",
                file=sys.stderr,
            )
        print(render_plan(plan, top=args.top))
    return 0 if plan.answer is not None else 1


def run_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import run

    def echo(line: str) -> None:
        print(f"calibrate: {line}", file=sys.stderr, flush=True)

    try:
        return run(
            args.bundle_dir,
            args.out,
            backend=args.backend,
            through_gateway=args.through_gateway,
            requests=args.requests,
            cache_dir=args.cache_dir or "",
            echo=echo,
        )
    except RuntimeError as exc:
        echo(str(exc))
        return 1

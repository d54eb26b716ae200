"""Compare the gateway's routing modes on a simulated fleet, in virtual time.

    python examples/simulate_fleet.py                      # 4 workers, 24 models, 64 clients
    python examples/simulate_fleet.py --clients 16 128     # several concurrencies
    python examples/simulate_fleet.py --rate 1200          # open loop: Poisson arrivals
    python examples/simulate_fleet.py --budget-ratio 1     # every model fits everywhere

The catalog: ``--models`` models with Zipf popularity (s = ``--zipf``), batch-1 costs of
2-8 ms (x(1 + 0.25 (B - 1)) at compiled batch sizes 1/2/4/8), weights of 100-400 MB. Every
worker's weight budget is the catalog's total bytes divided by ``--budget-ratio`` (3: the
catalog is 3x one worker's budget), and weights stream from host RAM at ``--bandwidth``
bytes/s. Workers run fifo, like the workers behind lpt_packing must.

Each mode runs the same traffic through the real router (and, for lpt_packing, the real
packer, estimator and repack cadence) in front of workers running the real scheduling and
weight-cache policies; only the device and the transfers are a cost model. The table shows
throughput, latency, weight loads and device idle time per mode, then p50/p99 of the most
popular models. See docs/fleet.md.
"""

from __future__ import annotations

import argparse
import time

from reactantserver.config import GatewaySchedulingConfig
from reactantserver.config.schema import GatewayModelConfig
from reactantserver.fleet import (
    ClosedLoop,
    FleetReport,
    FleetWorker,
    offered_fleet_load,
    simulate_fleet,
    zipf_fleet_catalog,
)

MODES = ("round_robin", "least_outstanding", "lpt_packing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--models", type=int, default=24)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of popularity")
    parser.add_argument(
        "--budget-ratio",
        type=float,
        default=3.0,
        help="catalog weight bytes / one worker's weight budget (default 3)",
    )
    parser.add_argument(
        "--bandwidth", type=float, default=12e9, help="host->device bytes/s (default 12e9)"
    )
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[64], help="closed-loop concurrency"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="open loop: total Poisson arrivals/s instead"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--rebalance", type=float, default=20.0, help="rebalance_compute_seconds")
    parser.add_argument(
        "--replicas",
        nargs="*",
        default=[],
        metavar="MODEL=K",
        help="lpt_packing: scheduling.models.<MODEL>.replicas (e.g. m01=2)",
    )
    parser.add_argument("--top", type=int, default=6, help="models shown in the latency table")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    overrides = {}
    for item in args.replicas:
        name, _, count = item.partition("=")
        overrides[name] = GatewayModelConfig(replicas="all" if count == "all" else int(count))

    catalog = zipf_fleet_catalog(
        args.models, total_rate=args.rate or 1.0, zipf_s=args.zipf, seed=args.seed
    )
    total = sum(m.nbytes for m in catalog)
    budget = int(total / args.budget_ratio)
    workers = [
        FleetWorker(name=f"w{i}", budget=budget, bandwidth=args.bandwidth, load_latency=0.001)
        for i in range(args.workers)
    ]
    print(
        f"catalog: {len(catalog)} models, Zipf s={args.zipf:g}, {total / 1e9:.2f} GB of weights "
        f"= {args.budget_ratio:g}x one worker's budget ({budget / 1e9:.2f} GB); "
        f"{args.workers} workers, {args.bandwidth / 1e9:g} GB/s host->device"
    )
    loads = [("open", args.rate)] if args.rate else [("closed", c) for c in args.clients]
    for kind, amount in loads:
        if kind == "open":
            print(
                f"traffic: open loop, {amount:g} req/s "
                f"({offered_fleet_load(catalog) / args.workers:.0%} of the fleet at full batches)"
            )
        else:
            print(f"traffic: closed loop, {amount} clients, no think time")
        reports: list[FleetReport] = []
        for mode in args.modes:
            gateway = GatewaySchedulingConfig(
                mode=mode,  # type: ignore[arg-type]
                rebalance_compute_seconds=args.rebalance,
                first_rebalance_compute_seconds=args.rebalance / 4,
                hysteresis=0.2,
                models=overrides,
            )
            started = time.perf_counter()
            reports.append(
                simulate_fleet(
                    catalog,
                    workers,
                    gateway,
                    duration=args.duration,
                    warmup=args.warmup,
                    seed=args.seed,
                    closed_loop=None if kind == "open" else ClosedLoop(clients=int(amount)),
                )
            )
            print(f"  ({mode} simulated in {time.perf_counter() - started:.1f} s)")
        print()
        print(comparison(reports))
        against = versus(reports)
        if against:
            print(against)
        print()
        print(per_model(reports, args.top))
        for r in reports:
            for warning in r.warnings:
                print(f"warning ({r.mode}): {warning}")
        print()


def comparison(reports: list[FleetReport]) -> str:
    out = [
        f"| {'mode':<17} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'loads/s':>7} | "
        f"{'loads/1k req':>12} | {'idle':>5} | {'waiting on loads':>16} | {'rows/batch':>10} |",
        f"|{'-' * 19}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 14}|{'-' * 7}|{'-' * 18}|"
        f"{'-' * 12}|",
    ]
    for r in reports:
        waiting = sum(w.loading for w in r.workers) / len(r.workers)
        out.append(
            f"| {r.mode:<17} | {r.throughput:>7.0f} | {r.p50 * 1e3:>7.1f} | {r.p99 * 1e3:>7.1f} | "
            f"{r.loads_per_second:>7.1f} | {r.loads_per_1000:>12.1f} | {r.idle:>5.1%} | "
            f"{waiting:>16.1%} | {r.mean_batch_rows:>10.2f} |"
        )
    return "\n".join(out)


def versus(reports: list[FleetReport]) -> str:
    """lpt_packing against round_robin, as ratios (when both ran): what docs/fleet.md's
    prose quotes, printed so that it is checked, not copied."""
    by_mode = {r.mode: r for r in reports}
    lpt, rr = by_mode.get("lpt_packing"), by_mode.get("round_robin")
    if lpt is None or rr is None or not rr.throughput or not rr.p50:
        return ""
    return (
        f"lpt_packing against round_robin: {lpt.throughput / rr.throughput:.1f}x the req/s at "
        f"{lpt.p50 / rr.p50:.2f}x the p50, {lpt.mean_batch_rows:.2f} rows per execution "
        f"against {rr.mean_batch_rows:.2f}"
    )


def per_model(reports: list[FleetReport], top: int) -> str:
    header = (
        "| model | " + " | ".join(f"{r.mode} p50 / p99 ms (rows/batch)" for r in reports) + " |"
    )
    out = [header, "|" + "---|" * (len(reports) + 1)]
    for i, name in enumerate(m.name for m in reports[0].models[:top]):
        cells = []
        for r in reports:
            m = r.models[i]
            cells.append(f"{m.p50 * 1e3:.1f} / {m.p99 * 1e3:.1f} ({m.mean_batch_rows:.2f})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    main()

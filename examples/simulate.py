"""Simulate a many-model workload on the real Scheduler, under virtual time.

    python examples/simulate.py                          # fair, then fifo, saturated
    python examples/simulate.py --load 0.8 --timeout 1 --discipline fair fifo edf
    python examples/simulate.py --models 20 --rows 20

The workload: ``--models`` models ranked by popularity (Zipf), with costs spanning
``--spread`` x (the most popular model is the cheapest), weights drawn from 1, 2, 4,
requests of 1, 2, 4 or 8 rows arriving as Poisson processes.

By default the arrival rate *saturates every model*: each model's demand is
``--saturate`` (1.3) times its weighted share of the device, counted at full batches,
so every queue stays non-empty and a fair scheduler must hand out exactly the
weights. ``--load X`` instead sets the total demand to X times the device's capacity
(at full batches), for a realistic, partly idle mix.

``--workers N`` (N > 1) runs the same workload in fleet mode instead: N simulated workers
(each with the chosen discipline) behind the gateway's router for ``--gateway``
(``round_robin``, ``least_outstanding`` or ``lpt_packing``), with every model's weights
always resident. ``examples/simulate_fleet.py`` compares the modes on a catalog that does
not fit in one worker's memory (docs/fleet.md).

Nothing is mocked but the device: requests go through ``Scheduler.submit`` and the
real dispatch loop, and a cost model stands in for execution. Time is
``trio.testing.MockClock``, so minutes of traffic replay in seconds.
"""

from __future__ import annotations

import argparse
import math
import time

from reactantserver.config import GatewaySchedulingConfig, SchedulerConfig
from reactantserver.fleet import FleetModel, FleetWorker, simulate_fleet
from reactantserver.scheduling.simulate import (
    offered_load,
    poisson_arrivals,
    saturating_rate,
    simulate,
    with_total_rate,
    zipf_models,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--discipline", nargs="+", default=["fair", "fifo"], choices=["fair", "fifo", "edf"]
    )
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument(
        "--cheapest",
        type=float,
        default=0.0002,
        help="batch-1 cost of the cheapest model, seconds (default 0.2 ms)",
    )
    parser.add_argument(
        "--spread", type=float, default=100.0, help="costliest / cheapest model cost (default 100)"
    )
    parser.add_argument(
        "--saturate",
        type=float,
        default=1.3,
        help="each model's demand over its weighted share (default 1.3)",
    )
    parser.add_argument(
        "--load",
        type=float,
        default=None,
        help="total demand over device capacity, instead of --saturate",
    )
    parser.add_argument("--duration", type=float, default=120.0, help="virtual seconds")
    parser.add_argument(
        "--warmup", type=float, default=30.0, help="virtual seconds excluded from the statistics"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="per-request deadline in seconds (edf sheds by it)",
    )
    parser.add_argument("--queue-depth", type=int, default=16, help="scheduler.max_queue_depth")
    parser.add_argument("--rows", type=int, default=None, help="show only the first N models")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=1, help="fleet mode: this many workers behind a gateway"
    )
    parser.add_argument(
        "--gateway",
        default="least_outstanding",
        choices=["round_robin", "least_outstanding", "lpt_packing"],
        help="fleet mode: the gateway's scheduling.mode",
    )
    args = parser.parse_args()

    specs = zipf_models(
        args.models,
        cost_range=(args.cheapest, args.cheapest * args.spread),
        rows=(1, 2, 4, 8),
        timeout=args.timeout,
        seed=args.seed,
    )
    if args.load is None:
        rate = saturating_rate(specs, args.saturate)
        how = f"every model at {args.saturate:g}x its weighted share"
    else:
        rate = math.fsum(s.rate for s in specs) * args.load / offered_load(specs)
        how = f"{args.load:g}x device capacity"
    specs = with_total_rate(specs, rate)
    arrivals = len(poisson_arrivals(specs, args.duration, seed=args.seed))
    costs = sorted(s.base_cost for s in specs)
    print(
        f"workload: {len(specs)} models, batch-1 cost {costs[0] * 1e3:.2f} .. "
        f"{costs[-1] * 1e3:.1f} ms ({costs[-1] / costs[0]:.0f}x), compiled sizes 1/2/4/8, "
        f"weights {sorted({s.weight for s in specs})}"
    )
    print(
        f"          Poisson arrivals at {rate:.0f}/s ({how}; demand "
        f"{offered_load(specs):.2f}x capacity at full batches),"
    )
    print(
        f"          {arrivals} requests over {args.duration:g} s, "
        f"max_queue_depth {args.queue_depth}, seed {args.seed}"
    )
    if args.workers > 1:
        # Fleet mode: the arrival rate above was sized for one device; scale it to the fleet.
        fleet = [FleetModel.from_spec(s) for s in with_total_rate(specs, rate * args.workers)]
        for discipline in args.discipline:
            workers = [
                FleetWorker(name=f"w{i}", discipline=discipline, max_queue_depth=args.queue_depth)
                for i in range(args.workers)
            ]
            started = time.perf_counter()
            report = simulate_fleet(
                fleet,
                workers,
                GatewaySchedulingConfig(mode=args.gateway),
                duration=args.duration,
                warmup=args.warmup,
                seed=args.seed,
            )
            print()
            print(f"fleet: {args.workers} workers running {discipline}")
            print(report.format(rows=args.rows))
            print(f"(simulated in {time.perf_counter() - started:.1f} s of real time)")
        return
    for discipline in args.discipline:
        config = SchedulerConfig(discipline=discipline, max_queue_depth=args.queue_depth)
        started = time.perf_counter()
        report = simulate(config, specs, duration=args.duration, warmup=args.warmup, seed=args.seed)
        print()
        print(report.format(rows=args.rows))
        print(f"(simulated in {time.perf_counter() - started:.1f} s of real time)")


if __name__ == "__main__":
    main()

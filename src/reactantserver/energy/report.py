"""``reactantserver report ADDRESS``: what each model costs, read from a live /metrics.

Theory of operation
-------------------
ADDRESS is the one a user knows: a worker's or a gateway's gRPC address (``host:8001``),
its admin address (``host:8002``), or either as ``host:port/metrics`` or an
``http://`` URL (:func:`locate`). A gRPC port answers HTTP/1.1 with HTTP/2 bytes; then
the report asks the server, over gRPC, where its admin listener is
(``reactant_control.ControlService/AdminEndpoint``: the server knows) and reads that.
Anything else -- nothing listening, a server that speaks neither, one without an admin
listener -- is one line on stderr and exit status 1, never a traceback.

The report scrapes ``http://ADDRESS/metrics`` twice, ``--interval`` seconds apart, and
works on the counters' advances between the two (a counter that went down -- a worker
restarted -- counts from 0). ADDRESS is a worker's admin port or a gateway's: a gateway
with ``metrics_endpoints`` carries every worker's ``worker_*`` series, labelled with the
worker, so the same code sums over one worker or many. Per model, over the workers that
serve it:

* requests/s          -- ``worker_requests_served_total`` advance / window;
* rows per execution  -- ``worker_rows_served_total`` / ``worker_dispatch_total``;
* device s/request    -- ``worker_compute_seconds_total`` / requests;
* joules per inference -- ``worker_energy_joules_total`` / requests: the device energy
  attributed to the model by device-time share (docs/monitoring.md), idle energy apart.
  Absent ("-") unless every worker that served the model in the window measures energy;
* cost per million requests -- each worker's window costs ``device_hour x window / 3600``
  (``worker_cost_device_hour``, else the gateway's ``gateway_cost_device_hour``); that
  cost, idle time included, is split among the worker's models by their device-time
  share, summed over workers and divided by the model's requests. Absent unless every
  worker that served it has a price.

The idle share is the device time nobody used: ``1 - device seconds / (window x workers)``.
Where no worker measures energy the report says "energy: not measured" and prints no
joules: never a made-up number.

:func:`parse` and :func:`build` are pure (text in, records out); only :func:`run` does I/O.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families

#: worker_* counters read per (worker, model): sample name -> field.
_COUNTERS = {
    "worker_requests_served_total": "requests",
    "worker_rows_served_total": "rows",
    "worker_dispatch_total": "dispatches",
    "worker_compute_seconds_total": "compute",
    "worker_energy_joules_total": "joules",
}


@attrs.frozen
class WorkerScrape:
    """One worker's own figures in one exposition."""

    energy_source: str | None = None  # nvml / rapl; None: not measured
    idle_joules: float = 0.0
    watts: float | None = None
    device_hour: float | None = None


@attrs.frozen
class Scrape:
    """The figures of one exposition (:func:`parse`)."""

    #: (worker, model) -> field -> counter value.
    models: Mapping[tuple[str, str], Mapping[str, float]]
    workers: Mapping[str, WorkerScrape]
    gateway_device_hour: float | None = None


def parse(text: str) -> Scrape:
    """The report's figures from a worker's or a gateway's text exposition."""
    models: dict[tuple[str, str], dict[str, float]] = {}
    workers: dict[str, dict[str, Any]] = {}
    gateway_price: float | None = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            worker = s.labels.get("worker", "")
            if s.name in _COUNTERS and "model" in s.labels:
                key = (worker, s.labels["model"])
                models.setdefault(key, {})[_COUNTERS[s.name]] = s.value
            elif s.name == "worker_info":
                workers.setdefault(worker, {})
            elif s.name == "worker_energy_measured":
                w = workers.setdefault(worker, {})
                if s.value == 1:
                    w["energy_source"] = s.labels.get("source", "")
            elif s.name == "worker_idle_energy_joules_total":
                workers.setdefault(worker, {})["idle_joules"] = s.value
            elif s.name == "worker_device_power_watts":
                workers.setdefault(worker, {})["watts"] = s.value
            elif s.name == "worker_cost_device_hour":
                workers.setdefault(worker, {})["device_hour"] = s.value
            elif s.name == "gateway_cost_device_hour":
                gateway_price = s.value
    return Scrape(
        models=models,
        workers={name: WorkerScrape(**w) for name, w in workers.items()},
        gateway_device_hour=gateway_price,
    )


@attrs.frozen
class ModelReport:
    model: str
    requests_per_second: float
    rows_per_execution: float | None
    device_seconds_per_request: float | None
    joules_per_inference: float | None
    cost_per_million_requests: float | None


@attrs.frozen
class Report:
    address: str
    window_seconds: float
    workers: tuple[str, ...]
    models: tuple[ModelReport, ...]
    #: Share of the workers' device time in the window that no model used.
    idle_share: float
    #: Workers that measure energy, with their source; empty: "energy: not measured".
    energy_sources: Mapping[str, str]
    #: Over the measured workers in the window: energy attributed, idle, power now.
    attributed_joules: float | None
    idle_joules: float | None
    watts: float | None
    #: Price per device-hour of each worker (None: unset), and the cost of the window's
    #: device time on workers that ran nothing (nobody to charge it to).
    device_hour: Mapping[str, float | None]
    unallocated_cost: float | None


def _advance(before: float | None, after: float) -> float:
    if before is None or after < before:
        return after  # new, or reset (a restarted worker counts from 0)
    return after - before


def build(before: Scrape, after: Scrape, seconds: float, address: str) -> Report:
    """The report for the window between two scrapes ``seconds`` apart."""
    workers = tuple(sorted(after.workers))
    delta: dict[tuple[str, str], dict[str, float]] = {}
    # model -> (worker, its advances), for every worker with the model's series
    per_model: dict[str, list[tuple[str, dict[str, float]]]] = {}
    busy: dict[str, float] = {}
    for (worker, model), fields in after.models.items():
        old = before.models.get((worker, model), {})
        d = delta[worker, model] = {f: _advance(old.get(f), v) for f, v in fields.items()}
        per_model.setdefault(model, []).append((worker, d))
        busy[worker] = busy.get(worker, 0.0) + d.get("compute", 0.0)
    price = {
        w: (after.workers[w].device_hour if after.workers[w].device_hour is not None
            else after.gateway_device_hour)
        for w in workers
    }  # fmt: skip
    measured = {w: s.energy_source for w, s in after.workers.items() if s.energy_source}

    models: list[ModelReport] = []
    for model, rows in sorted(per_model.items()):
        req = sum(d.get("requests", 0.0) for _, d in rows)
        dispatches = sum(d.get("dispatches", 0.0) for _, d in rows)
        compute = sum(d.get("compute", 0.0) for _, d in rows)
        served_on = [w for w, d in rows if d.get("requests", 0.0) > 0]
        joules: float | None = None
        if req > 0 and all(w in measured for w in served_on):
            joules = sum(d.get("joules", 0.0) for _, d in rows) / req
        cost: float | None = None
        ran_on = [(w, d) for w, d in rows if d.get("compute", 0.0) > 0]
        if req > 0 and all(price.get(w) is not None for w, _ in ran_on):
            total = 0.0
            for w, d in ran_on:
                window_cost = float(price[w] or 0.0) * seconds / 3600
                total += window_cost * d["compute"] / busy[w]
            cost = total / req * 1e6
        models.append(
            ModelReport(
                model=model,
                requests_per_second=req / seconds if seconds > 0 else 0.0,
                rows_per_execution=(
                    sum(d.get("rows", 0.0) for _, d in rows) / dispatches if dispatches else None
                ),
                device_seconds_per_request=compute / req if req else None,
                joules_per_inference=joules,
                cost_per_million_requests=cost,
            )
        )
    capacity = seconds * len(workers)
    idle_share = 1.0 - sum(busy.values()) / capacity if capacity > 0 else 1.0
    attributed = idle = watts = None
    if measured:
        attributed = sum(d.get("joules", 0.0) for (w, _), d in delta.items() if w in measured)
        idle = sum(
            _advance(
                before.workers[w].idle_joules if w in before.workers else None,
                after.workers[w].idle_joules,
            )
            for w in measured
        )
        readings = [r for w in measured if (r := after.workers[w].watts) is not None]
        watts = sum(readings) if readings else None
    unallocated: float | None = None
    idle_workers = [w for w in workers if busy.get(w, 0.0) == 0]
    if all(price[w] is not None for w in idle_workers):
        unallocated = sum(float(price[w] or 0.0) * seconds / 3600 for w in idle_workers)
    return Report(
        address=address,
        window_seconds=seconds,
        workers=workers,
        models=tuple(models),
        idle_share=max(0.0, idle_share),
        energy_sources=measured,
        attributed_joules=attributed,
        idle_joules=idle,
        watts=watts,
        device_hour=price,
        unallocated_cost=unallocated,
    )


# ----------------------------------------------------------------------------- output


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(report: Report) -> str:
    """The plain table an operator reads."""
    n = len(report.workers)
    lines = [
        f"reactantserver report {report.address}: {n} worker{'s' if n != 1 else ''}, "
        f"window {report.window_seconds:.1f} s"
    ]
    header = ("model", "requests/s", "rows/exec", "device s/req", "J/inference", "cost/1M req")
    table = [header]
    for m in report.models:
        table.append(
            (
                m.model,
                f"{m.requests_per_second:.2f}",
                _cell(m.rows_per_execution, ".2f"),
                _cell(m.device_seconds_per_request, ".6f"),
                _cell(m.joules_per_inference, ".4f"),
                _cell(m.cost_per_million_requests, ".4f"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    if not report.models:
        lines.append("(no model served in the window)")
    lines.append(
        f"idle share: {report.idle_share:.1%} of {report.window_seconds * n:.1f} device-seconds"
    )
    if not report.energy_sources:
        lines.append(
            "energy: not measured (no worker reads a power counter: NVML on a GPU, RAPL "
            "where the kernel exposes it)"
        )
    else:
        sources = ", ".join(f"{w}: {s}" for w, s in sorted(report.energy_sources.items()))
        attributed, idle = report.attributed_joules or 0.0, report.idle_joules or 0.0
        total = attributed + idle
        share = f" ({idle / total:.1%})" if total > 0 else ""
        power = f"; power now {report.watts:.1f} W" if report.watts is not None else ""
        lines.append(
            f"energy: {total:.1f} J in the window, {idle:.1f} J of it idle{share}{power} "
            f"[{sources}]"
        )
        if len(report.energy_sources) < n:
            lines.append(f"        measured on {len(report.energy_sources)} of {n} workers")
    prices = set(report.device_hour.values())
    if prices == {None} or not prices:
        lines.append("cost: not set (cost.device_hour)")
    else:
        shown = ", ".join(
            f"{w}: {'unset' if p is None else format(p, 'g')}"
            for w, p in sorted(report.device_hour.items())
        )
        unallocated = (
            f"; {report.unallocated_cost:.4f} for workers that ran nothing"
            if report.unallocated_cost
            else ""
        )
        lines.append(
            f"cost: per device-hour {shown}; idle time is charged to the models by their "
            f"share of device time{unallocated}"
        )
    return "\n".join(lines)


def as_json(report: Report) -> dict[str, Any]:
    """The report for tools (``--json``): the same figures, ``null`` where unknown."""
    return {
        "address": report.address,
        "window_seconds": report.window_seconds,
        "workers": list(report.workers),
        "idle_share": report.idle_share,
        "energy_measured": bool(report.energy_sources),
        "energy_sources": dict(report.energy_sources),
        "attributed_joules": report.attributed_joules,
        "idle_joules": report.idle_joules,
        "power_watts": report.watts,
        "device_hour": dict(report.device_hour),
        "unallocated_cost": report.unallocated_cost,
        "models": [attrs.asdict(m) for m in report.models],
    }


# ----------------------------------------------------------------------------- I/O


class Unreadable(Exception):
    """ADDRESS cannot be reported on; the message is the one line that says why."""


def metrics_url(address: str) -> str:
    """``host:port``, ``host:port/metrics`` or an ``http://`` URL -> the /metrics URL."""
    url = address if "://" in address else f"http://{address}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/", "/metrics"):
        raise Unreadable(
            f"{address!r}: expected host:port (a worker's or gateway's gRPC or admin "
            "address), host:port/metrics or http://host:port/metrics"
        )
    try:
        _ = parts.port  # a malformed port raises here
    except ValueError as exc:
        raise Unreadable(f"{address!r}: {exc}") from None
    return f"http://{parts.netloc}/metrics"


def fetch(url: str, timeout: float = 10.0) -> str:
    """``GET url``; ``OSError`` saying why not, ``http.client.HTTPException`` when what
    answers is not HTTP/1.1 (a gRPC port: HTTP/2)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


def admin_endpoint(host: str, port: int, timeout: float = 10.0) -> tuple[str, int]:
    """Ask the gRPC server at ``host:port`` where its admin listener is (AdminEndpoint)."""
    import asyncio

    from grpclib.client import Channel

    from ..protocol import reactant_control as cpb

    async def ask() -> cpb.AdminEndpointResponse:
        channel = Channel(host, port)
        try:
            stub = cpb.ControlServiceStub(channel)
            return await stub.admin_endpoint(cpb.AdminEndpointRequest(), timeout=timeout)
        finally:
            channel.close()

    reply = asyncio.run(ask())
    return reply.host, int(reply.port)


def locate(
    address: str,
    *,
    get: Callable[[str], str] = fetch,
    ask: Callable[[str, int], tuple[str, int]] = admin_endpoint,
) -> tuple[str, str]:
    """``(the /metrics URL to read, a note)`` for ADDRESS (the module docstring); the
    note says where a gRPC address led ("" for an admin address). ``Unreadable`` else."""
    url = metrics_url(address)
    try:
        get(url)
        return url, ""
    except http.client.HTTPException:
        pass  # not HTTP/1.1: a gRPC port, or something else; ask it below
    except OSError as exc:
        raise Unreadable(f"cannot read {url}: {_reason(exc)}") from None
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    try:
        admin_host, admin_port = ask(host, port)
    except Exception as exc:  # grpclib's errors, a reset, a timeout: one line whatever
        raise Unreadable(
            f"{address} answers neither HTTP (/metrics) nor reactantserver's gRPC "
            f"AdminEndpoint ({type(exc).__name__}: {exc}); give the admin address "
            "(endpoints.metrics_port, a gateway's listen.metrics)"
        ) from None
    if not admin_port:
        raise Unreadable(
            f"{address} is the gRPC port of a server with no admin listener, so there is "
            "no /metrics to read (set endpoints.metrics_port, or a gateway's listen.metrics)"
        )
    if admin_host in ("", "0.0.0.0", "::", "[::]"):
        admin_host = host  # bound to every address: the one the gRPC port was reached on
    bracketed = f"[{admin_host}]" if ":" in admin_host else admin_host
    found = f"http://{bracketed}:{admin_port}/metrics"
    return found, f"{address} is a gRPC port; reading its admin listener, {found}"


def _reason(exc: OSError) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc)


def run(
    address: str,
    interval: float,
    *,
    get: Callable[[str], str] = fetch,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Report:
    """Scrape ADDRESS's /metrics (an admin address: see :func:`locate` for the others)
    twice ``interval`` seconds apart and build the report."""
    url = metrics_url(address)
    t0 = clock()
    before = parse(get(url))
    sleep(interval)
    after = parse(get(url))
    return build(before, after, clock() - t0, address)


def main(address: str, interval: float, json_output: bool) -> int:
    """The CLI: print the report; 1 with a line on stderr when ADDRESS cannot be read."""
    import sys

    try:
        url, note = locate(address)
        if note:
            print(note, file=sys.stderr)
        shown = url.removeprefix("http://").removesuffix("/metrics")
        report = run(shown, interval)
    except Unreadable as exc:
        print(exc, file=sys.stderr)
        return 1
    except (OSError, ValueError, http.client.HTTPException) as exc:
        print(f"cannot read {metrics_url(address)}: {exc}", file=sys.stderr)
        return 1
    if not report.workers:
        print(
            f"{address}/metrics has no worker series (a gateway without metrics_endpoints?)",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(as_json(report), indent=2) if json_output else render(report))
    return 0

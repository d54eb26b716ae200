"""The workers' own metrics, fetched at scrape time and merged into the gateway's exposition.

Theory of operation
-------------------
When ``/metrics`` is scraped, :class:`WorkerMetrics` fetches every ``metrics_endpoints``
address's ``/metrics`` at once (plain HTTP/1.1 GET on Trio, :data:`SCRAPE_TIMEOUT` each,
:data:`MAX_BODY` bytes at most), parses each text exposition with prometheus-client's
parser and keeps the families until the collector reads them (:meth:`collect`). Each
sample gets the ``worker`` label of its endpoint -- the gateway's name for it, replacing
the worker's own, so that two nodes' ``worker0`` stay apart -- and families of the same
name from several workers are merged into one (one HELP and TYPE). A worker whose scrape
fails contributes nothing that round and ``gateway_worker_metrics_up{worker}`` says 0.

Nothing here runs on the request path; a scrape costs the workers' scrapes plus parsing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import attrs
import trio
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..config.rules import split_host_port

log = logging.getLogger(__name__)

#: How long one worker's /metrics may take.
SCRAPE_TIMEOUT = 5.0
#: Largest exposition accepted from one worker.
MAX_BODY = 32 * 1024 * 1024


@attrs.frozen
class Endpoint:
    """One worker's admin address and the ``worker`` label its series get."""

    address: str
    label: str


async def fetch_metrics(address: str, timeout: float = SCRAPE_TIMEOUT) -> str:
    """GET ``http://address/metrics``; the body, or ``OSError``/``ValueError`` saying why not."""
    parsed = split_host_port(address)
    if parsed is None:
        raise ValueError(f"not host:port: {address!r}")
    host, port = parsed[0].strip("[]"), parsed[1]
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            request = f"GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
            await stream.send_all(request.encode("ascii"))
            chunks: list[bytes] = []
            size = 0
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY:
                    raise ValueError(f"the exposition is larger than {MAX_BODY} bytes")
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    status = status_line.split(b" ")
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"/metrics answered {status_line.decode('latin-1')!r}")
    return body.decode("utf-8", "replace")


def relabel(families: Sequence[Metric], worker: str) -> list[Metric]:
    """``families`` with ``worker=<worker>`` on every sample."""
    out = []
    for family in families:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        copy.samples = [
            Sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp, s.exemplar)
            for s in family.samples
        ]
        out.append(copy)
    return out


def merge_families(per_worker: Sequence[Sequence[Metric]]) -> list[Metric]:
    """One family per name, the samples of every worker in it (first HELP/TYPE wins)."""
    merged: dict[str, Metric] = {}
    for families in per_worker:
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            if into.type != family.type:
                continue  # two workers of different versions disagree: keep the first kind
            into.samples.extend(family.samples)
    return list(merged.values())


class WorkerMetrics:
    """The merged worker families of the last scrape (see the module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = tuple(endpoints)
        self._families: list[Metric] = []
        self.up: dict[str, bool] = {e.label: False for e in self.endpoints}

    async def refresh(self) -> None:
        """Fetch every worker's exposition now (Trio; bounded by :data:`SCRAPE_TIMEOUT`)."""
        if not self.endpoints:
            return
        results: list[list[Metric] | None] = [None] * len(self.endpoints)

        async def one(i: int, endpoint: Endpoint) -> None:
            try:
                text = await fetch_metrics(endpoint.address)
                results[i] = relabel(list(text_string_to_metric_families(text)), endpoint.label)
            except (OSError, ValueError, trio.TooSlowError) as exc:
                log.debug("scraping %s failed: %s", endpoint.address, exc)

        async with trio.open_nursery() as nursery:
            for i, endpoint in enumerate(self.endpoints):
                nursery.start_soon(one, i, endpoint)
        self.up = {e.label: r is not None for e, r in zip(self.endpoints, results, strict=True)}
        self._families = merge_families([r for r in results if r is not None])

    def collect(self) -> Iterator[Metric]:
        yield from self._families

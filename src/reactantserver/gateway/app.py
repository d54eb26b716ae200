"""The gateway process: Trio supervising a grpclib proxy, the prober and the admin port.

Theory of operation
-------------------
:func:`run` is ``reactantserver gateway gateway.yml``: it runs :func:`serve_gateway` as
Trio's guest on a standard asyncio loop (:mod:`reactantserver.transport.guest`), with
SIGINT/SIGTERM turned into a graceful stop, and returns the exit status.

:func:`serve_gateway` builds one :class:`Gateway` and supervises, in one nursery:

* the gRPC server on ``listen.grpc``: the hardened wire of ``transport.server`` (the one a
  worker serves on: connection and stream limits, handshake and idle timeouts, messages
  checked at their length prefix, rate-limited fault logs), on the asyncio loop. Its
  handlers are the :class:`~.proxy.Proxy`'s, ``grpc.health.v1.Health`` and server
  reflection; ModelInfer never leaves the asyncio side;
* the :class:`~.prober.Prober` (a Trio task: a probe round every
  ``health_interval_seconds``, and on demand from the request path through a
  :class:`~reactantserver.transport.guest.TrioPortal`);
* under ``scheduling.mode: lpt_packing``, the :class:`~.lpt.LptDriver` (a Trio task fed by
  the prober's tables; also the proxy's GatewayControlService). Its startup -- every worker
  ready within ``startup_wait_seconds``, the fleet checked, the first placement -- runs
  before the gRPC server listens; a fleet it cannot place on is one line and exit 1
  (:class:`~.lpt.LptRefused`);
* the admin port on ``listen.metrics`` (``/healthz``, ``/readyz`` = a worker is ready,
  ``/metrics`` with the workers' expositions merged in), unless its port is 0.

Stopping (the ``stop`` event, or a signal under :func:`run`): new calls are refused with
UNAVAILABLE and health turns NOT_SERVING; calls in flight get up to
:data:`DRAIN_GRACE_SECONDS` to finish (less than a node supervisor's 10 s before it
kills); then GOAWAY on every connection, a short linger so the frames arrive, and the
connections, the worker connections and the nursery close. A second signal stops at once.

A prober that could reach no worker for ``wedge_exit_rounds x health_interval_seconds``
seconds raises :class:`~.prober.GatewayWedged`; :func:`run` then exits with status 1 for a
supervisor to restart the gateway.

Nothing here imports JAX (tests/project/test_no_jax.py).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping
from functools import partial

import attrs
import trio
from grpclib.const import Cardinality, Handler
from prometheus_client import CollectorRegistry

from ..admin import AdminApp, serve_admin
from ..config.certs import read_secret
from ..config.dump import dump_config
from ..config.rules import split_host_port
from ..config.schema import GatewayConfig, LoggingConfig
from ..protocol import screen
from ..protocol.grpc.reflection import v1 as reflection_v1
from ..protocol.grpc.reflection import v1alpha as reflection_v1alpha
from ..protocol.reflection import WORKER_SERVICES, ReflectionAnswerer
from ..signals import drain_on_signals
from ..transport import guest
from ..transport.core.limits import WireCounters, WireLimits
from ..transport.health import HealthServicer
from ..transport.security import (
    ListenerSecurity,
    describe_security,
    listener_security,
    open_warning,
)
from ..transport.server import GuardedServer, ServerStream, listen_tcp
from ..transport.streaming import StreamHandler
from ..transport.tls import ClientTls
from ..transport.unary import DirectHandler
from .calls import Raw, RawCodec
from .core.control import LptController
from .core.routing import Router, make_router
from .core.stats import GatewayStats
from .core.table import RouteTable
from .lpt import LptDriver, LptRefused
from .metrics import GatewayCollector
from .pool import WorkerClient
from .prober import GatewayWedged, Prober, Refresher, Registrations
from .proxy import Proxy
from .scrape import Endpoint, WorkerMetrics

log = logging.getLogger("reactantserver.gateway")

#: What the gateway's reflection lists (every service it answers).
SERVICES: tuple[str, ...] = (*WORKER_SERVICES, "reactant_control.GatewayControlService")
#: How long calls in flight may take to finish once stopping (a node supervisor kills the
#: gateway 10 s after SIGTERM).
DRAIN_GRACE_SECONDS = 8.0
#: After GOAWAY, how long connections stay open so the frames reach the clients.
GOAWAY_LINGER = 0.25
CLOSE_TIMEOUT = 5.0


@attrs.frozen
class GatewayAddress:
    """Where a started gateway listens (ports actually bound; 0 = admin port off)."""

    grpc_port: int
    metrics_port: int


class Gateway:
    """Everything one gateway process holds, wired together (no I/O at construction)."""

    def __init__(self, config: GatewayConfig, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        environment = os.environ if env is None else env
        #: The served side's TLS and restricted groups (keys read now: a bad one fails here).
        self.security = listener_security(
            config.tls, config.restricted, environment, what="gateway gRPC"
        )
        wc = config.worker_client
        worker_tls = (
            ClientTls(
                wc.tls.ca_file,
                wc.tls.cert_file,
                wc.tls.key_file,
                wc.tls.server_name,
                what="gateway -> workers TLS",
            )
            if wc.tls.ca_file
            else None
        )
        worker_key = (
            read_secret(wc.key_file, wc.key_env, environment).encode()
            if wc.key_file or wc.key_env
            else b""
        )
        #: lpt_packing's driver (None in the other modes); its controller owns the router.
        self.lpt: LptDriver | None = None
        controller = None
        # The models to answer UNAVAILABLE for (not NOT_FOUND) before any worker lists them.
        first = RouteTable(known=frozenset(config.expected_models))
        if config.scheduling.mode == "lpt_packing":
            controller = LptController(config.scheduling, first)
            self.router: Router = controller.router
        else:
            self.router = make_router(config.scheduling, first)
        names = config.worker_names or ("",) * len(config.endpoints)
        self.clients = tuple(
            WorkerClient(
                address,
                name,
                max_streams=config.worker_client.max_concurrent_streams,
                max_reply_bytes=config.grpc.max_send_msg_bytes,
                inflight=self.router.inflight.worker(address),  # one count, router and pool
                tls=worker_tls,
                key=worker_key,
            )
            for address, name in zip(config.endpoints, names, strict=True)
        )
        self.stats = GatewayStats()
        #: The hardened wire's counts (connections, streams, client mistakes by kind).
        self.wire = WireCounters()
        self.registrations = Registrations()
        self.prober = Prober(
            self.clients,
            self.router,
            interval=config.health_interval_seconds,
            wedge_exit_rounds=config.wedge_exit_rounds,
            registrations=self.registrations,
            on_table=self._on_table,
        )
        if controller is not None:
            self.lpt = LptDriver(
                controller,
                self.prober,
                self.clients,
                startup_wait_seconds=config.startup_wait_seconds,
            )
        self.worker_metrics = WorkerMetrics(_metrics_endpoints(config, self.clients))
        self.proxy: Proxy | None = None
        self.health = HealthServicer(self.health_status)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            GatewayCollector(
                stats=self.stats,
                router=self.router,
                prober=self.prober,
                clients=self.clients,
                wire=self.wire,
                workers=self.worker_metrics,
                mode=config.scheduling.mode,
                lpt=controller,
                device_hour=config.cost.device_hour,
                draining=lambda: self.proxy is not None and self.proxy.draining,
            )
        )

    def _on_table(self, table: RouteTable) -> None:
        if self.lpt is not None:
            self.lpt.on_table(table)

    def readiness(self) -> tuple[bool, str]:
        if self.proxy is not None and self.proxy.draining:
            return False, "the gateway is shutting down"
        return self.prober.ready()

    def health_status(self, service: str) -> bool | None:
        """grpc.health.v1: "" is the gateway (a worker is ready); a model serves when a ready
        worker serves it, is known but not serving when a worker lists it, listed it since
        the start or it is expected (``RouteTable.known``), or when no worker is ready to
        say (``routing.refusal``'s rule: UNAVAILABLE, not NOT_FOUND), else unknown."""
        if not service:
            return self.readiness()[0]
        table = self.router.table
        if table.serves(service):
            return True
        if service in table.known or not table.ready_workers:  # known: what a worker lists
            return False
        return None

    def build_proxy(self, portal: guest.TrioPortal) -> Proxy:
        """The proxy, with its refresh path crossing into Trio through ``portal``."""
        stats = self.stats

        def requested(ran: bool) -> None:
            stats.refreshes_requested += 1
            stats.refreshes_run += int(ran)

        refresher = Refresher(lambda: portal.run(self.prober.probe_round), on_request=requested)
        if self.lpt is not None:
            self.lpt.portal = portal
        self.proxy = Proxy(
            self.config,
            self.clients,
            self.router,
            self.prober,
            refresh=refresher.refresh,
            refresh_soon=refresher.soon,
            stats=stats,
            registrations=self.registrations,
            control=self.lpt,
        )
        return self.proxy

    def mapping(self, proxy: Proxy) -> dict[str, Handler | DirectHandler | StreamHandler]:
        """Every gRPC handler of the gateway, by path."""
        table = proxy.mapping()
        table.update(self.health.mapping())
        answerer = ReflectionAnswerer.from_package(services=SERVICES)
        screen.prepare()  # the small requests' schemas, before the first one arrives

        async def reflect(stream: ServerStream) -> None:
            async for request in stream:
                await stream.send_message(answerer.answer_bytes(request))

        for module in (reflection_v1alpha, reflection_v1):
            for path in module.ServerReflectionBase().__mapping__():
                table[path] = Handler(reflect, Cardinality.STREAM_STREAM, Raw, Raw)
        return table


def _metrics_endpoints(
    config: GatewayConfig, clients: tuple[WorkerClient, ...]
) -> tuple[Endpoint, ...]:
    """``metrics_endpoints`` with each one's ``worker`` label: the worker's name when the
    list lines up with ``endpoints`` (or ``worker_names``), else the admin address."""
    addresses = config.metrics_endpoints
    if len(addresses) == len(clients):
        return tuple(Endpoint(a, c.name) for a, c in zip(addresses, clients, strict=True))
    return tuple(Endpoint(a, a) for a in addresses)


# ------------------------------------------------------------------------------ gRPC server


def build_server(
    mapping: dict[str, Handler | DirectHandler | StreamHandler],
    config: GatewayConfig,
    counters: WireCounters,
    security: ListenerSecurity | None = None,
    on_closed: Callable[[str], None] | None = None,
) -> GuardedServer:
    """The gateway's gRPC server over ``mapping``: the hardened wire a worker serves on
    (``transport.server``), with the gateway's ``grpc:`` limits, TLS and restricted
    groups. The one place that builds it."""
    g = config.grpc
    limits = WireLimits.from_gateway_grpc(g)  # refusals name the gateway's grpc: keys
    security = security if security is not None else ListenerSecurity()
    return GuardedServer(
        mapping,
        codec=RawCodec(g.max_recv_msg_bytes, g.max_send_msg_bytes),
        limits=limits,
        counters=counters,
        tls=security.tls,
        authorizer=security.authorizer,
        on_closed=on_closed,
    )


def listen_address(address: str) -> socket.socket:
    """A listening socket on ``host:port`` (port 0 picks one): :func:`listen_tcp`."""
    parsed = split_host_port(address)
    if parsed is None:
        raise ValueError(f"expected host:port, got {address!r}")
    return listen_tcp(parsed[0].strip("[]"), parsed[1], backlog=512)


def listen_problems(config: GatewayConfig) -> list[str]:
    """One line for each address of ``config`` the gateway could not listen on now (checked
    before starting, so that a taken port is one line, not a traceback)."""
    lines = []
    for what, key, address in (
        ("gRPC", "listen.grpc", config.listen.grpc),
        ("admin HTTP", "listen.metrics", config.listen.metrics),
    ):
        parsed = split_host_port(address)
        if parsed is None or parsed[1] == 0:
            continue  # off, or any free port: nothing to collide with
        try:
            listen_address(address).close()
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            lines.append(f"cannot listen for {what} on {address}: {reason} (change {key})")
    return lines


async def _serve_grpc(
    gateway: Gateway,
    proxy: Proxy,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``stop``, then drain (see the module docstring) and return."""
    config = gateway.config
    sock: socket.socket | None = listen_address(config.listen.grpc)
    assert sock is not None
    port: int = sock.getsockname()[1]
    mapping = gateway.mapping(proxy)

    async def start(sock: socket.socket) -> GuardedServer:
        # Built on the asyncio side, where "the running loop" is the host loop.
        server = build_server(
            mapping, config, gateway.wire, gateway.security, proxy.connection_closed
        )
        await server.start(sock)
        return server

    server: GuardedServer | None = None
    try:
        server = await guest.aio(start(sock))
        sock = None  # the server owns it now
        log.info(
            "gateway gRPC listening on %s (port %d; %s)",
            config.listen.grpc,
            port,
            describe_security(gateway.security),
        )
        task_status.started(port)
        await stop.wait()
        log.info("draining: refusing new calls, waiting up to %.0f s", DRAIN_GRACE_SECONDS)
        proxy.drain()
        gateway.health.drain()
        with trio.move_on_after(DRAIN_GRACE_SECONDS) as waited:
            await guest.aio(proxy.wait_idle())
        if waited.cancelled_caught:
            log.warning(
                "%d calls still in flight after the grace period", proxy.stats.admission.calls
            )
        with trio.move_on_after(1.0):  # health watchers hear NOT_SERVING before GOAWAY
            await guest.aio(gateway.health.wait_told())
        server.goaway()
        await trio.sleep(GOAWAY_LINGER)
    finally:
        if server is not None:
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                server.close()
                await guest.aio(server.wait_closed())
        if sock is not None:
            sock.close()


# ------------------------------------------------------------------------------ the process


async def serve_gateway(
    config: GatewayConfig,
    *,
    stop: trio.Event | None = None,
    gateway: Gateway | None = None,
    freeze_heap: bool = False,
    task_status: trio.TaskStatus[GatewayAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one gateway until ``stop`` is set (see the module docstring).

    Must run as Trio's guest of an asyncio loop (:func:`run`, or ``guest.run``). ``gateway``
    is built from ``config`` unless given (an embedder or a test that reads its statistics).
    ``freeze_heap`` (the process's own gateway, :func:`run`): once started, exempt every
    object alive then from the cyclic collector's later passes, as a worker does
    (``worker/core.py``): the oldest generation's passes walked the whole startup heap --
    grpclib, protobuf, Trio, the config -- some 2-4 us per forwarded request under load.
    """
    stop = stop if stop is not None else trio.Event()
    log.info("effective gateway configuration:\n%s", dump_config(config))
    gateway = gateway if gateway is not None else Gateway(config)
    parsed = split_host_port(config.listen.grpc)
    warning = open_warning(parsed[0] if parsed else "", gateway.security, "restricted")
    if warning is not None:
        log.warning("%s", warning)
    try:
        async with trio.open_nursery() as nursery:
            proxy = gateway.build_proxy(guest.TrioPortal(nursery))

            async def grpc_then_stop(task_status: trio.TaskStatus[int]) -> None:
                await _serve_grpc(gateway, proxy, stop, task_status=task_status)
                nursery.cancel_scope.cancel()

            lpt = gateway.lpt
            if lpt is not None:
                # lpt_packing places before it serves: every worker, checked, then placed.
                await nursery.start(gateway.prober.run)
                with trio.CancelScope() as waiting:
                    nursery.start_soon(_cancel_when, stop, waiting)
                    await lpt.startup()
                if waiting.cancelled_caught:
                    log.info("stopped before lpt_packing could place the models")
                    nursery.cancel_scope.cancel()
                    return
                await nursery.start(lpt.run)
            grpc_port = await nursery.start(grpc_then_stop)
            metrics_port = 0
            host_port = split_host_port(config.listen.metrics)
            if host_port is not None and host_port[1] != 0:
                app = AdminApp(
                    gateway.registry,
                    gateway.readiness,
                    before_metrics=gateway.worker_metrics.refresh,
                )
                metrics_port = await nursery.start(
                    partial(serve_admin, max_connections=config.grpc.max_admin_connections),
                    app,
                    host_port[0].strip("[]"),
                    host_port[1],
                )
                proxy.admin = (host_port[0].strip("[]"), metrics_port)
            if lpt is None:
                await nursery.start(gateway.prober.run)
            # Workers not answering yet is the normal course of a start (they compile
            # first): the line says what the gateway waits for, the prober logs "gateway
            # ready" when one is, and only a worker that was ready and left is a warning.
            ready_now = sum(p.ready for p in gateway.prober.probes.values())
            total = len(gateway.clients)
            log.info(
                "gateway started: %s; mode %s",
                f"{ready_now} of {total} workers ready"
                if ready_now
                else f"waiting for {total} worker{'s' if total != 1 else ''}",
                config.scheduling.mode,
            )
            if freeze_heap:
                gc.collect()
                gc.freeze()
            task_status.started(GatewayAddress(grpc_port, metrics_port))
    finally:
        with trio.CancelScope(shield=True):
            for client in gateway.clients:
                await guest.aio(client.wait_closed())


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _main(config: GatewayConfig) -> int:
    stop = trio.Event()
    wedged: list[GatewayWedged | LptRefused] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(drain_on_signals, stop, nursery.cancel_scope, log)
        try:
            await serve_gateway(config, stop=stop, freeze_heap=True)
        except* (GatewayWedged, LptRefused) as group:
            wedged.extend(e for e in group.exceptions if isinstance(e, GatewayWedged | LptRefused))
        finally:
            nursery.cancel_scope.cancel()
    for exc in wedged:
        log.error("%s", exc)
    return 1 if wedged else 0


def run(config: GatewayConfig) -> int:
    """``reactantserver gateway``: serve until SIGINT/SIGTERM; the exit status."""
    return guest.run(_main, config)


# ------------------------------------------------------------------------------ logging


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: LoggingConfig, level: str | None = None) -> None:
    """The root logger as ``logging:`` says (``level`` overrides ``logging.level``)."""
    handler = logging.StreamHandler()
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or settings.level).upper())


__all__ = [
    "DRAIN_GRACE_SECONDS",
    "Gateway",
    "GatewayAddress",
    "configure_logging",
    "run",
    "serve_gateway",
]

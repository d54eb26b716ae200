"""Every range and cross-field rule of a worker and of a gateway, in two tables.

Theory of operation
-------------------
Structuring (``convert``) guarantees *types*; this module checks *values*. A rule is a
key path pattern (``"*"`` matches every mapping key or list position) and a check that
returns what was expected, or ``None`` when the value is fine. ``problems(obj, rules,
cross, locate)`` applies a table to a structured record and returns ``Problem``s; the
caller raises the earliest. The rules live here, in one place, because ``docs/
configuration.md`` lists them and both the node file and the environment are checked
against the same table.

The checks are deliberately not attrs validators on the records: code (tests, the
simulator) builds records directly, e.g. with port 0 for "any free port", and the records
stay plain shapes. What an operator writes is held to these rules.

Node-file rules (worker names and ports, ``gpus``, the ``models:`` pin map, the gateway
beside the workers) need the whole node and live in ``node``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from .schema import (
    API_GROUPS,
    ClientTlsConfig,
    GatewayConfig,
    GatewayTrust,
    Restriction,
    ServerConfig,
    TlsConfig,
)
from .source import Origin, Path, Problem, describe, show

#: A check returns what was expected (the ``expected ...`` part of the message), or None.
Check = Callable[[Any], str | None]
#: A cross-field rule returns ``(path, message)`` pairs; it is given ``locate`` so that a
#: message about two values can say where the *other* one came from.
Cross = Callable[[Any, Callable[[Path], Origin]], Iterator[tuple[Path, str]]]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _number(value: float, ok: bool, what: str, allow_inf: bool = False) -> str | None:
    if math.isinf(value) and not allow_inf:
        return f"expected {what}; got {show(value)}"
    return None if ok else f"expected {what}; got {show(value)}"


def positive(value: float) -> str | None:
    return _number(value, value > 0, "a number > 0")


def non_negative(meaning: str = "", *, allow_inf: bool = False) -> Check:
    what = f"a number >= 0 ({meaning})" if meaning else "a number >= 0"
    return lambda value: _number(value, value >= 0, what, allow_inf)


def at_least(low: int, meaning: str = "") -> Check:
    what = f"an integer >= {low}" + (f" ({meaning})" if meaning else "")
    return lambda value: None if value >= low else f"expected {what}; got {show(value)}"


def at_most(high: int, low: Check) -> Check:
    """``low``'s check, and at most ``high`` (a protocol field's width)."""

    def check(value: int) -> str | None:
        found = low(value)
        if found is None and value > high:
            return f"expected an integer <= {high}; got {show(value)}"
        return found

    return check


def interval(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Check:
    text = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"

    def check(value: float) -> str | None:
        above = value > low if open_low else value >= low
        below = value < high if open_high else value <= high
        return None if above and below else f"expected a number in {text}; got {show(value)}"

    return check


def port(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"expected a port in 1..65535; got {show(value)}"


def port_or_off(value: int) -> str | None:
    if 0 <= value <= 65535:
        return None
    return f"expected a port in 1..65535, or 0 for off; got {show(value)}"


def name(value: str) -> str | None:
    if _NAME.match(value):
        return None
    return f"expected a name of letters, digits, '.', '_' and '-'; got {show(value)}"


def non_empty(value: str) -> str | None:
    return None if value.strip() else "expected a non-empty string; got ''"


def split_host_port(value: str) -> tuple[str, int] | None:
    """``host:port`` -> ``(host, port)``; IPv6 hosts in brackets. None when malformed."""
    host, sep, digits = value.strip().rpartition(":")
    if not sep or not host or not digits.isdigit():
        return None
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return None
    return host, int(digits)


def host_port(*, off_allowed: bool = False) -> Check:
    span = "1..65535, or 0 for off" if off_allowed else "1..65535"

    def check(value: str) -> str | None:
        parsed = split_host_port(value)
        low = 0 if off_allowed else 1
        if parsed is None or not low <= parsed[1] <= 65535:
            return f"expected host:port with a port in {span}; got {show(value)}"
        return None

    return check


_SHM_PREFIX = re.compile(r"^/[A-Za-z0-9._-]{0,254}$")
_HEADER = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
#: Headers the server reads itself (:mod:`reactantserver.transport.core.auth`).
RESERVED_HEADERS = frozenset({"reactant-gateway-key", "reactant-owner"})


def shm_prefix(value: str) -> str | None:
    if value == "" or _SHM_PREFIX.match(value):
        return None
    return (
        "expected '' or '/' and letters, digits, '.', '_' or '-' (a POSIX shared-memory "
        f"name prefix such as /reactantserver-); got {show(value)}"
    )


def api_group(value: str) -> str | None:
    if value in API_GROUPS:
        return None
    return f"expected one of {', '.join(API_GROUPS)}; got {show(value)}"


def header_name(value: str) -> str | None:
    if value == "":
        return None  # a restriction by certificate alone (the cross rule checks)
    if not _HEADER.match(value) or value.startswith("grpc-") or value.endswith("-bin"):
        return (
            "expected a lower-case gRPC metadata name (letters, digits, '.', '_', '-'; not "
            f"grpc-* or *-bin); got {show(value)}"
        )
    if value in RESERVED_HEADERS:
        return f"expected a header of its own; {value} is read by the server itself"
    return None


def replicas(value: int | str) -> str | None:
    if value == "all" or (isinstance(value, int) and value >= 1):
        return None
    return f"expected a positive integer or all; got {show(value)}"


# --- applying a table ----------------------------------------------------------------------


def _walk(obj: Any, pattern: Path, at: Path = ()) -> Iterator[tuple[Path, Any]]:
    if obj is None:
        return
    if not pattern:
        yield at, obj
        return
    head, rest = pattern[0], pattern[1:]
    if isinstance(obj, Mapping):
        keys = list(obj) if head == "*" else [head] if head in obj else []
        for key in keys:
            yield from _walk(obj[key], rest, (*at, key))
    elif isinstance(obj, tuple):
        for index, item in enumerate(obj):
            if head in ("*", index):
                yield from _walk(item, rest, (*at, index))
    elif attrs.has(type(obj)):
        yield from _walk(getattr(obj, str(head)), rest, (*at, head))


def problems(
    obj: Any,
    rules: Sequence[tuple[Path, Check]],
    cross: Sequence[Cross],
    locate: Callable[[Path], Origin],
) -> list[Problem]:
    found = []
    for pattern, rule in rules:
        for path, value in _walk(obj, pattern):
            message = rule(value)
            if message is not None:
                found.append(Problem(locate(path), message))
    for cross_rule in cross:
        found.extend(Problem(locate(p), message) for p, message in cross_rule(obj, locate))
    return found


def duplicates(values: Sequence[Any], at: Path, what: str) -> Iterator[tuple[Path, str]]:
    """Flag the second and later occurrences of a value in a list."""
    seen: set[Any] = set()
    for index, value in enumerate(values):
        if value in seen:
            yield (*at, index), f"expected distinct {what}; {show(value)} is listed twice"
        seen.add(value)


def _wire_bounds(section: str) -> tuple[tuple[Path, Check], ...]:
    """The hardened wire's bounds on its clients, which a worker's ``endpoints:`` and a
    gateway's ``grpc:`` set under the same key names."""
    return (
        ((section, "max_connections"), at_least(1)),
        ((section, "max_concurrent_streams"), at_most(2**31 - 1, at_least(1))),
        ((section, "handshake_timeout_seconds"), positive),
        ((section, "idle_timeout_seconds"), positive),
        ((section, "body_timeout_seconds"), positive),
        ((section, "send_timeout_seconds"), positive),
        ((section, "max_unsent_bytes"), at_most(1 << 40, at_least(1))),
        ((section, "max_admin_connections"), at_least(1)),
    )


# --- a worker (ServerConfig) -----------------------------------------------------------------

WORKER_RULES: tuple[tuple[Path, Check], ...] = (
    (("name",), name),
    (("model_dirs", "*"), non_empty),
    (("models_include", "*"), non_empty),
    (("model_poll_seconds",), positive),
    (("gpu",), at_least(0)),
    (("runtime", "mem_fraction"), interval(0, 1, open_low=True)),
    (("runtime", "weight_cache_fraction"), interval(0, 1)),
    (("runtime", "weight_cache_wiggle_fraction"), interval(0, 1, open_high=True)),
    (("runtime", "arena_bytes"), at_least(0, "0 = no arena")),
    (("scheduler", "ema_halflife_seconds"), positive),
    (("scheduler", "max_queue_depth"), at_least(1)),
    (("scheduler", "dispatch_timeout_seconds"), positive),
    (("scheduler", "compaction_interval"), at_least(0, "0 = off")),
    (("scheduler", "cost_ema_alpha"), interval(0, 1, open_low=True)),
    (("scheduler", "recency_penalty_cap"), interval(0, 1, open_low=True)),
    (("scheduler", "meta_concurrency"), at_least(1)),
    (("scheduler", "inline_max_seconds"), non_negative("0 = never inline")),
    (("scheduler", "pipeline_depth"), at_least(1, "1 = no pipelining")),
    (("scheduler", "models", "*", "weight"), positive),
    (("scheduler", "models", "*", "max_batch_size"), at_least(0, "0 = uncapped")),
    (("endpoints", "host"), non_empty),
    (("endpoints", "port"), port),
    (("endpoints", "metrics_port"), port_or_off),
    (("endpoints", "max_concurrent_requests"), at_least(0, "0 = uncapped")),
    (("endpoints", "max_message_bytes"), at_least(1)),
    *_wire_bounds("endpoints"),
    (("endpoints", "max_shm_regions"), at_least(1)),
    (("endpoints", "shm_key_prefix"), shm_prefix),
    (("endpoints", "restricted", "*", "groups", "*"), api_group),
    (("endpoints", "restricted", "*", "header"), header_name),
    (("cost", "device_hour"), non_negative("the price of one device-hour")),
)


def _worker_ports(
    cfg: ServerConfig, locate: Callable[[Path], Origin]
) -> Iterator[tuple[Path, str]]:
    ep = cfg.endpoints
    if ep.metrics_port != 0 and ep.metrics_port == ep.port:
        yield (
            ("endpoints", "metrics_port"),
            f"expected a port other than the gRPC port; got {ep.metrics_port} for both (the gRPC "
            f"port comes from {describe(locate(('endpoints', 'port')))})",
        )


def _worker_lists(cfg: ServerConfig, _: Callable[[Path], Origin]) -> Iterator[tuple[Path, str]]:
    yield from duplicates(cfg.model_dirs, ("model_dirs",), "directories")
    yield from duplicates(cfg.models_include, ("models_include",), "model names")


def server_tls_problems(tls: TlsConfig, at: Path) -> Iterator[tuple[Path, str]]:
    """A listener's ``tls:``: a certificate and its key together, a client CA with them."""
    if bool(tls.cert_file) != bool(tls.key_file):
        missing = "key_file" if tls.cert_file else "cert_file"
        yield (*at, missing), "expected cert_file and key_file together; got only one of them"
    if tls.client_ca_file and not tls.cert_file:
        yield (
            (*at, "client_ca_file"),
            "expected cert_file and key_file too (mutual TLS is TLS with client certificates)",
        )


def _key_source(key_file: str, key_env: str, at: Path) -> Iterator[tuple[Path, str]]:
    if key_file and key_env:
        yield (*at, "key_env"), "expected key_file or key_env, not both"


def restriction_problems(
    restricted: tuple[Restriction, ...], at: Path, mtls: bool
) -> Iterator[tuple[Path, str]]:
    """``restricted:``: each entry names groups, a key (header + its source) or
    certificate identities (under mutual TLS); a group is restricted once."""
    owner: dict[str, int] = {}
    for index, entry in enumerate(restricted):
        here = (*at, index)
        if not entry.groups:
            yield (*here, "groups"), "expected at least one API group; got []"
        yield from duplicates(entry.groups, (*here, "groups"), "groups")
        yield from _key_source(entry.key_file, entry.key_env, here)
        keyed = bool(entry.key_file or entry.key_env)
        if keyed and not entry.header:
            yield (*here, "header"), "expected the header that carries the key (e.g. admin-key)"
        if entry.header and not keyed:
            yield (
                (*here, "header"),
                "expected key_file or key_env with it: the key is never written in the YAML",
            )
        if not keyed and not entry.identities:
            yield here, "expected a key (header with key_file or key_env) or identities"
        if entry.identities and not mtls:
            yield (
                (*here, "identities"),
                "expected mutual TLS (tls.client_ca_file): identities are client certificates'",
            )
        for group in entry.groups:
            if group in owner and owner[group] != index:
                yield (
                    (*here, "groups"),
                    f"expected each group restricted once; {group} is also in item {owner[group]}",
                )
            owner.setdefault(group, index)


def trust_problems(trust: GatewayTrust, at: Path, mtls: bool) -> Iterator[tuple[Path, str]]:
    yield from _key_source(trust.key_file, trust.key_env, at)
    if trust.identities and not mtls:
        yield (
            (*at, "identities"),
            "expected mutual TLS (tls.client_ca_file): identities are client certificates'",
        )


def _worker_security(cfg: ServerConfig, _: Callable[[Path], Origin]) -> Iterator[tuple[Path, str]]:
    ep = cfg.endpoints
    mtls = bool(ep.tls.client_ca_file)
    yield from server_tls_problems(ep.tls, ("endpoints", "tls"))
    yield from restriction_problems(ep.restricted, ("endpoints", "restricted"), mtls)
    yield from trust_problems(ep.gateway, ("endpoints", "gateway"), mtls)


WORKER_CROSS: tuple[Cross, ...] = (_worker_ports, _worker_lists, _worker_security)

# --- a gateway (GatewayConfig) ---------------------------------------------------------------

GATEWAY_RULES: tuple[tuple[Path, Check], ...] = (
    (("listen", "grpc"), host_port()),
    (("listen", "metrics"), host_port(off_allowed=True)),
    (("endpoints", "*"), host_port()),
    (("metrics_endpoints", "*"), host_port()),
    (("worker_names", "*"), name),
    (("grpc", "max_recv_msg_bytes"), at_least(1)),
    (("grpc", "max_send_msg_bytes"), at_least(1)),
    (("grpc", "max_concurrent_requests_per_worker"), at_least(0, "0 = uncapped")),
    *_wire_bounds("grpc"),
    (("worker_client", "request_timeout_seconds"), positive),
    (("worker_client", "max_concurrent_streams"), at_least(1)),
    (("restricted", "*", "groups", "*"), api_group),
    (("restricted", "*", "header"), header_name),
    (("cost", "device_hour"), non_negative("the price of one device-hour")),
    (("scheduling", "rebalance_compute_seconds"), positive),
    (
        ("scheduling", "first_rebalance_compute_seconds"),
        non_negative("0 = use rebalance_compute_seconds"),
    ),
    (("scheduling", "max_worker_share"), interval(0, 1, open_low=True)),
    (("scheduling", "hysteresis"), interval(0, 1, open_high=True)),
    (
        ("scheduling", "ema_halflife_compute_seconds"),
        non_negative("0 = use rebalance_compute_seconds"),
    ),
    (("scheduling", "default_replicas"), replicas),
    (("scheduling", "routing_fill_factor"), positive),
    (("scheduling", "compaction_interval"), at_least(0)),
    (("scheduling", "models", "*", "replicas"), replicas),
    (("scheduling", "models", "*", "fill_factor"), positive),
    (("startup_wait_seconds",), non_negative(".inf = wait forever", allow_inf=True)),
    (("health_interval_seconds",), positive),
    (("wedge_exit_rounds",), at_least(0, "0 = never exit")),
)


def _gateway_lists(cfg: GatewayConfig, _: Callable[[Path], Origin]) -> Iterator[tuple[Path, str]]:
    yield from duplicates(cfg.endpoints, ("endpoints",), "endpoints")
    yield from duplicates(cfg.metrics_endpoints, ("metrics_endpoints",), "endpoints")
    yield from duplicates(cfg.worker_names, ("worker_names",), "names")
    yield from duplicates(cfg.expected_models, ("expected_models",), "model names")
    # worker_names label endpoints (and metrics_endpoints) by position.
    if cfg.worker_names and len(cfg.worker_names) != len(cfg.endpoints):
        yield (
            ("worker_names",),
            f"expected one name per endpoint ({len(cfg.endpoints)}); got {len(cfg.worker_names)}",
        )
    names, metrics = cfg.worker_names, cfg.metrics_endpoints
    if names and metrics and len(metrics) != len(names):
        yield (
            ("metrics_endpoints",),
            f"expected one address per worker name ({len(names)}); got {len(metrics)}",
        )


def client_tls_problems(tls: ClientTlsConfig, at: Path) -> Iterator[tuple[Path, str]]:
    if bool(tls.cert_file) != bool(tls.key_file):
        missing = "key_file" if tls.cert_file else "cert_file"
        yield (*at, missing), "expected cert_file and key_file together; got only one of them"
    if (tls.cert_file or tls.server_name) and not tls.ca_file:
        yield (
            (*at, "ca_file"),
            "expected the CA that signed the workers' certificates (TLS is on with ca_file)",
        )


def _gateway_tls(cfg: GatewayConfig, _: Callable[[Path], Origin]) -> Iterator[tuple[Path, str]]:
    yield from server_tls_problems(cfg.tls, ("tls",))
    yield from restriction_problems(cfg.restricted, ("restricted",), bool(cfg.tls.client_ca_file))
    wc = cfg.worker_client
    yield from client_tls_problems(wc.tls, ("worker_client", "tls"))
    yield from _key_source(wc.key_file, wc.key_env, ("worker_client",))


GATEWAY_CROSS: tuple[Cross, ...] = (_gateway_lists, _gateway_tls)

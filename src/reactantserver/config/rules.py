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

from .schema import GatewayConfig, ServerConfig
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
    (("endpoints", "max_connections"), at_least(1)),
    (("endpoints", "max_concurrent_streams"), at_most(2**31 - 1, at_least(1))),
    (("endpoints", "handshake_timeout_seconds"), positive),
    (("endpoints", "idle_timeout_seconds"), positive),
    (("endpoints", "max_shm_regions"), at_least(1)),
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


WORKER_CROSS: tuple[Cross, ...] = (_worker_ports, _worker_lists)

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
    (("grpc", "max_connections"), at_least(1)),
    (("grpc", "max_concurrent_streams"), at_most(2**31 - 1, at_least(1))),
    (("grpc", "handshake_timeout_seconds"), positive),
    (("grpc", "idle_timeout_seconds"), positive),
    (("worker_client", "request_timeout_seconds"), positive),
    (("worker_client", "max_concurrent_streams"), at_least(1)),
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


def _gateway_tls(cfg: GatewayConfig, _: Callable[[Path], Origin]) -> Iterator[tuple[Path, str]]:
    tls = cfg.tls
    if bool(tls.cert_file) != bool(tls.key_file):
        missing = "key_file" if tls.cert_file else "cert_file"
        yield ("tls", missing), "expected cert_file and key_file together; got only one of them"


GATEWAY_CROSS: tuple[Cross, ...] = (_gateway_lists, _gateway_tls)

"""A listener's security from its configuration: TLS, the authorizer, the start-up warning.

The one place that turns ``endpoints.tls`` / ``endpoints.restricted`` /
``endpoints.gateway`` (a worker) and ``tls`` / ``restricted`` (a gateway) into the
:class:`~.tls.ServerTls` and :class:`~.core.auth.Authorizer` a
:class:`~.server.GuardedServer` is given, reading the keys from their files or
environment variables (:func:`reactantserver.config.certs.read_secret`, the function the
configuration check used). It also says, once at start, what a listener beyond loopback
leaves open (:func:`open_warning`).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Mapping, Sequence

import attrs

from reactantserver.config.certs import read_secret
from reactantserver.config.schema import EndpointsConfig, GatewayTrust, Restriction, TlsConfig

from .core.auth import STATE_CHANGING, Authorizer, Rule, Trust
from .tls import ServerTls

log = logging.getLogger(__name__)


@attrs.frozen
class ListenerSecurity:
    """What a server checks before a call runs: TLS (None: cleartext) and the authorizer
    (None: every group open, no gateway trusted)."""

    tls: ServerTls | None = None
    authorizer: Authorizer | None = None


def server_tls(tls: TlsConfig, what: str) -> ServerTls | None:
    if not tls.cert_file:
        return None
    return ServerTls(tls.cert_file, tls.key_file, tls.client_ca_file, what=what)


def rules(restricted: Sequence[Restriction], env: Mapping[str, str]) -> tuple[Rule, ...]:
    compiled = []
    for entry in restricted:
        key = b""
        if entry.key_file or entry.key_env:
            key = read_secret(entry.key_file, entry.key_env, env).encode()
        compiled.append(
            Rule(frozenset(entry.groups), entry.header, key, frozenset(entry.identities))
        )
    return tuple(compiled)


def trust(gateway: GatewayTrust, env: Mapping[str, str]) -> Trust | None:
    if not (gateway.key_file or gateway.key_env or gateway.identities):
        return None
    key = b""
    if gateway.key_file or gateway.key_env:
        key = read_secret(gateway.key_file, gateway.key_env, env).encode()
    return Trust(key, frozenset(gateway.identities))


def listener_security(
    tls: TlsConfig,
    restricted: Sequence[Restriction],
    env: Mapping[str, str],
    *,
    gateway: GatewayTrust | None = None,
    what: str = "gRPC",
) -> ListenerSecurity:
    """The security of one listener (secrets read now: a bad one fails the start)."""
    compiled = rules(restricted, env)
    trusted = trust(gateway, env) if gateway is not None else None
    authorizer = Authorizer(compiled, trusted) if compiled or trusted else None
    return ListenerSecurity(server_tls(tls, f"{what} TLS"), authorizer)


def is_loopback(host: str) -> bool:
    """Whether a bind address keeps the listener on this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_warning(host: str, security: ListenerSecurity, where: str) -> str | None:
    """What a listener on ``host`` leaves open to the network, as one warning line, with
    how to close it; None on loopback or when nothing is left open."""
    if is_loopback(host) or (security.tls is not None and security.tls.mutual):
        return None  # (under mutual TLS only the operator's CA's clients get in)
    restricted = security.authorizer.restricted if security.authorizer is not None else frozenset()
    open_groups = [g for g in STATE_CHANGING if g not in restricted]
    if not open_groups:
        return None
    return (
        f"gRPC listens on {host} beyond loopback and anyone who reaches it may call the "
        f"groups {', '.join(open_groups)} (load and unload models, change policies, register "
        "shared memory): restrict them with "
        f"{where}: [{{groups: [{', '.join(open_groups)}], header: admin-key, key_file: ...}}] "
        "(docs/security.md), or bind to 127.0.0.1 behind a gateway"
    )


def describe_security(security: ListenerSecurity) -> str:
    """How the listener is protected, for its "listening on" log line."""
    tls = security.tls
    wire = "cleartext h2c" if tls is None else ("mutual TLS" if tls.mutual else "TLS")
    authorizer = security.authorizer
    if authorizer is None or not authorizer.restricted:
        groups = "every API group open"
    else:
        groups = "restricted: " + ", ".join(sorted(authorizer.restricted))
    if authorizer is not None and authorizer.trust is not None:
        groups += "; a gateway is trusted"
    return f"{wire}, {groups}"


def own_client(
    endpoints: EndpointsConfig, env: Mapping[str, str]
) -> tuple[ssl.SSLContext | None, dict[str, str]]:
    """How the worker's own start-up report (``--announce``) reaches its listener: TLS
    without verifying the certificate (it connects to itself, on this machine), its own
    certificate as the client's under mutual TLS, and every restricted group's key."""
    tls = None
    if endpoints.tls.cert_file:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        tls.set_alpn_protocols(["h2"])
        if endpoints.tls.client_ca_file:
            tls.load_cert_chain(endpoints.tls.cert_file, endpoints.tls.key_file)
    keys = {
        entry.header: read_secret(entry.key_file, entry.key_env, env)
        for entry in endpoints.restricted
        if entry.header
    }
    return tls, keys

"""Who a call is, and whether it may do what it asks: restricted API groups, sans-IO.

Why
---
Any client that reaches a listener could unload models, set a model's weight to 1e-300,
compact memory, repack a gateway, or list and remove every shared-memory region. Triton
answers this with *restricted protocol groups* (``--grpc-restricted-protocol=<groups>:
<key>=<value>``): each group of RPCs is either open or needs a header carrying a key. We
keep its groups and names (and add ``control`` and ``placement`` for our control
services), so that what a Triton operator writes means the same here.

Rules
-----
1. **Every RPC is in exactly one group** (:data:`GROUPS`; ``tests/transport/test_auth.py`` checks
   the table against every service the worker and the gateway serve). A group is open
   unless a :class:`Rule` restricts it.
2. **A restricted call passes** with the rule's header carrying its key (compared with
   ``hmac.compare_digest``: the time taken does not say how much of a guess was right),
   or under mutual TLS when the client certificate's CN or one of its subject alternative
   names is one of the rule's ``identities``. A call without the header is UNAUTHENTICATED,
   one with a wrong key (or a certificate not allowed) PERMISSION_DENIED; both messages
   name the group and the header, never the key.
3. **The gateway is trusted by key or certificate** (:class:`Trust`, a worker's
   ``endpoints.gateway``): its calls pass every rule (the gateway checks its own clients
   against its own groups) and may carry ``reactant-owner``, the client they act for.
   A ``reactant-owner`` from anyone else is PERMISSION_DENIED: a client cannot claim to be
   another.
4. **A call's owner** -- whose shared-memory regions it may see, use and remove -- is,
   first that applies: the client the trusted gateway names (``gateway/<owner>``), the
   gateway itself (``gateway``), the client certificate (``tls:<CN or first SAN>``), the
   first rule whose key the call carries (``key:<header>``: everyone holding that key is
   one owner), or else the connection (``conn:<id>``). The server cannot tell apart two
   clients that present nothing, except by their connection: so a region of such a client
   belongs to its connection, and goes when it closes (docs/security.md says why).

What it costs: nothing when no rule and no trust is configured (the server then uses the
connection's owner and does not call :meth:`Authorizer.decide`). Otherwise one pass over
a request's headers; and a client that sends the same header block again (they do) gets
its admission from the server's cache of the last one, without a new decision.
"""

from __future__ import annotations

import hmac
import itertools
import os
from collections.abc import Iterable, Mapping, Sequence

import attrs

from reactantserver.grpcwire import StatusCode

from .framing import Refusal
from .limits import Fault

#: Header a gateway's key travels in, and the one naming the client it acts for.
GATEWAY_KEY = "reactant-gateway-key"
OWNER = "reactant-owner"
#: Longest ``reactant-owner`` accepted (an owner is ``tls:`` + a certificate name, at most).
MAX_OWNER = 512

#: Every RPC the worker and the gateway serve, by service, to its group (rule 1).
GROUPS: Mapping[str, Mapping[str, str]] = {
    "inference.GRPCInferenceService": {
        "ServerLive": "health",
        "ServerReady": "health",
        "ModelReady": "health",
        "ServerMetadata": "metadata",
        "ModelMetadata": "metadata",
        "ModelInfer": "inference",
        "ModelStreamInfer": "inference",
        "ModelConfig": "model-config",
        "ModelStatistics": "statistics",
        "RepositoryIndex": "model-repository",
        "RepositoryModelLoad": "model-repository",
        "RepositoryModelUnload": "model-repository",
        "SystemSharedMemoryStatus": "shared-memory",
        "SystemSharedMemoryRegister": "shared-memory",
        "SystemSharedMemoryUnregister": "shared-memory",
        "CudaSharedMemoryStatus": "shared-memory",
        "CudaSharedMemoryRegister": "shared-memory",
        "CudaSharedMemoryUnregister": "shared-memory",
        "IsSameIPCNamespace": "shared-memory",
        "TraceSetting": "trace",
        "LogSettings": "logging",
    },
    "reactant_control.ControlService": {
        # Where the admin HTTP port listens (``reactantserver report``): what the server
        # is, read-only, like ServerMetadata.
        "AdminEndpoint": "metadata",
        "ModelControlStatus": "control",
        "SetModelResidency": "control",
        "SetModelPolicy": "control",
        "CompactMemory": "control",
    },
    "reactant_control.GatewayControlService": {
        "GetSchedulingStatus": "placement",
        "SetSchedulingPolicy": "placement",
        "SetModelPlacement": "placement",
        "Repack": "placement",
    },
    "grpc.health.v1.Health": {"Check": "health", "Watch": "health"},
    "grpc.reflection.v1.ServerReflection": {"ServerReflectionInfo": "metadata"},
    "grpc.reflection.v1alpha.ServerReflection": {"ServerReflectionInfo": "metadata"},
}

#: The groups whose RPCs change the server's state or reach another client's data: what
#: a listener beyond loopback should restrict (the start-up warning names them).
STATE_CHANGING: tuple[str, ...] = (
    "model-repository",
    "shared-memory",
    "control",
    "placement",
    "trace",
    "logging",
)


def group_of(path: str) -> str | None:
    """The group of ``/package.Service/Method`` (None: not an RPC of the table)."""
    _, service, method = path.split("/", 2) if path.count("/") == 2 else ("", "", "")
    return GROUPS.get(service, {}).get(method)


@attrs.frozen
class Rule:
    """A restriction, compiled: its groups, the header and key, the allowed certificates."""

    groups: frozenset[str]
    header: str = ""
    key: bytes = b""
    identities: frozenset[str] = frozenset()


@attrs.frozen
class Trust:
    """How the gateway is known (rule 3): its key, or its certificate names."""

    key: bytes = b""
    identities: frozenset[str] = frozenset()


#: A fresh prefix per process, so connection owners of two processes (two gateways in
#: front of one worker) never collide.
_RUN = os.urandom(4).hex()
_SERIAL = itertools.count(1)


@attrs.frozen
class Peer:
    """What a connection says of its client: certificate names and its own id."""

    #: The verified client certificate's CN and SANs; () without mutual TLS.
    names: tuple[str, ...] = ()
    #: ``conn:<id>``, unique in this process's life (and across processes).
    connection: str = attrs.field(factory=lambda: f"conn:{_RUN}-{next(_SERIAL)}")

    @property
    def owner(self) -> str:
        """The owner of a call that presents nothing more than this connection."""
        return f"tls:{self.names[0]}" if self.names else self.connection


def _equal(sent: str, key: bytes) -> bool:
    return hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), key)


class Authorizer:
    """Rules 2-4 of the module docstring, over one server's rules and trust."""

    def __init__(self, rules: Sequence[Rule] = (), trust: Trust | None = None) -> None:
        self.rules = tuple(rules)
        self.trust = trust
        self._by_group: dict[str, Rule] = {}
        for rule in self.rules:
            for group in rule.groups:
                if group in self._by_group:
                    raise ValueError(f"group {group!r} is restricted twice")
                self._by_group[group] = rule
        #: The headers a decision reads (lower case, as HTTP/2 sends them).
        self._watched = frozenset({OWNER, GATEWAY_KEY} | {r.header for r in self.rules if r.header})

    @property
    def restricted(self) -> frozenset[str]:
        return frozenset(self._by_group)

    def decide(self, path: str, headers: Iterable[tuple[str, str]], peer: Peer) -> str | Refusal:
        """The call's owner if it may go ahead, else the refusal to answer it with."""
        watched = self._watched
        sent: dict[str, str] = {}
        for name, value in headers:
            if name in watched and name not in sent:
                sent[name] = value
        trust = self.trust
        gateway = trust is not None and (
            bool(trust.identities.intersection(peer.names))
            or (bool(trust.key) and GATEWAY_KEY in sent and _equal(sent[GATEWAY_KEY], trust.key))
        )
        claimed = sent.get(OWNER)
        if gateway:
            if claimed is None:
                return "gateway"
            if not claimed or len(claimed) > MAX_OWNER or not claimed.isprintable():
                return _refuse(
                    StatusCode.INVALID_ARGUMENT,
                    f"{OWNER} must be 1 to {MAX_OWNER} printable characters",
                )
            return f"gateway/{claimed}"
        if claimed is not None:
            return _refuse(
                StatusCode.PERMISSION_DENIED,
                f"the {OWNER} header is honoured only from this server's gateway "
                f"(the {GATEWAY_KEY} header or its certificate)",
            )
        group = group_of(path)
        rule = self._by_group.get(group) if group is not None else None
        if rule is not None and not rule.identities.intersection(peer.names):
            rpc = path.rsplit("/", 1)[-1]
            given = sent.get(rule.header) if rule.header else None
            if given is None:
                how = f"send the header {rule.header!r} with its key" if rule.header else ""
                if rule.identities:
                    how += (" or " if how else "") + "connect with an allowed client certificate"
                return _refuse(
                    StatusCode.UNAUTHENTICATED if rule.header else StatusCode.PERMISSION_DENIED,
                    f"{rpc} is in the restricted group {group!r}: {how}",
                )
            if not _equal(given, rule.key):
                return _refuse(
                    StatusCode.PERMISSION_DENIED,
                    f"{rpc} is in the restricted group {group!r}: the {rule.header!r} header "
                    "does not carry its key",
                )
        if peer.names:
            return peer.owner
        for candidate in self.rules:
            presented = sent.get(candidate.header) if candidate.header else None
            if presented is not None and _equal(presented, candidate.key):
                return f"key:{candidate.header}"
        return peer.connection


def _refuse(code: StatusCode, message: str) -> Refusal:
    return Refusal(code, message, Fault.UNAUTHORIZED)

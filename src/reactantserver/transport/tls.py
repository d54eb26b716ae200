"""TLS and mutual TLS for the gRPC listeners and the connections to workers (``ssl``).

Theory of operation
-------------------
**A listener** (:class:`ServerTls`) serves TLS 1.2 or newer and offers exactly one
application protocol, ``h2`` (ALPN, RFC 7301; gRPC requires it). A client that does not
negotiate ``h2`` -- one that offers no ALPN or only ``http/1.1`` -- is refused by the
connection (:func:`negotiated_h2`, checked in :mod:`.h2guard` before any HTTP/2 byte is
read), and a cleartext client never gets past the handshake: its HTTP/2 preface is not a
ClientHello. With ``client_ca_file`` every client must present a certificate signed by
that CA (``CERT_REQUIRED``): one without is refused in the handshake.

**Certificates are reloaded when their files change**, without a restart and without
touching connections that are open: asyncio's server is given one *front* context whose
``sni_callback`` -- which OpenSSL calls on every ClientHello, with or without a server
name -- swaps in the current context (:meth:`ServerTls.context`). That context is rebuilt
when any file's (device, inode, size, mtime) changed since the last build: a renamed-in
file (what cert-manager and certbot do) and a rewritten one both count. A rebuild that
fails -- a certificate written before its key, a half-written file -- keeps the previous
context and logs one warning per set of files, and is tried again on the next handshake
after the files change again. Cost: one ``stat`` per file per handshake (microseconds,
against the milliseconds of the handshake itself); nothing per request.

**A client** (:class:`ClientTls`: the gateway to its workers, ``reactantserver.client``)
verifies the server's certificate against ``ca_file`` and its name (``server_name``, or
the host connected to), offers ``h2`` and presents ``cert_file``/``key_file`` when set
(mutual TLS). Its context is reloaded on change the same way, for the next connection.

**Identity.** :func:`certificate_names` reads a verified peer certificate's subject
common name and subject alternative names (DNS, URI, email, IP), which restricted API
groups and shared-memory ownership use (:mod:`.core.auth`).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

ALPN = "h2"

_Signature = tuple[tuple[int, int, int, int], ...]


def _signature(paths: Sequence[str]) -> _Signature:
    """What changes when any of ``paths`` is replaced or rewritten (missing: zeros)."""
    marks = []
    for path in paths:
        try:
            st = os.stat(path)
            marks.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            marks.append((0, 0, 0, 0))
    return tuple(marks)


class _Reloading:
    """A context built from files, rebuilt when their signature changes (module doc)."""

    def __init__(self, paths: Sequence[str], what: str) -> None:
        self._paths = tuple(p for p in paths if p)
        self._what = what
        self._signature = _signature(self._paths)
        #: Built now: a file that cannot be used fails the start, not the first handshake.
        self._context = self._build()
        self._failed: _Signature | None = None
        self.reloads = 0

    def _build(self) -> ssl.SSLContext:  # pragma: no cover -- every subclass has its own
        raise NotImplementedError

    def context(self) -> ssl.SSLContext:
        """The current context, rebuilt first if the files changed."""
        signature = _signature(self._paths)
        if signature != self._signature and signature != self._failed:
            try:
                context = self._build()
            except (OSError, ssl.SSLError, ValueError) as exc:
                self._failed = signature
                log.warning(
                    "%s: the files changed but cannot be loaded (%s); still using the "
                    "previous certificate",
                    self._what,
                    getattr(exc, "reason", None) or exc,
                )
            else:
                self._context, self._signature, self._failed = context, signature, None
                self.reloads += 1
                log.info("%s: certificate files reloaded", self._what)
        return self._context


class ServerTls(_Reloading):
    """A listener's TLS (module docstring); ``client_ca_file`` turns on mutual TLS."""

    def __init__(
        self, cert_file: str, key_file: str, client_ca_file: str = "", *, what: str = "TLS"
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        super().__init__((cert_file, key_file, client_ca_file), what)

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols([ALPN])
        return context

    def listener_context(self) -> ssl.SSLContext:
        """The front context asyncio's server is given: each handshake gets the current one."""
        front = self._build()

        def choose(connection: Any, server_name: str | None, _: ssl.SSLContext) -> None:
            connection.context = self.context()

        front.sni_callback = choose
        return front


class ClientTls(_Reloading):
    """A client's TLS (module docstring)."""

    def __init__(
        self,
        ca_file: str,
        cert_file: str = "",
        key_file: str = "",
        server_name: str = "",
        *,
        what: str = "TLS client",
    ) -> None:
        self.ca_file = ca_file
        self.cert_file = cert_file
        self.key_file = key_file
        self.server_name = server_name
        super().__init__((ca_file, cert_file, key_file), what)

    def _build(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file or None)
        context.set_alpn_protocols([ALPN])
        return context

    def server_hostname(self, host: str) -> str:
        """The name the server's certificate must carry when connecting to ``host``."""
        return self.server_name or host.strip("[]")


def negotiated_h2(transport: Any) -> bool | None:
    """For a TLS transport, whether ALPN chose ``h2``; None for a cleartext one."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    return bool(ssl_object.selected_alpn_protocol() == ALPN)


def certificate_names(transport: Any) -> tuple[str, ...]:
    """A TLS peer's verified certificate's names: the subject CN first, then each
    subject alternative name; () without a verified certificate."""
    peer = transport.get_extra_info("peercert")
    if not peer:
        return ()
    names: list[str] = []
    for rdn in peer.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.append(str(value))
    for _, value in peer.get("subjectAltName", ()):
        if value not in names:
            names.append(str(value))
    return tuple(names)


def client_tls(
    tls: ClientTls | ssl.SSLContext | None, host: str
) -> tuple[ssl.SSLContext | None, str | None]:
    """``(ssl, server_hostname)`` for ``loop.create_connection`` to ``host``."""
    if tls is None:
        return None, None
    if isinstance(tls, ssl.SSLContext):
        return tls, host.strip("[]")
    return tls.context(), tls.server_hostname(host)


def check_h2(transport: Any, what: str) -> None:
    """Refuse a client-side TLS connection on which the server did not choose ``h2``."""
    if negotiated_h2(transport) is False:
        transport.close()
        raise ConnectionError(f"{what} did not negotiate HTTP/2 (ALPN h2) over TLS")

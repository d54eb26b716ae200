"""What the security suites share: raw gRPC calls with any metadata, tritonclient and
grpcurl with certificates, shared-memory objects under /dev/shm, and waiting for a
server-side condition."""

from __future__ import annotations

import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as tc
from test_grpcurl import GRPCURL
from tls_certs import Pki

SHM = Path("/dev/shm")
X = np.arange(16, dtype=np.float32).reshape(1, 16)


def channel(target: str, pki: Pki | None = None, client: str | None = None) -> grpc.Channel:
    """A grpcio channel: cleartext without ``pki``, TLS with it (mTLS with ``client``)."""
    if pki is None:
        return grpc.insecure_channel(target)
    cert = key = None
    if client is not None:
        pair = pki.client(client)
        cert, key = pair.cert.read_bytes(), pair.key.read_bytes()
    creds = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key, cert)
    return grpc.secure_channel(target, creds)


def call(
    target: str,
    path: str,
    body: bytes = b"",
    *,
    pki: Pki | None = None,
    client: str | None = None,
    metadata: Sequence[tuple[str, str]] = (),
    timeout: float = 10.0,
) -> tuple[str, str]:
    """One unary call of ``path`` with serialized ``body``: (status name, details)."""
    with channel(target, pki, client) as ch:
        method = ch.unary_unary(path, request_serializer=None, response_deserializer=None)
        try:
            method(body, metadata=tuple(metadata), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


def triton(
    target: str, pki: Pki | None = None, client: str | None = None
) -> tc.InferenceServerClient:
    """tritonclient as a Triton user configures it: ``ssl=True``, root certificates, and a
    client certificate chain and key for mutual TLS."""
    if pki is None:
        return tc.InferenceServerClient(target)
    pair = pki.client(client) if client else None
    return tc.InferenceServerClient(
        target,
        ssl=True,
        root_certificates=str(pki.ca_file),
        private_key=str(pair.key) if pair else None,
        certificate_chain=str(pair.cert) if pair else None,
    )


def grpcurl(
    target: str, pki: Pki | None, client: str | None, *args: str
) -> subprocess.CompletedProcess[str]:
    """grpcurl with ``-cacert`` (and ``-cert``/``-key``), or ``-plaintext``."""
    tls: list[str] = ["-plaintext"]
    if pki is not None:
        tls = ["-cacert", str(pki.ca_file)]
        if client is not None:
            pair = pki.client(client)
            tls += ["-cert", str(pair.cert), "-key", str(pair.key)]
    return subprocess.run(
        [GRPCURL, *tls, *args[:-1], target, args[-1]] if args else [GRPCURL, *tls, target, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def x_input(region: str | None = None) -> list[tc.InferInput]:
    inp = tc.InferInput("x", [1, 16], "FP32")
    if region is None:
        inp.set_data_from_numpy(X)
    else:
        inp.set_shared_memory(region, X.nbytes)
    return [inp]


@contextmanager
def shm_object(data: bytes, prefix: str = "reactantserver-test-") -> Iterator[tuple[str, Path]]:
    """A /dev/shm object holding ``data``: (its key, its path); removed afterwards."""
    name = f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:10]}"
    path = SHM / name
    path.write_bytes(data)
    try:
        yield "/" + name, path
    finally:
        path.unlink(missing_ok=True)


def server_serial(host: str, port: int, ca_file: Path, alpn: Sequence[str] = ("h2",)) -> str:
    """The serial number of the certificate a new TLS handshake gets (the server asks for
    no client certificate here, or refuses after the handshake)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols(list(alpn))
    import socket

    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        cert = tls.getpeercert()
        assert cert is not None
        return str(cert["serialNumber"])

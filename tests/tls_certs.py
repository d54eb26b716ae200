"""Test certificates, made at test time with ``trustme`` (the test extra; it uses
``cryptography``): a CA, a server certificate for 127.0.0.1 / localhost, and client
certificates by name -- all as PEM files, the way an operator hands them to a server."""

from __future__ import annotations

from pathlib import Path

import attrs
import trustme


@attrs.frozen
class Pair:
    cert: Path
    key: Path


@attrs.frozen
class Pki:
    """Files under ``directory``: ``ca.pem``, ``server.pem``/``server.key`` and, per
    client name, ``<name>.pem``/``<name>.key``; ``other_ca.pem`` is a CA nobody trusts."""

    directory: Path
    ca: trustme.CA
    ca_file: Path
    other_ca_file: Path
    server: Pair
    clients: dict[str, Pair]

    def client(self, name: str) -> Pair:
        return self.clients[name]

    def issue_server(self, label: str) -> Pair:
        """Another server certificate (same names, another serial), for reload tests."""
        return _write(self.directory, label, self.ca.issue_cert("127.0.0.1", "localhost", "::1"))


def _write(directory: Path, name: str, cert: trustme.LeafCert) -> Pair:
    pem, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(pem))
    key.write_bytes(cert.private_key_pem.bytes())
    return Pair(pem, key)


def make_pki(directory: Path, clients: tuple[str, ...] = ("alice", "bob", "ops", "gateway")) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    other = directory / "other_ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    server = _write(directory, "server", ca.issue_cert("127.0.0.1", "localhost", "::1"))
    issued = {
        name: _write(directory, name, ca.issue_cert(f"{name}.clients.test", common_name=name))
        for name in clients
    }
    return Pki(directory, ca, ca_file, other, server, issued)

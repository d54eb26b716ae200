"""A hostile client against a worker, over real sockets: TLS, restricted groups, shared memory.

The server is the real ``serve_grpc`` over the real ``Service`` (``tests/wire_server.py``:
a subprocess, over the fake host), configured as an operator would in ``endpoints:``;
the clients are tritonclient (``ssl=True``, root certificates, a client certificate),
grpcurl (``-cacert``, ``-cert``/``-key``), grpcio and plain sockets. Certificates are made
at test time (``tests/tls_certs.py``, trustme). docs/security.md is the page this checks.
The gateway's side of the same is ``tests/transport/test_security_gateway.py``.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tc
from clocks import wait_until
from security_support import (
    X,
    call,
    grpcurl,
    server_serial,
    shm_object,
    triton,
    x_input,
)
from tls_certs import Pki, make_pki
from tritonclient.utils import InferenceServerException
from wire_server import WireServer, running_wire_server

from reactantserver.client import Client, ClientTls
from reactantserver.errors import PermissionDenied, Unauthenticated, Unavailable
from reactantserver.h2.wire import PREFACE
from reactantserver.protocol import inference as pb

ADMIN_KEY = "admin-key-0123456789abcdef"
STATS_KEY = "stats-key-fedcba9876543210"
INFER = "/inference.GRPCInferenceService/"
CONTROL = "/reactant_control.ControlService/"


def code(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[WireServer]:
    """Mutual TLS; model-repository and control need admin-key (or the ops certificate),
    statistics needs stats-key; everything else is open."""
    tmp = tmp_path_factory.mktemp("locked")
    (tmp / "admin.key").write_text(ADMIN_KEY + "\n")
    (tmp / "stats.key").write_text(STATS_KEY + "\n")
    tls = {
        "cert_file": str(pki.server.cert),
        "key_file": str(pki.server.key),
        "client_ca_file": str(pki.ca_file),
    }
    restricted = [
        {
            "groups": ["model-repository", "control"],
            "header": "admin-key",
            "key_file": str(tmp / "admin.key"),
            "identities": ["ops"],
        },
        {"groups": ["statistics"], "header": "stats-key", "key_file": str(tmp / "stats.key")},
    ]
    with running_wire_server(tmp, tls=tls, restricted=restricted) as server:
        yield server


# ------------------------------------------------------------------------------ TLS


def test_a_cleartext_client_is_refused_by_a_tls_listener(locked: WireServer, pki: Pki) -> None:
    """tritonclient without ssl gets UNAVAILABLE; an h2c preface on a raw socket gets no
    HTTP/2 answer, only a closed connection (it never passes the TLS handshake)."""
    client = triton(locked.url)
    with pytest.raises(InferenceServerException) as caught:
        client.is_server_live()
    assert code(caught.value) == "UNAVAILABLE"
    client.close()
    with socket.create_connection(("127.0.0.1", locked.port), timeout=10) as raw:
        raw.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
        assert b"SETTINGS" not in answer and not answer.startswith(b"\x00\x00")
    assert locked.alive()


def test_a_client_without_a_certificate_is_refused_under_mutual_tls(
    locked: WireServer, pki: Pki
) -> None:
    """No certificate, or one signed by a CA the server does not trust: refused in the
    handshake (tritonclient, our client, grpcurl); with a good one, served."""
    for client in (triton(locked.url, pki), triton(locked.url, pki, None)):
        with pytest.raises(InferenceServerException) as caught:
            client.is_server_live()
        assert code(caught.value) == "UNAVAILABLE"
        client.close()
    with (
        Client(locked.url, tls=ClientTls(str(pki.ca_file)), timeout=10) as ours,
        pytest.raises(Unavailable),
    ):
        ours.is_server_live()
    stranger = make_pki(pki.directory / "stranger", clients=("mallory",))
    foreign = stranger.client("mallory")
    with (
        Client(
            locked.url,
            tls=ClientTls(str(pki.ca_file), str(foreign.cert), str(foreign.key)),
            timeout=10,
        ) as ours,  # fmt: skip
        pytest.raises(Unavailable),
    ):
        ours.is_server_live()
    done = grpcurl(locked.url, pki, None, "-connect-timeout", "1", "list")
    assert done.returncode != 0
    alice = triton(locked.url, pki, "alice")
    assert alice.is_server_live()
    alice.close()


def test_tritonclient_and_grpcurl_speak_mutual_tls(locked: WireServer, pki: Pki) -> None:
    client = triton(locked.url, pki, "alice")
    result = client.infer("double", x_input())
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * X)
    client.close()
    listed = grpcurl(locked.url, pki, "alice", "list")
    assert listed.returncode == 0, listed.stderr
    assert "inference.GRPCInferenceService" in listed.stdout
    ready = grpcurl(locked.url, pki, "alice", "-d", '{"name": "double"}',
                    "inference.GRPCInferenceService/ModelReady")  # fmt: skip
    assert ready.returncode == 0, ready.stderr
    assert json.loads(ready.stdout) == {"ready": True}
    with Client(locked.url, tls=ClientTls(str(pki.ca_file), str(pki.client("bob").cert),
                                          str(pki.client("bob").key)), timeout=10) as ours:  # fmt: skip
        np.testing.assert_array_equal(ours.infer("double", {"x": X})["y"], 2 * X)


def test_a_tls_client_that_does_not_negotiate_h2_is_closed(tmp_path: Path, pki: Pki) -> None:
    """ALPN http/1.1 only: the connection is closed before any HTTP/2, and counted."""
    tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    with running_wire_server(tmp_path, tls=tls) as server:
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.set_alpn_protocols(["http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            assert conn.selected_alpn_protocol() is None
            conn.sendall(PREFACE)
            assert conn.recv(4096) == b""
        wait_until(
            lambda: (
                server.metrics().get('worker_grpc_client_errors_total{kind="tls_refused"}', 0) == 1
            ),
            what="the refusal counted",
        )


def test_a_new_handshake_gets_the_new_certificate(tmp_path: Path, pki: Pki) -> None:
    """The certificate files replaced while serving: the next handshake gets the new
    certificate, a connection already open keeps working, and files that cannot be loaded
    (a certificate without its key yet) keep the last good certificate."""
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    with running_wire_server(
        tmp_path, tls={"cert_file": str(cert), "key_file": str(key)}
    ) as server:
        first = server_serial("127.0.0.1", server.port, pki.ca_file)
        client = triton(server.url, pki)
        assert client.is_server_live()
        fresh = pki.issue_server("fresh")
        # A certificate whose key has not arrived yet: refused, the old one stays.
        (tmp_path / "next.pem").write_bytes(fresh.cert.read_bytes())
        os.replace(tmp_path / "next.pem", cert)
        assert server_serial("127.0.0.1", server.port, pki.ca_file) == first
        assert "cannot be loaded" in server.log()
        (tmp_path / "next.key").write_bytes(fresh.key.read_bytes())
        os.replace(tmp_path / "next.key", key)
        second = server_serial("127.0.0.1", server.port, pki.ca_file)
        assert second != first
        assert client.is_server_live()  # the connection opened before still serves
        client.close()
        assert "certificate files reloaded" in server.log()


# ------------------------------------------------------------------------------ restricted groups


@pytest.mark.parametrize(
    ("path", "group", "header", "key"),
    [
        (INFER + "RepositoryIndex", "model-repository", "admin-key", ADMIN_KEY),
        (INFER + "RepositoryModelUnload", "model-repository", "admin-key", ADMIN_KEY),
        (CONTROL + "CompactMemory", "control", "admin-key", ADMIN_KEY),
        (CONTROL + "SetModelPolicy", "control", "admin-key", ADMIN_KEY),
        (INFER + "ModelStatistics", "statistics", "stats-key", STATS_KEY),
    ],
)
def test_each_restricted_group_wants_its_own_key(
    locked: WireServer, pki: Pki, path: str, group: str, header: str, key: str
) -> None:
    """No header: UNAUTHENTICATED; a wrong key, or another group's: PERMISSION_DENIED --
    each message names the group and the header, never the key; the right key passes."""
    rpc = path.rsplit("/", 1)[1]
    missing = call(locked.url, path, pki=pki, client="alice")
    assert missing[0] == "UNAUTHENTICATED"
    assert f"{rpc} is in the restricted group {group!r}" in missing[1]
    assert f"send the header {header!r}" in missing[1]
    other = STATS_KEY if key == ADMIN_KEY else ADMIN_KEY
    for wrong in ("guess", key[:-1], other):
        denied = call(locked.url, path, pki=pki, client="alice", metadata=[(header, wrong)])
        assert denied[0] == "PERMISSION_DENIED", wrong
        assert f"the {header!r} header does not carry its key" in denied[1]
        assert wrong not in denied[1] and key not in denied[1]
    status, _ = call(locked.url, path, pki=pki, client="alice", metadata=[(header, key)])
    assert status not in ("UNAUTHENTICATED", "PERMISSION_DENIED")


def test_open_groups_stay_open_and_an_allowed_certificate_needs_no_key(
    locked: WireServer, pki: Pki
) -> None:
    alice = triton(locked.url, pki, "alice")
    assert alice.is_model_ready("double")  # health, metadata, inference: open
    assert alice.get_model_metadata("double").name == "double"
    with pytest.raises(InferenceServerException) as caught:
        alice.get_model_repository_index()
    assert code(caught.value) == "UNAUTHENTICATED"
    assert "or connect with an allowed client certificate" in caught.value.message()
    assert alice.get_model_repository_index(headers={"admin-key": ADMIN_KEY}).models
    alice.close()
    ops = triton(locked.url, pki, "ops")  # the ops certificate is in identities
    assert ops.get_model_repository_index().models
    ops.close()
    assert call(locked.url, CONTROL + "ModelControlStatus", pki=pki, client="ops")[0] == "OK"


def test_our_client_sends_a_key_and_reads_the_refusals(locked: WireServer, pki: Pki) -> None:
    tls = ClientTls(str(pki.ca_file), str(pki.client("alice").cert), str(pki.client("alice").key))
    with (
        Client(locked.url, tls=tls, timeout=10) as plain,
        pytest.raises(Unauthenticated, match="restricted group 'model-repository'"),
    ):
        plain.repository_index()
    with (
        Client(locked.url, tls=tls, timeout=10, metadata={"admin-key": "nope"}) as wrong,
        pytest.raises(PermissionDenied, match="does not carry its key"),
    ):
        wrong.repository_index()
    with Client(locked.url, tls=tls, timeout=10, metadata={"admin-key": ADMIN_KEY}) as admin:
        assert admin.repository_index()


def test_nobody_but_the_gateway_may_name_an_owner(locked: WireServer, pki: Pki) -> None:
    """``reactant-owner`` claims another client's shared memory: refused from a client."""
    status, message = call(
        locked.url,
        INFER + "SystemSharedMemoryStatus",
        pki=pki,
        client="alice",
        metadata=[("reactant-owner", "tls:bob")],
    )
    assert status == "PERMISSION_DENIED"
    assert "honoured only from this server's gateway" in message


# ------------------------------------------------------------------------------ shared memory


def test_one_client_cannot_see_use_or_remove_anothers_region(locked: WireServer, pki: Pki) -> None:
    """alice's region (her certificate is her identity) is invisible to bob, unusable by
    him in a request, and his unregister -- by name or all -- leaves it alone; they may
    both use the same region name for their own objects."""
    with shm_object(X.tobytes()) as (a_key, _), shm_object((3 * X).tobytes()) as (b_key, _):
        alice, bob = triton(locked.url, pki, "alice"), triton(locked.url, pki, "bob")
        alice.register_system_shared_memory("in", a_key, X.nbytes)
        alice.register_system_shared_memory("alice-only", a_key, X.nbytes)
        assert bob.get_system_shared_memory_status().regions == {}
        with pytest.raises(InferenceServerException) as caught:
            bob.infer("double", x_input("alice-only"))
        assert code(caught.value) == "FAILED_PRECONDITION"
        assert "'alice-only' is not registered" in caught.value.message()
        bob.unregister_system_shared_memory("alice-only")
        bob.unregister_system_shared_memory()
        assert set(alice.get_system_shared_memory_status().regions) == {"in", "alice-only"}
        bob.register_system_shared_memory("in", b_key, X.nbytes)  # the same name, his own
        np.testing.assert_array_equal(alice.infer("double", x_input("in")).as_numpy("y"), 2 * X)
        np.testing.assert_array_equal(bob.infer("double", x_input("in")).as_numpy("y"), 6 * X)
        alice.unregister_system_shared_memory()
        assert set(bob.get_system_shared_memory_status().regions) == {"in"}
        bob.unregister_system_shared_memory()
        alice.close()
        bob.close()


def test_a_connection_is_the_owner_of_a_client_that_presents_nothing(tmp_path: Path) -> None:
    """Cleartext, no key: each connection is its own owner, and its regions go (their file
    descriptors closed) when it closes. (grpcio shares one connection among the channels
    of a process unless told not to: those are one owner.)"""
    own = [("grpc.use_local_subchannel_pool", 1)]
    with running_wire_server(tmp_path) as server, shm_object(X.tobytes()) as (key, _):
        before = server.open_fds()
        first = tc.InferenceServerClient(server.url, channel_args=own)
        second = tc.InferenceServerClient(server.url, channel_args=own)
        first.register_system_shared_memory("in", key, X.nbytes)
        assert second.get_system_shared_memory_status().regions == {}
        with pytest.raises(InferenceServerException):
            second.infer("double", x_input("in"))
        np.testing.assert_array_equal(first.infer("double", x_input("in")).as_numpy("y"), 2 * X)
        assert server.open_fds() >= before + 1
        first.close()
        second.close()
        wait_until(lambda: server.open_fds() <= before, what="the region's descriptor closed")


def test_an_object_outside_the_prefix_is_neither_read_nor_written(tmp_path: Path) -> None:
    """The issue's attack: another program's /dev/shm object (the victim) registered as a
    region, read back through ``double`` and overwritten with the outputs. With the
    prefix off (``shm_key_prefix: ""``, an operator's explicit choice) it works as the
    issue showed; with the default ``/reactantserver-`` it is refused before anything is
    opened, and IsSameIPCNamespace will not say whether the object exists."""
    secret = np.full((1, 16), 7.0, dtype=np.float32)
    with shm_object(secret.tobytes(), prefix="victim-") as (victim, path):
        with running_wire_server(tmp_path, shm_key_prefix="") as open_server:
            client = triton(open_server.url)
            client.register_system_shared_memory("v", victim, secret.nbytes)
            out = tc.InferRequestedOutput("y")
            out.set_shared_memory("v", secret.nbytes)
            client.infer("double", x_input("v"), outputs=[out])
            np.testing.assert_array_equal(  # read 7s, wrote 14s back over them
                np.frombuffer(path.read_bytes(), np.float32), np.full(16, 14.0)
            )
            client.close()
        path.write_bytes(secret.tobytes())
        with running_wire_server(tmp_path) as server:
            client = triton(server.url)
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("v", victim, secret.nbytes)
            assert code(caught.value) == "INVALID_ARGUMENT"
            assert "only keys that start with '/reactantserver-'" in caught.value.message()
            for key in (victim, "/victim-does-not-exist"):  # the same answer either way
                status, message = call(
                    server.url,
                    INFER + "IsSameIPCNamespace",
                    bytes(pb.IsSameIpcNamespaceRequest(name=key)),
                )
                assert status == "INVALID_ARGUMENT", message
            assert str(path) not in _open_files(server.pid)  # the server holds nothing of it
            client.close()
        assert path.read_bytes() == secret.tobytes()


def _open_files(pid: int) -> set[str]:
    """What the server process holds open (``/proc/PID/fd``)."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            held.add(os.readlink(fd))
        except OSError:
            continue  # closed meanwhile
    return held


def test_our_clients_regions_are_under_the_prefix(tmp_path: Path) -> None:
    """``reactantserver.client`` creates its objects under ``/reactantserver-``, which a
    server accepts by default."""
    with (
        running_wire_server(tmp_path) as server,
        Client(server.url, timeout=10) as client,
        client.shared_memory(4096) as region,
    ):
        assert region.key.startswith("/reactantserver-")
        out = client.infer("double", {"x": X}, ["y"], shm=region)
        np.testing.assert_array_equal(out["y"], 2 * X)

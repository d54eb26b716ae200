"""A hostile client against a gateway, over real sockets: TLS, restricted groups, and one
client's shared memory kept from another's through the gateway's fan-out.

Two workers (the real ``serve_grpc`` and ``Service`` over the fake host, in threads) serve
mutual TLS and trust the gateway by its key (``endpoints.gateway``); the gateway serves
mutual TLS to its clients, restricts its control groups, and speaks mutual TLS to the
workers with a certificate of its own (``worker_client.tls``). The worker's side of the
same is ``tests/transport/test_security.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest
from clocks import wait_until
from gateway_harness import PAIRED, PAIRED_KEY_ENV, FakeWorker, fake_workers, running_gateway
from security_support import X, call, grpcurl, shm_object, triton, x_input
from tls_certs import Pki, make_pki
from tritonclient.utils import InferenceServerException
from worker_harness import free_port

from reactantserver.config.schema import (
    ClientTlsConfig,
    EndpointsConfig,
    GatewayConfig,
    GatewayTrust,
    ListenConfig,
    LoggingConfig,
    Restriction,
    TlsConfig,
)

ADMIN_KEY = "gateway-admin-key-0123456789"
INFER = "/inference.GRPCInferenceService/"
PLACEMENT = "/reactant_control.GatewayControlService/"


def code(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def regions(workers: list[FakeWorker]) -> list[set[tuple[str, str]]]:
    """Every worker's (owner, region) pairs, read on the worker itself."""
    return [{(owner, r.name) for owner, r in w.service.registry.held()} for w in workers]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[tuple[str, list[FakeWorker]]]:
    tmp = tmp_path_factory.mktemp("gateway")
    (tmp / "admin.key").write_text(ADMIN_KEY)
    tls = TlsConfig(
        cert_file=str(pki.server.cert),
        key_file=str(pki.server.key),
        client_ca_file=str(pki.ca_file),
    )
    endpoints = EndpointsConfig(tls=tls, gateway=GatewayTrust(key_env=PAIRED_KEY_ENV))
    with fake_workers(2, endpoints=endpoints) as workers:
        gateway_cert = pki.client("gateway")
        config = GatewayConfig(
            listen=ListenConfig(grpc="127.0.0.1:0", metrics=f"127.0.0.1:{free_port()}"),
            endpoints=tuple(w.address for w in workers),
            worker_names=("w0", "w1"),
            health_interval_seconds=60.0,
            logging=LoggingConfig(format="text"),
            tls=tls,
            restricted=(
                Restriction(
                    groups=("placement", "model-repository"),
                    header="admin-key",
                    key_file=str(tmp / "admin.key"),
                ),
            ),
            worker_client=attrs.evolve(
                PAIRED,
                tls=ClientTlsConfig(
                    ca_file=str(pki.ca_file),
                    cert_file=str(gateway_cert.cert),
                    key_file=str(gateway_cert.key),
                ),
            ),
        )
        with running_gateway(config) as gw:
            yield gw.grpc, workers


def test_the_gateway_refuses_cleartext_and_clients_without_a_certificate(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    target, _ = fleet
    for client in (triton(target), triton(target, pki)):
        with pytest.raises(InferenceServerException) as caught:
            client.is_server_live()
        assert code(caught.value) == "UNAVAILABLE"
        client.close()
    assert grpcurl(target, pki, None, "-connect-timeout", "1", "list").returncode != 0
    assert grpcurl(target, None, None, "-connect-timeout", "1", "list").returncode != 0


def test_tritonclient_and_grpcurl_through_a_tls_gateway_to_tls_workers(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    target, _ = fleet
    client = triton(target, pki, "alice")
    assert client.is_server_ready()
    result = client.infer("double", x_input())
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * X)
    client.close()
    listed = grpcurl(target, pki, "alice", "list")
    assert listed.returncode == 0, listed.stderr
    assert "reactant_control.GatewayControlService" in listed.stdout
    ready = grpcurl(target, pki, "alice", "-d", '{"name": "double"}',
                    "inference.GRPCInferenceService/ModelReady")  # fmt: skip
    assert ready.returncode == 0, ready.stderr


def test_the_gateway_checks_its_own_restricted_groups(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    """The gateway's groups, its key: missing UNAUTHENTICATED, wrong PERMISSION_DENIED,
    right key through (the workers behind trust the gateway by its own key)."""
    target, _ = fleet
    for path, group in ((PLACEMENT + "Repack", "placement"),
                        (INFER + "RepositoryIndex", "model-repository")):  # fmt: skip
        missing = call(target, path, pki=pki, client="alice")
        assert missing[0] == "UNAUTHENTICATED", missing
        assert f"restricted group {group!r}" in missing[1]
        wrong = call(target, path, pki=pki, client="alice", metadata=[("admin-key", "x")])
        assert wrong[0] == "PERMISSION_DENIED", wrong
    status, _ = call(target, INFER + "RepositoryIndex", pki=pki, client="alice",
                     metadata=[("admin-key", ADMIN_KEY)])  # fmt: skip
    assert status == "OK"
    # round_robin: the placement group passes the key check and is refused for its mode.
    status, message = call(target, PLACEMENT + "Repack", pki=pki, client="alice",
                           metadata=[("admin-key", ADMIN_KEY)])  # fmt: skip
    assert status == "FAILED_PRECONDITION" and "lpt_packing" in message


def test_a_worker_refuses_a_client_that_claims_the_gateways_place(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    """Straight to a worker with a certificate the CA signed: naming an owner (to use
    alice's regions) is refused without the gateway's key, and so is a wrong key."""
    _, workers = fleet
    for metadata in (
        [("reactant-owner", "tls:alice")],
        [("reactant-gateway-key", "guess"), ("reactant-owner", "tls:alice")],
    ):
        status, message = call(workers[0].address, INFER + "SystemSharedMemoryStatus",
                               pki=pki, client="bob", metadata=metadata)  # fmt: skip
        assert status == "PERMISSION_DENIED", metadata
        assert "honoured only from this server's gateway" in message


def test_through_the_gateway_one_client_cannot_see_use_or_remove_anothers_region(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    """alice and bob, both through the gateway: the workers hold each one's regions under
    the client the gateway names, so bob sees none of alice's, cannot name hers in a
    request, and his unregister (by name, or all) leaves hers; the same name is two
    regions, each reading its owner's object."""
    target, workers = fleet
    with shm_object(X.tobytes()) as (a_key, _), shm_object((3 * X).tobytes()) as (b_key, _):
        alice, bob = triton(target, pki, "alice"), triton(target, pki, "bob")
        alice.register_system_shared_memory("in", a_key, X.nbytes)
        alice.register_system_shared_memory("alice-only", a_key, X.nbytes)
        assert regions(workers) == [{("gateway/tls:alice", "in"),
                                     ("gateway/tls:alice", "alice-only")}] * 2  # fmt: skip
        assert bob.get_system_shared_memory_status().regions == {}
        for _ in range(2):  # round robin: each worker refuses him
            with pytest.raises(InferenceServerException) as caught:
                bob.infer("double", x_input("alice-only"))
            assert code(caught.value) == "FAILED_PRECONDITION"
            assert "'alice-only' is not registered" in caught.value.message()
        bob.unregister_system_shared_memory("alice-only")
        bob.unregister_system_shared_memory()
        assert set(alice.get_system_shared_memory_status().regions) == {"in", "alice-only"}
        bob.register_system_shared_memory("in", b_key, X.nbytes)
        for _ in range(2):
            np.testing.assert_array_equal(alice.infer("double", x_input("in")).as_numpy("y"), 2 * X)
            np.testing.assert_array_equal(bob.infer("double", x_input("in")).as_numpy("y"), 6 * X)
        alice.unregister_system_shared_memory()
        bob.unregister_system_shared_memory()
        assert regions(workers) == [set(), set()]
        alice.close()
        bob.close()


def test_a_victim_object_is_refused_through_the_gateway(
    fleet: tuple[str, list[FakeWorker]], pki: Pki
) -> None:
    target, workers = fleet
    with shm_object(b"\x07" * 64, prefix="victim-") as (victim, path):
        client = triton(target, pki, "alice")
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("v", victim, 64)
        assert code(caught.value) == "INVALID_ARGUMENT"
        assert "only keys that start with '/reactantserver-'" in caught.value.message()
        client.close()
        assert regions(workers) == [set(), set()]
        assert path.read_bytes() == b"\x07" * 64


def test_a_gateway_not_paired_with_its_workers_refuses_shared_memory(tmp_path: Path) -> None:
    """Without the key the workers trust, they cannot tell the gateway's clients apart:
    the gateway refuses to register for anyone, saying what to configure."""
    with (
        fake_workers(1) as workers,
        running_gateway(
            GatewayConfig(
                listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0"),
                endpoints=(workers[0].address,),
            )
        ) as gw,
        shm_object(X.tobytes()) as (key, _),
    ):
        client = triton(gw.grpc)
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("in", key, X.nbytes)
        assert code(caught.value) == "FAILED_PRECONDITION"
        assert "worker_client.key_file or key_env" in caught.value.message()
        assert np.array_equal(client.infer("double", x_input()).as_numpy("y"), 2 * X)
        client.close()


def test_a_closed_client_connection_takes_its_regions_off_the_workers(tmp_path: Path) -> None:
    """Cleartext through a paired gateway: the client's connection is its owner; when it
    closes, the gateway removes its regions from every worker."""
    with (
        fake_workers(2) as workers,
        running_gateway(
            GatewayConfig(
                listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0"),
                endpoints=tuple(w.address for w in workers),
                worker_client=PAIRED,
            )
        ) as gw,
        shm_object(X.tobytes()) as (key, _),
    ):
        client = triton(gw.grpc)
        client.register_system_shared_memory("in", key, X.nbytes)
        (owner,) = {o for o, _ in regions(workers)[0]}
        assert owner.startswith("gateway/conn:")
        assert all(len(r) == 1 for r in regions(workers))
        client.close()
        wait_until(lambda: regions(workers) == [set(), set()], what="the regions removed")

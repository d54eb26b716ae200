"""Restricted API groups and call owners, sans-IO (``transport/core/auth.py``), and the
configuration of TLS, restrictions and keys (``config/rules.py``, ``config/certs.py``)."""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tls_certs import make_pki

from reactantserver.config import load_gateway, load_node, resolve_worker
from reactantserver.config.schema import API_GROUPS, GatewayConfig
from reactantserver.errors import ConfigError
from reactantserver.protocol import inference as pb
from reactantserver.protocol import reactant_control as cpb
from reactantserver.protocol.grpc.health import v1 as health_v1
from reactantserver.protocol.grpc.reflection import v1 as reflection_v1
from reactantserver.protocol.grpc.reflection import v1alpha as reflection_v1alpha
from reactantserver.status import StatusCode
from reactantserver.transport.core.auth import (
    GROUPS,
    STATE_CHANGING,
    Authorizer,
    Peer,
    Rule,
    Trust,
    group_of,
)
from reactantserver.transport.core.framing import Refusal
from reactantserver.transport.security import is_loopback, listener_security, open_warning

# ------------------------------------------------------------------------------ the map


def _served_paths() -> set[str]:
    """Every path the worker and the gateway serve, from the generated services."""
    paths: set[str] = set()
    for base in (
        pb.GrpcInferenceServiceBase(),
        cpb.ControlServiceBase(),
        cpb.GatewayControlServiceBase(),
        health_v1.HealthBase(),
        reflection_v1.ServerReflectionBase(),
        reflection_v1alpha.ServerReflectionBase(),
    ):
        paths.update(base.__mapping__())
    return paths


def test_every_rpc_is_in_exactly_one_group_and_every_group_is_used() -> None:
    """The map is total over what is served (a new RPC without a group fails here), names
    only served RPCs, and each of its groups is one a restriction may name."""
    served = _served_paths()
    unmapped = sorted(p for p in served if group_of(p) is None)
    assert unmapped == []
    mapped = {f"/{service}/{rpc}" for service, rpcs in GROUPS.items() for rpc in rpcs}
    assert mapped == served
    used = {group for rpcs in GROUPS.values() for group in rpcs.values()}
    assert used == set(API_GROUPS)
    assert set(STATE_CHANGING) <= used


def test_the_gateways_handler_table_is_in_the_map() -> None:
    """What the gateway really routes (its handler table, health and reflection included),
    not only the protos; the worker's table is built from the same generated services."""
    from gateway_harness import PAIRED

    from reactantserver.gateway.app import Gateway

    async def table() -> list[str]:
        gateway = Gateway(GatewayConfig(endpoints=("127.0.0.1:1",), worker_client=PAIRED))
        proxy = gateway.build_proxy(portal=None)  # type: ignore[arg-type]
        return list(gateway.mapping(proxy))

    paths = asyncio.run(table())
    assert len(paths) > 30
    assert sorted(p for p in paths if group_of(p) is None) == []


# ------------------------------------------------------------------------------ decisions

KEY = b"the-admin-key"
ADMIN = Rule(frozenset({"model-repository", "control"}), "admin-key", KEY, frozenset({"ops"}))
LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def refusal(verdict: str | Refusal) -> tuple[StatusCode, str]:
    assert isinstance(verdict, Refusal), verdict
    return verdict.code, verdict.message


def test_a_restricted_call_without_its_key_wrong_or_right() -> None:
    auth = Authorizer([ADMIN])
    peer = Peer()
    code, message = refusal(auth.decide(LOAD, [], peer))
    assert code is StatusCode.UNAUTHENTICATED
    assert "RepositoryModelLoad is in the restricted group 'model-repository'" in message
    assert "'admin-key'" in message
    code, message = refusal(auth.decide(LOAD, [("admin-key", "the-admin-kez")], peer))
    assert code is StatusCode.PERMISSION_DENIED and "the-admin" not in message
    assert auth.decide(LOAD, [("admin-key", "the-admin-key")], peer) == "key:admin-key"
    assert auth.decide(INFER, [], peer) == peer.connection  # open group


def test_an_allowed_certificate_passes_without_the_key_and_owns_by_its_name() -> None:
    auth = Authorizer([ADMIN])
    assert auth.decide(LOAD, [], Peer(("ops", "ops.clients.test"))) == "tls:ops"
    code, _ = refusal(auth.decide(LOAD, [], Peer(("alice",))))
    assert code is StatusCode.UNAUTHENTICATED
    assert auth.decide(INFER, [("admin-key", "the-admin-key")], Peer(("alice",))) == "tls:alice"


def test_only_the_trusted_gateway_names_an_owner() -> None:
    auth = Authorizer([ADMIN], Trust(b"gw-key", frozenset({"gateway"})))
    claim = [("reactant-owner", "tls:alice")]
    code, message = refusal(auth.decide(INFER, claim, Peer(("bob",))))
    assert code is StatusCode.PERMISSION_DENIED and "reactant-owner" in message
    code, _ = refusal(auth.decide(INFER, [("reactant-gateway-key", "gw-kez"), *claim], Peer()))
    assert code is StatusCode.PERMISSION_DENIED
    assert auth.decide(LOAD, [("reactant-gateway-key", "gw-key"), *claim], Peer()) == (
        "gateway/tls:alice"
    )
    assert auth.decide(LOAD, claim, Peer(("gateway",))) == "gateway/tls:alice"
    assert auth.decide(LOAD, [("reactant-gateway-key", "gw-key")], Peer()) == "gateway"
    code, _ = refusal(
        auth.decide(INFER, [("reactant-gateway-key", "gw-key"), ("reactant-owner", "")], Peer())
    )
    assert code is StatusCode.INVALID_ARGUMENT


@given(sent=st.text(min_size=0, max_size=40), group=st.sampled_from(API_GROUPS))
def test_a_restricted_group_passes_only_its_exact_key(sent: str, group: str) -> None:
    """Invariant: a call of a restricted group passes if and only if it carries the exact
    key (or an allowed certificate); any other value is refused, and the refusal never
    contains the key."""
    rule = Rule(frozenset({group}), "k", KEY)
    path = next(f"/{s}/{r}" for s, rpcs in GROUPS.items() for r, g in rpcs.items() if g == group)
    verdict = Authorizer([rule]).decide(path, [("k", sent)], Peer())
    if sent.encode() == KEY:
        assert verdict == "key:k"
    else:
        assert isinstance(verdict, Refusal)
        assert KEY.decode() not in verdict.message


def test_two_connections_are_two_owners() -> None:
    assert Peer().owner != Peer().owner
    assert Peer(("alice",)).owner == Peer(("alice",)).owner == "tls:alice"


# ------------------------------------------------------------------------------ start-up warning


def test_a_listener_beyond_loopback_warns_of_what_it_leaves_open(tmp_path: Path) -> None:
    from reactantserver.config.schema import Restriction, TlsConfig

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    open_all = listener_security(TlsConfig(), (), {})
    assert open_warning("127.0.0.1", open_all, "endpoints.restricted") is None
    warning = open_warning("0.0.0.0", open_all, "endpoints.restricted")
    assert warning is not None
    assert "model-repository, shared-memory, control, placement, trace, logging" in warning
    assert "endpoints.restricted" in warning
    locked = listener_security(
        TlsConfig(),
        (Restriction(groups=STATE_CHANGING, header="admin-key", key_env="K"),),
        {"K": "secret"},
    )
    assert open_warning("0.0.0.0", locked, "endpoints.restricted") is None


# ------------------------------------------------------------------------------ configuration


def _node(tmp: Path, endpoints: str) -> Path:
    path = tmp / "node.yaml"
    (tmp / "models").mkdir(exist_ok=True)
    path.write_text(
        "model_repo: models\ngpus: 0\nglobal:\n  endpoints:\n"
        + textwrap.indent(textwrap.dedent(endpoints), "    ")
    )
    return path


def _problems(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return list(excinfo.value.problems)


def test_certificates_that_cannot_serve_fail_the_configuration_with_their_line(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki", clients=("alice",))
    path = _node(
        tmp_path,
        f"""\
        tls:
          cert_file: {pki.server.cert}
          key_file: {pki.client("alice").key}
          client_ca_file: pki/nothing.pem
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_node(path, {})
    assert _problems(caught) == [
        f"{path}:6: global.endpoints.tls.cert_file: expected a certificate and its key; the "
        f"key '{pki.client('alice').key}' does not match the certificate '{pki.server.cert}'",
        f"{path}:8: global.endpoints.tls.client_ca_file: expected a CA certificate file; "
        f"'{tmp_path / 'pki' / 'nothing.pem'}' does not exist",
    ]
    path = _node(tmp_path, "tls: {cert_file: pki/server.pem, key_file: pki/server.key}\n")
    cfg = resolve_worker(load_node(path, {}), env={})
    assert cfg.endpoints.tls.cert_file == str(tmp_path / "pki" / "server.pem")  # next to the file


def test_restrictions_are_checked_whole(tmp_path: Path) -> None:
    path = _node(
        tmp_path,
        """\
        restricted:
          - {groups: [control, repository], header: admin-key, key_env: NOT_SET}
          - {groups: [control], header: other-key, key_file: missing.key}
          - {groups: [statistics], header: stats-key}
          - {groups: [shared-memory], identities: [ops]}
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_node(path, {})
    problems = "\n".join(_problems(caught))
    assert "restricted[0].groups[1]: expected one of inference, health" in problems
    assert "got 'repository'" in problems
    assert "restricted[1].groups: expected each group restricted once; control" in problems
    assert "restricted[2].header: expected key_file or key_env with it" in problems
    assert "restricted[3].identities: expected mutual TLS" in problems
    assert "restricted[0].key_env: expected a readable key; key_env 'NOT_SET'" in problems
    assert "restricted[1].key_file: expected a readable key" in problems


def test_the_gateways_tls_keys_do_what_they_say_also_from_the_environment(
    tmp_path: Path,
) -> None:
    """tls.cert_file / key_file / client_ca_file (parsed and ignored before): checked
    against the disk, and REACTANT_GATEWAY_TLS_* set them."""
    pki = make_pki(tmp_path / "pki", clients=("alice",))
    path = tmp_path / "gateway.yml"
    path.write_text("endpoints: ['127.0.0.1:8080']\ntls:\n  cert_file: nowhere.pem\n")
    with pytest.raises(ConfigError) as caught:
        load_gateway(path, {})
    assert _problems(caught) == [
        f"{path}:2: tls.key_file: expected cert_file and key_file together; got only one of them"
    ]
    path.write_text(
        "endpoints: ['127.0.0.1:8080']\ntls:\n  cert_file: nowhere.pem\n  key_file: k.key\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_gateway(path, {})
    assert _problems(caught) == [
        f"{path}:3: tls.cert_file: expected a certificate and its key; "
        f"'{tmp_path / 'nowhere.pem'}' does not exist"
    ]
    path.write_text("endpoints: ['127.0.0.1:8080']\n")
    env = {
        "REACTANT_GATEWAY_TLS_CERT_FILE": str(pki.server.cert),
        "REACTANT_GATEWAY_TLS_KEY_FILE": str(pki.server.key),
        "REACTANT_GATEWAY_TLS_CLIENT_CA_FILE": str(pki.ca_file),
    }
    cfg = load_gateway(path, env)
    assert cfg.tls.client_ca_file == str(pki.ca_file)
    env["REACTANT_GATEWAY_TLS_KEY_FILE"] = str(pki.client("alice").key)
    with pytest.raises(ConfigError) as caught:
        load_gateway(path, env)
    assert "does not match the certificate" in "\n".join(_problems(caught))


def test_a_gateway_from_the_environment_serves_mutual_tls(tmp_path: Path) -> None:
    """REACTANT_GATEWAY_TLS_*: the gateway built from them serves mutual TLS."""
    from reactantserver.gateway.app import Gateway

    pki = make_pki(tmp_path / "pki")
    env = {
        "REACTANT_GATEWAY_WORKERS": "127.0.0.1:1",
        "REACTANT_GATEWAY_TLS_CERT_FILE": str(pki.server.cert),
        "REACTANT_GATEWAY_TLS_KEY_FILE": str(pki.server.key),
        "REACTANT_GATEWAY_TLS_CLIENT_CA_FILE": str(pki.ca_file),
    }
    gateway = Gateway(load_gateway(None, env), env)
    assert gateway.security.tls is not None and gateway.security.tls.mutual


def test_the_triton_flag_takes_its_key_from_a_file_or_a_variable(tmp_path: Path) -> None:
    from reactantserver.config.certs import SecretError, parse_restricted, with_restrictions
    from reactantserver.config.schema import Restriction

    key = tmp_path / "admin.key"
    key.write_text("k\n")
    assert parse_restricted(f"model-repository,control:admin-key=file:{key}") == Restriction(
        groups=("model-repository", "control"), header="admin-key", key_file=str(key)
    )
    assert parse_restricted("statistics:stats-key=env:STATS").key_env == "STATS"
    with pytest.raises(SecretError, match="shows in every process listing"):
        parse_restricted("control:admin-key=hunter2")  # Triton's literal form
    with pytest.raises(SecretError, match="got 'repository'"):
        parse_restricted("repository:admin-key=env:K")
    existing = (Restriction(groups=("control",), header="a", key_env="K"),)
    with pytest.raises(SecretError, match="control is also in item 0"):
        with_restrictions(existing, ["control:b=env:K"], {"K": "x"})
    with pytest.raises(SecretError, match="unset or empty"):
        with_restrictions((), ["control:b=env:MISSING"], {})
    assert len(with_restrictions(existing, ["trace:b=env:K"], {"K": "x"})) == 2


def test_the_pages_group_table_is_the_map() -> None:
    """docs/security.md's table of groups lists every RPC of each group, as the map has it."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    table = page.split("| group | RPCs |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (.+?) \|$", table, flags=re.M))
    assert set(rows) == set(API_GROUPS)
    for group, listed in rows.items():
        names = set()
        for item in re.sub(r"\s*\(.*?\)", "", listed).split(", "):
            head, _, tail = item.strip().partition("{")
            if tail:  # SystemSharedMemory{Status,Register,Unregister}
                names.update(head + part for part in tail.rstrip("}").split(","))
            else:
                names.add(head)
        expected = {rpc for rpcs in GROUPS.values() for rpc, g in rpcs.items() if g == group}
        assert names == expected, group


def test_a_nodes_gateway_must_speak_tls_to_workers_that_serve_it(tmp_path: Path) -> None:
    """Workers serving TLS (and asking for client certificates) behind the node's own
    gateway: its worker_client.tls must say how to verify them and what to present."""
    from reactantserver.config import resolve_gateway

    pki = make_pki(tmp_path / "pki", clients=("gateway",))
    (tmp_path / "models").mkdir()
    tls = (
        f"    tls: {{cert_file: {pki.server.cert}, key_file: {pki.server.key}, "
        f"client_ca_file: {pki.ca_file}}}\n"
    )
    base = "model_repo: models\ngpus: 0\nworkers: [{name: a}, {name: b}]\nglobal:\n  endpoints:\n"
    path = tmp_path / "node.yaml"
    path.write_text(base + tls)
    with pytest.raises(ConfigError, match=r"worker_client.tls.ca_file: expected the CA"):
        resolve_gateway(load_node(path, {}), {})
    gw = pki.client("gateway")
    path.write_text(
        base + tls + f"gateway:\n  worker_client:\n    tls: {{ca_file: {pki.ca_file}}}\n"
    )
    with pytest.raises(ConfigError, match=r"worker_client.tls.cert_file: expected a client cert"):
        resolve_gateway(load_node(path, {}), {})
    path.write_text(
        base + tls + "gateway:\n  worker_client:\n    tls: "
        f"{{ca_file: {pki.ca_file}, cert_file: {gw.cert}, key_file: {gw.key}}}\n"
    )
    assert resolve_gateway(load_node(path, {}), {}).worker_client.tls.cert_file == str(gw.cert)

"""The checks of a configuration's certificates and keys against the disk and environment.

Theory of operation
-------------------
Like :mod:`.paths`, this is a check that reads the disk, so that ``reactantserver
config`` refuses what ``serve`` could not start with -- a certificate that is not there,
a key that does not match its certificate, a CA file that holds no certificate, a secret
file that is empty or an environment variable that is unset -- with the line that names
it, instead of a traceback from the first TLS handshake.

A certificate and its key are loaded into a throw-away ``ssl.SSLContext`` exactly as the
listener will load them (``load_cert_chain`` checks that the key matches the
certificate); a CA file with ``load_verify_locations``. A secret is a file's first line
(stripped; the file must not be empty) or an environment variable's value. Messages
never quote a file's contents.

The same functions read the secrets at start-up (:func:`read_secret`), so what the check
accepted is what the server uses.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterator, Mapping

from .schema import (
    ClientTlsConfig,
    GatewayConfig,
    GatewayTrust,
    Restriction,
    ServerConfig,
    TlsConfig,
)
from .source import Origin, Path, Problem, show


class SecretError(ValueError):
    """A secret that cannot be read (the message says why, never what it holds)."""


def _file_problem(path: str) -> str | None:
    try:
        with open(path, "rb"):
            return None
    except FileNotFoundError:
        return "does not exist"
    except IsADirectoryError:
        return "is a directory"
    except PermissionError:
        return "cannot be read (permission denied)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"


def chain_problem(cert_file: str, key_file: str) -> str | None:
    """Why ``cert_file`` + ``key_file`` cannot serve TLS (None: they can)."""
    for path in (cert_file, key_file):
        why = _file_problem(path)
        if why is not None:
            return f"{show(path)} {why}"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        if "KEY_VALUES_MISMATCH" in str(reason).upper():
            return f"the key {show(key_file)} does not match the certificate {show(cert_file)}"
        return f"{show(cert_file)} and {show(key_file)} are not a PEM certificate and its key ({reason})"
    except OSError as exc:
        return f"{show(cert_file)} cannot be read ({exc.strerror or exc})"
    return None


def ca_problem(ca_file: str) -> str | None:
    """Why ``ca_file`` cannot verify peers (None: it can)."""
    why = _file_problem(ca_file)
    if why is not None:
        return f"{show(ca_file)} {why}"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return f"{show(ca_file)} holds no PEM CA certificate ({reason})"
    if not context.get_ca_certs():
        return f"{show(ca_file)} holds no CA certificate"
    return None


def read_secret(key_file: str, key_env: str, env: Mapping[str, str]) -> str:
    """The secret of a ``key_file`` / ``key_env`` pair; :class:`SecretError` if unusable."""
    if key_file:
        why = _file_problem(key_file)
        if why is not None:
            raise SecretError(f"key_file {show(key_file)} {why}")
        with open(key_file, encoding="utf-8", errors="replace") as f:
            secret = f.readline().strip()
        if not secret:
            raise SecretError(f"key_file {show(key_file)} is empty (its first line is the key)")
        return secret
    secret = env.get(key_env, "").strip()
    if not secret:
        raise SecretError(f"key_env {show(key_env)}: the environment variable is unset or empty")
    return secret


# --- the problems of a record ---------------------------------------------------------------


def _server_tls(tls: TlsConfig, at: Path) -> Iterator[tuple[Path, str]]:
    if tls.cert_file and tls.key_file:
        why = chain_problem(tls.cert_file, tls.key_file)
        if why is not None:
            yield (*at, "cert_file"), f"expected a certificate and its key; {why}"
    if tls.client_ca_file:
        why = ca_problem(tls.client_ca_file)
        if why is not None:
            yield (*at, "client_ca_file"), f"expected a CA certificate file; {why}"


def _client_tls(tls: ClientTlsConfig, at: Path) -> Iterator[tuple[Path, str]]:
    if tls.ca_file:
        why = ca_problem(tls.ca_file)
        if why is not None:
            yield (*at, "ca_file"), f"expected a CA certificate file; {why}"
    if tls.cert_file and tls.key_file:
        why = chain_problem(tls.cert_file, tls.key_file)
        if why is not None:
            yield (*at, "cert_file"), f"expected a certificate and its key; {why}"


def _secret(
    key_file: str, key_env: str, at: Path, env: Mapping[str, str]
) -> Iterator[tuple[Path, str]]:
    if not (key_file or key_env):
        return
    try:
        read_secret(key_file, key_env, env)
    except SecretError as exc:
        yield (*at, "key_file" if key_file else "key_env"), f"expected a readable key; {exc}"


def _restrictions(
    restricted: tuple[Restriction, ...], at: Path, env: Mapping[str, str]
) -> Iterator[tuple[Path, str]]:
    for index, entry in enumerate(restricted):
        yield from _secret(entry.key_file, entry.key_env, (*at, index), env)


def _trust(trust: GatewayTrust, at: Path, env: Mapping[str, str]) -> Iterator[tuple[Path, str]]:
    yield from _secret(trust.key_file, trust.key_env, at, env)


def _problems(found: Iterator[tuple[Path, str]], locate: Callable[[Path], Origin]) -> list[Problem]:
    return [Problem(locate(path), message) for path, message in found]


def worker_file_problems(
    cfg: ServerConfig, locate: Callable[[Path], Origin], env: Mapping[str, str]
) -> list[Problem]:
    """A problem for each certificate, CA or secret of a worker that cannot be used."""
    ep = cfg.endpoints

    def found() -> Iterator[tuple[Path, str]]:
        yield from _server_tls(ep.tls, ("endpoints", "tls"))
        yield from _restrictions(ep.restricted, ("endpoints", "restricted"), env)
        yield from _trust(ep.gateway, ("endpoints", "gateway"), env)

    return _problems(found(), locate)


def gateway_file_problems(
    cfg: GatewayConfig, locate: Callable[[Path], Origin], env: Mapping[str, str]
) -> list[Problem]:
    """A problem for each certificate, CA or secret of a gateway that cannot be used."""

    def found() -> Iterator[tuple[Path, str]]:
        yield from _server_tls(cfg.tls, ("tls",))
        yield from _restrictions(cfg.restricted, ("restricted",), env)
        yield from _client_tls(cfg.worker_client.tls, ("worker_client", "tls"))
        yield from _secret(cfg.worker_client.key_file, cfg.worker_client.key_env,
                           ("worker_client",), env)  # fmt: skip

    return _problems(found(), locate)


def anchor(path: str, base: str) -> str:
    """A relative path of a file written in directory ``base`` means "next to the file"."""
    return path if not path or os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


# --- --grpc-restricted-protocol ---------------------------------------------------------------

#: The flag, as Triton spells it.
RESTRICTED_FLAG = "--grpc-restricted-protocol"


def parse_restricted(text: str) -> Restriction:
    """``<group>[,<group>...]:<header>=file:<path>`` or ``...=env:<VAR>``: Triton's
    ``--grpc-restricted-protocol`` with the key read from a file or a variable (a key
    written on the command line is in every ``ps`` listing, so it is refused)."""
    from .rules import api_group, header_name  # the rules of the YAML form

    groups_text, sep, rest = text.partition(":")
    header, eq, source = rest.partition("=")
    if not sep or not eq:
        raise SecretError(
            f"{RESTRICTED_FLAG}={show(text)}: expected <group>[,<group>...]:<header>="
            "file:<path> or ...=env:<VARIABLE>"
        )
    groups = tuple(g.strip() for g in groups_text.split(",") if g.strip())
    problems = [p for p in (*(api_group(g) for g in groups), header_name(header)) if p]
    if not groups:
        problems.append("expected at least one group")
    if not header:
        problems.append("expected a header name")
    kind, colon, where = source.partition(":")
    if not colon or kind not in ("file", "env") or not where:
        problems.append(
            "expected the key as file:<path> or env:<VARIABLE> (a key written on the "
            "command line shows in every process listing)"
        )
    if problems:
        raise SecretError(f"{RESTRICTED_FLAG}={show(text)}: " + "; ".join(problems))
    if kind == "file":
        return Restriction(groups=groups, header=header, key_file=os.path.abspath(where))
    return Restriction(groups=groups, header=header, key_env=where)


def with_restrictions(
    restricted: tuple[Restriction, ...], flags: list[str], env: Mapping[str, str]
) -> tuple[Restriction, ...]:
    """``restricted`` with the flags' restrictions added, each group restricted once and
    every key readable; :class:`SecretError` says what is wrong."""
    from .rules import restriction_problems

    added = tuple(parse_restricted(flag) for flag in flags)
    combined = restricted + added
    for path, message in restriction_problems(combined, (), mtls=True):
        raise SecretError(f"{RESTRICTED_FLAG}: restriction {path[0] if path else ''}: {message}")
    for entry in added:
        read_secret(entry.key_file, entry.key_env, env)
    return combined

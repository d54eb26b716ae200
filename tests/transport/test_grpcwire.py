"""The gRPC wire vocabulary (``reactantserver.grpcwire``): its invariants, and that it is the
only place in src/ that speaks each word.

Theory of operation: the round trip of ``grpc-timeout`` and its grammar are property tests
over the floats and over strings built near the grammar; the "one place" tests read the
sources (AST and text), the way ``test_import_graph.py`` reads the layering.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import decode_timeout
from hypothesis import example, given
from hypothesis import strategies as st

import reactantserver
from reactantserver import grpcwire, status
from reactantserver.grpcwire import (
    HTTP_TO_GRPC,
    LONGEST_TIMEOUT,
    StatusCode,
    encode_grpc_timeout,
    parse_grpc_status,
    parse_grpc_timeout,
    status_for_http,
)
from reactantserver.transport.grpcerror import error_code, grpc_error

PACKAGE = Path(reactantserver.__file__).parent
GRAMMAR = re.compile(r"[0-9]{1,8}[HMSmun]")
#: Exact seconds per unit, for the bound on what rounding loses.
UNIT = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "S": 1.0, "M": 60.0, "H": 3600.0}
#: The next finer unit: the one that would have needed a ninth digit.
FINER = {"u": "n", "m": "u", "S": "m", "M": "S", "H": "M"}


#: The longest timeout the header can say: 99,999,999 hours.
LONGEST = (10**8 - 1) * 3600.0


@given(st.floats(min_value=0.0, max_value=LONGEST, allow_nan=False, allow_infinity=False))
@example(0.3)
@example(0.1)
@example(99.99999999999999)
@example(0.09999999999999999)
@example(1e-9)
@example(5e-324)
@example(99_999_999.5)
@example(LONGEST)
def test_an_encoded_timeout_is_never_longer_and_loses_under_one_unit(seconds: float) -> None:
    """For every ``seconds`` from 0 to the longest the header can say: the text matches the grammar (1-8 digits and a
    unit); read back by ``parse_grpc_timeout`` it is never longer than ``seconds`` (the
    forwarded deadline never outlives the caller's) and shorter by less than one unit of
    the unit written; that unit is the finest whose value fits eight digits (the finer one
    would have needed a ninth); and grpclib's own reader agrees with ours."""
    text = encode_grpc_timeout(seconds)
    assert GRAMMAR.fullmatch(text), text
    back = parse_grpc_timeout(text)
    unit = text[-1]
    assert back <= seconds
    assert seconds - back < UNIT[unit] * (1 + 1e-9) or seconds == 0
    finer = FINER.get(unit)
    if finer is not None:
        assert seconds / UNIT[finer] >= (10**8 - 1)
    assert back == pytest.approx(decode_timeout(text), rel=1e-12, abs=0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.05, "50000000n"),
        (0.25, "250000u"),
        (0.3, "300000u"),
        (59.9999, "59999900u"),
        (3600.5, "3600500m"),
        (10**6, "1000000S"),
        (10**9, "16666666M"),
        (10**11, "27777777H"),
        (0.0, "0n"),
        (-1.0, "0n"),
        (math.nan, "0n"),
        (math.inf, LONGEST_TIMEOUT),
        (1e13, LONGEST_TIMEOUT),
        (1e300, LONGEST_TIMEOUT),
    ],
)
def test_encoded_timeout_examples(seconds: float, text: str) -> None:
    assert encode_grpc_timeout(seconds) == text


def _near_grammar() -> st.SearchStrategy[str]:
    """Strings a grpc-timeout parser may meet: the grammar's own, and the near misses
    (no digits, nine digits, signs, spaces, underscores, dots, non-ASCII digits, a
    lowercase or unknown unit, the unit first, text after the unit)."""
    digits = st.text(alphabet="0123456789", min_size=0, max_size=10)
    noise = st.sampled_from(["", "-", "+", " ", "_", ".", "٣", "²", "０", "\n", "e", "x"])
    unit = st.sampled_from([*"HMSmun", "h", "s", "N", "U", "", "ms", "x"])
    built = st.builds(lambda a, d, b, u, c: a + d + b + u + c, noise, digits, noise, unit, noise)
    return st.one_of(built, st.text(max_size=12))


@given(_near_grammar())
@example("00000000n")
@example("99999999H")
@example("123456789m")
@example("1_0S")
@example(" 5S")
@example("5S ")
@example("٣S")
@example("")
@example("n")
def test_parse_accepts_exactly_the_grammar(text: str) -> None:
    """``parse_grpc_timeout`` accepts a string exactly when it is 1 to 8 ASCII digits and
    one of ``H M S m u n`` (the gRPC spec's ``Timeout``), and then returns digits x unit
    (within a rounding of the float); any other string raises ``ValueError``, nothing
    else."""
    if GRAMMAR.fullmatch(text):
        expected = int(text[:-1]) * UNIT[text[-1]]
        assert parse_grpc_timeout(text) == pytest.approx(expected, rel=1e-15, abs=0)
    else:
        with pytest.raises(ValueError, match="malformed grpc-timeout"):
            parse_grpc_timeout(text)


def test_the_status_codes_are_grpcs_and_grpclibs() -> None:
    """Seventeen codes, numbered and named as grpc/status.proto (grpclib's enum agrees);
    reactantserver.status still exports the same class for users."""
    assert [(c.name, c.value) for c in StatusCode] == [(s.name, s.value) for s in Status]
    assert status.StatusCode is StatusCode
    for code in StatusCode:
        assert parse_grpc_status(str(int(code))) is code
        assert parse_grpc_status(str(int(code)).encode()) is code
    for junk in ("17", "-1", "", "00", " 0", "OK", b"99"):
        assert parse_grpc_status(junk) is StatusCode.UNKNOWN


def test_the_http_table_is_grpcs() -> None:
    """gRPC's doc/http-grpc-status-mapping.md, and UNKNOWN for every other status."""
    assert dict(HTTP_TO_GRPC) == {
        400: StatusCode.INTERNAL,
        401: StatusCode.UNAUTHENTICATED,
        403: StatusCode.PERMISSION_DENIED,
        404: StatusCode.UNIMPLEMENTED,
        429: StatusCode.UNAVAILABLE,
        502: StatusCode.UNAVAILABLE,
        503: StatusCode.UNAVAILABLE,
        504: StatusCode.UNAVAILABLE,
    }
    for other in (0, 200, 206, 302, 405, 415, 500, 501, 999):
        assert status_for_http(other) is StatusCode.UNKNOWN


def test_grpclibs_status_is_made_at_the_one_edge() -> None:
    """grpc_error turns a code (ours, or a bare number off the wire) into grpclib's
    exception; error_code reads it back; a number gRPC does not define is UNKNOWN."""
    for code in StatusCode:
        exc = grpc_error(code, "m")
        assert isinstance(exc, GRPCError) and exc.status is Status(int(code))
        assert exc.message == "m" and error_code(exc) is code
    assert grpc_error(17).status is Status.UNKNOWN
    assert grpc_error(-1).status is Status.UNKNOWN


# --- one place: the sources -------------------------------------------------------------


@functools.cache
def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(PACKAGE)): p.read_text()
        for p in sorted(PACKAGE.rglob("*.py"))
        if "protocol/" not in str(p.relative_to(PACKAGE)) or p.name == "reflection.py"
    }


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module of src/ parsed once for the four checks below."""
    return {name: ast.parse(text) for name, text in _sources().items()}


def test_grpc_timeout_is_parsed_and_written_only_in_grpcwire() -> None:
    """No module but grpcwire holds a table or pattern of the timeout units (a dict or
    set with the unit letters as keys, a string naming them all), and none formats a value
    with a unit letter after it (``f"{x}m"``): the old parsers and writers of the gateway,
    the framing and the client are gone."""
    offenders = []
    for name, tree in _trees().items():
        if name == "grpcwire.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict | ast.Set):
                keys = node.keys if isinstance(node, ast.Dict) else node.elts
                literal = {k.value for k in keys if isinstance(k, ast.Constant)}
                if {"m", "u", "n"} <= literal:
                    offenders.append((name, node.lineno, "unit table"))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.search(r"H.?M.?S.?m.?u.?n", node.value) and "grpc-timeout" not in node.value:
                    offenders.append((name, node.lineno, "unit pattern"))
            elif isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
                last = node.values[-1]
                if (
                    isinstance(last, ast.Constant)
                    and last.value in ("H", "M", "S", "m", "u", "n")
                    and isinstance(node.values[-2], ast.FormattedValue)
                ):
                    offenders.append((name, node.lineno, "unit written"))
    assert offenders == []
    gone = ("decode_grpc_timeout", "parse_timeout", "def grpc_timeout", "_HTTP_TO_GRPC",
            "HTTP_STATUSES")  # fmt: skip
    assert [(n, w) for n, text in _sources().items() for w in gone if w in text] == []


def test_the_http_status_table_is_only_in_grpcwire() -> None:
    """No module but grpcwire holds a mapping keyed by HTTP statuses 429 and 503 (as
    numbers or as the bytes of a header)."""
    offenders = []
    for name, tree in _trees().items():
        if name == "grpcwire.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                literal = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {429, 503} <= literal or {b"429", b"503"} <= literal:
                    offenders.append((name, node.lineno))
    assert offenders == []


_NAMES = {code.name for code in StatusCode}


def test_no_module_spells_a_status_code_as_a_bare_number() -> None:
    """No module-level name of a status code (``OK``, ``_UNIMPLEMENTED``, ...) is bound to
    a number literal outside grpcwire, nor a set of statuses or codes to numbers: the codes
    are StatusCode's members."""
    offenders = []
    for name, tree in _trees().items():
        if name == "grpcwire.py":
            continue
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            targets = [t for t in node.targets if isinstance(t, ast.Name | ast.Tuple)]
            names = [
                n.id
                for t in targets
                for n in (t.elts if isinstance(t, ast.Tuple) else [t])
                if isinstance(n, ast.Name)
            ]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            numbers = any(isinstance(v, ast.Constant) and type(v.value) is int for v in values)
            if numbers and any(n.lstrip("_") in _NAMES for n in names):
                offenders.append((name, node.lineno, names))
            # A set of codes (``FAILOVER_STATUSES = frozenset({5, 14})``).
            inner = [
                elt
                for sub in ast.walk(node.value)
                if isinstance(sub, ast.Set | ast.Tuple | ast.List)
                for elt in sub.elts
            ]
            ints = inner and all(
                isinstance(e, ast.Constant) and type(e.value) is int for e in inner
            )
            if ints and any("STATUS" in n.upper() or "CODE" in n.upper() for n in names):
                offenders.append((name, node.lineno, names))
    assert offenders == []


def test_grpclibs_status_enum_is_used_only_where_a_grpcerror_is_made() -> None:
    """Only transport/grpcerror.py imports grpclib's ``Status`` (generated protocol code
    aside): everywhere else a code is a StatusCode, turned into grpclib's at that edge."""
    offenders = []
    for name, tree in _trees().items():
        if name == "transport/grpcerror.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "grpclib.const":
                if any(alias.name == "Status" for alias in node.names):
                    offenders.append((name, node.lineno))
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "Status"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "const"
            ):
                offenders.append((name, node.lineno))
    assert offenders == []


def test_grpcwire_is_pure() -> None:
    """The module imports nothing but the standard library's enum and typing helpers: no
    asyncio, trio, socket or grpclib (it belongs on the ground floor)."""
    tree = ast.parse(Path(grpcwire.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"__future__", "enum", "collections.abc"}

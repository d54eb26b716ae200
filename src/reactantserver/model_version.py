"""Which model version a request asks for, and whether it is the one served.

Bundles are unversioned: each name serves one version at a time, reported to clients as
``records.REPORTED_VERSION`` ("1") in every answer that carries a version. A request may
still name a version (``model_version`` of ModelInfer, ``version`` of ModelReady,
ModelMetadata, ModelConfig and ModelStatistics), and a client must be able to tell that it
did not get the version it asked for. The rules, Triton's:

=============================  ==========================================================
requested                      answer
=============================  ==========================================================
``""``                         the version served
the version served (``"1"``)   the version served
another integer (``"7"``)      NOT_FOUND: "model 'simple' version 7 is not found" (what
                               Triton says of a version it does not have; ModelReady
                               answers ``ready: false``, as Triton does)
anything else                  INVALID_ARGUMENT: "failed to get model version from
                               specified version string 'x'" (Triton's words: its own
                               clients test for them)
=============================  ==========================================================

An integer is what Triton's ``std::stol`` would read *and* nothing else: an optional sign
and decimal digits (Triton reads ``"7abc"`` as 7; we refuse it). A negative one is
INVALID_ARGUMENT. The worker checks every request (:mod:`reactantserver.service`); the
gateway checks a ModelInfer itself from its peek (a worker's NOT_FOUND would make the
gateway fail over, as for a model the worker does not serve) and passes the other RPCs'
versions on to the worker.

No I/O, no JAX: a function of the strings given.
"""

from __future__ import annotations

import re

from .errors import InvalidArgument, NotFound

__all__ = ["check_version", "parse_version", "serves_version"]

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
#: Characters of a client's version string repeated in a refusal at most.
_ECHO = 64


def _echo(text: str) -> str:
    return repr(text if len(text) <= _ECHO else text[:_ECHO] + "...")


def parse_version(requested: str) -> int | None:
    """The version a request names: None for ``""`` (the one served), else its number;
    ``InvalidArgument`` for a string that is not an integer >= 0."""
    if not requested:
        return None
    if _INTEGER.fullmatch(requested) is None:
        raise InvalidArgument(
            f"failed to get model version from specified version string {_echo(requested)}: "
            "the version must be an integral value > 0, or empty for the version served"
        )
    version = int(requested)
    if version < 0:
        raise InvalidArgument(
            f"invalid model version specified {_echo(requested)}: the version must be an "
            "integral value > 0, or empty for the version served"
        )
    return version


def serves_version(served: str, requested: str) -> bool:
    """Whether a request for version ``requested`` gets the version ``served``
    (``InvalidArgument`` when ``requested`` is not a version at all)."""
    version = parse_version(requested)
    return version is None or str(version) == served


def check_version(model: str, served: str, requested: str) -> None:
    """Raise unless a request for version ``requested`` of ``model`` is served by the
    version ``served``: ``InvalidArgument`` for a malformed version, ``NotFound`` for a
    version that is not served."""
    if not serves_version(served, requested):
        raise NotFound(
            f"model {model!r} version {parse_version(requested)} is not found: version "
            f"{served} serves; ask for it, or send no version"
        )

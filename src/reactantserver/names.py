"""The known names closest to a mistyped one, for a NOT_FOUND that says what was meant.

A client that asks for ``irsi`` when the server has ``iris`` gets ``did you mean 'iris'?``
(the worker and the gateway both say it). :func:`difflib.get_close_matches` ranks by
similarity ratio; the cut-off (0.6, difflib's default) keeps unrelated names out, so a
name with no near neighbour gets no hint rather than a misleading one. Pure and cheap: it
runs only on the NOT_FOUND path, over the names a server knows (tens to hundreds).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: How many candidates a hint names at most.
MAX_SUGGESTIONS = 3
#: A name longer than this gets no hint: it is no typo, and difflib's work grows with its
#: length (a 1 MiB model name took 0.3 s on the event loop).
MAX_HINTED = 256


def closest(name: str, known: Iterable[str], n: int = MAX_SUGGESTIONS) -> list[str]:
    """Up to ``n`` names of ``known`` close to ``name``, the closest first (never ``name``)."""
    if len(name) > MAX_HINTED:
        return []
    candidates = sorted({k for k in known if k and k != name})
    return difflib.get_close_matches(name, candidates, n=n)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'iris'?"`` (or ``'a' or 'b'``) to append to a message; ``""``
    when no known name is close."""
    close = closest(name, known)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"

"""Where a key of a YAML document was written, and its value as plain Python.

Node files (``config/source.py``) and bundle manifests (``bundle/manifest.py``) are both
read with ruamel.yaml's round-trip loader, which keeps each key's line, so that every
error names ``file:line``. Both then turn the loader's containers and scalars into the
plain ``dict`` / ``list`` / ``int`` / ``float`` / ``bool`` / ``str`` the rules check with
``type``. The two pieces they share live here; each keeps its own walk, since they key
their line tables differently (a tuple path, a dotted string).
"""

from __future__ import annotations

from typing import Any


def line_of(container: Any, key: object, *, item: bool) -> int | None:
    """1-based line of a key (or, with ``item``, a list index) of a round-trip container,
    or None where the loader kept none (keys pulled in through a ``<<:`` merge)."""
    lc = getattr(container, "lc", None)
    if lc is None:
        return None
    try:
        row = lc.item(key)[0] if item else lc.key(key)[0]
    except (KeyError, IndexError, TypeError):
        return None
    return int(row) + 1


def plain_scalar(node: Any) -> Any:
    """A round-trip scalar as the builtin it subclasses (``ScalarFloat``, ``ScalarInt``,
    and ``ScalarBoolean``, which subclasses int), so checks can use ``type``; anything
    else unchanged."""
    if type(node).__name__ == "ScalarBoolean" or isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node

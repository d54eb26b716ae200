"""Where a key of a YAML document was written, and its value as plain Python.

Node files (``config/source.py``) and bundle manifests (``bundle/manifest.py``) are both
read with ruamel.yaml's round-trip loader, which keeps each key's line, so that every
error names ``file:line``. Both then turn the loader's containers and scalars into the
plain ``dict`` / ``list`` / ``int`` / ``float`` / ``bool`` / ``str`` the rules check with
``type``. The pieces they share live here; each keeps its own walk, since they key
their line tables differently (a tuple path, a dotted string).

Bounded loading
---------------
A YAML file is written by an operator, or -- a manifest in a dynamic repository -- by
whoever can write there, and both loaders turn aliases into repeated values: a 705-byte
node.yaml of nested aliases took over 60 s and 2 GiB, a 640-byte ``provenance`` of
10^6 aliases 69 s and 1.3 GiB, and 50,000 nested ``[`` raised RecursionError (issue 41;
ruamel's scanner is also quadratic in flow nesting). :func:`load_round_trip` refuses
both before building anything, with the line to look at (:class:`YamlTooLarge`):

* **nesting** past :data:`MAX_DEPTH` levels (block and flow together), refused by the
  scanner as it meets the level (:class:`_BoundedScanner`), before the parser or the
  composer recurse into it;
* **expansion** past :data:`MAX_NODES` values: one pass over the parser's events counts
  the values the document stands for, an alias counting as many as what its anchor
  holds, and stops at the alias that passes the bound -- in milliseconds, whatever it
  expands to. Aliases within the bound (an anchored ``defaults:`` block merged into each
  worker) load as before.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    ScalarEvent,
)
from ruamel.yaml.scanner import RoundTripScanner

#: Deepest nesting of mappings and sequences a file may have (a node file has five).
MAX_DEPTH = 64
#: Most values a file may stand for once its aliases are expanded.
MAX_NODES = 100_000


class YamlTooLarge(Exception):
    """A YAML file nests too deep or expands to too many values: ``line`` (1-based) and
    ``problem`` (a sentence without the file's name, each caller adds it)."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


class _BoundedScanner(RoundTripScanner):
    """ruamel's round-trip scanner, refusing nesting past :data:`MAX_DEPTH` as it meets it."""

    def _deeper(self) -> None:
        if len(self.indents) + self.flow_level >= MAX_DEPTH:
            raise YamlTooLarge(
                self.reader.line + 1,
                f"nested deeper than {MAX_DEPTH} levels of mappings and sequences",
            )

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:
        self._deeper()
        super().fetch_flow_collection_start(TokenClass, to_push)

    def add_indent(self, column: int) -> bool:
        if self.indent < column:
            self._deeper()
        return bool(super().add_indent(column))


def _loader() -> YAML:
    yaml = YAML(typ="rt", pure=True)
    yaml.Scanner = _BoundedScanner
    return yaml


def _check_expansion(text: str) -> None:
    """Raise :class:`YamlTooLarge` at the alias that makes ``text`` stand for more than
    :data:`MAX_NODES` values (one pass over the parser's events)."""
    expanded = 0  # values the document stands for so far, aliases expanded
    sizes: dict[str, int] = {}  # anchor -> values its node stands for
    open_: list[tuple[int, str | None]] = []  # collections: (expanded at start, anchor)
    for event in _loader().parse(text):
        if isinstance(event, ScalarEvent):
            expanded += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, AliasEvent):
            expanded += sizes.get(event.anchor or "", 1)
            if expanded > MAX_NODES:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise YamlTooLarge(
                    line,
                    f"the aliases make the file stand for more than {MAX_NODES} values; write "
                    "the values out, or repeat fewer of them",
                )
        elif isinstance(event, CollectionStartEvent):
            expanded += 1
            open_.append((expanded - 1, event.anchor))
        elif isinstance(event, CollectionEndEvent) and open_:
            start, anchor = open_.pop()
            if anchor:
                sizes[anchor] = expanded - start
    if expanded > MAX_NODES:  # values written out, without aliases: too many as well
        raise YamlTooLarge(1, f"the file holds more than {MAX_NODES} values")


def load_round_trip(text: str) -> Any:
    """``text`` loaded with ruamel's round-trip loader (lines kept), within the bounds of
    the module docstring: :class:`YamlTooLarge` past them, ruamel's ``YAMLError`` for
    text that is not YAML."""
    _check_expansion(text)
    return _loader().load(text)


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

"""Where each configuration value came from, and the one error a bad configuration gets.

Theory of operation
-------------------
A YAML file is read once with ruamel.yaml's round-trip loader, which keeps the position
of every key. It is turned into plain ``dict``/``list``/scalars and a ``SourceMap``: the
1-based line of every key path (``("global", "scheduler", "discipline") -> 14``). From
then on nothing needs ruamel; validation works on plain data and *paths*.

Every value that reaches a record has an ``Origin``: a line of a file (``FileOrigin``)
or an environment variable (``EnvOrigin``). A check that fails produces a ``Problem``
(origin + what was expected), and the checks never stop at the first one: a load
gathers every problem it can find and ``raise_all`` turns them into one
``ConfigError`` with one line per problem, in file order (environment problems after
file ones), so an operator fixes everything in one round and the report does not
depend on the order the checks happen to run in. Two rules keep the report free of
echoes: a key gets one line, from the first check that flagged it (each worker of a
node re-checks the shared ``global:`` block, and some keys meet two rules), and a value
that structuring had to drop or stand in for (its problem ``covers`` it) hides every
later complaint about that key or what is under it.

Message forms (the whole contract with operators and tests)::

    node.yaml:14: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'
    INFERENCE_SERVER_SCHEDULER_DISCIPLINE: expected one of fair, fifo, edf; got 'x'

The file is named as the caller gave it, lines are 1-based and point at the offending
key (or list item). A key with an empty value (``key:`` and nothing after it) is dropped
while reading: it means the same as leaving the key out.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn

import attrs
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from ..errors import ConfigError
from ..yaml_lines import YamlTooLarge, line_of, load_round_trip, plain_scalar

#: A key path: mapping keys are ``str``, list positions ``int``.
Path = tuple[str | int, ...]


def keypath(path: Path) -> str:
    """``("workers", 1, "scheduler", "discipline")`` -> ``workers[1].scheduler.discipline``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def show(value: object) -> str:
    """A value as an operator wrote it, for the ``got ...`` part of a message."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)


@attrs.frozen
class FileOrigin:
    """A key of a file: where the operator goes to fix it."""

    file: str
    #: 1-based; 0 when unknown (a record built in code rather than read from a file).
    line: int
    path: Path

    def render(self, message: str) -> str:
        where = f"{self.file}:{self.line}" if self.line > 0 else self.file
        return f"{where}: {keypath(self.path)}: {message}" if self.path else f"{where}: {message}"


@attrs.frozen
class EnvOrigin:
    """An environment variable."""

    var: str

    def render(self, message: str) -> str:
        return f"{self.var}: {message}"


Origin = FileOrigin | EnvOrigin


def describe(origin: Origin) -> str:
    """Where a value came from, for a message about another value."""
    if isinstance(origin, EnvOrigin):
        return origin.var
    where = f"{origin.file}:{origin.line}" if origin.line > 0 else origin.file
    return f"{keypath(origin.path)} at {where}" if origin.path else where


@attrs.frozen
class Problem:
    """One thing wrong with a configuration: where, and what was expected.

    ``covers`` is set when the value was dropped (or stood in for) so that the other
    checks could go on: it names the key whose later complaints would only echo this one.
    """

    origin: Origin
    message: str
    covers: Origin | None = None

    def sort_key(self) -> tuple[int, int, str]:
        if isinstance(self.origin, FileOrigin):
            return (0, self.origin.line, self.origin.file)
        return (1, 0, self.origin.var)

    def render(self) -> str:
        return self.origin.render(self.message)


def _within(origin: Origin, cover: Origin) -> bool:
    """Whether ``origin`` is the key ``cover`` names or lies under it."""
    if isinstance(origin, EnvOrigin) or isinstance(cover, EnvOrigin):
        return origin == cover
    return origin.file == cover.file and origin.path[: len(cover.path)] == cover.path


def report(problems: Iterable[Problem]) -> list[str]:
    """The lines of a report of ``problems``: echoes removed (module doc), in file order.

    One line per key: when two checks flag the same key (``base_port`` out of range, and
    so is ``base_port + 0``), the one that ran first -- the more specific, by construction
    of the callers -- speaks for it. The sort is stable, so problems on one line keep the
    order the checks ran in.
    """
    batch = list(problems)
    covers = [p.covers for p in batch if p.covers is not None]
    first: dict[Origin, Problem] = {}
    for p in batch:
        if p.covers is None and any(_within(p.origin, c) for c in covers):
            continue
        first.setdefault(p.origin, p)
    return [p.render() for p in sorted(first.values(), key=Problem.sort_key)]


def raise_all(problems: Iterable[Problem]) -> None:
    """Raise one ``ConfigError`` listing every problem (``report``), if there is any."""
    lines = report(problems)
    if lines:
        raise ConfigError(*lines)


def fail(origin: Origin, message: str) -> NoReturn:
    raise ConfigError(Problem(origin, message).render())


@attrs.frozen
class SourceMap:
    """The file a document came from and the line of each of its key paths."""

    file: str = "<config>"
    lines: Mapping[Path, int] = attrs.field(factory=dict)

    def line(self, path: Path) -> int:
        """The line of ``path``, or of its nearest ancestor that has one (0 if none)."""
        probe = path
        while probe not in self.lines and probe:
            probe = probe[:-1]
        return self.lines.get(probe, 0)

    def origin(self, path: Path) -> FileOrigin:
        return FileOrigin(self.file, self.line(path), path)


def read_yaml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], SourceMap]:
    """Read a YAML file whose top level is a mapping (an empty file is an empty mapping).

    Returns plain data (``dict``/``list``/``str``/``int``/``float``/``bool``; keys with an
    empty value dropped) and its ``SourceMap``.
    """
    file = os.fspath(path)
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: cannot read the file: not UTF-8 text ({exc.reason})") from None
    try:
        doc = load_round_trip(text)
    except YamlTooLarge as exc:
        raise ConfigError(f"{file}:{exc.line}: refused: {exc.problem}") from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{file}:{line}: not valid YAML: {what}") from None
    except YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    lines: dict[Path, int] = {(): 1}
    if doc is None:
        return {}, SourceMap(file, lines)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{file}:1: expected a mapping of keys at the top level; got {show(doc)}")
    data = _plain(doc, (), lines)
    assert isinstance(data, dict)
    return data, SourceMap(file, lines)


def _plain(node: Any, path: Path, lines: dict[Path, int]) -> Any:
    if isinstance(node, Mapping):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            # YAML reads ``123:`` as an integer key; every mapping of the schema is keyed
            # by names (a model may well live in a directory called 123), so keys are text.
            name = str(key)
            child = (*path, name)
            lines[child] = line_of(node, key, item=False) or lines.get(path, 1)
            if value is None:
                continue
            out[name] = _plain(value, child, lines)
        return out
    if isinstance(node, list | tuple):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            lines[child] = line_of(node, index, item=True) or lines.get(path, 1)
            items.append(_plain(value, child, lines))
        return items
    return plain_scalar(node)


class RawTree:
    """Plain data being assembled from several sources, with the origin of every path.

    Layers are applied in order (defaults are implicit: a path nobody set is left to the
    record's default). Mappings merge key by key; anything else replaces what was there.
    ``locate`` answers "where did the value at this path come from" for error messages,
    falling back to the nearest ancestor that was set (a missing key is reported at the
    line of the mapping that lacks it) and finally to ``root``.
    """

    def __init__(self, root: Origin) -> None:
        self.data: dict[str, Any] = {}
        self.origins: dict[Path, Origin] = {}
        self.root = root

    def overlay(
        self, block: Mapping[str, Any], origin_of: Callable[[Path], Origin], at: Path = ()
    ) -> None:
        """Deep-merge ``block`` at ``at``; ``origin_of`` maps a path relative to the block
        to its origin."""
        self._merge(block, origin_of, at, ())

    def _merge(
        self, block: Mapping[str, Any], origin_of: Callable[[Path], Origin], at: Path, rel: Path
    ) -> None:
        for key, value in block.items():
            inner: Path = (*rel, key)
            target = self._container((*at, *rel))
            if isinstance(value, Mapping) and isinstance(target.get(key), dict):
                self.origins[(*at, *inner)] = origin_of(inner)
                self._merge(value, origin_of, at, inner)
            else:

                def below(sub: Path, inner: Path = inner) -> Origin:
                    return origin_of((*inner, *sub))

                self.set((*at, *inner), value, origin_of(inner), origin_of=below)

    def set(
        self,
        path: Path,
        value: Any,
        origin: Origin,
        origin_of: Callable[[Path], Origin] | None = None,
    ) -> None:
        """Replace the value at ``path``. Paths inside ``value`` get ``origin_of`` (relative
        to ``path``) when given, else ``origin``."""
        container = self._container(path[:-1])
        container[str(path[-1])] = _copy(value)
        self.origins[path] = origin
        for sub in _subpaths(value):
            self.origins[(*path, *sub)] = origin_of(sub) if origin_of else origin

    def has(self, path: Path) -> bool:
        return self.get(path) is not _MISSING

    def get(self, path: Path) -> Any:
        """The value at ``path`` (list positions included), or ``_MISSING``."""
        node: Any = self.data
        for key in path:
            found = (isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)) or (
                isinstance(node, dict) and key in node
            )
            if not found:
                return _MISSING
            node = node[key]
        return node

    def locate(self, path: Path) -> Origin:
        probe = path
        while probe and probe not in self.origins:
            probe = probe[:-1]
        found = self.origins.get(probe, self.root)
        if isinstance(found, FileOrigin) and len(probe) < len(path):
            return FileOrigin(found.file, found.line, found.path + path[len(probe) :])
        return found

    def _container(self, path: Path) -> dict[str, Any]:
        node = self.data
        for key in path:
            child = node.get(str(key))
            if not isinstance(child, dict):
                child = node[str(key)] = {}
            node = child
        return node


_MISSING: Any = object()


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _subpaths(value: Any) -> Iterator[Path]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield (key,)
            for sub in _subpaths(item):
                yield (key, *sub)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield (index,)
            for sub in _subpaths(item):
                yield (index, *sub)

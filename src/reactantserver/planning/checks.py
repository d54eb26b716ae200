"""Reading the planner's files: typed values out of plain YAML data, every problem gathered.

The planner's three files (costs, traffic, device) are read like the configuration: with
:func:`reactantserver.config.source.read_yaml`, whose ``SourceMap`` knows the line of every
key, and checked by a :class:`Checker` that never stops at the first problem. Each getter
takes the mapping that holds the key and the key's *full* path, returns the value (or the
default, or ``None`` after recording a problem), and the caller ends with
``raise_all(checker.problems)``: one ``ConfigError``, one ``FILE:LINE: key.path: expected
...; got ...`` line per problem, in file order -- the messages the configuration gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.source import Path, Problem, SourceMap, show
from ..names import did_you_mean

__all__ = ["MISSING", "Checker"]

#: A getter's ``default`` meaning "the key is required".
MISSING: Any = object()


class Checker:
    """Typed getters over plain data, recording :class:`Problem`\\ s (module docstring)."""

    def __init__(self, lines: SourceMap) -> None:
        self.lines = lines
        self.problems: list[Problem] = []

    def problem(self, path: Path, message: str) -> None:
        self.problems.append(Problem(self.lines.origin(path), message))

    def keys(self, mapping: Mapping[str, Any], path: Path, allowed: Sequence[str]) -> None:
        """Refuse keys of ``mapping`` (at ``path``) that are not ``allowed``."""
        for key in mapping:
            if key not in allowed:
                hint = did_you_mean(str(key), allowed)
                self.problem(
                    (*path, key), f"unknown key; expected one of {', '.join(allowed)}{hint}"
                )

    def _get(self, parent: Mapping[str, Any], path: Path, default: Any) -> Any:
        key = str(path[-1])
        if not isinstance(parent, Mapping) or key not in parent:
            if default is MISSING:
                self.problem(path, "missing; it is required")
            return MISSING
        return parent[key]

    def mapping(
        self, parent: Mapping[str, Any], path: Path, *, required: bool = True
    ) -> dict[str, Any]:
        value = self._get(parent, path, MISSING if required else None)
        if value is MISSING:
            return {}
        if not isinstance(value, Mapping):
            self.problem(path, f"expected a mapping; got {show(value)}")
            return {}
        return dict(value)

    def number(
        self,
        parent: Mapping[str, Any],
        path: Path,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        strict: bool = False,
        default: Any = MISSING,
    ) -> Any:
        """A finite number; ``strict``: above ``minimum``, not equal to it."""
        value = self._get(parent, path, default)
        if value is MISSING:
            return None if default is MISSING else default
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            self.problem(path, f"expected a number; got {show(value)}")
            return None if default is MISSING else default
        if minimum is not None and (value <= minimum if strict else value < minimum):
            self.problem(
                path, f"expected a number {'>' if strict else '>='} {minimum:g}; got {show(value)}"
            )
            return None if default is MISSING else default
        if maximum is not None and value > maximum:
            self.problem(path, f"expected a number <= {maximum:g}; got {show(value)}")
            return None if default is MISSING else default
        return float(value)

    def integer(
        self,
        parent: Mapping[str, Any],
        path: Path,
        *,
        minimum: int | None = None,
        default: Any = MISSING,
    ) -> Any:
        value = self._get(parent, path, default)
        if value is MISSING:
            return None if default is MISSING else default
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(path, f"expected a whole number; got {show(value)}")
            return None if default is MISSING else default
        if minimum is not None and value < minimum:
            self.problem(path, f"expected a whole number >= {minimum}; got {show(value)}")
            return None if default is MISSING else default
        return value

    def text(self, parent: Mapping[str, Any], path: Path, *, default: Any = MISSING) -> Any:
        value = self._get(parent, path, default)
        if value is MISSING:
            return None if default is MISSING else default
        if not isinstance(value, str):
            self.problem(path, f"expected text; got {show(value)}")
            return None if default is MISSING else default
        return value

    def choice(
        self,
        parent: Mapping[str, Any],
        path: Path,
        options: Sequence[str],
        *,
        default: Any = MISSING,
    ) -> Any:
        value = self._get(parent, path, default)
        if value is MISSING:
            return None if default is MISSING else default
        if value not in options:
            hint = did_you_mean(str(value), options) if isinstance(value, str) else ""
            self.problem(path, f"expected one of {', '.join(options)}; got {show(value)}{hint}")
            return None if default is MISSING else default
        return value

    def size_table(self, parent: Mapping[str, Any], path: Path) -> dict[int, float]:
        """A mapping of batch sizes (whole numbers >= 1) to seconds (> 0), not empty."""
        table = self.mapping(parent, path)
        out: dict[int, float] = {}
        for key in table:
            where = (*path, key)
            try:
                size = int(key)
            except ValueError:
                size = 0
            if size < 1 or str(size) != str(key):
                self.problem(where, f"expected a batch size (a whole number >= 1); got {key!r}")
                continue
            value = self.number(table, where, minimum=0.0, strict=True)
            if value is not None:
                out[size] = value
        if not table and path[-1] in parent:
            self.problem(path, "expected seconds at one compiled batch size at least")
        return out

    def spread(self, parent: Mapping[str, Any], path: Path) -> tuple[float, ...]:
        """A list of positive numbers (measured / expected ratios), returned sorted; ``()``
        when absent."""
        value = self._get(parent, path, None)
        if value is MISSING:
            return ()
        items = value if isinstance(value, list) else None
        if not items or any(
            isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0
            for x in items
        ):
            self.problem(path, f"expected a list of numbers > 0; got {show(value)}")
            return ()
        return tuple(sorted(float(x) for x in items))

    def rows(self, parent: Mapping[str, Any], path: Path) -> tuple[int, ...] | None:
        """Rows per request: a whole number >= 1, or a list of them (drawn uniformly)."""
        value = self._get(parent, path, None)
        if value is MISSING:
            return None
        items = value if isinstance(value, list) else [value]
        out = []
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                where = (*path, i) if isinstance(value, list) else path
                self.problem(where, f"expected a whole number of rows >= 1; got {show(item)}")
                return None
            out.append(item)
        if not out:
            self.problem(path, "expected a whole number of rows >= 1, or a list of them")
            return None
        return tuple(out)

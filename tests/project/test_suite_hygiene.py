"""The suite does not bet on the real clock.

A sleep in a test that stands in for an event (the server has the call by now, the log
line is written by now) passes on an idle machine and fails on a loaded one. So every
``time.sleep``, ``asyncio.sleep`` or ``trio.sleep`` in ``tests/`` with an argument other
than a literal 0 (a bare yield) must be one of:

- on a virtual clock: lexically inside a function that takes pytest-trio's
  ``autojump_clock`` fixture or makes a ``MockClock(autojump_threshold=...)`` for its own
  ``trio.run``, or marked ``# virtual-clock: <what moves it>`` (a fake's sleep that only
  virtual-time tests reach, a ``clocks.VirtualClockLoop`` test);
- a real wait that is part of the scenario, marked ``# real-clock: <reason>`` (a hostile
  client that must pause between sends, an idle timeout of a real process under test, the
  poll of ``clocks.wait_until``).

Waiting for an event is done with ``clocks.wait_until`` (another thread or process),
``clocks.Changes`` (the test's own asyncio loop) or an event of the code under test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"time", "asyncio", "trio"}
VIRTUAL_FIXTURES = {"autojump_clock"}
REASON = re.compile(r"#\s*(real|virtual)-clock:\s*\S")


def _is_sleep(call: ast.Call) -> bool:
    func = call.func
    if not (
        isinstance(func, ast.Attribute)
        and func.attr == "sleep"
        and isinstance(func.value, ast.Name)
        and func.value.id in CLOCKS
    ):
        return False
    argument = call.args[0] if call.args else None
    return not (isinstance(argument, ast.Constant) and argument.value == 0)


def _is_autojump_clock(node: ast.AST) -> bool:
    """``MockClock(autojump_threshold=...)``, however ``MockClock`` is reached."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "MockClock" and any(k.arg == "autojump_threshold" for k in node.keywords)


class _Finder(ast.NodeVisitor):
    """One walk: each sleep with the functions around it, and the functions on a
    virtual clock (a fixture parameter, or a MockClock made anywhere inside)."""

    def __init__(self) -> None:
        self.around: list[ast.AST] = []  # the enclosing functions, outermost first
        self.virtual: set[ast.AST] = set()
        self.sleeps: list[tuple[ast.Call, tuple[ast.AST, ...]]] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if {a.arg for a in node.args.args + node.args.kwonlyargs} & VIRTUAL_FIXTURES:
            self.virtual.add(node)
        self.around.append(node)
        self.generic_visit(node)
        self.around.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Call(self, node: ast.Call) -> None:
        if _is_sleep(node):
            self.sleeps.append((node, tuple(self.around)))
        elif _is_autojump_clock(node):
            self.virtual.update(self.around)
        self.generic_visit(node)

    def found(self) -> list[tuple[int, int, bool]]:
        """(first line, last line, on a virtual clock) of each sleep."""
        return [
            (call.lineno, call.end_lineno or call.lineno, not self.virtual.isdisjoint(around))
            for call, around in self.sleeps
        ]


def clock_sleeps(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, text) of each sleep in ``path``: kind "autojump", "virtual", "real"
    (the two last from their comment) or "unexplained"."""
    source = path.read_text()
    if "sleep(" not in source:
        return []
    lines = source.splitlines()
    finder = _Finder()
    finder.visit(ast.parse(source))
    out = []
    for first, last, virtual in finder.found():
        # The comment on one of the call's lines (a sleep's own lines hold no such string).
        reasons = [m for m in (REASON.search(lines[n - 1]) for n in range(first, last + 1)) if m]
        kind = "autojump" if virtual else reasons[0].group(1) if reasons else "unexplained"
        out.append((first, kind, lines[first - 1].strip()))
    return out


def test_every_real_clock_sleep_in_the_tests_says_why() -> None:
    """Each sleep in tests/ is on a virtual clock or carries ``# real-clock: <reason>``:
    none stands in for an event without saying so."""
    unexplained = [
        f"{path.relative_to(TESTS.parent)}:{line}: {text}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, kind, text in clock_sleeps(path)
        if kind == "unexplained"
    ]
    assert not unexplained, (
        "sleeps on the real clock with no reason given (wait for the event instead: "
        "clocks.wait_until, clocks.Changes, autojump_clock; or say why with "
        "'# real-clock: <reason>'):\n" + "\n".join(unexplained)
    )


def test_the_finder_sees_sleeps_and_their_reasons(tmp_path: Path) -> None:
    """The check itself: a bare sleep is unexplained, a yield is no sleep, a reason or an
    autojump_clock test explains one, and a reason must say something."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio, time, trio\n"
        "def a():\n"
        "    time.sleep(0.1)\n"
        "    time.sleep(0)\n"
        "    time.sleep(1)  # real-clock: the child must exit first\n"
        "    time.sleep(1)  # real-clock:\n"
        "async def b(autojump_clock):\n"
        "    async def inner():\n"
        "        await trio.sleep(5)\n"
        "async def c(delay):\n"
        "    await asyncio.sleep(\n"
        "        delay,  # virtual-clock: VirtualClockLoop\n"
        "    )\n"
        "    await trio.sleep(delay)\n"
        "def d():\n"
        "    async def main():\n"
        "        await trio.sleep(3)\n"
        "    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))\n"
        "    trio.run(main, clock=trio.testing.MockClock())\n"
    )
    assert [(line, kind) for line, kind, _ in clock_sleeps(sample)] == [
        (3, "unexplained"),
        (5, "real"),
        (6, "unexplained"),
        (9, "autojump"),
        (11, "virtual"),
        (14, "unexplained"),
        (17, "autojump"),
    ]

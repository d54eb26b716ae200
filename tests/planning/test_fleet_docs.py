"""docs/fleet.md's prose quotes only numbers its output blocks print.

Issue 42: the page's prose quoted 74.2, 105.7 and 2.94 where its own tables said 71.6,
103.4 and 2.91 (the tables had been regenerated, the prose not), and a two-line excerpt of
``--replicas m01=2`` was in no test at all. Now every block of "Comparing the modes" is a
``doc-test: command`` block, which tests/docs/test_docs_output.py runs and compares with the
page, and this test checks the other link of the chain: each number of the section's prose
-- outside code, where the inputs are written (`--budget-ratio 0.9`, `2-8 ms`) -- is a
number one of the section's output blocks prints. A number copied by hand from an older
run fails here; one that the command prints, the docs test keeps current.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
SECTION = ("## Comparing the modes", "## Live benchmark")
_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.S | re.M)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:x|%)?(?![\w.])")


def _section() -> str:
    text = PAGE.read_text()
    start, end = (text.index(heading) for heading in SECTION)
    return text[start:end]


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(text)


def test_every_number_of_the_prose_is_printed_by_a_block() -> None:
    section = _section()
    blocks = _FENCE.findall(section)
    assert len(blocks) == 3, "the section's three commands and their output"
    printed = set(_numbers("\n".join(blocks)))
    prose = _FENCE.sub("", section)
    prose = re.sub(r"`[^`]*`", "", prose)  # inputs and names are code
    prose = re.sub(r"<!--.*?-->", "", prose)
    quoted = _numbers(prose)
    assert len(quoted) >= 20, quoted
    assert [n for n in quoted if n not in printed] == []


def test_every_block_of_the_section_is_run() -> None:
    section = _section()
    for match in _FENCE.finditer(section):
        before = section[: match.start()].rstrip().splitlines()[-1]
        assert before == "<!-- doc-test: command -->", match[0][:60]

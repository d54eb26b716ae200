"""Every reference in the docs and the docstrings that can drift, resolved against the tree.

What drifts when code moves is a name: a path a page shows, a module a docstring points
at, a section another page links to. Each test below collects every reference of one kind,
resolves it against what exists now, and fails naming each broken one as ``FILE:LINE``.
Nothing here lists the modules or the pages: whatever exists is what references must
resolve to, so a file moved (or a package split) fails the references that still name
the old place, and nothing else.

The kinds
---------
Paths (current pages: ``docs/*.md`` and ``README.md``)
    every word of an inline code span (``\\`...\\```) that is a repository path: one that
    starts with a top-level folder or file of the checkout (``src/``, ``tests/``,
    ``benchmarks/``, ``docs/``, ``noxfile.py``, ...) exists there (a ``*`` is a glob that
    must match; ``FILE::NAME`` also needs ``def NAME`` in FILE); one that starts with a
    package of ``src/reactantserver`` (``h2/core.py``, ``scheduling/``) exists
    under ``src/reactantserver/`` (``transport/h2conn.HeldWrites``: that module has that
    name); a bare file name (``h2/server.py``) is some file of the checkout's source folders.
    The ``docs/<page>.md`` a source file names in its text exists too.
    A file as it was at a commit is named the way git names it, ``COMMIT:PATH``
    (``a02cdcc:gateway/http2.py``, ``250bf86^:transport/h2rules.py``): it must have existed there.
Dotted names (current pages)
    ``reactantserver.x.y`` (a call's ``(...)`` dropped) imports, or is a name of the
    module it starts with, or is a logger the package names.
Roles (docstrings and comments under ``src/``)
    every ``:mod:``, ``:class:``, ``:func:``, ``:meth:``, ``:attr:``, ``:data:``,
    ``:exc:`` target resolves by import and ``getattr``, Sphinx's way: ``~`` dropped; a
    target with a leading dot relative to the module's package (``.h2core``) or to the
    module itself; otherwise a name of the module (or of one of its classes, for a
    method's docstring), else an absolute name, else a builtin. An attribute an
    ``attrs`` class or an annotation declares, or one its methods set on ``self``, counts.
Links (every page, ``docs/history/`` included)
    a relative markdown link ``[text](other.md#anchor)`` names an existing file and, for
    a page, an existing heading anchor under GitHub's slug rule (:func:`slug`).
Quoted sections (docs pages and source text)
    ``(docs/benchmarks.md, "The gateway")`` names a page and the start of one of its
    headings.
Nox sessions (pages and source text)
    ``nox -s <name>`` names a session of ``noxfile.py``.
Package maps
    a package ``__init__.py`` whose docstring names three or more of the package's
    modules is a map of the package: it names every one of them (a module added later
    is added to the map, or the docstring states a rule instead of a list).

``docs/history/`` records what was true when each figure was measured: its pages may name
files that have since moved, so only their links are checked.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "reactantserver"
#: Pages that say what is true now (paths, names and sessions checked).
CURRENT = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
#: Every page (links checked).
PAGES = [*CURRENT, *sorted((ROOT / "docs").glob("*/**/*.md"))]
#: The checkout's folders whose files a bare file name may mean.
SOURCE_FOLDERS = ("src", "tests", "benchmarks", "examples", "deploy", "proto", ".ci")
#: Paths a page names that a command makes (ignored by git, absent from a fresh clone).
MADE = ("examples/repo",)
#: Generated code: no docstrings of ours.
GENERATED = ("protocol/inference", "protocol/reactant_control", "protocol/grpc")


@attrs.frozen
class Ref:
    where: str  # FILE:LINE
    target: str

    def __str__(self) -> str:
        return f"{self.where}: {self.target}"


def _rel(path: Path) -> str:
    """A path as the messages name it: relative to the checkout (a page outside: its name)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def source_files() -> list[Path]:
    """The checkout's Python files whose text may name pages and sessions."""
    files = [ROOT / "noxfile.py"]
    for folder in ("src", "tests", "benchmarks", "examples", "deploy"):
        files += sorted((ROOT / folder).rglob("*.py"))
    this = Path(__file__).resolve()  # its broken references are on purpose
    return [
        f
        for f in files
        if "__pycache__" not in f.parts
        and not str(f.relative_to(ROOT)).startswith(MADE)
        and f != this
    ]


def package_files() -> list[Path]:
    """The package's own modules (not the generated protobuf code)."""
    return [
        f
        for f in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in f.parts and not any(g in _rel(f) for g in GENERATED)
    ]


# ------------------------------------------------------------------ reading markdown


_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a page outside fenced blocks and HTML comments."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and not line.lstrip().startswith("<!--"):
            yield number, line


_SHELLS = ("sh", "bash", "shell", "console")


def command_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command) of the commands a page's fenced blocks show: every line of a
    ``sh``/``bash`` block, the ``$ `` lines of any other. Output is left alone: a block of
    output is a capture of what a run printed that day."""
    info = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := _FENCE.match(line):
            info = None if info is not None else line[m.end() :].strip() or ""
        elif info is not None:
            if line.startswith("$ "):
                yield number, line[2:]
            elif info in _SHELLS[:3] and not line.lstrip().startswith("#"):
                yield number, line


_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line number, content) of every inline code span outside fenced blocks."""
    for number, line in prose_lines(text):
        for m in _SPAN.finditer(line):
            yield number, m[1]


def heading_texts(text: str) -> list[str]:
    """A page's ATX headings, as text (fenced blocks skipped)."""
    return [
        m[1].strip().rstrip("#").strip()
        for _, line in prose_lines(text)
        if (m := re.match(r"^#{1,6}\s+(.*)$", line))
    ]


def _rendered(heading: str) -> str:
    """A heading's text as rendered: links by their text, code and emphasis marks gone."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = re.sub(r"<[^>]+>", "", heading)
    return heading.replace("`", "").replace("*", "")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text lower-cased, every character that
    is not a letter, digit, space, ``-`` or ``_`` dropped, each space a ``-``."""
    text = _rendered(heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page; a repeated one gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in heading_texts(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    # Explicit anchors a page sets itself: <a id="..."></a> / <a name="...">.
    found.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return found


_LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every markdown link outside fenced blocks and code spans."""
    for number, line in prose_lines(text):
        for m in _LINK.finditer(_SPAN.sub("``", line)):
            yield number, m[1]


# ------------------------------------------------------------------ resolving


def _top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {".ci"}


def _subpackages() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def _basenames() -> set[str]:
    names = {p.name for p in ROOT.iterdir() if p.is_file()}
    for folder in SOURCE_FOLDERS:
        names.update(p.name for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts)
    return names


@functools.cache
def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has_attribute(owner: Any, name: str) -> bool:
    """``owner.name`` exists, or ``owner`` is a class that declares ``name`` (an attrs
    field, an annotation, or ``self.name = ...`` in one of its methods)."""
    if hasattr(owner, name):
        return True
    if not isinstance(owner, type):
        return False
    for klass in owner.__mro__:
        if attrs.has(klass) and name in attrs.fields_dict(klass):
            return True
        if name in getattr(klass, "__annotations__", {}):
            return True
        if name in _self_attributes(klass):
            return True
    return False


@functools.cache
def _tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())


@functools.cache
def _self_attributes(klass: type) -> frozenset[str]:
    """The names ``klass``'s own methods assign on ``self`` (read from its source)."""
    import inspect

    try:
        path = inspect.getsourcefile(klass)
    except TypeError:
        return frozenset()
    if path is None or not path.endswith(".py"):
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Attribute)
                    and isinstance(inner.ctx, ast.Store)
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id == "self"
                ):
                    found.add(inner.attr)
    return frozenset(found)


def _chain(owner: Any, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if i == len(parts) - 1:
            return _has_attribute(owner, part)
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def resolves(dotted: str) -> bool:
    """``dotted`` is a module, or a name (chain) of the longest module it starts with."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module(".".join(parts[:cut]))
        if module is not None:
            return cut == len(parts) or _chain(module, parts[cut:])
    return False


def _classes_of(module: ModuleType) -> list[type]:
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__
    ]


def role_resolves(target: str, module_name: str, is_package: bool) -> bool:
    """A role's target, as Sphinx looks it up from ``module_name``."""
    target = target.lstrip("~!").removesuffix("()")
    module = importlib.import_module(module_name)
    package = module_name if is_package else module_name.rpartition(".")[0]
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
        rest = target[dots:]
        return resolves(f"{base}.{rest}") or _chain(module, rest.split("."))
    parts = target.split(".")
    if _chain(module, parts) or resolves(target) or _chain(builtins, parts):
        return True
    if resolves(f"{package}.{target}"):
        return True
    # A method's docstring naming a sibling: ``:meth:`close``` inside the class.
    return any(_chain(klass, parts) for klass in _classes_of(module))


_ROLE = re.compile(r":(mod|class|func|meth|attr|data|exc|obj):`(?:[^`<]*<)?([^`>]+)>?`")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT / "src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def roles() -> list[tuple[Ref, str, bool]]:
    """(reference, module it appears in, whether that module is a package)."""
    found = []
    for path in package_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in _ROLE.finditer(line):
                ref = Ref(f"{_rel(path)}:{number}", f":{m[1]}:`{m[2]}`")
                found.append((ref, module_name(path), path.name == "__init__.py"))
    return found


_PATH_WORD = re.compile(r"^[\w.~*/-]+(?:::\w+)?$")


def path_problem(word: str, top: set[str], packages: set[str], names: set[str]) -> str | None:
    """Why ``word`` (a word of a code span) is a broken repository path; None when it is
    no repository path or it resolves."""
    word = word.strip(",;:()\"'").removesuffix(".")
    if m := re.fullmatch(r"([0-9a-f]{7,40}\^?):([\w./-]+)", word):
        return _at_commit(m[1], m[2])
    if not _PATH_WORD.match(word) or word.startswith(("/", "~", ".")) or "://" in word:
        return None
    word, _, function = word.partition("::")
    word = re.sub(r":\d+$", "", word)
    first = word.split("/")[0]
    if "/" in word or word in top:
        if first == "reactantserver":
            base, word = PACKAGE.parent, word
        elif first in top:
            base = ROOT
        elif first in packages:
            base = PACKAGE
        else:
            return None  # a user's path (repo/logreg/, secrets/admin.key)
        if word.startswith(MADE):
            return None
        last = word.rstrip("/").split("/")[-1]
        stem, dot, name = last.partition(".")
        if dot and "." not in name and not (base / word).exists() and name.isidentifier():
            # transport/h2conn.HeldWrites: a module and a name of it
            module = (base / word).parent / f"{stem}.py"
            if module.is_file() and module.is_relative_to(ROOT / "src"):
                if resolves(f"{module_name(module)}.{name}"):
                    return None
                return f"{module_name(module)} has no {name}"
        matches = list(base.glob(word)) if "*" in word else [base / word]
        if not any(m.exists() for m in matches):
            return "no such file"
        if function:
            source = matches[0].read_text()
            if not re.search(rf"^\s*(?:async )?def {function}\b", source, re.M):
                return f"{word} has no {function}"
        return None
    if re.fullmatch(r"[\w-]+\.py", word) and word not in names:
        return "no file of that name in the checkout"
    return None


def _at_commit(commit: str, path: str) -> str | None:
    """``COMMIT:PATH`` (git's way of naming a file as it was): the file at that commit, where
    the clone has the commit (a shallow one may not: then it is taken on trust)."""

    def git(*args: str) -> int:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode

    if git("cat-file", "-e", f"{commit}^{{commit}}") != 0:
        return None
    for base in ("", "src/reactantserver/"):
        if git("cat-file", "-e", f"{commit}:{base}{path}") == 0:
            return None
    return f"no {path} at {commit}"


def _page_problems(pages: Iterable[Path], check: Any, lines: Any = code_spans) -> list[str]:
    problems = []
    for page in pages:
        for number, span in lines(page.read_text()):
            for problem in check(span):
                problems.append(f"{_rel(page)}:{number}: {problem}")
    return problems


# ------------------------------------------------------------------ the tests


def broken_paths(pages: Iterable[Path]) -> list[str]:
    top, packages, names = _top_level(), _subpackages(), _basenames()

    def check(span: str) -> Iterator[str]:
        for word in span.split():
            problem = path_problem(word, top, packages, names)
            if problem:
                yield f"`{word}`: {problem}"

    def check_command(command: str) -> Iterator[str]:
        # In a command only what starts at the checkout's top is a path of ours.
        for word in re.split(r"[\s=]+", command):
            if word.split("/")[0] in top and ("/" in word or word.endswith(".py")):
                problem = path_problem(word, top, packages, names)
                if problem:
                    yield f"`{word}` (a command): {problem}"

    return sorted(
        _page_problems(pages, check) + _page_problems(pages, check_command, command_lines),
        key=_by_place,
    )


def _by_place(problem: str) -> tuple[str, int]:
    page, line, _ = problem.split(":", 2)
    return page, int(line)


def test_every_path_a_page_shows_exists() -> None:
    broken = broken_paths(CURRENT)
    assert broken == [], "paths the pages show that do not exist:\n" + "\n".join(broken)


def test_every_page_the_code_names_exists() -> None:
    broken = []
    for path in source_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for page in re.findall(r"\bdocs/[\w/-]+\.md\b", line):
                if not (ROOT / page).is_file():
                    broken.append(f"{_rel(path)}:{number}: {page}")
    assert broken == [], "pages the code names that do not exist:\n" + "\n".join(broken)


_DOTTED = re.compile(r"^reactantserver(?:\.\w+)+")


def logger_names() -> set[str]:
    """The loggers the package names (``logging.getLogger("reactantserver.x")``)."""
    found = set()
    for path in package_files():
        found.update(re.findall(r"getLogger\(\s*\"([\w.]+)\"", path.read_text()))
    return found


def broken_names(pages: Iterable[Path]) -> list[str]:
    loggers = logger_names()

    def check(span: str) -> Iterator[str]:
        m = _DOTTED.match(span.strip())
        if m and m[0] not in loggers and not resolves(m[0]):
            yield f"`{span}`: does not import"

    return _page_problems(pages, check)


def test_every_dotted_name_a_page_shows_imports() -> None:
    broken = broken_names(CURRENT)
    assert broken == [], "dotted names that do not resolve:\n" + "\n".join(broken)


def test_every_role_in_the_docstrings_resolves() -> None:
    found = roles()
    assert len(found) > 100, "the role pattern finds (next to) nothing: is it still right?"
    broken = [
        str(ref)
        for ref, module, is_package in found
        if not role_resolves(ref.target[ref.target.index("`") + 1 : -1], module, is_package)
    ]
    assert broken == [], "roles whose target does not resolve:\n" + "\n".join(broken)


def broken_links(pages: Iterable[Path]) -> list[str]:
    broken = []
    for page in pages:
        for number, target in links(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{_rel(page)}:{number}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors_of(file):
                broken.append(f"{where}: {file.name} has no heading #{anchor}")
    return broken


@functools.cache
def _anchors_of(page: Path) -> set[str]:
    return anchors(page.read_text())


def test_every_link_between_pages_resolves() -> None:
    broken = broken_links(PAGES)
    assert broken == [], "links that lead nowhere:\n" + "\n".join(broken)


_QUOTED = re.compile(r"\b((?:docs/)?(?:history/)?[\w-]+\.md),? \"([^\"]+)\"")


def broken_sections(files: Iterable[Path]) -> list[str]:
    broken = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for page, title in _QUOTED.findall(line):
                file = ROOT / page if page.startswith("docs/") else ROOT / "docs" / page
                if not file.is_file():
                    broken.append(f"{_rel(path)}:{number}: {page}: no such page")
                    continue
                if not any(h.startswith(title.lower()) for h in _headings_of(file)):
                    broken.append(f'{_rel(path)}:{number}: {page} has no section "{title}"')
    return broken


@functools.cache
def _headings_of(page: Path) -> list[str]:
    return [_rendered(h).lower() for h in heading_texts(page.read_text())]


def test_every_quoted_section_exists() -> None:
    broken = broken_sections([*PAGES, *source_files()])
    assert broken == [], "sections named that no page has:\n" + "\n".join(broken)


def nox_sessions() -> set[str]:
    """The sessions ``noxfile.py`` defines: its functions under a session decorator."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ast.unparse(call) in ("session", "nox.session"):
                named = [
                    k.value.value
                    for k in getattr(decorator, "keywords", [])
                    if k.arg == "name" and isinstance(k.value, ast.Constant)
                ]
                sessions.add(named[0] if named else node.name)
    return sessions


def test_every_nox_session_named_exists() -> None:
    sessions = nox_sessions()
    assert {"tests", "lint", "bench"} <= sessions, sessions
    broken = []
    for path in [*PAGES, *source_files()]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r"\bnox -s ([\w-]+)", line):
                if name not in sessions:
                    broken.append(f"{_rel(path)}:{number}: nox -s {name}")
    assert broken == [], f"sessions noxfile.py does not define ({sorted(sessions)}):\n" + "\n".join(
        broken
    )


def modules_of(package: Path) -> set[str]:
    """A package's modules and subpackages, by name."""
    return {
        p.stem
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }


def named_modules(docstring: str, package: str, modules: set[str]) -> set[str]:
    """The package's modules a docstring names: ````x````, ````pkg.x.Name````,
    ``:mod:`.x```, ``x.py``."""
    words = re.findall(r"``([^`]+)``", docstring)
    words += re.findall(r":\w+:`~?([^`]+)`", docstring)
    words += re.findall(r"\b(\w+)\.py\b", docstring)
    own = package.removeprefix("reactantserver.")
    found = set()
    for word in words:
        word = word.lstrip(".")
        if word.startswith("reactantserver."):
            if not word.startswith(f"{package}."):
                continue
            word = word.removeprefix(f"{package}.")
        word = word.removeprefix(f"{own}.")
        first = re.split(r"[./\s(]", word)[0]
        if first in modules:
            found.add(first)
    return found


def package_maps() -> list[tuple[str, set[str]]]:
    """(package ``__init__.py``, the modules its map leaves out) for every package map."""
    maps = []
    for init in package_files():
        if init.name != "__init__.py" or init.parent == PACKAGE:
            continue  # the top-level package's docstring is its public surface, not a map
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        modules = modules_of(init.parent)
        named = named_modules(docstring, module_name(init), modules)
        if len(named) >= 3:
            maps.append((_rel(init), modules - named))
    return maps


def test_every_package_map_names_every_module() -> None:
    maps = package_maps()
    assert len(maps) >= 5, "fewer package maps than there are: is named_modules still right?"
    missing = [f"{init}:1: leaves out {sorted(left)}" for init, left in maps if left]
    assert missing == [], "package docstrings that list some modules, not all:\n" + "\n".join(
        missing
    )


# ------------------------------------------------------------------ the checker itself


def test_the_slug_is_githubs() -> None:
    """GitHub's anchors for headings this project writes (checked on github.com)."""
    assert slug("The gateway (issue 17)") == "the-gateway-issue-17"
    assert slug("(b) Prefetch on and off, Zipf catalog ten times the budget") == (
        "b-prefetch-on-and-off-zipf-catalog-ten-times-the-budget"
    )
    assert slug(
        "Cheaper routing and slot checks; how far an A/B of two processes can be trusted"
    ) == ("cheaper-routing-and-slot-checks-how-far-an-ab-of-two-processes-can-be-trusted")
    assert slug("The gateway's own timeout is no longer sent") == (
        "the-gateways-own-timeout-is-no-longer-sent"
    )
    assert slug("(a) Cold-load bandwidth: the weight cache against a plain `jax.device_put`") == (
        "a-cold-load-bandwidth-the-weight-cache-against-a-plain-jaxdevice_put"
    )
    assert anchors("# A\n\n## A\n\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def _a_module_with_a_class() -> tuple[Path, str, str]:
    """Some module of a subpackage that defines a class: (its file, its name, the class)."""
    for path in package_files():
        if path.parent != PACKAGE and path.name != "__init__.py":
            classes = _classes_of(importlib.import_module(module_name(path)))
            if classes:
                return path, module_name(path), classes[0].__name__
    raise AssertionError("no module of a subpackage defines a class")


def test_the_checker_names_each_broken_reference(tmp_path: Path) -> None:
    """A page with one broken reference of each kind gets one problem for each, at its
    line; the same page with the references mended gets none. The references are made
    from whatever module exists, so that moving files keeps this test true."""
    path, module, klass = _a_module_with_a_class()
    where = str(path.relative_to(PACKAGE))  # sub/module.py
    sub, stem = where.split("/")[0], path.stem
    other = tmp_path / "other.md"
    other.write_text("# Other\n\n## The section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        f"See `{sub}/no_such_module.py` and `src/reactantserver/{sub}/gone.py`.\n"
        f"Also `no_such_file.py`, `{module}.NoSuchName` and `{where[:-3]}.NoSuchName`.\n"
        "[a](other.md#no-such-section) and [b](missing.md) and [c](#page)\n"
        "```\n`transport/in_a_fence.py`\n```\n"
        'and (other.md, "No such section"), `tests/docs/test_docs_references.py::no_such_test`\n'
    )
    assert broken_paths([page]) == [
        f"page.md:2: `{sub}/no_such_module.py`: no such file",
        f"page.md:2: `src/reactantserver/{sub}/gone.py`: no such file",
        "page.md:3: `no_such_file.py`: no file of that name in the checkout",
        f"page.md:3: `{where[:-3]}.NoSuchName`: {module} has no NoSuchName",
        "page.md:8: `tests/docs/test_docs_references.py::no_such_test`: "
        "tests/docs/test_docs_references.py has no no_such_test",
    ]
    assert broken_names([page]) == [f"page.md:3: `{module}.NoSuchName`: does not import"]
    assert broken_links([page]) == [
        "page.md:4: (other.md#no-such-section): other.md has no heading #no-such-section",
        "page.md:4: (missing.md): no such file",
    ]
    (tmp_path / "docs").mkdir()
    other.rename(tmp_path / "docs" / "other.md")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_sections([page]) == ['page.md:8: other.md has no section "No such section"']
        page.write_text('(other.md, "The section")\n')
        assert broken_sections([page]) == []
    finally:
        ROOT = saved
    page.write_text(
        "# Page\n"
        f"See `{where}`, `src/reactantserver/{where}`, `{path.name}`,\n"
        f"`{module}`, `{module}.{klass}`, `{where[:-3]}.{klass}`,\n"
        "`tests/docs/test_docs_references.py::test_the_slug_is_githubs`.\n"
        "[a](docs/other.md#the-section) and [c](#page)\n"
    )
    assert broken_paths([page]) == broken_names([page]) == []
    assert broken_links([page]) == []
    package = module.rpartition(".")[0]
    assert role_resolves(f".{stem}", f"{package}.__init__"[: -len(".__init__")], True)
    assert role_resolves(f"~{module}.{klass}", "reactantserver", True)
    assert role_resolves(klass, module, False)
    assert not role_resolves(".no_such_module", module, False)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    if head.returncode == 0:  # a checkout with its history: COMMIT:PATH is looked up
        commit = head.stdout.decode().strip()
        assert path_problem(f"{commit}:noxfile.py", set(), set(), set()) is None
        assert path_problem(f"{commit}:{where}", set(), set(), set()) is None
        assert path_problem(f"{commit}:{sub}/gone.py", set(), set(), set()) == (
            f"no {sub}/gone.py at {commit}"
        )
    assert not role_resolves("NoSuchClass", module, False)


def test_the_package_map_rule_reads_the_names_a_docstring_uses() -> None:
    modules = {"table", "routing", "wire", "proxy"}
    docstring = (
        "``table`` the route table; :mod:`.routing`; ``gateway.wire.peek``; see proxy.py; "
        "``reactantserver.transport.table`` is another package's"
    )
    assert named_modules(docstring, "reactantserver.gateway", modules) == modules
    assert named_modules("the table, the routing", "reactantserver.gateway", modules) == set()

"""The import graph read from the sources: which package may import which, and no circles.

``tests/project/test_layers.py`` imports modules in fresh interpreters and looks at what came
along; this file reads the ASTs instead, so it also sees imports made inside functions
and under ``if TYPE_CHECKING:`` -- a lazy or type-only import that closes a circle is
still a circle to a reader, and hides the layering it breaks.

* The worker's scheduling package never imports the gateway: the fleet simulator, which
  drives both, lives above them (:mod:`reactantserver.fleet`).
* The transport (the HTTP/2 and gRPC layer both roles stand on) never imports the gateway.
* No module of the package imports h2 or hyperframe: the HTTP/2 core is our own, one
  connection (``h2/core.py``) for both roles (``h2/server.py`` serving,
  ``h2/client.py`` the client role the gateway and the Python client share), and h2 is a
  test-only dependency (the differential tests' oracle).
* The Python client imports neither the gateway nor grpclib's client or protocol: its
  connection is the transport's client role.
* Within ``transport/`` and within ``gateway/``, no module imports itself through others
  (the circles ``h2conn`` <-> ``h2lean`` and ``proxy`` <-> ``forward`` were restructured
  away, not hidden behind lazy imports).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "reactantserver"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute dotted names (``from x
    import y`` gives both ``x`` and ``x.y``: y may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _named(ast.walk(tree), package)


def _named(nodes: Iterable[ast.AST], package: str) -> set[str]:
    """The modules the import statements among ``nodes`` name, absolute (relative ones
    resolved against ``package``)."""
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _modules(subpackage: str) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((PACKAGE / subpackage).rglob("*.py"))}


@pytest.mark.parametrize(
    ("lower", "higher"),
    [("scheduling", "reactantserver.gateway"), ("transport", "reactantserver.gateway")],
)
def test_a_lower_package_never_imports_a_higher_one(lower: str, higher: str) -> None:
    """No module of ``lower`` imports ``higher`` or anything in it, anywhere in its source
    (top level, functions, ``TYPE_CHECKING`` blocks)."""
    offenders = {
        name: sorted(i for i in _imports(path) if i == higher or i.startswith(higher + "."))
        for name, path in _modules(lower).items()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_fleet_simulator_sits_above_scheduling_and_gateway() -> None:
    """The simulator imports both (it is what joins them), and is no longer in scheduling."""
    assert not (PACKAGE / "scheduling" / "fleet.py").exists()
    imported = set().union(*(_imports(p) for p in _modules("fleet").values()))
    assert any(i.startswith("reactantserver.gateway.") for i in imported)
    assert any(i.startswith("reactantserver.scheduling.") for i in imported)


def test_no_module_imports_h2() -> None:
    """No module of the package (server, gateway, client, everything) imports h2 or
    hyperframe, anywhere in its source."""
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    offenders = {
        name: sorted(i for i in _imports(path) if i.split(".")[0] in ("h2", "hyperframe"))
        for name, path in modules.items()
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert {"reactantserver.client.channel", "reactantserver.h2.client"} <= set(modules)


def test_the_client_speaks_http2_through_the_transport_only() -> None:
    """The Python client imports no gateway module and none of grpclib's client or
    protocol (grpclib serves it for its codec, status and exceptions only); its HTTP/2
    is the transport's client role, the gateway's too."""
    banned = ("reactantserver.gateway", "grpclib.client", "grpclib.protocol")
    offenders = {name: _imports_any(path, banned) for name, path in _modules("client").items()}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert "reactantserver.h2.client" in _imports(PACKAGE / "client" / "channel.py")
    assert "reactantserver.h2.client" in _imports(PACKAGE / "gateway" / "channel.py")


#: The roles and the server's asyncio edge: what may only read the connection's states,
#: windows and budget (``h2/core.py`` moves and charges them).
ROLES = ("h2/server.py", "h2/client.py", "transport/h2guard.py")


def _bypasses(source: str) -> list[str]:
    """Where ``source`` goes around the connection's state machine, its flow control or
    its abuse budget, each as ``line: what``: an assignment to a ``.state`` (a stream's or
    the connection's: only the transition tables move them), arithmetic on or an
    assignment to a window (an attribute named ``*window*``, or a field of
    ``h2core.RecvWindow``: only ``Connection._sent`` debits a send window), and a budget
    charge (``abuse`` imported, a ``budget`` named, a method of ``AbuseBudget`` called, or
    one of its counters or the connection's ``wasted`` moved)."""
    from reactantserver.h2.abuse import AbuseBudget
    from reactantserver.h2.core import RecvWindow

    methods = {n for n, v in vars(AbuseBudget).items() if callable(v) and n[0] != "_"}
    counters = {n for n in AbuseBudget.__slots__ if not n.startswith("_")} | {"wasted"}
    fields = set(RecvWindow.__slots__)

    def window(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and ("window" in node.attr or node.attr in fields)

    def targets(node: ast.AST) -> list[ast.expr]:
        if isinstance(node, ast.Assign):
            found = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            found = [node.target]
        else:
            return []
        flat: list[ast.expr] = []
        while found:
            target = found.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                found.extend(target.elts)
            else:
                flat.append(target)
        return flat

    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        for target in targets(node):
            if not isinstance(target, ast.Attribute):
                continue
            if target.attr == "state":
                found.append(f"{line}: assigns .state")
            elif window(target):
                found.append(f"{line}: assigns a window (.{target.attr})")
            elif target.attr in counters and (
                isinstance(node, ast.AugAssign) or target.attr != "streams"
            ):  # (a role's own ``streams`` table may be made; the budget's count is moved)
                found.append(f"{line}: charges the budget (.{target.attr})")
        operands: list[ast.expr] = (
            [node.left, node.right]
            if isinstance(node, ast.BinOp)
            else [node.operand]
            if isinstance(node, ast.UnaryOp)
            else []
        )
        if any(window(o) for o in operands):
            found.append(f"{line}: arithmetic on a window")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "abuse":
            found.append(f"{line}: imports the abuse budget")
        elif isinstance(node, ast.Name) and node.id in ("budget", "AbuseBudget"):
            found.append(f"{line}: names the budget")
        elif isinstance(node, ast.Attribute) and node.attr in {"budget"} | methods:
            found.append(f"{line}: charges the budget (.{node.attr})")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


def test_the_bypass_finder_finds_each_kind() -> None:
    """The check below finds what it looks for: each line of this snippet is one
    bypass, and the reads beside them (a state compared, a window compared, the verdict
    read) are none."""
    snippet = "\n".join([
        "stream.state = 3",
        "self.state, x = 2, 1",
        "stream.send_window -= size",
        "self._open(self.peer_initial_window - size)",
        "self.inbound.left += 1",
        "self.budget.streams += 1",
        "processor.budget.peer_reset(at, now)",
        "h2.wasted += 1",
        "from .abuse import AbuseBudget",
        "ok = stream.state == 3 and size > stream.send_window and h2.verdict",
    ])  # fmt: skip
    found = _bypasses(snippet)
    assert [int(f.split(":")[0]) for f in found] == [1, 2, 3, 4, 5, 6, 6, 7, 7, 8, 9], found


def test_both_roles_are_one_connection() -> None:
    """The server and the client role are one state machine: each subclasses
    ``h2core.Connection`` directly and adds only its sending API -- neither reads frames
    (``receive_data`` or a frame handler ``_on_*``) nor overrides the core's moves, debit
    or budget -- and, read from their ASTs, neither they nor the server's asyncio edge
    (``h2guard.py``) assigns a stream's or the connection's state, does arithmetic on a
    window or charges the abuse budget: ``h2core.Connection`` moves states by its
    transition tables (``_move``, ``_move_connection``), debits the send windows in one
    place (``_sent``) and keeps the one budget of both roles (the edge tells it what only
    the edge knows -- which calls started -- and reads the verdict)."""
    from reactantserver.h2.client import ClientConnection
    from reactantserver.h2.core import Connection
    from reactantserver.h2.server import ServerConnection

    core = {"receive_data", "_move", "_move_connection", "_sent", "_open", "_end_remote",
            "_grant", "_granted", "send_pieces", "send_data", "acknowledge_received_data",
            "increment_flow_control_window", "grow_connection_window", "judge",
            "call_started", "calls_started", "calls_reset", "__init__"}  # fmt: skip
    for role in (ServerConnection, ClientConnection):
        assert role.__bases__ == (Connection,), role
        own = set(vars(role))
        assert not {n for n in own if n.startswith("_on_") or n in core}, role
    offenders = {name: _bypasses((PACKAGE / name).read_text()) for name in ROLES}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_core_moves_states_and_debits_windows_in_one_place() -> None:
    """Within ``h2/core.py`` itself: a ``.state`` is assigned only where a state starts
    (``__init__``) or moves by its table (``Connection._move`` for streams,
    ``Connection._move_connection`` for the connection), and a send window is debited
    (``-=``) only in ``Connection._sent`` (the peer's WINDOW_UPDATE and SETTINGS credit
    them where they are read)."""
    tree = ast.parse((PACKAGE / "h2" / "core.py").read_text())
    assigns: dict[str, set[str]] = {"state": set(), "debit": set()}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state":
                        assigns["state"].add(function.name)
                    if (
                        isinstance(node, ast.AugAssign)
                        and isinstance(node.op, ast.Sub)
                        and isinstance(target, ast.Attribute)
                        and "window" in target.attr
                    ):
                        assigns["debit"].add(function.name)
    assert assigns == {"state": {"__init__", "_move", "_move_connection"}, "debit": {"_sent"}}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a path along its edges that returns to its start), or None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return exc.args[1][::-1]  # graphlib follows the edges backwards (to predecessors)
    return None


@pytest.mark.parametrize("subpackage", ["h2", "transport", "gateway"])
def test_no_import_circle_within(subpackage: str) -> None:
    """The modules of ``subpackage`` import each other without a circle (package
    ``__init__`` re-exports left out: they import their modules by design)."""
    modules = {n: p for n, p in _modules(subpackage).items() if p.name != "__init__.py"}
    graph = {name: _imports(path) & set(modules) - {name} for name, path in modules.items()}
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_one() -> None:
    """The check above can fail: a two-module circle is reported as such."""
    assert _cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


#: grpclib's connection and stream machinery (and the modules only it needs): the server's
#: edge once subclassed or reached into these; it now uses grpclib's public records only
#: (``const``, ``exceptions``, ``metadata``, ``encoding``).
_GRPCLIB_SHELL = ("grpclib.protocol", "grpclib.server", "grpclib.utils", "grpclib.stream",
                  "grpclib.events", "grpclib.config")  # fmt: skip
#: The server's edge and the handlers it runs (transport/, and the gateway's served side).
_SERVED = [*_modules("transport").values(), PACKAGE / "gateway" / "proxy.py",
           PACKAGE / "gateway" / "app.py"]  # fmt: skip
#: The modules that use hpack (through its public API: the decoder and its errors); h2 and
#: hyperframe are imported by no module (test_no_module_imports_h2),
#: and every other module names HTTP/2 events, errors and codes through our
#: ``h2/events.py`` alone.
_H2_ALLOWED = {"reactantserver.h2.core", "reactantserver.h2.hpack"}


def _imports_any(path: Path, names: tuple[str, ...]) -> list[str]:
    return sorted(i for i in _imports(path) if any(i == n or i.startswith(n + ".") for n in names))


def test_the_served_side_does_not_use_grpclibs_connection_or_stream() -> None:
    """No module of the server's edge or of the handlers it serves imports grpclib's
    protocol, server, stream, events, utils or config modules (whose private attributes
    the edge once reached into), anywhere in its source."""
    offenders = {_module_name(p): _imports_any(p, _GRPCLIB_SHELL) for p in _SERVED}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_transport_names_h2_only_through_h2events() -> None:
    """Outside the core's own modules (``h2/core.py``, ``h2/hpack.py``), neither ``h2/``
    nor transport/ imports h2, hpack or hyperframe."""
    offenders = {
        name: _imports_any(path, ("h2", "hpack", "hyperframe"))
        for name, path in {**_modules("h2"), **_modules("transport")}.items()
        if name not in _H2_ALLOWED
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _private_names(tree: ast.AST) -> set[str]:
    """The single-underscore names a module's code uses as attributes or defines."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name
        else:
            continue
        if name.startswith("_") and not name.startswith("__"):
            names.add(name)
    return names


def test_no_private_attribute_of_the_http2_or_grpc_libraries_is_touched() -> None:
    """No code in src/ reads or writes a private attribute of h2, hpack, hyperframe or
    grpclib: the libraries' own single-underscore names (every ``x._name`` their sources
    use or define, read from the installed sources), less the ones our own code defines
    on ``self``, appear nowhere in src/ as an attribute of anything but ``self``/``cls``.
    Its limit: a name one of our classes also defines for itself is not judged, and
    ``self`` in a subclass of theirs is -- which the next test rules out. (On a02cdcc this
    finds seven: ``_cardinality``, ``_send_request_done``, ``_stream``, ``_wrapper``,
    ``_end_done``, ``_messages_sent`` of grpclib's client stream, ``_method_name`` of its
    server stream.)"""
    import importlib.util

    theirs: set[str] = set()
    for lib in ("h2", "hpack", "hyperframe", "grpclib"):
        spec = importlib.util.find_spec(lib)
        assert spec is not None and spec.origin is not None
        for path in Path(spec.origin).parent.rglob("*.py"):
            theirs |= _private_names(ast.parse(path.read_text(encoding="utf-8")))
    ours: set[str] = set()
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                ours.add(node.name)
            target = node.target if isinstance(node, ast.AnnAssign) else None
            targets = node.targets if isinstance(node, ast.Assign) else [target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in ("self", "cls")
                ):
                    ours.add(t.attr)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        ours.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        ours.update(t.id for t in item.targets if isinstance(t, ast.Name))
    suspect = theirs - ours
    touched = sorted(
        f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in suspect
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )
    assert touched == []


#: The extension points of those libraries a class of ours may subclass: grpclib's codecs.
_SUBCLASSABLE = {"grpclib.encoding.base.CodecBase", "grpclib.encoding.proto.ProtoCodec"}


def test_no_class_extends_the_http2_or_grpc_libraries_beyond_their_codecs() -> None:
    """No class in src/ subclasses a class of h2, hpack, hyperframe or grpclib but
    grpclib's codec base classes: a subclass reaches its base's private state through
    ``self``, which the private-attribute check above cannot see. (Before issue 34:
    h2's ``FrameBuffer``, ``Settings`` and ``H2Connection``, grpclib's ``EventsProcessor``,
    ``Stream``, ``Connection``, ``H2Protocol`` and ``Channel``.)"""
    libs = ("h2", "hpack", "hyperframe", "grpclib")
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        origin: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    origin[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    origin[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                text = ast.unparse(base)
                head, _, rest = text.partition(".")
                full = origin.get(head, head) + (f".{rest}" if rest else "")
                if full.split(".")[0] in libs and full not in _SUBCLASSABLE:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}({full})")
    assert found == []


# ------------------------------------------------------------------ the rooms by kind

#: Libraries that do I/O or run an event loop: the folder rule's list.
IO_LIBRARIES = ("asyncio", "trio", "socket", "grpclib")
#: betterproto's generated modules import grpclib at their top for the client stubs they
#: define; what pure code takes from them is messages (data), so the rule does not follow
#: into them (tests/project/test_proto.py keeps them generated, never edited).
GENERATED = "reactantserver.protocol."


def _is_pure_room(path: Path) -> bool:
    """Under ``h2/``, or under a folder named ``core`` (``gateway/core/``, ``transport/core/``)."""
    folders = path.relative_to(PACKAGE).parts[:-1]
    return folders[:1] == ("h2",) or "core" in folders


def _ours(names: set[str], modules: dict[str, Path], *, packages: bool = True) -> set[str]:
    """The modules of ours among ``names``, with (unless ``packages`` is False) the packages
    whose ``__init__`` runs first."""
    found = set()
    for name in names:
        parts = name.split(".")
        for i in range(2 if packages else len(parts) - 1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules:
                found.add(prefix)
    return found


def _generated(path: Path) -> bool:
    return "DO NOT EDIT" in path.read_text(encoding="utf-8")[:300]


def test_the_folder_rule_nothing_pure_does_io() -> None:
    """The one folder rule: no module under ``h2/`` or a ``core/`` folder imports asyncio,
    trio, socket or grpclib -- itself, or through any module of ours it imports (every
    import in its source is followed, functions and ``TYPE_CHECKING`` blocks included,
    with the packages whose ``__init__`` runs on the way; betterproto's generated messages
    excepted, see ``GENERATED``)."""
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    pure = [name for name, path in modules.items() if _is_pure_room(path)]
    assert any(n.startswith("reactantserver.h2.") for n in pure)
    assert any(".gateway.core." in n for n in pure) and any(".transport.core." in n for n in pure)
    offenders: dict[str, str] = {}
    for name in pure:
        seen, todo = {name}, [name]
        while todo:
            current = todo.pop()
            direct = _imports(modules[current])
            io = sorted(i for i in direct if i.split(".")[0] in IO_LIBRARIES)
            if io:
                offenders[name] = f"{current} imports {io[0]}"
                break
            for nxt in _ours(direct, modules) - seen:
                if nxt.startswith(GENERATED) and _generated(modules[nxt]):
                    continue
                seen.add(nxt)
                todo.append(nxt)
    assert offenders == {}


def test_the_http2_library_stands_on_nothing_of_ours() -> None:
    """``h2/`` is the ground floor: it imports nothing of the package outside itself (its
    limits, events and errors are its own, as h11's are)."""
    offenders = {
        name: sorted(
            i
            for i in _imports(path)
            if i.startswith("reactantserver.") and not i.startswith("reactantserver.h2")
        )
        for name, path in _modules("h2").items()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _module_level_imports(path: Path) -> set[str]:
    """The imports that run when ``path`` is imported: its top level, through ``if`` and
    ``try`` blocks, but not under ``if TYPE_CHECKING:`` nor inside functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    yield from statements(node.body)
                    yield from statements(node.orelse)
            elif isinstance(node, ast.Try):
                yield from statements(node.body)
                for handler in node.handlers:
                    yield from statements(handler.body)
            else:
                yield node

    return _named(statements(tree.body), package)


def room_of(module: str) -> str:
    """A module's room: its folder under the package (``gateway``, ``gateway/core``, ``h2``),
    or, for a module at the package's top, that module (``errors``, ``status``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "reactantserver"
    if (PACKAGE / parts[0]).is_dir():
        if len(parts) >= 2 and (PACKAGE / parts[0] / parts[1]).is_dir():
            return f"{parts[0]}/{parts[1]}"
        return parts[0]
    return parts[0]


def house() -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other room when it loads, else one
    above the highest room it imports. Raises ``graphlib.CycleError`` on a circle."""
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    below: dict[str, set[str]] = {}
    for name, path in modules.items():
        room = room_of(name)
        below.setdefault(room, set())
        for other in _ours(_module_level_imports(path), modules, packages=False):
            if room_of(other) not in (room, "reactantserver") and room != "reactantserver":
                below[room].add(room_of(other))
    floors: dict[str, int] = {}
    for room in TopologicalSorter(below).static_order():
        floors[room] = 1 + max((floors[r] for r in below[room]), default=0)
    return floors


def test_the_house_has_no_circle_and_under_ten_floors() -> None:
    """Rooms (a folder, a ``core/`` inside one, or a top-level module) import each other at
    load time without a circle (``house()`` would raise), no room imports a room above it
    (which a floor is defined to rule out), and the tallest chain is under ten floors (the
    flat tree before issue 46 had ten by this count; docs/architecture.md draws them). The
    HTTP/2 library is on the ground floor."""
    floors = house()
    assert max(floors.values()) < 10, sorted(floors.items(), key=lambda kv: kv[1])
    assert floors["h2"] == 1
    assert floors["gateway/core"] < floors["gateway"]
    assert floors["transport/core"] < floors["transport"]


def drawn_house() -> str:
    """The house as docs/architecture.md draws it: a line a floor, from the top."""
    floors = house()
    lines = []
    for floor in range(max(floors.values()), 0, -1):
        rooms = sorted(r for r, f in floors.items() if f == floor)
        lines.append(f"{floor:>2}  " + "  ".join(rooms))
    return "\n".join(lines)


def test_the_architecture_page_draws_the_house_as_it_is() -> None:
    """docs/architecture.md's "Rooms by kind" block is the house the sources make (run
    ``python tests/project/test_import_graph.py`` to print it after a change)."""
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    section = page.split("## Rooms by kind", 1)[1]
    block = section.split("<!-- house -->\n```\n", 1)[1].split("\n```", 1)[0]
    assert block == drawn_house()


if __name__ == "__main__":
    print(drawn_house())

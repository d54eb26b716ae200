"""Why a worker cannot start (or stopped), said in one line each.

Theory of operation
-------------------
After its configuration is checked, ``reactantserver serve`` can still fail to start:
a port is taken, an address is not this machine's, the device is missing. Raised inside
``trio.run``, such a failure arrives wrapped in one ``ExceptionGroup`` per nursery it
crossed, and printing it whole shows an operator sixty lines of Trio internals around
one ``OSError``. This module gives the command line the two things it needs instead:

* ``listen_problems(config)``: before anything starts (before JAX is even imported),
  try to bind every address the worker will listen on, the way its listeners will
  (``SO_REUSEADDR``), and say which one cannot be had and what to change. This is a
  courtesy, not a guarantee -- another process may take the port in between -- so:
* ``failure_lines(exc, recheck)``: whatever still escapes ``trio.run``, flattened to its
  leaf exceptions, one line each: our own errors (``ReactantError``) and ``OSError`` as
  their message, anything else with its type, since it is probably a bug. An address
  that could not be listened on after all -- the race the check cannot close -- is asked
  about again with ``recheck`` (``listen_problems`` of the same configuration): the port
  another process took is still taken, and its line is the one the check would have
  printed, naming the address and what to change, not a bare ``Address already in use``.

The command prints these lines, keeps the traceback for ``--log-level debug``, and
exits non-zero (``exit_status``): 2 when every cause is a configuration error found
late (a CUDA backend without a GPU), as for one found at load; :data:`EXIT_CONFIG` (78)
when an address cannot be listened on, found before the start (``listen_problems``) or
at it; else 1.

**The exit status contract** (docs/node.md, "Exit statuses"). 2 and 78 mean "this will
not succeed on retry": the configuration is wrong, or the machine does not allow what it
asks (a port taken, an address not this machine's, a port that needs privileges). A node
supervisor stops the node on either instead of restarting the child forever. Any other
non-zero status is a crash, which a restart may well cure.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Iterator

from .config import ServerConfig
from .config.env import WORKER_ENV
from .errors import ConfigError, ReactantError

#: Status for "the environment does not allow what the configuration asks": sysexits.h's
#: EX_CONFIG. Like 2 (a configuration error), retrying cannot help.
EXIT_CONFIG = 78
#: Why an address cannot be listened on that a restart does not change.
_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})

#: The variable that moves a port for one run, by key path (the names config/env.py
#: derives from the schema): a taken port is most often a second server started by hand,
#: and the quickest way past it is the environment, not an edit of a shared node file.
_PORT_VARIABLE: dict[tuple[str | int, ...], str] = {s.path: s.var for s in WORKER_ENV.values()}

#: What to change, by errno, for an address that cannot be listened on ({variable}: the
#: variable of the port in question).
_LISTEN_HINTS: dict[int, str] = {
    errno.EADDRINUSE: (
        "another process is listening there (stop it, or choose another port: "
        "{variable}=PORT in the environment for one run, or in the node file: base_port / "
        "metrics_base_port, or a workers: entry's port / metrics_port)"
    ),
    errno.EACCES: "ports below 1024 need privileges; choose a port of 1024 or above",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine (endpoints.host)",
}


def _can_listen(host: str, port: int) -> OSError | None:
    """Bind (and release) ``host:port`` as the worker's listeners will; the error, if any."""
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r} ({exc.strerror})")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc
    return None


def listen_problems(config: ServerConfig) -> list[str]:
    """One line for each address of ``config`` the worker could not listen on now."""
    ep = config.endpoints
    wanted = [("gRPC", ep.port, ("endpoints", "port"))]
    if ep.metrics_port:
        wanted.append(("admin HTTP", ep.metrics_port, ("endpoints", "metrics_port")))
    lines = []
    for what, port, key in wanted:
        if port == 0:
            continue  # any free port: nothing to collide with
        error = _can_listen(ep.host, port)
        if error is None:
            continue
        hint = _LISTEN_HINTS.get(error.errno or 0, "").format(variable=_PORT_VARIABLE[key])
        reason = (error.strerror or str(error)).lower()
        lines.append(
            f"cannot listen for {what} on {ep.host}:{port}: {reason}"
            + (f"; {hint}" if hint else "")
        )
    return lines


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def causes(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of ``exc`` (nested groups flattened), cancellations left out:
    they are how Trio stops the siblings of the task that failed, not causes."""
    import trio

    found = [leaf for leaf in _leaves(exc) if not isinstance(leaf, trio.Cancelled)]
    return found or [exc]


def describe(exc: BaseException) -> str:
    """One line for one cause."""
    if isinstance(exc, ReactantError):
        return str(exc)
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc)
        return f"{text}: {exc.filename}" if exc.filename else text
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"unexpected {type(exc).__name__}" + (f": {text}" if text else "")


def failure_lines(exc: BaseException, recheck: Callable[[], list[str]] | None = None) -> list[str]:
    """One line per distinct cause of ``exc``, in the order they were raised; a cause
    that is an address not to be had is ``recheck()``'s lines (the module docstring)."""
    lines: list[str] = []
    for leaf in causes(exc):
        if recheck is not None and _cannot_listen(leaf):
            found = recheck()
            if found:
                lines.extend(found)
                continue
            # Free again by now: say what happened and where to look.
            lines.append(
                f"cannot listen: {describe(leaf).lower()}; another process held one of the "
                "addresses while the server started and has let it go (start it again, or "
                "choose other ports)"
            )
            continue
        lines.append(describe(leaf))
    return list(dict.fromkeys(lines))


def exit_status(exc: BaseException) -> int:
    """2 when every cause is a ``ConfigError`` (what was asked for is wrong);
    :data:`EXIT_CONFIG` when every cause is that or an address that cannot be listened on
    (the race ``listen_problems`` cannot close); else 1 (a crash)."""
    leaves = causes(exc)
    if all(isinstance(leaf, ConfigError) for leaf in leaves):
        return 2
    if all(isinstance(leaf, ConfigError) or _cannot_listen(leaf) for leaf in leaves):
        return EXIT_CONFIG
    return 1


def _cannot_listen(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _LISTEN_ERRNOS

"""Start a child that dies with the supervisor, wait for it, and relay its output by line.

Theory of operation
-------------------
**Dying with the supervisor.** Between ``fork`` and ``exec`` the child asks the kernel
for ``SIGKILL`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept across
``exec``), so no worker outlives a supervisor that was itself SIGKILLed or crashed,
which no signal forwarding could handle. If the supervisor died before the ``prctl``
took effect, the child sees a new parent and kills itself.

The kernel sends that signal when the *thread* that forked the child ends, not the
process. ``trio.lowlevel.open_process`` forks from a worker thread that Trio retires
after a few idle seconds, which would kill every child shortly after its start. So
children are forked here, on the Trio thread itself (``subprocess.Popen`` returns as soon
as the child has exec'ed), and waited for through a pidfd that the event loop watches
(polled where the kernel has no pidfd).

**Own process group.** A terminal's Ctrl-C goes to the whole foreground process group;
children get a group of their own, so only the supervisor hears it and every child
receives exactly one, orderly SIGTERM from it.

**Affinity.** The child's CPU set is applied before ``exec`` so that everything it
starts, XLA's thread pool included (sized from the affinity mask), sees only its share.

**Output.** stdout and stderr are pipes read by the event loop; each complete line is
handed to the sink as ``[name] line``. A partial last line is flushed at EOF, so the
last words of a crashing child are never lost.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

import trio

PR_SET_PDEATHSIG = 1
#: Longest line relayed whole; a longer run without a newline is cut into pieces.
MAX_LINE_BYTES = 64 * 1024


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover -- every Linux libc has it
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


# Looked up once in the parent: between fork and exec only async-signal-safe work is wise.
_PRCTL = _load_prctl()


def _before_exec(parent: int, cpus: Sequence[int]) -> Callable[[], None]:
    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the supervisor is already gone
                os.kill(os.getpid(), signal.SIGKILL)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class Child:
    """A started child process: its pid, its output streams, and a way to wait for it."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdout: trio.abc.ReceiveStream,
        stderr: trio.abc.ReceiveStream,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.stderr = stderr
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no pidfd: poll instead
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        """None while running; the exit status, or ``-signal`` when a signal ended it."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the child to exit and reap it."""
        if self._pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(self._pidfd)
            finally:
                os.close(self._pidfd)
                self._pidfd = None
            return self._popen.wait()
        while self._popen.poll() is None:
            await trio.sleep(0.05)
        return self._popen.returncode

    def kill_and_reap(self) -> None:
        """SIGKILL and reap, blocking (a killed process is gone within milliseconds)."""
        self.send_signal(signal.SIGKILL)
        self._popen.wait()

    def send_signal(self, signum: int) -> None:
        """Signal the child if it has not been reaped (never a recycled pid)."""
        if self._popen.returncode is None:
            try:
                self._popen.send_signal(signum)
            except ProcessLookupError:  # exited, not yet reaped
                pass


def start(argv: Sequence[str], env: Mapping[str, str], *, cpus: Sequence[int] = ()) -> Child:
    """Fork and exec ``argv`` from the calling thread (see the module doc: it must be the
    thread that lives as long as the supervisor)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            preexec_fn=_before_exec(os.getpid(), cpus),  # fork-safe: see _before_exec
            process_group=0,
            close_fds=True,
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return Child(popen, trio.lowlevel.FdStream(out_r), trio.lowlevel.FdStream(err_r))


async def relay_lines(
    stream: trio.abc.ReceiveStream, name: str, sink: Callable[[str], None]
) -> None:
    """Hand every line of ``stream`` to ``sink`` as ``[name] line`` until EOF."""
    pending = b""
    try:
        while True:
            chunk = await stream.receive_some(MAX_LINE_BYTES)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                sink(f"[{name}] {line.decode('utf-8', 'replace').rstrip(chr(13))}")
            while len(pending) >= MAX_LINE_BYTES:
                piece, pending = pending[:MAX_LINE_BYTES], pending[MAX_LINE_BYTES:]
                sink(f"[{name}] {piece.decode('utf-8', 'replace')}")
        if pending:
            sink(f"[{name}] {pending.decode('utf-8', 'replace')}")
    finally:
        await stream.aclose()

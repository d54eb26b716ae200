"""Where a request's CPU goes, by stage, at one in flight (``nox -s bench -- profile``;
``--inflight N``: at N).

A worker (``python -m reactantserver.cli serve``, as deployed) serves the zoo's
``double`` (``y = 2 * x``, FP32 ``[1, 16]``: the program is a few microseconds, so what is
left is the serving path); nghttp2's ``h2load -c 1 -m 1`` (``-m N``) posts the same framed
ModelInfer back to back (every answer checked: HTTP 200 and an OK answer's DATA bytes).
The worker is pinned to the last core, the load to the others. Each run has two windows:

* a plain one, read with ``psutil``: the worker's **user** and **system** CPU seconds per
  request (the kernel's share: the socket's ``recv`` and ``send``, ``epoll``, the
  wake-ups of other threads);
* one with ``py-spy record --gil`` sampling the worker: the samples of whichever thread
  holds the GIL, each given to the first stage (below) that one of its frames belongs
  to, innermost first. A stage's share of the samples times the user CPU per request is
  its microseconds.

The stages, in the order a request meets them: HTTP/2 in (the socket read, frames,
HPACK, the guard, the call's collection), decode (ModelInfer bytes to records, the
inputs checked and viewed), scheduling (admission, versions, the queue, the policy, the
dispatch loop or the host loop's pass), the loop's wake-ups (Trio's guest ticks, its I/O
thread, asyncio's self-pipe), the crossing to the device thread and back, the executor
(gather, scatter, weights, statistics), XLA's dispatch of the tiny program (JAX's call
path and the C++ it runs under the GIL), encode (records to response bytes), HTTP/2 out
(the answer's frames and the corked ``send``), and the event loop itself (``epoll``,
``_run_once``).

``--baseline REV`` profiles the tree at ``REV`` (``git archive``) the same way, its
windows alternating with this tree's (``--runs`` pairs), and prints both side by side:
what a change saved, stage by stage.

    python benchmarks/bench_profile.py                    # this tree (about a minute)
    python benchmarks/bench_profile.py --baseline main --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_gateway as bg  # noqa: E402
import bench_serve as bs  # noqa: E402

MODEL = bs.SMALL_MODEL

#: (stage, frame patterns): a sample goes to the stage of its innermost frame that
#: matches; a pattern is ``path`` or ``path:function`` (py-spy names a frame
#: ``function (path:line)``, the path relative to its ``sys.path`` entry). Checked in
#: this order for each frame, so a specific function comes before its file's rule.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP/2 out: answer frames, corked send", (
        "asyncio/selector_events.py:_SelectorSocketTransport.write",
        "reactantserver/transport/h2conn.py", "reactantserver/h2/server.py",
        "reactantserver/transport/unary.py:UnaryCall.answer",
        "reactantserver/transport/unary.py:UnaryCall._answer",
        "reactantserver/transport/unary.py:DirectCalls.answer",
        "reactantserver/transport/unary.py:message_pieces",
        "reactantserver/transport/h2guard.py:GuardedProtocol.flush",
        "reactantserver/h2/core.py:Connection._queue_block",
        "reactantserver/h2/core.py:Connection.send_pieces",
        "reactantserver/h2/hpack.py:TableEncoder",
    )),
    ("encode: records -> response bytes", (
        "reactantserver/protocol/codec.py:encode", "reactantserver/protocol/codec.py:_output",
        "reactantserver/inferio.py:encode", "reactantserver/inferio.py:_checked_output",
        "reactantserver/worker/grpc.py:_Infer._finish",
        "reactantserver/service.py:Service.finish_infer",
    )),
    ("decode: ModelInfer bytes -> records", (
        "reactantserver/protocol/", "reactantserver/inferio.py", "reactantserver/tensors.py",
        "reactantserver/worker/grpc.py:_Infer.begin",
    )),
    ("XLA: the tiny program's dispatch", (
        "reactantserver/runtime/model.py", "jax/", "jaxlib/",
    )),
    ("executor: gather, scatter, weights", (
        "reactantserver/runtime/", "reactantserver/models.py", "numpy/",
        "reactantserver/weights/",
    )),
    ("device thread: hand-off and back", (
        "reactantserver/threads.py", "threading.py", "queue.py",
    )),
    ("the loop's wake-ups: Trio guest, I/O thread", (
        "trio/", "outcome/", "sniffio/",
        "asyncio/selector_events.py:BaseSelectorEventLoop._read_from_self",
        "asyncio/selector_events.py:BaseSelectorEventLoop._write_to_self",
        "asyncio/base_events.py:BaseEventLoop.call_soon_threadsafe",
    )),
    ("scheduling: admission, queue, policy, pass", (
        "reactantserver/scheduling/", "reactantserver/transport/guest.py:call_soon",
        "reactantserver/transport/guest.py:_holding_writes", "reactantserver/lifecycle/",
        # the worker's drivers (its listener, worker/grpc.py, is the wire's: HTTP/2 in)
        "reactantserver/worker/serving.py", "reactantserver/worker/core.py",
        "reactantserver/worker/lifecycle.py", "reactantserver/worker/control.py",
        "reactantserver/worker/repository.py", "reactantserver/worker/build.py",
        "reactantserver/worker/metas.py",
        "reactantserver/service.py", "reactantserver/records.py", "reactantserver/host.py",
        "reactantserver/histogram.py", "reactantserver/statistics.py",
        "reactantserver/changes.py",
    )),
    ("HTTP/2 in: read, frames, HPACK, guard", (
        "reactantserver/transport/", "reactantserver/h2/", "reactantserver/worker/grpc.py",
        "hpack/", "asyncio/selector_events.py:_SelectorSocketTransport._read_ready",
    )),
    ("event loop: epoll, _run_once, callbacks", (
        "asyncio/", "selectors.py",
    )),
)  # fmt: skip
OTHER = "other (enum, typing, logging, ...)"
KERNEL = "kernel: recv, send, epoll, wake-ups (system CPU)"


def _frame(frame: str) -> tuple[str, str]:
    """``fn (path/file.py:12)`` -> (``path/file.py``, ``fn``)."""
    name, _, rest = frame.partition(" (")
    return rest.rpartition(":")[0], name


def stage_of(stack: str) -> str:
    """The stage of one py-spy stack (root first, ``;``-separated)."""
    for frame in reversed(stack.split(";")):
        path, function = _frame(frame)
        for stage, patterns in STAGES:
            for pattern in patterns:
                file, _, prefix = pattern.partition(":")
                if path.startswith(file) and (not prefix or function.startswith(prefix)):
                    return stage
    return OTHER


def samples_by_stage(raw: str) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            counts[stage_of(stack)] += int(number)
    return counts


@attrs.frozen
class Run:
    """One run against one worker: its plain window and its sampled one."""

    requests: int
    seconds: float
    user: float  # CPU seconds in the plain window
    system: float
    samples: collections.Counter[str]

    @property
    def user_per_request(self) -> float:
        return self.user / self.requests

    @property
    def system_per_request(self) -> float:
        return self.system / self.requests

    def stage_us(self) -> dict[str, float]:
        """Microseconds per request by stage: the samples' shares of the user CPU, and
        the system CPU as the kernel's row."""
        total = sum(self.samples.values()) or 1
        out = {
            stage: self.samples[stage] / total * self.user_per_request * 1e6
            for stage in [*(name for name, _ in STAGES), OTHER]
        }
        out[KERNEL] = self.system_per_request * 1e6
        return out


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` and its descendants."""
    root = psutil.Process(pid)
    user = system = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        user += t.user
        system += t.system
    return user, system


async def h2load_for(
    exe: str, body: Path, url: str, seconds: float, log: Path, inflight: int = 1
) -> str:
    """h2load ``-c 1 -m inflight`` for ``seconds``, each request's times in ``log``; its summary,
    every answer checked (:func:`bench_gateway.check_h2load_summary`, by the caller)."""
    log.unlink(missing_ok=True)  # h2load appends to a log that is there
    proc = await asyncio.create_subprocess_exec(
        exe, "-c", "1", "-m", str(inflight), "-D", f"{max(1, round(seconds * 1000))}ms",
        "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
        f"--log-file={log}", f"http://{url}{bg.INFER_PATH}",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out = (await proc.communicate())[0].decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"h2load failed ({proc.returncode}):\n{out[-2000:]}")
    return out


async def one_run(
    server: bs.Server, exe: str, body: Path, reply: int, args: argparse.Namespace, spy: str
) -> Run:
    """The plain window, then the sampled one, against ``server``."""
    pid = server.proc.pid
    log = body.with_name(f"h2load_{server.port}.tsv")
    running = asyncio.ensure_future(
        h2load_for(
            exe,
            body,
            server.url,
            args.warmup + args.seconds + bg.H2LOAD_TAIL,
            log,
            args.inflight,
        )
    )
    await asyncio.sleep(args.warmup)
    opened, (u0, s0) = time.time(), cpu_split(pid)
    await asyncio.sleep(args.seconds)
    closed, (u1, s1) = time.time(), cpu_split(pid)
    bg.check_h2load_summary(await running, reply)
    requests = len(bg.h2load_latencies(log.read_text(), opened, closed))
    raw = body.with_name(f"profile_{server.port}.txt")
    raw.unlink(missing_ok=True)
    sampled = asyncio.ensure_future(
        h2load_for(
            exe, body, server.url, args.warmup + args.profile_seconds + 1, log, args.inflight
        )
    )
    await asyncio.sleep(args.warmup)
    proc = await asyncio.create_subprocess_exec(
        spy, "record", "--gil", "--nonblocking", "--format", "raw", "--rate", "500",
        "--duration", str(max(1, round(args.profile_seconds))), "--pid", str(pid),
        "--output", str(raw),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    bg.check_h2load_summary(await sampled, reply)
    if proc.returncode != 0 or not raw.exists():
        raise RuntimeError(f"py-spy could not sample the worker: {err.decode()[-300:]}")
    return Run(
        max(1, requests), closed - opened, u1 - u0, s1 - s0, samples_by_stage(raw.read_text())
    )


def table(columns: Sequence[tuple[str, Sequence[Run]]]) -> list[str]:
    """Microseconds per request by stage, the median over each column's runs."""
    names = [*(name for name, _ in STAGES), OTHER, KERNEL]
    head = f"{'stage, us of worker CPU per request':<48}" + "".join(
        f"{name:>16}" for name, _ in columns
    )
    lines = [head]
    medians = []
    for _, runs in columns:
        per = [r.stage_us() for r in runs]
        medians.append({n: statistics.median(p[n] for p in per) for n in names})
    for name in names:
        lines.append(f"{name:<48}" + "".join(f"{m[name]:>16.0f}" for m in medians))
    totals = [
        statistics.median((r.user_per_request + r.system_per_request) * 1e6 for r in runs)
        for _, runs in columns
    ]
    lines.append(f"{'total (user + system)':<48}" + "".join(f"{t:>16.0f}" for t in totals))
    rps = [statistics.median(r.requests / r.seconds for r in runs) for _, runs in columns]
    lines.append(f"{'requests/s (plain windows)':<48}" + "".join(f"{x:>16.0f}" for x in rps))
    return lines


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    started = time.perf_counter()
    exe = shutil.which("h2load")
    spy = bs.py_spy()
    if exe is None or spy is None:
        missing = "h2load (apt-get install nghttp2-client)" if exe is None else "py-spy"
        print(f"the stage profile needs {missing}: skipped")
        return
    repo = workdir / "repo"
    bs.build_repo(repo, zoo=(MODEL,), exported=())
    cores = sorted(os.sched_getaffinity(0))
    server_cores, load_cores = frozenset(cores[-1:]), frozenset(cores[:-1] or cores)
    os.sched_setaffinity(0, load_cores)  # this process and h2load (its child)
    pin = partial(os.sched_setaffinity, 0, server_cores)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline:
        tree = bs.baseline_tree(args.baseline, workdir)
        if tree is not None:
            trees.insert(0, (args.baseline[:12], tree / "src"))
    servers = []
    for _, src in trees:
        env_before = os.environ.get("PYTHONPATH")
        if src is not None:
            os.environ["PYTHONPATH"] = str(src)
        try:
            servers.append(bs.start_ours(repo, workdir, cache_dir=workdir / "cache", pin=pin))
        finally:
            if env_before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = env_before
    load_before = os.getloadavg()
    runs: list[list[Run]] = [[] for _ in servers]
    try:
        for server in servers:
            await bs.wait_ready(server, [MODEL])
        body = workdir / "request.bin"
        body.write_bytes(bg.framed_request())
        replies = [await bg.check_request(s.url, body.read_bytes()) for s in servers]
        for _ in range(args.runs):
            for i, server in enumerate(servers):
                runs[i].append(await one_run(server, exe, body, replies[i], args, spy))
    finally:
        for server in servers:
            server.stop()
    print(
        f"{args.inflight} in flight (h2load -c 1 -m {args.inflight}, the double model); "
        f"worker pinned to "
        f"cores {sorted(server_cores)}, h2load to {sorted(load_cores)}; median of "
        f"{args.runs} runs{', the trees alternating' if len(servers) > 1 else ''}, "
        f"{args.seconds:g} s plain windows, {args.profile_seconds:g} s sampled (py-spy --gil)"
    )
    print(
        "load average "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + " before, "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + f" after ({os.cpu_count()} CPUs)"
    )
    print()
    print("\n".join(table([(name, r) for (name, _), r in zip(trees, runs, strict=True)])))
    print(f"\n({time.perf_counter() - started:.0f} s)")


def xla_alone(calls: int = 3000) -> list[str]:
    """The tiny program's call (``y = x * s``, FP32 [1, 16], the ``double`` bundle's
    shape) in this process pinned to one core, back to back and after a pass of Python
    that walks 60,000 dicts between calls, as a request's own Python work does: what
    the XLA row costs once the serving path has pushed XLA's code and data out of the
    caches. Microseconds per call (and its output read), the median."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[-1:]))
    x, scale = np.ones((1, 16), np.float32), np.ones((1,), np.float32)
    program = jax.jit(lambda a, b: a * b).lower(x, scale).compile()
    scale_on_device = jax.device_put(scale)
    junk = [{"a": i, "b": str(i)} for i in range(60_000)]

    def walk() -> int:
        return sum(d["a"] for d in junk[::7])

    lines = []
    for name, between in (("back to back", None), ("after a pass of Python", walk)):
        times = []
        for _ in range(calls):
            if between is not None:
                between()
            t0 = time.perf_counter()
            np.asarray(program(x, scale_on_device))
            times.append(time.perf_counter() - t0)
        lines.append(f"  {name:<24} {statistics.median(times[calls // 10 :]) * 1e6:6.1f} us")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (median reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="plain window per run")
    parser.add_argument("--profile-seconds", type=float, default=3.0, help="sampled window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in")
    parser.add_argument("--baseline", help="also profile the tree at this git revision")
    parser.add_argument("--inflight", type=int, default=1, help="h2load -m: requests in flight")
    parser.add_argument("--workdir", help="keep the repository, caches and logs here")
    parser.add_argument(
        "--xla-alone",
        action="store_true",
        help="only the tiny program's call alone, hot and after a pass of Python (no server)",
    )
    args = parser.parse_args(argv)
    if args.xla_alone:
        print("the tiny program's call in one process, one core, median:")
        print("\n".join(xla_alone()))
        return
    bs.run_in_workdir(args.workdir, "rs_bench_profile_", partial(_run, args))


if __name__ == "__main__":
    main()

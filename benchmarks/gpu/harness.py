"""What the GPU tests and the GPU benchmarks share: a worker process, the device, tables.

* :class:`WorkerProcess` runs ``python -m reactantserver.cli serve NODE.yaml`` in its
  own process, as deployed: one worker process per GPU, and XLA's allocator settings
  (``runtime.mem_fraction``, ``runtime.preallocate``) are per process, so every
  configuration a test or benchmark wants gets a process of its own. The caller's
  process never initialises CUDA; it talks to the worker over gRPC and ``/metrics``.
* :func:`node_yaml` writes a node file for that one worker.
* :func:`gpu_memory` and :func:`describe_device` read ``nvidia-smi`` (the device as
  the driver sees it, independent of JAX).
* :class:`Table` prints a benchmark's table and writes it under the results folder
  (:func:`results_dir`: ``$OUT`` when set, else ``gpu-results/``).

Only :func:`start_runtime` and :func:`device_header` import JAX (when called);
``reactantserver.client`` is the client (it needs no tritonclient, which the GPU
machine's image lacks).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import attrs

ROOT = Path(__file__).resolve().parents[2]


def results_dir() -> Path:
    """Where results go: ``$OUT`` (the device tool brings that folder back), else
    ``gpu-results/`` in the repository (git-ignored)."""
    out = Path(os.environ.get("OUT") or ROOT / "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- the device


@attrs.frozen
class GpuMemory:
    """``nvidia-smi``'s view of GPU 0, in MiB."""

    used_mib: int
    total_mib: int

    @property
    def total_bytes(self) -> int:
        return self.total_mib * 2**20


def nvidia_smi(*args: str) -> str | None:
    """``nvidia-smi`` output, or None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_memory(index: int = 0) -> GpuMemory | None:
    """Used and total memory of GPU ``index`` as the driver reports them."""
    text = nvidia_smi(
        "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits", f"-i={index}"
    )
    if not text:
        return None
    used, total = (int(float(v)) for v in text.strip().splitlines()[0].split(","))
    return GpuMemory(used, total)


def describe_device() -> str:
    """One line naming the GPU, its memory and driver (``nvidia-smi``), for table headers."""
    text = nvidia_smi(
        "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader", "-i=0"
    )
    if not text:
        return "no nvidia-smi (no NVIDIA GPU visible to this process)"
    name, memory, driver = (v.strip() for v in text.strip().splitlines()[0].split(","))
    return f"{name}, {memory}, driver {driver}"


def start_runtime(backend: str, **runtime: Any) -> Any:
    """A ``Runtime`` on ``backend`` for an in-process benchmark (no CPU fallback on cuda:
    a GPU benchmark must not quietly measure the CPU)."""
    from reactantserver.config import RuntimeConfig
    from reactantserver.runtime import Runtime

    return Runtime.start(
        RuntimeConfig(backend=backend, allow_cpu_fallback=backend != "cuda", **runtime), ""
    )


def device_header(runtime: Any = None) -> str:
    """``device: ...`` for the top of a table: the driver's view of the GPU, JAX's
    version, and the device the runtime runs on."""
    import jax

    line = f"device: {describe_device()}; jax {jax.__version__}"
    if runtime is not None:
        line += f"; backend {runtime.backend} ({runtime.device.device_kind})"
    return line


# ---------------------------------------------------------------------------- node files


def node_yaml(
    repo: Path,
    *,
    port: int,
    metrics_port: int,
    cache_dir: Path | str = "",
    backend: str = "cuda",
    runtime: Mapping[str, Any] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    mode: str = "static",
    include: Sequence[str] = (),
) -> str:
    """A node file for one worker on 127.0.0.1. ``runtime`` and ``scheduler`` add keys to
    those sections; ``models`` is ``scheduler.models``. ``backend: cuda`` refuses to fall
    back to the CPU: a GPU test must not pass on the CPU by accident."""
    lines = [
        "# Written by benchmarks/gpu/harness.py: one worker, one device.",
        f"model_repo: {repo}",
        f"base_port: {port}",
        f"metrics_base_port: {metrics_port}",
        "workers:",
        "  - name: worker0",
        "global:",
        f"  cache_dir: '{cache_dir}'",
        f"  model_control_mode: {mode}",
    ]
    if include:
        lines.append(f"  models_include: [{', '.join(include)}]")
    lines += ["  runtime:", f"    backend: {backend}"]
    if backend == "cuda":
        lines.append("    allow_cpu_fallback: false")
    lines += [f"    {k}: {_yaml(v)}" for k, v in (runtime or {}).items()]
    lines.append("  scheduler:")
    lines += [f"    {k}: {_yaml(v)}" for k, v in (scheduler or {}).items()]
    if models:
        lines.append("    models:")
        for name, keys in models.items():
            lines.append(f"      {name}:")
            lines += [f"        {k}: {_yaml(v)}" for k, v in keys.items()]
    lines += [
        "  endpoints:",
        "    host: 127.0.0.1",
        "    max_concurrent_requests: 0",
    ]
    return "\n".join(lines) + "\n"


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# ------------------------------------------------------------------------ worker process


class WorkerError(RuntimeError):
    """The worker process exited or did not become ready; the message ends with its log."""


@attrs.define
class WorkerProcess:
    """A ``reactantserver serve`` process on a node file (see the module docstring)."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> None:
        """Until ServerReady says yes (every startup model loaded or failed); raises
        :class:`WorkerError` with the log's tail if the process exits or time runs out."""
        from reactantserver.client import Client, RetryPolicy

        deadline = time.monotonic() + timeout
        with Client(self.url, timeout=5, retry=RetryPolicy(max_retries=0)) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise WorkerError(
                        f"the worker exited with status {self.proc.returncode}; its log ends:\n"
                        + self.log_tail()
                    )
                try:
                    if client.is_server_ready():
                        return
                except Exception:  # not listening yet, or starting up
                    pass
                time.sleep(0.2)
        raise WorkerError(f"the worker was not ready after {timeout:.0f} s:\n" + self.log_tail())

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples that carry no label but ``worker`` and ``gpu``, by name."""
        return {name: v for name, labels, v in self.samples() if set(labels) <= {"worker", "gpu"}}

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """Every ``/metrics`` sample: (name, labels, value)."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                yield s.name, dict(s.labels), s.value

    def stop(self) -> int:
        """SIGTERM (drain, then exit), SIGKILL after 60 s; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def worker_env(src: Path | None = None) -> dict[str, str]:
    """The environment for a worker process: ours, less the JAX platform list (the worker
    sets it from ``runtime.backend``; the tests' process runs JAX on the CPU), with
    ``src`` (default: this tree's) first on the path."""
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    first = str(src or ROOT / "src")
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != first]
    env["PYTHONPATH"] = os.pathsep.join([first, *rest])
    return env


def start_worker(
    workdir: Path,
    node_text: str,
    *,
    port: int,
    metrics_port: int,
    log_level: str = "info",
    src: Path | None = None,
) -> WorkerProcess:
    """Write ``node_text`` to ``workdir`` and start a worker on it (not yet ready); the
    worker runs ``src``'s code (default: this tree's, ``worker_env``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    node = workdir / f"node_{port}.yaml"
    node.write_text(node_text)
    log = workdir / f"worker_{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reactantserver.cli",
                "serve",
                str(node),
                "--log-level",
                log_level,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(src),
        )
    return WorkerProcess(proc, port, metrics_port, log)


@contextmanager
def running_worker(
    workdir: Path,
    repo: Path,
    *,
    ready_timeout: float = 300.0,
    log_level: str = "info",
    **node: Any,
) -> Iterator[WorkerProcess]:
    """A ready worker on a node file ``node_yaml(repo, **node)``; stopped on exit."""
    port, metrics_port = free_port(), free_port()
    text = node_yaml(repo, port=port, metrics_port=metrics_port, **node)
    worker = start_worker(workdir, text, port=port, metrics_port=metrics_port, log_level=log_level)
    try:
        worker.wait_ready(ready_timeout)
        yield worker
    finally:
        worker.stop()


# --------------------------------------------------------------------------------- tables


class Table:
    """Lines printed as they come and written to ``results_dir() / f"{name}.txt"``."""

    def __init__(self, name: str, *, out: Path | None = None, title: str = "") -> None:
        folder = out or results_dir()
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{name}.txt"
        self._file: TextIO = self.path.open("w")
        if title:
            self.line(title)

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self._file.write(text + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

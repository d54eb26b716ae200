"""``reactantserver serve --announce``: say how the startup load is going, then how to try it.

Theory of operation
-------------------
A worker answers ``ServerLive`` at once and compiles its models afterwards, which on a
first start takes a while and, in the log, reads as a stream of compile lines. For a
person at a terminal (``nox -s serve`` passes ``--announce``), ``announce`` runs beside
the worker and talks to it the way any client would -- over gRPC on loopback, through
``reactantserver.client`` -- so it needs nothing from the worker's insides:

1. every ``poll`` seconds it reads RepositoryIndex and logs a progress line whenever the
   count of ready (or failed) models changes: ``startup: 3 of 8 models ready ...``;
2. once ``ServerReady`` says yes -- or nothing is loading any more and it never will --
   it prints one block to stdout: where the worker listens, and three commands to try
   (grpcurl, the Python client with a call built from a ready model's metadata, curl
   on ``/metrics``), then returns. It is a few RPCs at startup and none after.

Everything here is presentation: the block is built by pure functions
(``example_call``, ``ready_block``) that tests check without a server.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import ssl
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

import attrs
import trio

from .client import AsyncClient, ModelMetadata, RepositoryModel, TensorMetadata
from .config.gateway import connect_host
from .errors import RequestError

log = logging.getLogger("reactantserver.serve")

#: The model the block prefers for its example call: the example zoo's simplest.
PREFERRED = "double"
#: Models whose example input would be larger than this many elements are not shown.
MAX_EXAMPLE_ELEMENTS = 1 << 16
#: Polls in a row with nothing loading after which the startup load is taken to be over.
SETTLED_POLLS = 8
#: Python literals of one element, by datatype kind (BYTES models are not shown).
_ONE = {"BOOL": "True", "FP16": "1.0", "BF16": "1.0", "FP32": "1.0", "FP64": "1.0"}


@attrs.frozen
class Startup:
    """What the startup load looks like from outside: counts and names."""

    ready: tuple[str, ...]
    failed: tuple[str, ...]
    loading: tuple[str, ...]

    @classmethod
    def from_index(cls, index: Sequence[RepositoryModel]) -> Startup:
        def names(*states: str) -> tuple[str, ...]:
            return tuple(sorted(m.name for m in index if m.state in states))

        failed = tuple(sorted(m.name for m in index if m.state == "UNAVAILABLE" and m.reason))
        return cls(names("READY"), failed, names("LOADING"))

    def line(self) -> str:
        total = len(self.ready) + len(self.failed) + len(self.loading)
        text = f"startup: {len(self.ready)} of {total} models ready"
        if self.failed:
            text += f", {len(self.failed)} failed ({', '.join(self.failed)})"
        if self.loading:
            text += f"; compiling {', '.join(self.loading)}"
        return text


def _literal(shape: Sequence[int], one: str) -> str:
    """A Python expression for a nested list of ``shape`` (``-1`` read as 1), all ``one``."""
    text = one
    for dim in reversed(shape):
        size = 1 if dim < 0 else dim
        text = f"[{text}] * {size}" if size > 1 else f"[{text}]"
    return text


def _input_literal(tensor: TensorMetadata) -> str | None:
    if tensor.datatype == "BYTES":
        return None
    return _literal(tensor.shape, _ONE.get(tensor.datatype, "1"))


def _elements(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= max(dim, 1)
    return count


def example_call(meta: ModelMetadata) -> str | None:
    """``{"x": [[1.0] * 16]}``: an inputs argument for ``Client.infer`` built from the
    model's metadata (every element 1; a variable axis of length 1), or None when the
    model takes BYTES or its inputs would be too large to show."""
    parts = []
    for tensor in meta.inputs:
        literal = _input_literal(tensor)
        if literal is None or _elements(tensor.shape) > MAX_EXAMPLE_ELEMENTS:
            return None
        parts.append(f"{tensor.name!r}: {literal}".replace("'", '"'))
    return "{" + ", ".join(parts) + "}"


def pick_example(metas: Sequence[ModelMetadata]) -> tuple[ModelMetadata, str] | None:
    """The model to show and its inputs: ``PREFERRED`` when it can be shown, else the one
    with the smallest input (ties by name)."""
    shown = [(m, call) for m in metas if (call := example_call(m)) is not None]
    if not shown:
        return None
    for meta, call in shown:
        if meta.name == PREFERRED:
            return meta, call
    return min(
        shown, key=lambda pair: (sum(_elements(t.shape) for t in pair[0].inputs), pair[0].name)
    )


def _program(name: str) -> str:
    """How to run ``name`` from this shell: the copy beside this interpreter (the nox
    virtualenv's) when there is one, as a path relative to the working directory if
    shorter, else the bare name."""
    here = os.path.dirname(sys.executable)
    found = shutil.which(name, path=here)
    if found is None:
        return name
    relative = os.path.relpath(found)
    return relative if not relative.startswith("..") else found


def ready_block(
    *,
    grpc: str,
    metrics: str | None,
    startup: Startup,
    ready: bool,
    example: tuple[ModelMetadata, str] | None,
    tls: bool = False,
) -> str:
    """The block printed once the worker is ready (see the module doc); with ``tls`` the
    commands say how to reach a TLS listener (docs/security.md)."""
    rule = "-" * 78
    models = f"{len(startup.ready)} model{'s' if len(startup.ready) != 1 else ''}"
    head = f"reactantserver is {'ready' if ready else 'up, but not ready'}: {models}"
    if startup.ready:
        head += f" ({', '.join(startup.ready)})"
    lines = [rule, head]
    if startup.failed:
        lines.append(
            f"  failed to load: {', '.join(startup.failed)} (the log says why; RepositoryIndex too)"
        )
    lines.append(f"  gRPC (KServe V2 / Triton):  {grpc}")
    lines.append(
        f"  health and metrics:         http://{metrics}/metrics  /healthz  /readyz"
        if metrics
        else "  health and metrics:         off (set metrics_base_port in the node file)"
    )
    lines.append("Try:")
    grpcurl = _program("grpcurl")
    wire = "-cacert CA.pem -cert CLIENT.pem -key CLIENT.key" if tls else "-plaintext"
    lines.append(f"  {grpcurl} {wire} {grpc} inference.GRPCInferenceService/RepositoryIndex")
    if example is not None and not tls:
        meta, call = example
        script = (
            "from reactantserver.client import Client; "
            f'print(Client("{grpc}").infer("{meta.name}", {call}))'
        )
        lines.append(f"  {_program('python')} -c {shlex.quote(script)}")
    if metrics:
        lines.append(f"  curl -s http://{metrics}/metrics | grep worker_requests_total")
    lines.append("Ctrl-C (or SIGTERM) stops it: new calls are refused, calls in flight answered.")
    lines.append(rule)
    return "\n".join(lines)


async def announce(
    host: str,
    grpc_port: int,
    metrics_port: int | None,
    *,
    out: TextIO | None = None,
    poll: float = 0.25,
    tls: ssl.SSLContext | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Log startup progress until the worker is ready (or settled), then print the block.
    ``tls`` and ``metadata``: how to reach a worker that serves TLS or restricts groups
    (:func:`reactantserver.transport.security.own_client`)."""
    address = connect_host(host)
    grpc = f"{address}:{grpc_port}"
    metrics = f"{address}:{metrics_port}" if metrics_port else None
    async with AsyncClient(grpc, timeout=10, tls=tls, metadata=metadata) as client:
        shown = ""
        settled = 0
        while True:
            index = await client.repository_index()
            startup = Startup.from_index(index)
            if index and startup.line() != shown:
                shown = startup.line()
                log.info("%s", shown)
            ready = await client.is_server_ready()
            # Nothing loading for a while: the startup load is over although the worker is
            # not ready (every model failed). An empty index may only mean the repository
            # is still being scanned, so it has to stay empty for longer.
            settled = settled + 1 if not startup.loading else 0
            if ready or settled >= (SETTLED_POLLS if index else 4 * SETTLED_POLLS):
                break
            await trio.sleep(poll)
        metas = []
        for name in startup.ready:
            try:
                metas.append(await client.model_metadata(name))
            except RequestError:
                continue  # unloaded meanwhile: show another
    block = ready_block(
        grpc=grpc,
        metrics=metrics,
        startup=startup,
        ready=ready,
        example=pick_example(metas),
        tls=tls is not None,
    )
    stream = out if out is not None else sys.stdout
    print(block, file=stream, flush=True)

"""A bundle's ``model.py``: loading its hooks and running them on a request.

Theory of operation
-------------------
A bundle may ship a ``model.py`` of plain Python. For ``kind: model`` it may define

* ``preprocess(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``: from the
  client-facing tensors (``client_inputs``, or ``inputs`` when absent) to the
  executable's inputs, e.g. UINT8 or BYTES images -> normalised FP32;
* ``postprocess(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``: from the
  executable's outputs to the client-facing ones.

Both are optional and synchronous. The worker runs them in a worker thread of their own
limiter, on behalf of the request (never on the event loop, the dispatch loop or the
device thread), so a slow hook delays only its own request. ``preprocess`` of a
batched model sees one request's rows and must keep the row count.

For ``kind: meta`` it must define ``async def run(inputs, ctx)`` (executed elsewhere).

``load_hooks`` imports the file under a fresh module name each time (a reload must
see new code, and two bundles' ``model.py`` must not collide), and turns anything
that goes wrong during import into a ``BundleError`` carrying the last line of the
traceback and the line of ``model.py`` it came from. ``run_preprocess`` and
``run_postprocess`` call a hook and check what it returned against the manifest, so a
buggy hook fails its request with a message naming the tensor instead of an obscure
error deeper in the server: an exception *inside* preprocess is the client's input
being refused (``InvalidArgument``), a wrong *result* is the bundle's fault
(``ExecutionFailed``).

JAX-free: a ``model.py`` may import what it likes, but this module imports no JAX.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import itertools
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12 on

from .errors import BundleError, ExecutionFailed, InvalidArgument

Arrays = dict[str, np.ndarray]
HookFn = Callable[[Arrays], Mapping[str, Any]]

_counter = itertools.count()


@attrs.frozen
class Hooks:
    """The functions a ``model.py`` defines (``None`` for the ones it does not)."""

    path: Path
    preprocess: HookFn | None
    postprocess: HookFn | None
    #: ``async def run(inputs, ctx)`` of a meta bundle.
    run: Callable[..., Any] | None
    module_name: str


def _import_failure(bundle: str, path: Path, exc: BaseException) -> BundleError:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        line = exc.lineno
        last = f"SyntaxError: {exc.msg}"
    where = f" (line {line})" if line is not None else ""
    return BundleError(bundle, f"{path.name}: import failed: {last}{where}")


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Imports a model.py without writing ``__pycache__`` next to it: a bundle directory
    holds what its author put there (an exported bundle, a read-only repository), and a
    cached ``.pyc`` of some Python version is not part of a bundle."""

    def set_data(self, path: str, data: Buffer, *, _mode: int = 0o666) -> None:
        return None  # the bytecode cache write; the import itself is unaffected


def load_hooks(bundle: str, path: Path, *, kind: str) -> Hooks:
    """Import ``path`` (a bundle's model.py) and collect its hooks."""
    module_name = f"reactantserver_bundle_{next(_counter)}_{''.join(c if c.isalnum() else '_' for c in bundle)}"
    spec = importlib.util.spec_from_file_location(
        module_name, path, loader=_SourceOnlyLoader(module_name, str(path))
    )
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise BundleError(bundle, f"{path.name}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered while it executes so dataclasses/typing inside model.py work.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as exc:
        # Including SystemExit: a model.py calling sys.exit() is a bad bundle, and
        # must not take the server down with it.
        sys.modules.pop(module_name, None)
        raise _import_failure(bundle, path, exc) from None

    def get(name: str) -> Any:
        fn = getattr(module, name, None)
        if fn is not None and not callable(fn):
            raise BundleError(
                bundle, f"{path.name}: {name}: expected a function, got {type(fn).__name__}"
            )
        return fn

    pre, post, run = get("preprocess"), get("postprocess"), get("run")
    if kind == "meta":
        if run is None:
            raise BundleError(
                bundle, f"{path.name}: a kind: meta bundle must define `async def run(inputs, ctx)`"
            )
        if not inspect.iscoroutinefunction(run):
            raise BundleError(
                bundle,
                f"{path.name}: run: expected `async def run(inputs, ctx)`, got a plain function",
            )
    for name, fn in (("preprocess", pre), ("postprocess", post)):
        if fn is not None and inspect.iscoroutinefunction(fn):
            raise BundleError(
                bundle, f"{path.name}: {name}: expected a plain (sync) function, got `async def`"
            )
    return Hooks(
        path=path,
        preprocess=pre,
        postprocess=post,
        run=run if kind == "meta" else None,
        module_name=module_name,
    )


def check_result(
    model: str,
    hook: str,
    result: Any,
    specs: Sequence[Any],
    rows: int | None,
) -> Arrays:
    """Check a hook's (or a meta model's ``run``'s) result against ``specs``
    (TensorSpec-likes) and order it; ``ExecutionFailed`` names what is wrong."""
    if not isinstance(result, Mapping):
        raise ExecutionFailed(
            f"model {model!r}: model.py {hook} returned {type(result).__name__}, "
            "expected a dict of numpy arrays"
        )
    out: Arrays = {}
    for spec in specs:
        if spec.name not in result:
            raise ExecutionFailed(
                f"model {model!r}: model.py {hook} returned no tensor {spec.name!r} "
                f"(returned: {', '.join(sorted(map(str, result))) or 'nothing'})"
            )
        arr = np.asarray(result[spec.name])
        want = spec.numpy_dtype
        if spec.datatype == "BYTES":
            if arr.dtype.kind not in "OSU":
                raise ExecutionFailed(
                    f"model {model!r}: model.py {hook} returned {spec.name!r} as {arr.dtype}, "
                    "expected BYTES (an object array of bytes)"
                )
        elif arr.dtype != want:
            raise ExecutionFailed(
                f"model {model!r}: model.py {hook} returned {spec.name!r} as {arr.dtype}, "
                f"expected {spec.datatype} ({want})"
            )
        declared = list(spec.shape)
        if rows is not None and declared and declared[0] == -1:
            declared[0] = rows
        ok = len(arr.shape) == len(declared) and all(
            d == -1 or d == a for d, a in zip(declared, arr.shape, strict=True)
        )
        if not ok:
            raise ExecutionFailed(
                f"model {model!r}: model.py {hook} returned {spec.name!r} with shape "
                f"{list(arr.shape)}, expected {declared}"
            )
        out[spec.name] = arr
    extra = sorted(set(map(str, result)) - {s.name for s in specs})
    if extra:
        raise ExecutionFailed(
            f"model {model!r}: model.py {hook} returned undeclared tensors: {', '.join(extra)}"
        )
    return out


def run_preprocess(
    model: str, hooks: Hooks | None, inputs: Arrays, specs: Sequence[Any], rows: int | None
) -> Arrays:
    """Client tensors -> executable inputs (identity without a preprocess hook).

    ``specs`` are the executable inputs; ``rows`` the request's batch extent (``None``
    for an unbatched model). A hook that raises refuses the request as invalid.
    """
    hook = hooks.preprocess if hooks is not None else None
    return _run(model, "preprocess", hook, inputs, specs, rows)


def run_postprocess(
    model: str, hooks: Hooks | None, outputs: Arrays, specs: Sequence[Any], rows: int | None
) -> Arrays:
    """Executable outputs -> client tensors (identity without a postprocess hook)."""
    hook = hooks.postprocess if hooks is not None else None
    return _run(model, "postprocess", hook, outputs, specs, rows)


def _run(
    model: str,
    name: str,
    hook: HookFn | None,
    given: Arrays,
    specs: Sequence[Any],
    rows: int | None,
) -> Arrays:
    """``hook`` over ``given`` and its result checked against ``specs``. A preprocess
    that raises refuses the request (INVALID_ARGUMENT: the client's tensors); a
    postprocess that raises fails the execution."""
    if hook is None:
        return given
    try:
        result = hook(dict(given))
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        if name == "preprocess":
            raise InvalidArgument(
                f"model {model!r}: preprocess rejected the request: {why}"
            ) from exc
        raise ExecutionFailed(f"model {model!r}: {name} failed: {why}") from exc
    return check_result(model, name, result, specs, rows)

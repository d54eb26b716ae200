"""Session fixtures shared by the suite: the example zoo, exported once, and a CPU runtime.

``zoo_repo`` builds ``examples/build_repo.py``'s repository (the five zoo models with
their real compiled batch sizes, plus four seeded variants that reuse the zoo's
artifacts; not the detector, which adds ~5 s of exporting and is built by the tests that
use it) into a temporary directory once per session; every test that needs real
models reads it. ``zoo_runtime`` is a CPU ``Runtime`` without a persistent cache and
``zoo_models`` the zoo bundles compiled on it, so a test file that executes models
does not compile them again.

JAX is imported lazily by these fixtures only: JAX-free tests never pay for it.

**Guest mode.** The server runs Trio as the guest of a standard asyncio loop
(``reactantserver.transport.guest.run``), and so do the tests that start a real server
in this process: an async test marked ``guest`` (``pytestmark = pytest.mark.guest`` in
a module) is run by pytest-trio through ``guest.run`` instead of ``trio.run`` -- its
fixtures, its nursery and its clock (``autojump_clock`` works) included. Tests of the
sans-IO cores and drivers stay on plain ``trio.run`` and virtual time.

:func:`inline` is the thread runner the drivers' virtual-time tests inject
(``reactantserver.threads``): blocking work runs on the event loop, so the
``autojump_clock`` cannot move while it is "in flight".
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
from hypothesis import settings

# Property tests state invariants, not speed: on a shared 2-core machine one example can
# take ten times its usual time, and Hypothesis's per-example deadline (200 ms) then fails
# a correct test. Timings live in benchmarks (nox -s bench), never in tests.
settings.register_profile("reactantserver", deadline=None)
settings.load_profile("reactantserver")

#: JAX_PLATFORMS as the run was started with: ``gpu_support`` reads it to tell a CPU-only
#: run (``nox -s tests`` sets ``cpu``) from one that may have a GPU.
OUTER_JAX_PLATFORMS = os.environ.get("JAX_PLATFORMS")
# Before anything imports JAX: the suite runs on the CPU (nox sets it too). The gpu tests
# run their GPU work in worker processes of their own; this process stays on the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: Examples per generator in tests/transport/test_wire_fuzz.py unless ``--fuzz-examples`` says.
FUZZ_EXAMPLES = 25


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "guest: run this async test with Trio as the guest of an asyncio loop, as the server "
        "runs (transport.guest.run)",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give tests marked ``guest`` pytest-trio's ``run=`` marker, ahead of the plain one
    that ``trio_mode`` adds (pytest-trio takes the first ``trio`` marker with ``run``); skip
    the ``gpu`` tests where no GPU is visible (:func:`_skip_gpu_tests`)."""
    from inspect import iscoroutinefunction

    from reactantserver.transport import guest

    for item in items:
        function = getattr(item, "obj", None)
        if item.get_closest_marker("guest") is not None and iscoroutinefunction(function):
            item.add_marker(pytest.mark.trio(run=guest.run), append=False)
    _skip_gpu_tests(config, items)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=FUZZ_EXAMPLES,
        help="examples per generator of the wire fuzz suite (nox -s fuzz runs a long one)",
    )


def _skip_gpu_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``gpu`` tests, saying why, where no GPU is visible (``gpu_support``)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import gpu_support

    if gpu_support.dry_run():
        config.stash[_GPU_LINE] = "gpu tests: dry run on the CPU backend (REACTANT_GPU_DRY_RUN=1)"
        return
    reason, probe = gpu_support.no_gpu_reason(OUTER_JAX_PLATFORMS)
    if reason is not None:
        config.stash[_GPU_LINE] = f"gpu tests: skipped, {reason}"
        skip = pytest.mark.skip(reason=f"no GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)
    elif probe is not None:
        config.stash[_GPU_LINE] = f"gpu tests: on {', '.join(probe.devices)} (jax {probe.jax})"


_GPU_LINE = pytest.StashKey[str]()


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    line = config.stash.get(_GPU_LINE, None)
    return [line] if line else []


@pytest.fixture(scope="session")
def fuzz_examples(pytestconfig: pytest.Config) -> int:
    return int(pytestconfig.getoption("--fuzz-examples"))


ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# ``harness`` (benchmarks/gpu/harness.py): the worker-process helpers the gpu tests share
# with the GPU benchmarks.
if str(ROOT / "benchmarks" / "gpu") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


async def inline(fn: Callable[..., Any], *args: Any) -> Any:
    """A ``ThreadRunner`` for tests on virtual time: ``fn(*args)`` on the event loop,
    between two checkpoints (so other tasks still interleave around it)."""
    await trio.lowlevel.checkpoint()
    result = fn(*args)
    await trio.lowlevel.checkpoint()
    return result


#: Names of the zoo models (the bundles every test can rely on).
ZOO_NAMES = ("mlp", "resnet", "surrogate1d", "uint8_classifier", "double")
#: Variants built next to the zoo (``--catalog 4``: all derived from zoo artifacts).
ZOO_CATALOG = 4


def load_file(name: str, path: Path) -> ModuleType:
    """The Python file ``path`` (a script, an example, a benchmark: not a package module)
    as the module ``name``, imported once per test session."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_build_repo() -> ModuleType:
    """``examples/build_repo.py`` as a module (it puts ``examples/`` on sys.path)."""
    return load_file("reactantserver_examples_build_repo", EXAMPLES / "build_repo.py")


@pytest.fixture(scope="session")
def zoo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding the zoo and ``ZOO_CATALOG`` variants (built once)."""
    out = tmp_path_factory.mktemp("zoo") / "repo"
    load_build_repo().build(out, catalog=ZOO_CATALOG, detector=False)
    return out


@pytest.fixture(scope="session")
def zoo_spec() -> Callable[[str], Any]:
    """``zoo_spec(bundle_name)`` -> the ExportSpec (fn, params) that bundle was built from."""
    build_repo = load_build_repo()
    planned = {p.name: p for p in build_repo.plan(ZOO_CATALOG)}
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            p = planned[name]
            cache[name] = build_repo.ZOO[p.arch].export_spec(seed=p.seed, width=p.width)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def zoo_runtime() -> Any:
    """A CPU runtime (no persistent compilation cache)."""
    from reactantserver.config import RuntimeConfig
    from reactantserver.runtime import Runtime

    return Runtime.start(RuntimeConfig(backend="cpu"), "")


@pytest.fixture(scope="session")
def zoo_models(zoo_repo: Path, zoo_runtime: Any) -> dict[str, Any]:
    """name -> (LoadedModel, device weights) for every zoo model, compiled once."""
    from reactantserver.bundle import load_bundle
    from reactantserver.runtime import configure_cache

    # JAX's persistent-cache setting is process-wide: a worker started earlier in the
    # session may have pointed it at its cache_dir. This runtime has none, so say so again.
    configure_cache(None)
    out = {}
    for name in ZOO_NAMES:
        bundle = load_bundle(zoo_repo / name)
        model = zoo_runtime.load(bundle)
        out[name] = (model, zoo_runtime.to_device(bundle.read_weights()))
    return out


# Tests live in rooms that mirror src/ (tests/h2/, tests/gateway/, ...); the shared harnesses
# stay here. A few test modules import from a test of another room by module name (GRPCURL,
# the node harness, the broken-bundle cases), as they did in one flat folder: every room is on
# sys.path.
for _room in sorted(Path(__file__).resolve().parent.iterdir()):
    if _room.is_dir() and any(_room.glob("test_*.py")) and str(_room) not in sys.path:
        sys.path.append(str(_room))

"""One transfer each way: the transfer path per backend, and each path run for real on the CPU.

``output_path`` picks how an execution's bytes move from the device's platform and memory
kinds. JAX's CPU backend offers ``pinned_host`` memory too, so every path -- the CPU's
zero-copy one, outputs compiled into pinned host memory (CUDA's), and the asynchronous
copy (a device without pinned host memory) -- is compiled and run here on the zoo's
models and must give bit-identical answers, through ``execute`` and through ``launch`` +
``fetch`` with several executions launched before the first is fetched.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from reactantserver.bundle import load_bundle
from reactantserver.bundle.manifest import TensorSpec
from reactantserver.config import RuntimeConfig
from reactantserver.runtime import Runtime
from reactantserver.runtime.model import LoadedModel, _output_form, output_path
from reactantserver.runtime.programs import program_key

pytestmark = pytest.mark.slow


def test_output_path_per_backend_and_memory_kinds() -> None:
    assert output_path("cpu", ["device", "pinned_host", "unpinned_host"]) == "zero_copy"
    assert output_path("cuda", ["device", "pinned_host", "unpinned_host"]) == "pinned_host"
    assert output_path("cuda", ["device"]) == "copy_async"
    assert output_path("rocm", iter(["device", "pinned_host"])) == "pinned_host"


def test_a_programs_outputs_are_flattened_by_the_form_it_returns_them_in() -> None:
    """``LoadedModel`` reads how each program returns its outputs once, from its
    ``out_tree``: one array and a flat tuple or list are taken as they are, anything else
    (a nested tree, a dict) is flattened by JAX; ``execute`` and ``launch`` give the same
    list of arrays in tree order either way, and a program that says nothing (a test's
    fake) is flattened as a tree."""
    import jax

    spec = TensorSpec("x", "FP32", (-1,))
    bundle = SimpleNamespace(name="m", inputs=[spec], weight_specs=[], batched=True)
    x = np.arange(3, dtype=np.float32)
    cases = [
        (lambda a: a * 2, "leaf"),
        (lambda a: (a, a * 2), "sequence"),
        (lambda a: [a * 3], "sequence"),
        (lambda a: ((a,), [a * 2, a * 3]), "tree"),
        (lambda a: {"b": a * 2, "a": a}, "sequence"),  # the call sees a dict: flattened
    ]
    for fn, form in cases:
        program = jax.jit(fn).lower(x).compile()
        assert _output_form(program) == form
        model = LoadedModel(bundle, {3: program}, [])  # type: ignore[arg-type]
        expected = [a.tolist() for a in jax.tree.leaves(fn(x))]
        assert [a.tolist() for a in model.execute([x], [])] == expected
        assert [a.tolist() for a in model.fetch(model.launch([x], []))] == expected
    fake = LoadedModel(bundle, {3: lambda a: [[a], a * 2]}, [])  # type: ignore[arg-type, dict-item]
    assert _output_form(fake._executables[3]) == "tree"
    assert [a.tolist() for a in fake.execute([x], [])] == [x.tolist(), (x * 2).tolist()]


def test_a_cpu_runtime_keeps_the_zero_copy_path(zoo_runtime: Any) -> None:
    assert zoo_runtime.output_path == "zero_copy"


def test_the_output_memory_is_part_of_a_shared_programs_key() -> None:
    class Spec:
        shape = (4, 8)
        dtype = "float32"

    on_device = program_key("d", "cuda", 4, [Spec()])
    pinned = program_key("d", "cuda", 4, [Spec()], output_memory="pinned_host")
    assert on_device != pinned and on_device[3] == "device" and pinned[3] == "pinned_host"


@pytest.mark.parametrize("path", ["pinned_host", "copy_async"])
def test_every_path_answers_what_the_zero_copy_path_does(
    path: str, zoo_repo: Path, zoo_models: dict[str, Any]
) -> None:
    runtime = Runtime.start(RuntimeConfig(backend="cpu"), "")
    runtime.output_path = path  # type: ignore[assignment]
    rng = np.random.default_rng(3)
    for name in ("mlp", "resnet", "uint8_classifier"):
        bundle = load_bundle(zoo_repo / name)
        model = runtime.load(bundle)
        assert set(model.paths.values()) == {path}
        reference, weights = zoo_models[name]
        for size in model.sizes:
            draws = [
                [
                    rng.integers(0, 256, shape).astype(spec.numpy_dtype)
                    if spec.numpy_dtype == np.uint8
                    else rng.standard_normal(shape).astype(spec.numpy_dtype)
                    for spec, shape in zip(bundle.inputs, model.input_shapes(size), strict=True)
                ]
                for _ in range(3)
            ]
            want = [reference.execute(inputs, weights) for inputs in draws]
            # Three launched before the first fetch, as a pipelined loop does.
            launched = [model.launch(inputs, weights) for inputs in draws]
            got = [model.fetch(one) for one in launched]
            for w, g in zip(want, got, strict=True):
                for a, b in zip(w, g, strict=True):
                    np.testing.assert_array_equal(a, b)
            for w, inputs in zip(want, draws, strict=True):
                for a, b in zip(w, model.execute(inputs, weights), strict=True):
                    np.testing.assert_array_equal(a, b)
            if path == "pinned_host":
                kinds = {o.sharding.memory_kind for o in model.launch(draws[0], weights).outputs}
                assert kinds == {"pinned_host"}


def test_programs_of_one_artifact_are_shared_per_output_memory(zoo_repo: Path) -> None:
    runtime = Runtime.start(RuntimeConfig(backend="cpu"), "")
    bundle = load_bundle(zoo_repo / "mlp")
    first = runtime.load(bundle)
    runtime.output_path = "pinned_host"
    pinned = runtime.load(bundle)  # a program on the device is not one into pinned memory
    again = runtime.load(bundle)
    assert first.paths == dict.fromkeys(first.sizes, "zero_copy")
    assert "shared" not in {r.cache for r in pinned.compile_reports}
    assert [r.cache for r in again.compile_reports] == ["shared"] * len(again.sizes)
    assert again.paths == dict.fromkeys(again.sizes, "pinned_host")


def test_a_pinned_host_compile_that_fails_falls_back_to_the_asynchronous_copy(
    zoo_repo: Path, zoo_models: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Where the outputs cannot be compiled into the chosen memory (here a kind the CPU
    does not have), the program is compiled without, copies its outputs asynchronously,
    answers the same, and the next bundle of that artifact shares the fallback instead of
    failing the same compile again."""
    import jax

    from reactantserver.runtime import EnvironmentReport

    runtime = Runtime(
        RuntimeConfig(backend="cpu"),
        jax.devices("cpu")[0],
        "cpu",
        False,
        "",
        EnvironmentReport(applied={}, ignored={}, jax_was_initialised=True),
        output_memory="no_such_memory",
    )
    runtime.output_path = "pinned_host"
    bundle = load_bundle(zoo_repo / "mlp")
    model = runtime.load(bundle)
    assert set(model.paths.values()) == {"copy_async"}
    assert "shared" not in {r.cache for r in model.compile_reports}  # compiled, once each
    warned = [r.getMessage() for r in caplog.records if "pinned host memory" in r.getMessage()]
    assert len(warned) == len(model.sizes)
    variant = runtime.load(load_bundle(zoo_repo / "mlp_v000"))
    assert [r.cache for r in variant.compile_reports] == ["shared"] * len(variant.sizes)
    assert set(variant.paths.values()) == {"copy_async"}
    reference, weights = zoo_models["mlp"]
    x = [np.ones(shape, np.float32) for shape in model.input_shapes(8)]
    for a, b in zip(reference.execute(x, weights), model.execute(x, weights), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_out_of_memory_that_surfaces_at_fetch_is_resource_exhausted(zoo_repo: Path) -> None:
    """An asynchronous execution's error surfaces when its outputs are fetched: the launch
    returns, and the fetch raises what ``execute`` would (RESOURCE_EXHAUSTED for memory)."""
    from fake_device import jax_out_of_memory

    from reactantserver.errors import ResourceExhausted
    from reactantserver.runtime.model import LoadedModel

    class Pending:
        """An output whose computation failed on the device: reading it raises."""

        def __array__(self, *args: Any, **kwargs: Any) -> Any:
            raise jax_out_of_memory(1 << 30)

    bundle = load_bundle(zoo_repo / "double")
    fails: dict[int, Any] = {s: (lambda *args: [Pending()]) for s in (1, 4, 8)}
    model = LoadedModel(bundle, fails, [])
    weights: list[Any] = [object()] * len(bundle.weight_specs)
    launched = model.launch([np.zeros((4, 16), np.float32)], weights)
    with pytest.raises(ResourceExhausted, match="ran out of memory executing at batch size 4"):
        model.fetch(launched)


async def test_cudas_path_and_memory_kinds_as_the_gpu_test_checks_them(
    zoo_repo: Path, zoo_runtime: Any
) -> None:
    """``gpu_scenarios.transfer_paths``, the scenario ``test_gpu_transfers.py`` runs on a
    GPU, here on the CPU with the runtime on CUDA's path: every compiled size of every
    zoo model is on the ``pinned_host`` path and its launch's outputs are in pinned host
    memory, the weights the cache hands out (staged packed copies, one transfer) are in
    device memory, and every byte of weights is staged."""
    from conftest import ZOO_NAMES
    from gpu_scenarios import transfer_paths

    report = await transfer_paths(zoo_repo, "cpu", runtime=zoo_runtime)
    assert zoo_runtime.output_path == "zero_copy"  # put back
    assert report["runtime_path"] == "pinned_host"
    assert set(ZOO_NAMES) <= set(report["models"])
    for name, model in report["models"].items():
        assert set(model["paths"].values()) == {"pinned_host"}, name
        assert all(kinds == ["pinned_host"] for kinds in model["output_kinds"].values()), name
        assert model["weight_kinds"] == ["device"], name
    assert report["pinned_host_staging"] and report["staged_bytes"] == report["weight_bytes"]

"""A model with no batch axis (fixed shapes, no compiled batch sizes) served end to end.

Its one program is keyed 0 by the runtime; the scheduler dispatches it one request at a
time (size 1). Found by the serving benchmark: seeding the cost at size 0 once crashed
the dispatch loop on the first request.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from worker_harness import running_worker, worker_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unbatched_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import jax.numpy as jnp

    from reactantserver.export import export_bundle

    repo = tmp_path_factory.mktemp("unbatched")
    export_bundle(
        lambda params, x: x * params["scale"] + 1.0,
        {"scale": jnp.asarray(3.0, dtype=jnp.float32)},
        inputs=[("x", "FP32", [4, 8])],
        outputs=["y"],
        batch_sizes=[],
        out_dir=repo / "affine",
    )
    return repo


def test_unbatched_model_serves_one_request_per_dispatch(unbatched_repo: Path) -> None:
    with running_worker(worker_config(unbatched_repo, metrics=False)) as address:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{address.grpc_port}")
        config = client.get_model_config("affine").config
        assert config.max_batch_size == 0
        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        ii = grpcclient.InferInput("x", [4, 8], "FP32")
        ii.set_data_from_numpy(x)
        for _ in range(3):
            np.testing.assert_array_equal(client.infer("affine", [ii]).as_numpy("y"), x * 3 + 1)
        stats = client.get_inference_statistics("affine").model_stats[0]
        assert stats.execution_count == 3
        wrong = grpcclient.InferInput("x", [2, 8], "FP32")
        wrong.set_data_from_numpy(x[:2])
        with pytest.raises(InferenceServerException, match="expected shape"):
            client.infer("affine", [wrong])
        assert client.is_server_ready()
        client.close()

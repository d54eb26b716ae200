"""The peer's model for ``bench_peer``: MLServer's custom runtime computing ``y = 2 * x``.

Written the way MLServer's documentation writes custom runtimes: decode the input with
``NumpyCodec``, compute with numpy, encode the output with ``NumpyCodec``. Nothing here
is specific to the benchmark, so what is measured is MLServer's own request path.
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Double(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[NumpyCodec.encode_output("y", 2 * x)],
        )

"""Large unary answers: cache-sized DATA frames, whatever the peer allows, and nothing lost.

The server frames an answer in pieces of at most ``transport.server.SEND_CHUNK`` bytes even
when the client allows 16 MiB frames and windows (as gRPC's C core does): h2 and asyncio
copy every frame several times on its way out, and a small frame is copied while it is in
the CPU's cache (docs/benchmarks.md, "38 MB inline"). These tests drive the real server in a
subprocess (``tests/wire_server.py``) with a hand-written HTTP/2 client and read the frames
as they arrive.
"""

from __future__ import annotations

from collections.abc import Iterator

import h2.settings
import numpy as np
import pytest
from h2_client import H2Client, grpc_message
from wire_server import WireServer, running_wire_server

from reactantserver.protocol import inference as pb
from reactantserver.transport.server import SEND_CHUNK

pytestmark = pytest.mark.slow

ROWS = 12_000  # 768 KB in, 768 KB out: several chunks, more than a default window


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireServer]:
    with running_wire_server(tmp_path_factory.mktemp("answers")) as s:
        yield s


def _request(x: np.ndarray) -> bytes:
    tensor = pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=list(x.shape))
    return bytes(
        pb.ModelInferRequest(model_name="double", inputs=[tensor], raw_input_contents=[x.tobytes()])
    )


def _answer(client: H2Client, x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Call ``double`` with ``x``; the answer's ``y`` and the DATA frame sizes it came in."""
    sid = client.start()
    assert client.send(sid, grpc_message(_request(x)), end_stream=True)
    result = client.wait(sid, timeout=60)
    assert result.grpc_status == 0, result.grpc_message
    assert result.data[0] == 0 and int.from_bytes(result.data[1:5], "big") == len(result.data) - 5
    reply = pb.ModelInferResponse().parse(result.data[5:])
    y = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(x.shape)
    return y, result.frames


def test_an_answer_larger_than_a_chunk_leaves_in_chunks_when_16_mib_frames_are_allowed(
    server: WireServer,
) -> None:
    """A client allowing 16 MiB frames and windows still gets DATA frames of at most
    SEND_CHUNK bytes, and the bytes they carry are exactly the answer."""
    codes = h2.settings.SettingCodes
    with H2Client(server.port) as client:
        client.conn.update_settings(
            {codes.MAX_FRAME_SIZE: (1 << 24) - 1, codes.INITIAL_WINDOW_SIZE: (1 << 31) - 1}
        )
        client.conn.increment_flow_control_window((1 << 31) - 1 - 65535)
        client.flush()
        x = np.arange(ROWS * 16, dtype=np.float32).reshape(ROWS, 16)
        y, frames = _answer(client, x)
    np.testing.assert_array_equal(y, 2 * x)
    assert max(frames) <= SEND_CHUNK <= 1 << 20  # cache-sized, not the 16 MiB allowed
    assert len(frames) >= (2 * x.nbytes) // SEND_CHUNK


def test_an_answer_larger_than_the_peers_window_waits_for_window_updates(
    server: WireServer,
) -> None:
    """With HTTP/2's default 64 KiB windows the answer is sent window by window as the
    client acknowledges what it read; nothing is lost or reordered."""
    with H2Client(server.port) as client:
        x = (np.arange(ROWS * 16, dtype=np.float32) % 977).reshape(ROWS, 16)
        y, frames = _answer(client, x)
    np.testing.assert_array_equal(y, 2 * x)
    assert max(frames) <= 16384  # the client never raised SETTINGS_MAX_FRAME_SIZE

"""SIGTERM to a real ``reactantserver gateway`` under load: no call is reset.

Issue 42: SIGTERM to the gateway reset about one call per client connection
(``UNAVAILABLE Stream removed (recvmsg: Connection reset by peer)``) beside the clean
"shutting down; retry" refusals. The drain: new calls are refused with UNAVAILABLE, every
call already taken is answered, then the listener closes and every connection gets a
GOAWAY with the last stream id it took, and closes. The resets were clients that read
the GOAWAY and reconnected for their next call while the listener was still open: the
close cut those new connections with the call on them. Listening now stops before the
GOAWAY, so a reconnect is refused (the call never started: "failed to connect").

Eight tritonclient connections (each its own gRPC channel and subchannel pool), each
keeping four calls in flight, through a gateway process in front of two fake workers.
Every call must end answered, refused by the gateway's own "shutting down", or -- once
the listener is closed -- never connected: never reset, cancelled or cut off. Before the
fix this load saw 30-odd resets per SIGTERM.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from clocks import wait_until
from gateway_harness import fake_workers, free_port, start_cli, wait_serving
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

CONNECTIONS = 8
IN_FLIGHT = 4
X = np.arange(16, dtype=np.float32).reshape(1, 16)


def _kind(error: InferenceServerException | None) -> str:
    if error is None:
        return "ok"
    status, message = str(error.status()), error.message() or ""
    if status == "StatusCode.UNAVAILABLE" and "shutting down" in message:
        return "refused"
    if status == "StatusCode.UNAVAILABLE" and message.startswith("failed to connect"):
        return "not connected"
    return f"{status}: {message}"


def test_sigterm_under_load_resets_no_call(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def load() -> None:
        # A subchannel pool of its own: a connection of its own (gRPC shares subchannels
        # between channels with equal arguments otherwise).
        client = grpcclient.InferenceServerClient(
            address, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(X)
        slots = threading.Semaphore(IN_FLIGHT)

        def done(result: object, error: InferenceServerException | None) -> None:
            with lock:
                outcomes[_kind(error)] += 1
            slots.release()

        while not stop.is_set():
            slots.acquire()
            if not stop.is_set():
                client.async_infer("double", [x], done, client_timeout=30)
            else:
                slots.release()
        for _ in range(IN_FLIGHT):  # every call has ended
            slots.acquire()
        client.close()

    with fake_workers(2) as workers:
        gateway = start_cli(
            ["gateway", "--log-level", "info"],
            tmp_path / "gateway.log",
            REACTANT_GATEWAY_WORKERS=",".join(w.address for w in workers),
            REACTANT_GATEWAY_LISTEN_GRPC=address,
            REACTANT_GATEWAY_LISTEN_METRICS="127.0.0.1:0",
            REACTANT_GATEWAY_LOGGING_FORMAT="text",
        )
        try:
            wait_serving(address, gateway)
            threads = [threading.Thread(target=load) for _ in range(CONNECTIONS)]
            for thread in threads:
                thread.start()
            wait_until(lambda: outcomes["ok"] >= 50 * CONNECTIONS, what=lambda: outcomes)
            status = gateway.terminate()
            # The load outlives the gateway: calls started after the exit never connect.
            wait_until(lambda: outcomes["not connected"] > 0, what=lambda: outcomes)
            stop.set()
            for thread in threads:
                thread.join(60)
        finally:
            gateway.kill()
    assert status == 0, gateway.text()
    clean = {"ok", "refused", "not connected"}
    assert {k: n for k, n in outcomes.items() if k not in clean} == {}, outcomes
    assert outcomes["not connected"] > 0  # the load outlived the gateway
    assert "draining" in gateway.text()

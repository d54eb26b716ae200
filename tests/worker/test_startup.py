"""What ``reactantserver serve`` says when a worker cannot start, and how it announces
one that did: the pure parts of ``reactantserver.startup`` and ``reactantserver.announce``
(the processes are in test_serve_cli.py, test_noxfile.py and test_tutorial.py)."""

from __future__ import annotations

import errno
import socket

import trio

from reactantserver.announce import Startup, example_call, pick_example, ready_block
from reactantserver.client import ModelMetadata, RepositoryModel, TensorMetadata
from reactantserver.config import EndpointsConfig, ServerConfig
from reactantserver.errors import BundleError, ConfigError
from reactantserver.startup import EXIT_CONFIG, exit_status, failure_lines, listen_problems


def _nested(*leaves: BaseException) -> BaseExceptionGroup:
    """What trio.run raises: groups within groups, with the siblings' cancellations."""
    inner = BaseExceptionGroup("Exceptions from Trio nursery", [*leaves, trio.Cancelled._create()])
    return BaseExceptionGroup("Exceptions from Trio nursery", [inner])


def test_a_failure_is_one_line_per_cause_whatever_the_nesting() -> None:
    bind = OSError(errno.EADDRINUSE, "Address already in use")
    group = _nested(bind, ConfigError("runtime.backend: cuda: no usable GPU"), bind)
    assert failure_lines(group) == [
        "Address already in use",
        "runtime.backend: cuda: no usable GPU",
    ]
    # A taken port (found at the start, past listen_problems) and a configuration error:
    # neither is cured by a restart.
    assert exit_status(group) == EXIT_CONFIG == 78
    assert exit_status(_nested(ConfigError("a"), ConfigError("b"))) == 2
    assert exit_status(_nested(bind, KeyError("x"))) == 1  # a bug among them: a crash
    assert exit_status(_nested(FileNotFoundError(2, "No such file or directory"))) == 1
    assert failure_lines(FileNotFoundError(2, "No such file or directory", "/m")) == [
        "No such file or directory: /m"
    ]
    assert failure_lines(BundleError("mlp", "manifest.yaml: broken")) == [
        "bundle 'mlp': manifest.yaml: broken"
    ]
    assert failure_lines(_nested(KeyError("x"))) == ["unexpected KeyError: 'x'"]


def test_listen_problems_name_each_taken_address() -> None:
    with socket.socket() as grpc, socket.socket() as admin:
        for sock in (grpc, admin):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        ports = grpc.getsockname()[1], admin.getsockname()[1]
        config = ServerConfig(
            endpoints=EndpointsConfig(host="127.0.0.1", port=ports[0], metrics_port=ports[1])
        )
        lines = listen_problems(config)
    assert [line.split(";")[0] for line in lines] == [
        f"cannot listen for gRPC on 127.0.0.1:{ports[0]}: address already in use",
        f"cannot listen for admin HTTP on 127.0.0.1:{ports[1]}: address already in use",
    ]
    free = ServerConfig(endpoints=EndpointsConfig(host="127.0.0.1", port=0, metrics_port=0))
    assert listen_problems(free) == []
    elsewhere = ServerConfig(endpoints=EndpointsConfig(host="192.0.2.1", port=9))
    (line,) = listen_problems(elsewhere)
    assert line.startswith("cannot listen for gRPC on 192.0.2.1:9: ")


def test_a_port_lost_to_a_race_gets_the_check_s_line() -> None:
    """Issue 42: a port free at the check and taken by the time the listener bound it (the
    race the check cannot close) printed a bare "Address already in use". The failure is
    checked again: the port another process took is still taken, and the line is the
    check's own, naming the address and what to change."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        config = ServerConfig(endpoints=EndpointsConfig(host="127.0.0.1", port=port))
        lost = _nested(OSError(errno.EADDRINUSE, "Address already in use"))
        lines = failure_lines(lost, lambda: listen_problems(config))
        assert lines == listen_problems(config)
    (line,) = lines
    assert line.startswith(f"cannot listen for gRPC on 127.0.0.1:{port}: address already in use;")
    assert "INFERENCE_SERVER_ENDPOINTS_PORT=PORT" in line
    # Let go by the time of the second look: still one line that says what happened.
    (late,) = failure_lines(lost, lambda: [])
    assert late.startswith("cannot listen: address already in use; another process held one")
    assert exit_status(lost) == EXIT_CONFIG


def _meta(name: str, *inputs: tuple[str, str, tuple[int, ...]]) -> ModelMetadata:
    return ModelMetadata(name, (), "jax_cpu", tuple(TensorMetadata(*t) for t in inputs), ())


def test_the_example_call_is_built_from_metadata() -> None:
    assert example_call(_meta("double", ("x", "FP32", (-1, 16)))) == '{"x": [[1.0] * 16]}'
    detector = _meta("detector", ("image", "FP32", (64, 64, 3)), ("score_threshold", "FP32", (1,)))
    assert example_call(detector) == (
        '{"image": [[[1.0] * 3] * 64] * 64, "score_threshold": [1.0]}'
    )
    assert example_call(_meta("u8", ("image", "UINT8", (-1, 2)))) == '{"image": [[1] * 2]}'
    assert example_call(_meta("echo", ("s", "BYTES", (-1,)))) is None
    assert example_call(_meta("huge", ("x", "FP32", (-1, 1024, 1024)))) is None
    # Every literal means what it says: evaluated, it has the declared shape.
    import numpy as np

    value = eval(example_call(detector) or "")  # our own literal, made just above
    assert np.asarray(value["image"]).shape == (64, 64, 3)


def test_the_preferred_model_then_the_smallest() -> None:
    mlp = _meta("mlp", ("features", "FP32", (-1, 32)))
    double = _meta("double", ("x", "FP32", (-1, 16)))
    tiny = _meta("tiny", ("x", "FP32", (-1, 2)))
    assert pick_example([mlp, double, tiny]) == (double, '{"x": [[1.0] * 16]}')
    assert pick_example([mlp, tiny]) == (tiny, '{"x": [[1.0] * 2]}')
    assert pick_example([_meta("echo", ("s", "BYTES", (-1,)))]) is None


def test_progress_lines_and_the_block() -> None:
    index = [
        RepositoryModel("a", "", "READY", ""),
        RepositoryModel("b", "", "LOADING", ""),
        RepositoryModel("c", "", "UNAVAILABLE", "manifest.yaml: broken"),
    ]
    startup = Startup.from_index(index)
    assert startup.line() == "startup: 1 of 3 models ready, 1 failed (c); compiling b"
    block = ready_block(
        grpc="127.0.0.1:8001",
        metrics=None,
        startup=startup,
        ready=True,
        example=(_meta("a", ("x", "FP32", (-1, 2))), '{"x": [[1.0] * 2]}'),
    ).splitlines()
    assert block[1] == "reactantserver is ready: 1 model (a)"
    assert block[2] == "  failed to load: c (the log says why; RepositoryIndex too)"
    assert "off (set metrics_base_port in the node file)" in block[4]
    assert block[5] == "Try:"
    assert block[6].endswith(
        "grpcurl -plaintext 127.0.0.1:8001 inference.GRPCInferenceService/RepositoryIndex"
    )
    assert block[7].endswith(
        """-c 'from reactantserver.client import Client; print(Client("127.0.0.1:8001")"""
        """.infer("a", {"x": [[1.0] * 2]}))'"""
    )
    assert not any("curl" in line and "metrics" in line for line in block[5:])

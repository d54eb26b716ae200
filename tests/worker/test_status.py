"""The error-category -> gRPC status mapping, alone (no server, no grpclib in the code)."""

from __future__ import annotations

import logging
import subprocess
import sys

import grpc
import pytest
from grpclib.const import Status

from reactantserver.errors import (
    BatchTooLarge,
    BundleError,
    ConfigError,
    DeadlineExceeded,
    ExecutionFailed,
    FailedPrecondition,
    InvalidArgument,
    LifecycleError,
    NotFound,
    NotResident,
    QueueFull,
    RequestError,
    ResourceExhausted,
    TooManyRequests,
    Unavailable,
    Unimplemented,
)
from reactantserver.status import (
    CATEGORY_CODES,
    INTERNAL_MESSAGE,
    StatusCode,
    WireStatus,
    to_status,
)

CASES = [
    (InvalidArgument("model 'mlp': input 'x': bad"), StatusCode.INVALID_ARGUMENT),
    (BatchTooLarge("mlp", 9, [1, 8]), StatusCode.INVALID_ARGUMENT),
    (NotFound("model 'x' is not loaded"), StatusCode.NOT_FOUND),
    (Unavailable("model 'x' is not ready: compiling"), StatusCode.UNAVAILABLE),
    (ResourceExhausted("bounded"), StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull("mlp", 4), StatusCode.RESOURCE_EXHAUSTED),
    (TooManyRequests("64 requests are in flight"), StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded("model 'x': deadline passed"), StatusCode.DEADLINE_EXCEEDED),
    (FailedPrecondition("region 'r' is not registered"), StatusCode.FAILED_PRECONDITION),
    (NotResident("model 'x' weights are not on the device"), StatusCode.FAILED_PRECONDITION),
    (Unimplemented("use ModelInfer"), StatusCode.UNIMPLEMENTED),
    (ExecutionFailed("model 'x': batch 3 failed: XlaRuntimeError"), StatusCode.INTERNAL),
    (
        BundleError("mlp", "manifest.yaml: kind: expected model or meta"),
        StatusCode.FAILED_PRECONDITION,
    ),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda v: type(v).__name__)
def test_categories_keep_their_message(exc: Exception, code: StatusCode) -> None:
    assert to_status(exc) == WireStatus(code, str(exc))


def test_every_request_error_category_has_a_code() -> None:
    categories = {cls for cls, _ in CATEGORY_CODES}
    for cls in RequestError.__subclasses__():
        assert cls in categories, f"{cls.__name__} has no status code"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("secret: /home/alice/model.py line 3"),
        KeyError("weights"),
        LifecycleError("illegal transition LOADING -> LOADING"),
        ConfigError("node.yaml:3: endpoints.port: expected an int"),
        ExceptionGroup("two failures", [NotFound("a"), QueueFull("b", 1)]),
    ],
    ids=lambda v: type(v).__name__,
)
def test_anything_else_is_internal_with_a_fixed_message(
    exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="reactantserver.status"):
        status = to_status(exc, rpc="ModelInfer")
    assert status == WireStatus(StatusCode.INTERNAL, INTERNAL_MESSAGE)
    (record,) = caplog.records
    assert record.getMessage() == "ModelInfer failed with an unexpected error"
    assert record.exc_info is not None and record.exc_info[1] is exc


def test_a_group_of_one_is_that_exception() -> None:
    # What a Trio nursery inside the host raises when a single child task fails.
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [QueueFull("mlp", 8)])])
    assert to_status(nested).code is StatusCode.RESOURCE_EXHAUSTED
    assert to_status(nested).message.startswith("model 'mlp': queue is full")


def test_an_empty_message_names_the_class() -> None:
    assert to_status(Unavailable()) == WireStatus(StatusCode.UNAVAILABLE, "Unavailable")


def test_codes_are_grpc_numbers() -> None:
    for code in StatusCode:
        assert Status[code.name].value == code.value
        assert grpc.StatusCode[code.name].value[0] == code.value


def test_status_module_imports_no_grpc_library() -> None:
    code = (
        "import sys, reactantserver.status\n"
        "print(sorted(m for m in ('grpclib', 'grpc', 'asyncio')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

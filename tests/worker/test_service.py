"""Service semantics that need no server: called directly, Trio-native."""

from __future__ import annotations

from typing import Any

from reactantserver.errors import NotFound, Unavailable
from reactantserver.protocol import inference as pb
from reactantserver.records import CallContext
from reactantserver.service import Service


class _Host:
    """Only ``get`` matters here: one model loading, everything else unknown."""

    def get(self, name: str) -> Any:
        if name == "loading":
            raise Unavailable("model 'loading' is still loading")
        raise NotFound(f"model {name!r} is not loaded")


async def test_model_ready_answers_no_for_loading_and_unknown_models() -> None:
    service = Service(_Host())  # type: ignore[arg-type]
    for name in ("loading", "unknown"):
        reply = await service.model_ready(pb.ModelReadyRequest(name=name), CallContext())
        assert reply.ready is False

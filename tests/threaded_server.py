"""A ``GuardedServer`` on its own asyncio loop in a thread, for tests that drive it from
outside with blocking clients (``with Subclass() as server:``). A subclass gives the
handler table (``mapping``) and, if it needs other limits, ``self.limits``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Self

from clocks import wait_until

from reactantserver.gateway.calls import RawCodec
from reactantserver.transport.core.limits import WireLimits
from reactantserver.transport.server import GuardedServer


class ThreadedServer:
    def __init__(self, limits: WireLimits) -> None:
        self.limits = limits
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: GuardedServer | None = None
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    def mapping(self) -> Mapping[str, Any]:
        raise NotImplementedError

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        self.port = sock.getsockname()[1]
        self.server = GuardedServer(
            dict(self.mapping()), codec=RawCodec(1 << 31, 1 << 31), limits=self.limits
        )
        await self.server.start(sock)
        self._ready.set()
        await self._stop.wait()
        self.server.close()
        await self.server.wait_closed()

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None and self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def until(self, condition: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Wait (blocking) until ``condition()`` holds (``clocks.wait_until``, which fails
        after ``timeout``); True, for ``assert server.until(...)``."""
        wait_until(condition, timeout)
        return True

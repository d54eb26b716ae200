"""Trio as a guest of asyncio (``reactantserver.transport.guest``).

These tests run their own event loops (``guest.run``), so they are plain functions, not
pytest-trio tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import trio

from reactantserver.transport import guest


def test_run_returns_the_trio_result_and_both_loops_are_live() -> None:
    async def main(x: int) -> tuple[int, bool]:
        # Trio runs inside an asyncio callback: the host loop is the running loop.
        loop = asyncio.get_running_loop()
        await trio.sleep(
            0.001
        )  # real-clock: a real timer through the guest loop, not a wait for an event
        return x * 2, loop.is_running()

    assert guest.run(main, 21) == (42, True)


def test_run_raises_what_main_raises() -> None:
    async def main() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        guest.run(main)


def test_aio_awaits_an_asyncio_coroutine_from_trio() -> None:
    async def produce() -> str:
        await asyncio.sleep(
            0.001
        )  # real-clock: a real timer through the guest loop, not a wait for an event
        return "from asyncio"

    async def main() -> str:
        return await guest.aio(produce())

    assert guest.run(main) == "from asyncio"


def test_aio_propagates_exceptions() -> None:
    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("asyncio side")

    async def main() -> None:
        await guest.aio(fail())

    with pytest.raises(ValueError, match="asyncio side"):
        guest.run(main)


def test_cancelling_aio_cancels_and_waits_for_the_asyncio_task() -> None:
    """Invariant: the asyncio task has finished (its cleanup ran) before the Trio
    scope that awaited it is left."""
    log: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)  # real-clock: never ends: it is cancelled
        except asyncio.CancelledError:
            await asyncio.sleep(0.001)  # real-clock: a cleanup that itself awaits a timer
            log.append("asyncio cleanup done")
            raise

    async def main() -> None:
        with trio.move_on_after(0.01):
            await guest.aio(slow())
        log.append("trio scope left")

    guest.run(main)
    assert log == ["asyncio cleanup done", "trio scope left"]


def test_portal_runs_trio_tasks_for_asyncio_callers() -> None:
    async def double(x: int) -> int:
        await trio.sleep(
            0.001
        )  # real-clock: a real timer through the guest loop, not a wait for an event
        return 2 * x

    async def boom() -> None:
        raise RuntimeError("trio side")

    async def caller(portal: guest.TrioPortal) -> tuple[list[int], str]:
        results = await asyncio.gather(*(portal.run(double, i) for i in range(5)))
        try:
            await portal.run(boom)
        except RuntimeError as exc:
            error = str(exc)
        return list(results), error

    async def main() -> tuple[list[int], str]:
        async with trio.open_nursery() as nursery:
            portal = guest.TrioPortal(nursery)
            return await guest.aio(caller(portal))

    assert guest.run(main) == ([0, 2, 4, 6, 8], "trio side")


def test_cancelling_the_asyncio_caller_cancels_the_trio_task() -> None:
    events: list[str] = []
    started = asyncio.Event()

    async def forever() -> None:
        try:
            started.set()  # the same thread: the host loop's Event is safe to set
            await trio.sleep_forever()
        finally:
            events.append("trio task ended")

    async def caller(portal: guest.TrioPortal) -> None:
        task = asyncio.ensure_future(portal.run(forever))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        events.append("asyncio caller cancelled")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            portal = guest.TrioPortal(nursery)
            await guest.aio(caller(portal))
        events.append("nursery closed")

    guest.run(main)
    assert events[-1] == "nursery closed"
    assert set(events[:-1]) == {"trio task ended", "asyncio caller cancelled"}


def test_call_soon_runs_in_trio_context_in_order() -> None:
    seen: list[int] = []

    async def main() -> list[int]:
        async with trio.open_nursery() as nursery:
            portal = guest.TrioPortal(nursery)
            done = trio.Event()

            def note(i: int) -> None:
                trio.lowlevel.current_task()  # only works inside Trio's run context
                seen.append(i)
                if i == 9:
                    done.set()

            loop = asyncio.get_running_loop()
            for i in range(10):
                # From a plain asyncio callback, outside Trio's context.
                loop.call_soon(portal.call_soon, note, i)
            await done.wait()
        return seen

    assert guest.run(main) == list(range(10))


@pytest.mark.slow
def test_trio_signal_receiver_works_in_guest_mode() -> None:
    """SIGTERM reaches Trio's signal receiver when Trio is asyncio's guest."""
    code = textwrap.dedent(
        """
        import signal, sys, trio
        from reactantserver.transport import guest

        async def main():
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                print("ready", flush=True)
                async for signum in signals:
                    return signum

        print("got", guest.run(main), flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.strip() == f"got {int(signal.SIGTERM)}"


def test_call_soon_inside_a_read_runs_as_it_returns_when_nothing_else_is_ready() -> None:
    """``guest.call_soon`` from inside a connection's callback (``HeldWrites`` entered)
    with nothing else ready on the host loop runs as that callback returns -- the same
    order the loop's next pass would give it, without the pass; with another callback
    ready, it waits its turn behind it, as ``loop.call_soon`` does; outside a callback,
    on the next pass."""
    from reactantserver.transport.h2conn import held_writes

    async def main() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()
        held = held_writes()
        done = asyncio.Event()

        def read(name: str, other_ready: bool) -> None:
            held.enter()
            try:
                if other_ready:
                    loop.call_soon(order.append, f"{name}: another callback")
                assert guest.call_soon(lambda: order.append(f"{name}: the pass"))
                order.append(f"{name}: the read")
            finally:
                held.leave()
            order.append(f"{name}: returned")

        def reads() -> None:
            read("alone", False)
            read("crowded", True)
            loop.call_soon(done.set)

        # From an asyncio callback of its own (not a Trio tick): the loop's ready
        # queue holds only what each read adds.
        await guest.aio(_run_in_callback(loop, reads, done))
        assert guest.call_soon(lambda: order.append("outside: the pass"))
        order.append("outside: returned")
        await trio.sleep(0)
        await guest.aio(asyncio.sleep(0))
        return order

    assert guest.run(main) == [
        "alone: the read",
        "alone: the pass",
        "alone: returned",
        "crowded: the read",
        "crowded: returned",
        "crowded: another callback",
        "crowded: the pass",
        "outside: returned",
        "outside: the pass",
    ]


async def _run_in_callback(
    loop: asyncio.AbstractEventLoop, fn: object, done: asyncio.Event
) -> None:
    loop.call_soon(fn)  # type: ignore[arg-type]
    await done.wait()

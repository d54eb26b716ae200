"""SIGINT and SIGTERM for a serving process: the first drains, the second stops at once.

The worker (:func:`reactantserver.worker.serve`) and the gateway
(:func:`reactantserver.gateway.app.run`) stop the same way: the first signal sets their
``stop`` event (new calls are refused, those admitted are answered within the grace
period), a second one cancels the given scope (what still runs is cancelled, the process
exits). Each is logged on the caller's logger (``reactantserver.worker: received SIGTERM:
draining``), at info and warning.
"""

from __future__ import annotations

import logging
import signal

import trio


async def drain_on_signals(
    stop: trio.Event,
    scope: trio.CancelScope,
    log: logging.Logger,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Set ``stop`` on the first SIGINT/SIGTERM, cancel ``scope`` on the next; started once
    the handlers are installed (``await nursery.start(drain_on_signals, stop, scope, log)``)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not stop.is_set():
                log.info("received %s: draining", name)
                stop.set()
            else:
                log.warning("received %s again: stopping now", name)
                scope.cancel()

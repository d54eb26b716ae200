"""The values the scheduling core hands out: requests, batches, decisions, statistics.

``Request`` is the one mutable record: the core moves it through its ``state``
(``queued`` -> exactly one of ``dispatched``, ``shed``, ``cancelled``, ``removed``)
and never back, which is what "no request lost or answered twice" means in code.
Everything else is a frozen attrs record, safe to hand to another task or to a
metrics collector.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

import attrs

#: What a batch's ``group`` is: the caller's coalescing key, which the worker makes the
#: ``ServedModel`` its requests were admitted against (``Batch[ServedModel]``).
G = TypeVar("G")


class RequestState(enum.Enum):
    """Where a request is. Only ``QUEUED`` ever changes, and only once."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"  # handed out in a Batch
    SHED = "shed"  # dropped for its deadline: at dispatch, or when it passed while queued
    CANCELLED = "cancelled"  # the caller gave up while it was queued
    REMOVED = "removed"  # its model was removed or shut down (or refused on update)


@attrs.define(eq=False, slots=True)
class Request:
    """One queued call. Identity is the object (two equal payloads are two requests)."""

    #: Submission number, unique and increasing: "older" means a smaller ``seq``.
    seq: int
    model: str
    #: Opaque to the scheduler; the executor reads it.
    payload: Any
    #: Batch extent (1 for a model without a batch axis).
    rows: int
    #: Time of submission, on the caller's clock.
    arrival: float
    #: Absolute time by which the answer is useless; ``None`` for no deadline.
    deadline: float | None
    #: Coalescing key: only the leading run of requests with the head's group is batched.
    group: Hashable
    #: A meta-model sub-call: dispatched before the discipline's choice, never shed early.
    committed: bool
    state: RequestState = RequestState.QUEUED


@attrs.frozen
class Batch(Generic[G]):
    """One dispatch: ``requests`` of ``model`` (FIFO order) run at padded ``size``.

    ``group`` is the requests' common coalescing key (``Request.group``), typed by the
    caller: the worker's batches are ``Batch[ServedModel]``, so its executor reads the
    version a batch runs on as a typed field.
    """

    #: Dispatch number, unique and increasing.
    seq: int
    model: str
    size: int
    requests: tuple[Request, ...]
    rows: int
    group: G
    #: When the core handed it out.
    started: float
    #: The learned cost of one dispatch of this model at ``size``: its fastest run
    #: since the size was seeded (seconds; ``inf`` when never measured). The driver
    #: runs a batch inline on the dispatch loop only when this is below
    #: ``scheduler.inline_max_seconds``.
    cost: float = float("inf")


@attrs.frozen
class Decision:
    """What ``next_batch`` returns: the batch to run (or none) and requests shed on the way."""

    batch: Batch | None
    shed: tuple[Request, ...] = ()


@attrs.frozen
class ModelStatistics:
    """Counters and gauges of one model (cumulative since it was added)."""

    name: str
    weight: float
    #: Rows one dispatch may carry: the largest compiled size, capped by max_batch_size.
    max_batch_size: int
    queue_depth: int
    queued_rows: int
    #: Requests / rows handed to the executor in successful dispatches.
    requests: int
    rows: int
    dispatches: int
    compute_seconds: float
    shed: int
    cancelled: int
    #: Admissions refused because the queue was full.
    rejected: int
    #: Dispatches that failed or overran dispatch_timeout_seconds.
    failures: int
    #: The fair account: recent device seconds, decayed with ema_halflife_seconds.
    usage: float
    #: Learned (size, seconds) pairs.
    costs: tuple[tuple[int, float], ...]
    #: The fastest run at each learned size, (size, seconds): the program's own cost, the
    #: noise of a busy machine left out (``cost.CostTable.fastest``).
    fastest: tuple[tuple[int, float], ...] = ()


@attrs.frozen
class PolicyStatistics:
    """A snapshot of the whole core."""

    discipline: str
    models: Mapping[str, ModelStatistics]
    queued: int
    requests: int
    rows: int
    dispatches: int
    compute_seconds: float
    shed: int
    #: The model whose batch is out (handed out, not yet completed), if any.
    running: str | None

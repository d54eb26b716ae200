"""Row planning: which queued requests one dispatch takes, and at which compiled size.

A model compiled for batch sizes ``S = s_1 < s_2 < ... < s_m`` can only execute at one
of those sizes. A dispatch therefore picks a padded size ``B`` in ``S`` and takes a
*prefix* of the model's coalescing window -- the leading run of queued requests whose
``group`` equals the head's (same shape variant, same model version). The rules, in
the order they apply (ported from the original's ``plan_batch``):

1. ``R = min(rows in the window, cap)`` where ``cap`` is the model's
   ``max_batch_size`` (0 = uncapped).
2. If ``R >= s_1``: ``B`` is the largest compiled size ``<= R`` -- prefer a size the
   queue can *fill* over padding a larger one. Otherwise ``B = s_1`` (a partial fill
   pads up to the smallest compiled size).
3. If the head alone has more rows than ``B``, grow ``B`` to the smallest compiled size
   that holds the head (admission guarantees one exists).
4. Take requests in FIFO order while their rows total at most ``min(B, cap)``; if not
   even the head fits (a head larger than the cap), take the head alone. A request is
   never split.

Invariants (checked by ``tests/scheduling/test_sched_properties.py``): ``B`` is a compiled size;
the taken rows are ``<= B``; they are ``<= cap`` unless exactly one request is taken;
at least one request is taken; the taken requests are a prefix of the window.

Only the first ``min(cap, s_m)`` rows of the window can influence the plan, so the
scan stops there: planning costs O(largest compiled size), never O(queue length).
Non-coalescable models (an unbatched tensor, or one any-batch program) take the head
alone at its own extent.

This module is pure: no clock, no I/O, no numpy.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import attrs


@attrs.frozen
class Plan:
    """One dispatch's shape: padded ``size``, how many requests (``count``), their ``rows``."""

    size: int
    count: int
    rows: int


def largest_at_most(sizes: Sequence[int], n: int) -> int:
    """The largest of the ascending ``sizes`` that is ``<= n`` (``n >= sizes[0]``)."""
    return sizes[bisect.bisect_right(sizes, n) - 1]


def smallest_at_least(sizes: Sequence[int], n: int) -> int:
    """The smallest of the ascending ``sizes`` that is ``>= n`` (``n <= sizes[-1]``)."""
    return sizes[bisect.bisect_left(sizes, n)]


def plan_batch(sizes: Sequence[int], window_rows: Iterable[int], cap: int = 0) -> Plan:
    """Plan one dispatch of a coalescable model.

    ``sizes`` are the compiled batch sizes in ascending order; ``window_rows`` yields
    the rows of each request in the coalescing window, head first (it must yield at
    least one); ``cap`` is ``max_batch_size`` (0 = uncapped). The iterable is consumed
    only as far as the plan needs.
    """
    largest = sizes[-1]
    limit = largest if cap <= 0 else min(cap, largest)
    prefix: list[int] = []
    total = 0
    for rows in window_rows:
        prefix.append(rows)
        total += rows
        if total >= limit:
            # Nothing past this point can change R (already at the cap or the
            # largest size) nor fit in the fill computed below.
            break
    if not prefix:
        raise ValueError("plan_batch needs at least one request in the window")
    head = prefix[0]
    reach = min(total, limit)
    size = largest_at_most(sizes, reach) if reach >= sizes[0] else sizes[0]
    if head > size:
        size = smallest_at_least(sizes, head)
    fill = size if cap <= 0 else min(size, cap)
    count = taken = 0
    for rows in prefix:
        if taken + rows > fill:
            break
        taken += rows
        count += 1
    if count == 0:
        # A head larger than the cap still runs, alone: requests are never split.
        return Plan(size=size, count=1, rows=head)
    return Plan(size=size, count=count, rows=taken)


def shrink_size(sizes: Sequence[int], planned: int, rows: int) -> int:
    """The size to run after shedding left ``rows`` of a batch planned at ``planned``.

    The original ran the survivors at the planned size; padding rows nobody asked for
    only costs device time, so we drop to the smallest compiled size that still holds
    them (never above the planned one).
    """
    if not sizes:
        return planned
    return min(planned, smallest_at_least(sizes, rows))

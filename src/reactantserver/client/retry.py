"""When to ask again: exponential backoff with full jitter, bounded by the call's deadline.

Theory of operation
-------------------
A call that fails with a :data:`~reactantserver.client.status.RETRYABLE` status
(RESOURCE_EXHAUSTED: a queue or the in-flight cap is full; UNAVAILABLE: the server is
starting, draining or unreachable) is tried again after a pause. Retry ``k`` (0-based)
pauses for a time drawn uniformly from ``[0, min(max_delay, base_delay * 2**k)]`` ("full
jitter"): clients refused together spread out instead of returning together, and the
expected pause still doubles with every refusal.

:meth:`RetryPolicy.next_delay` is sans-IO: it is given the current time, the deadline and a
random source, and returns the pause or ``None`` for "give up now". It gives up when the
retries are spent, or when the drawn pause would end at or after the deadline -- sleeping
into a deadline only to fail with DEADLINE_EXCEEDED would hide the server's actual answer,
so the caller then raises the last error at once.

The defaults follow the original client: two retries, about a second apart.
"""

from __future__ import annotations

import math
import random

import attrs


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"RetryPolicy.{attribute.name} must be finite and >= 0, got {value!r}")


@attrs.frozen
class RetryPolicy:
    """How often, and how long apart, a refused call is tried again."""

    #: Retries after the first attempt (0 turns retrying off).
    max_retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    #: Upper bound of the first pause, seconds; each later bound doubles.
    base_delay: float = attrs.field(default=1.0, validator=_non_negative)
    #: No pause is drawn from a range wider than this, seconds.
    max_delay: float = attrs.field(default=8.0, validator=_non_negative)

    @classmethod
    def never(cls) -> RetryPolicy:
        """Fail on the first refusal."""
        return cls(max_retries=0)

    def bound(self, retry: int) -> float:
        """The upper end of the pause before retry ``retry`` (0-based)."""
        # min() before the power would overflow a float for a large retry count.
        if self.base_delay == 0:
            return 0.0
        doublings = min(retry, 64)
        return min(self.max_delay, self.base_delay * 2.0**doublings)

    def next_delay(
        self, retry: int, *, now: float, deadline: float, rng: random.Random
    ) -> float | None:
        """The pause before retry ``retry``, or ``None`` to give up.

        ``now`` and ``deadline`` are on the same clock; ``deadline`` is ``inf`` when the
        call has none.
        """
        if retry >= self.max_retries:
            return None
        delay = rng.uniform(0.0, self.bound(retry))
        if now + delay >= deadline:
            return None
        return delay

"""One backoff for every retry loop outside the RAPI client (which has :class:`RetryPolicy`).

A tiny helper rather than ``stamina``: the loops that use it (the store's writer, the
dispatcher's loops) do not retry one call: they decide per failure whether to wait, give
up or report, count retries in metrics and reset once the database answers again, which a
decorator-shaped retry library does not fit.

    backoff = Backoff(initial=0.05, maximum=5.0)
    while True:
        try:
            ...
        except SomeTransientError:
            await asyncio.sleep(backoff.next())
            continue
        backoff.reset()
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(slots=True)
class Backoff:
    """Exponential delays: ``initial``, then times ``factor`` per failure, at most ``maximum``.

    With ``jitter`` each delay is drawn uniformly from ``[delay / 2, delay]`` so that
    processes failing together do not retry together.
    """

    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    jitter: bool = False
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < self.initial or self.factor < 1:
            raise ValueError(
                f"backoff needs 0 <= initial <= maximum and factor >= 1 "
                f"(got initial={self.initial}, maximum={self.maximum}, factor={self.factor})"
            )

    def peek(self) -> float:
        """The delay :meth:`next` would give (without jitter), without counting an attempt."""
        # the exponent stops growing past the maximum: a loop retrying for hours must not
        # overflow the float (2.0 ** 1024 raises OverflowError)
        delay = self.initial
        for _ in range(self.attempts):
            delay *= self.factor
            if delay >= self.maximum or self.factor == 1:
                break
        return min(self.maximum, delay)

    def next(self) -> float:
        """The delay to wait before the next try; each call counts one failed attempt."""
        delay = self.peek()
        self.attempts += 1
        if self.jitter:
            return random.uniform(delay / 2, delay)
        return delay

    def reset(self) -> None:
        """The operation succeeded: the next failure starts from ``initial`` again."""
        self.attempts = 0

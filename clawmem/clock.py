"""Time is injected: every component takes a ``clock`` returning Unix seconds as a float."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], float]


def now_seconds(clock: Clock) -> int:
    """Return ``floor(clock())``: the whole second that TTL arithmetic is based on."""
    return math.floor(clock())


def utc_datetime(clock: Clock) -> datetime:
    """Return the clock's time as a naive UTC datetime, the form DATETIME columns hold."""
    return datetime.fromtimestamp(clock(), UTC).replace(tzinfo=None)


class FakeClock:
    """A clock for tests and demos that only moves when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds

"""An array memory whose reads wait until a test lets them go, as a slow database would: the
async adapters' tests prove the event loop keeps serving while such a read is in flight."""

from __future__ import annotations

import threading
from typing import Any

from clawmem.clock import FakeClock
from clawmem.memory.array import ArrayMemory


class HeldMemory(ArrayMemory):
    """Each ``get`` sets :attr:`entered`, then waits (10 s at most) for :attr:`release`."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.entered = threading.Event()
        self.release = threading.Event()

    def get(self, key: str, namespace: str = "default") -> Any:
        self.entered.set()
        if not self.release.wait(10):
            raise TimeoutError("the event loop never ran the releasing coroutine")
        return super().get(key, namespace)

"""Clocks a test moves by hand (an idle tracker's, a standby's, a simulated GPU's, the sampler's): "idle for
45 s" takes no 45 s."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeClock:
    """A monotonic clock that only moves when told; ``sleep`` records each sleep in ``slept`` and, unless
    ``sleep_advances`` is False (a test that checks what was slept, not what came after), moves by it."""

    def __init__(self, start: float = 1000.0, sleep_advances: bool = True) -> None:
        self.now = start
        self.slept: list[float] = []
        self.sleep_advances = sleep_advances

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.sleep_advances:
            self.now += seconds

"""A clock a test moves by hand (an idle tracker's, a standby's): "idle for 45 s" takes no 45 s."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

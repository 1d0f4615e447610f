"""How much of each GPU's time probes took: the ledger behind ``probes.max_gpu_time_ratio``.

Every span a probe held a GPU (a round of the probe service, an interconnect run's hold) is recorded
here when it ends; the scheduler asks :meth:`GpuTimeLedger.allows` before it starts a due probe, so
probes take at most the configured share of a GPU's time over a rolling day. The total is published
as ``gpuperf_probe_gpu_seconds_total`` (the recording rules turn it into a share).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from gpuperfd.config import GPU_TIME_WINDOW_SECONDS

__all__ = ["GpuTimeLedger"]


class GpuTimeLedger:
    """Per GPU: the spans probes held it within the last ``window_seconds`` (monotonic clock). Thread-safe."""

    def __init__(self, ratio: float, window_seconds: float = GPU_TIME_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        #: The share of the window probes may take (probes.max_gpu_time_ratio); a reload sets it.
        self.ratio = ratio
        self.window_seconds = window_seconds
        self.clock = clock
        self._spans: dict[int, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    @property
    def budget_seconds(self) -> float:
        return self.ratio * self.window_seconds

    def record(self, gpu: int, started: float, ended: float) -> float:
        """A span a probe held ``gpu`` (monotonic times); returns its seconds."""
        seconds = max(0.0, ended - started)
        with self._lock:
            self._spans.setdefault(gpu, deque()).append((started, ended))
        return seconds

    def used(self, gpu: int, now: float | None = None) -> float:
        """Seconds probes held ``gpu`` within the last window (a span across its start counts its part)."""
        now = self.clock() if now is None else now
        start = now - self.window_seconds
        with self._lock:
            spans = self._spans.get(gpu, deque())
            while spans and spans[0][1] <= start:
                spans.popleft()
            return sum(min(end, now) - max(begin, start) for begin, end in spans if end > start)

    def allows(self, gpu: int, expected_seconds: float = 0.0, now: float | None = None) -> bool:
        """True if a probe expected to take ``expected_seconds`` fits what is left of ``gpu``'s share."""
        return self.used(gpu, now) + max(0.0, expected_seconds) <= self.budget_seconds

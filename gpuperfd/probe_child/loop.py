"""The timed step loop shared by the measured windows and the GPU-busy pass."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from gpuperfd.probe_child.context import Clock, ProbeContext, Workload

#: How many iterations the host may run ahead of the GPU inside a window.
MAX_AHEAD = 2


def run_loop(ctx: ProbeContext, workload: Workload, clock: Clock, seconds: float, iterations: int | None,
              min_iterations: int = 1, on_step: Callable[[int], None] | None = None) -> tuple[int, float]:
    """Run steps until ``iterations`` (if given) or ``seconds`` have passed; returns (n, wall)."""
    ahead: deque[Any] = deque()
    n = 0
    t0 = time.perf_counter()
    workload.begin(clock)
    while True:
        workload.step(clock)
        n += 1
        if on_step is not None:
            on_step(n)
        if ctx.is_cuda and not workload.host_clock:
            event = torch.cuda.Event()
            event.record()
            ahead.append(event)
            while len(ahead) > MAX_AHEAD:
                ahead.popleft().synchronize()
        if iterations is not None:
            if n >= iterations:
                break
        elif n >= min_iterations and time.perf_counter() - t0 >= seconds:
            break
    ctx.synchronize()
    return n, time.perf_counter() - t0



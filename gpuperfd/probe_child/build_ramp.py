"""Load queued on the GPU while a compiled build runs on the CPU, so the board's power ramp is over
when the windows start (issue 60).

A compiled variant's build is CPU work for its first 1.6-2.1 s (Dynamo's trace and Inductor's cache
load, ViT on an H200 with the cache warm), during which the GPU, already ours, idles. Its first
windows then ramp the board's power and were set aside as settle (1.0-2.1 s, ``_Settle``): on a lent
H200 ViT's turn from the qualifying moment to its result was 7.1 s against a 5.1 s goal. Here, right
after the CUDA context, dense matrix products lasting about :data:`RAMP_SECONDS` are queued on a
stream of their own and the build starts at once: the GPU ramps while the CPU compiles. Nothing
waits for the ramp on purpose; the build's first device-wide synchronize (before its CUDA-graph
capture) finds it done or waits out its rest, and the windows start after that. Nothing is launched
from another thread, so a graph capture never overlaps a launch of ours.

The products are the largest that a quarter of the room allows (16384 on an H200: ~13 ms each), and
their count comes from one timed product, so the queue holds about :data:`RAMP_SECONDS` of work in at
most :data:`MAX_LAUNCHES` launches (CUDA's launch queue is about 1,000 deep: beyond that a launch
blocks the CPU, which would serialize the build behind the ramp). On a slower or smaller board the
ramp is shorter, never longer. The buffers are the ramp stream's (the caching allocator keeps them
for it); :func:`~gpuperfd.probe_child.harness.prepare` gives them back after the build's synchronize,
and the peak-memory statistics are reset before the warm-up, so a result's memory is the workload's.
"""

from __future__ import annotations

import time

import torch

__all__ = ["RAMP_SECONDS", "MAX_LAUNCHES", "queue_ramp", "ramp_side", "ramp_count"]

#: About as long as a compiled build's CPU part with the cache warm (1.6-2.1 s, ViT on an H200): longer
#: and the build would wait for the ramp, shorter and the windows would still ramp.
RAMP_SECONDS = 1.5
#: The most products queued: far below CUDA's launch-queue depth, so no launch blocks the CPU.
MAX_LAUNCHES = 256
#: The products' largest side: 16384 (8.8 TFLOP each, ~13 ms on an H200 in bf16).
MAX_SIDE = 16384
#: Below this side a board has no room worth ramping for.
MIN_SIDE = 1024


def queue_ramp(device: torch.device, dtype: torch.dtype, seconds: float = RAMP_SECONDS,
               budget_bytes: int | None = None) -> int:
    """Queue about ``seconds`` of dense products on a new stream of ``device`` and return at once;
    the number of products queued (0 when ``seconds`` is 0 or there is no room). ``budget_bytes``:
    the child's memory limit, if it has one (the ramp takes at most a quarter of it, as of the free)."""
    if seconds <= 0:
        return 0
    room = torch.cuda.mem_get_info(device)[0]
    side = ramp_side(room if budget_bytes is None else min(room, budget_bytes), torch.finfo(dtype).bits // 8)
    if side is None:
        return 0
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        a = torch.randn(side, side, device=device, dtype=dtype)
        b = torch.randn(side, side, device=device, dtype=dtype)
        out = torch.empty(side, side, device=device, dtype=dtype)
        torch.mm(a, b, out=out)  # cuBLAS's handle and heuristics: not part of the timed product
        stream.synchronize()
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        stream.synchronize()
        count = ramp_count(seconds, time.perf_counter() - start)
        for _ in range(count):
            torch.mm(a, b, out=out)
    return count


def ramp_side(room_bytes: int, itemsize: int) -> int | None:
    """The products' side: the largest power of two up to :data:`MAX_SIDE` whose three matrices take
    at most a quarter of ``room_bytes``; None below :data:`MIN_SIDE`."""
    side = MAX_SIDE
    while side >= MIN_SIDE and 3 * side * side * itemsize > room_bytes // 4:
        side //= 2
    return side if side >= MIN_SIDE else None


def ramp_count(seconds: float, one_seconds: float) -> int:
    """How many products of ``one_seconds`` each make ``seconds``: at least 1, at most :data:`MAX_LAUNCHES`."""
    return max(1, min(MAX_LAUNCHES, round(seconds / max(one_seconds, 1e-6))))

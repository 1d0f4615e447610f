"""How the daemon and the CLIs run the interconnect probe: one protocol, two executors.

The interconnect probe is a node probe: one run holds every GPU of its set at once. An
:class:`InterconnectExecutor` runs it on the devices it is given and returns one
:class:`~gpuperfd.probe_data.interconnect.InterconnectResult`: the real one starts one worker
process per GPU (NCCL; gloo on a CPU), the simulated one computes the figures from the simulated
node's topology and faults. Neither sets a cap or holds a GPU after it returns.
:class:`RetestingExecutor` wraps either: a pair judged slow is measured again before any verdict.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpuperfd.device.base import Device
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult, PeerCopy

__all__ = ["InterconnectExecutor", "RetestingExecutor", "SlowPairs"]


class InterconnectExecutor(Protocol):
    """Runs the interconnect probe across ``devices`` (at least two) and returns its one result."""

    def run(self, devices: Sequence[Device], request: InterconnectRequest,
            abort: threading.Event) -> InterconnectResult:
        """Blocks until the run ends (ok, failed, or aborted: every worker ended either way)."""


#: Judges a run on the GPUs it ran on: the ordered pairs a verdict could come from (below their figure).
SlowPairs = Callable[[InterconnectResult, Sequence[Device]], set[tuple[int, int]]]


class RetestingExecutor:
    """An executor whose slow pairs are measured again before anything is judged (issue 55).

    A peer copy slower than its figure is measured again, alone, in a fresh run, after a pause, up to
    ``retests`` times; each pair keeps its fastest run (noise and other work only slow a copy down,
    a link cannot copy faster than it is), so only a slowness that reproduces is left to judge. A
    retest that could not finish (a job arrived, it failed) leaves its pairs *unconfirmed*: their
    copies are dropped from the result (listed in ``extra["unconfirmed"]`` with why), so no verdict
    comes from them. ``extra["retests"]`` lists every retest with the figures before and after.
    A wrong copy in a retest fails the whole run (wrong_result), as in the first run."""

    def __init__(self, inner: InterconnectExecutor, slow_pairs: SlowPairs, retests: int = 2,
                 pause_seconds: float = 1.0) -> None:
        self.inner = inner
        self.slow_pairs = slow_pairs
        self.retests = retests
        self.pause_seconds = pause_seconds

    def __getattr__(self, name: str) -> Any:  # the inner executor's own attributes (last_pids, ...)
        return getattr(self.inner, name)

    def run(self, devices: Sequence[Device], request: InterconnectRequest,
            abort: threading.Event) -> InterconnectResult:
        t0 = time.monotonic()
        result = self.inner.run(devices, request, abort)
        retests: list[dict[str, Any]] = []
        for _ in range(self.retests):
            if not result.ok:
                break
            suspects = self.slow_pairs(result, devices)
            left = request.timeout_seconds - (time.monotonic() - t0) - self.pause_seconds
            if not suspects or abort.wait(self.pause_seconds) or left <= 1.0:
                if suspects:
                    result = _unconfirmed(result, suspects, "no time left in the run's timeout to measure "
                                          "them again" if left <= 1.0 else "aborted before the retest")
                break
            again = self.inner.run(devices, dataclasses.replace(
                request, pairs=tuple(sorted(suspects)), allreduce_bytes=(), timeout_seconds=left), abort)
            retests.append({"pairs": [f"{a}->{b}" for a, b in sorted(suspects)], "status": again.status,
                            "failure_reason": again.failure_reason,
                            "before": _figures(result, suspects), "after": _figures(again, suspects)})
            if again.failure_reason == "wrong_result":
                result = dataclasses.replace(again, copies=_fastest(result, again), allreduce=result.allreduce)
                break
            if not again.ok:
                result = _unconfirmed(result, suspects, f"the retest did not finish: {again.status} "
                                      f"({again.failure_reason}): {again.error_message}")
                break
            result = dataclasses.replace(result, copies=_fastest(result, again))
        else:
            if result.ok and (left_slow := self.slow_pairs(result, devices)):
                retests.append({"pairs": [f"{a}->{b}" for a, b in sorted(left_slow)], "confirmed": True})
        if retests:
            result = dataclasses.replace(result, extra={**result.extra, "retests": retests},
                                         wall_seconds=time.monotonic() - t0)
        return result


def _figures(result: InterconnectResult, pairs: set[tuple[int, int]]) -> dict[str, float]:
    return {f"{c.src}->{c.dst}": round(c.bandwidth_bytes_per_second / 1e9, 1) for c in result.copies
            if (c.src, c.dst) in pairs}


def _fastest(first: InterconnectResult, again: InterconnectResult) -> tuple[PeerCopy, ...]:
    """Each pair's faster copy of the two runs (a wrong one wins: it must fail the run)."""
    retested = {(c.src, c.dst): c for c in again.copies}
    out = []
    for copy in first.copies:
        other = retested.get((copy.src, copy.dst))
        if other is not None and (not other.ok or other.bandwidth_bytes_per_second > copy.bandwidth_bytes_per_second):
            copy = other
        out.append(copy)
    return tuple(out)


def _unconfirmed(result: InterconnectResult, pairs: set[tuple[int, int]], why: str) -> InterconnectResult:
    """The result without the copies of ``pairs`` (no verdict from a slowness not measured again)."""
    kept = tuple(c for c in result.copies if (c.src, c.dst) not in pairs)
    unconfirmed = {f"{a}->{b}": why for a, b in sorted(pairs)}
    return dataclasses.replace(result, copies=kept, extra={**result.extra, "unconfirmed": unconfirmed})

"""A power-cap sweep: run one probe at each cap on one GPU, then restore the original cap.

The sweep never imports torch or pynvml: it gets a device and a function that
measures the probe once at the cap set now (a warm child's next point, see
:mod:`gpuperfd.probing.executors`) and returns a ProbeResult. In read-only mode it
runs the probe once at the current cap and never touches the limit.

Per cap: journal (first change only), set, read the limit back (bounded by
``settle_seconds``), measure; the measurement itself waits for steady power and SM
clock under load (:mod:`gpuperfd.probe_data.settle`). With ``stop_early`` the caps below
one that is clearly slower than ``max_slowdown`` allows are skipped (status
``skipped``, reason ``early_stop``): throughput does not rise as the cap falls, so
none of them could be recommended.

The rule it applies (recommendation, early stop) is plain data in :mod:`gpuperfd.probe_data.recommend`;
this module is the loop that changes caps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpuperfd.caps.guard import CapGuard
from gpuperfd.caps.journal import CapJournal
from gpuperfd.device.base import Device
from gpuperfd.probe_data.recommend import SweepPoint, clearly_slower, read_only_note, unmeasured_caps
from gpuperfd.probe_data.result import ProbeResult

if TYPE_CHECKING:
    from gpuperfd.probing.observer import SweepObserver

log = logging.getLogger(__name__)


def skipped_point(cap: float, like: ProbeResult, why: str) -> SweepPoint:
    """A point not run on purpose (reported as skipped, never as failed)."""
    result = ProbeResult.failure(like.probe, like.variant, like.preset, "early_stop", why, status="skipped",
                                 params=dict(like.params), device=like.device, started_at=time.time())
    return SweepPoint(cap, result)


class SweepAborted(Exception):
    """The sweep was stopped (daemon shutdown) before every cap ran."""


class SweepPreempted(Exception):
    """A user's job wants the GPU (``wanted`` said so before a cap): the sweep gave it back, cap restored."""


def _stop_before(gpu: int, cap: float, abort: threading.Event, wanted: Callable[[], str | None] | None) -> None:
    """Raise if the sweep must not set ``cap``: a shutdown (:class:`SweepAborted`) or a user's job
    that now holds the GPU (:class:`SweepPreempted`); the caller's ``finally`` restores the cap."""
    if abort.is_set():
        raise SweepAborted(f"sweep on gpu {gpu} aborted before {cap:.0f} W")
    if wanted is not None and (why := wanted()) is not None:
        raise SweepPreempted(f"sweep on gpu {gpu} gave way before {cap:.0f} W: {why}")


def _ends_sweep(gpu: int, result: ProbeResult) -> bool:
    """A point after which no cap is tried: aborted or preempted (give the GPU back now), or no room
    for the preset (no cap makes the card's memory larger); logged."""
    if result.status == "aborted" or result.preempted:
        log.log(logging.INFO if result.preempted else logging.WARNING, "gpu %d: sweep stopped: %s", gpu,
                result.error_message)
        return True
    if result.failure_reason == "no_room":
        log.warning("gpu %d: sweep stopped: %s", gpu, result.error_message)
        return True
    return False


def run_sweep(
    device: Device,
    journal: CapJournal,
    caps_watts: Sequence[float],
    run_point: Callable[[float], ProbeResult],
    *,
    settle_seconds: float = 5.0,
    read_only: bool = False,
    abort: threading.Event | None = None,
    observer: SweepObserver | None = None,
    stop_early: float | None = None,
    wanted: Callable[[], str | None] | None = None,
) -> list[SweepPoint]:
    """Run ``run_point`` at each cap (highest first); always restore the original cap.

    ``observer`` is told the cap held now (``on_cap``, None once restored) and each result as it
    comes (``on_point``). ``abort`` stops between points, restoring first.
    ``stop_early``: the recommendation's max_slowdown; caps below the first one that is
    clearly slower than that (see :func:`clearly_slower`) are skipped. None runs every cap.
    ``wanted``: asked before each cap why a user's job now holds the GPU (None: nobody); an answer
    raises :class:`SweepPreempted`, cap restored. A point that gave way (skipped, preempted) stops it too.
    """
    abort = abort or threading.Event()
    on_cap = observer.on_cap if observer is not None else None
    on_point = observer.on_point if observer is not None else None
    points: list[SweepPoint] = []
    if read_only:
        current = device.power_limits().enforced_watts
        # Asked-for caps other than the current one go unmeasured: a warning, not just news.
        level = log.warning if unmeasured_caps(caps_watts, current) else log.info
        level("gpu %d: %s", device.index, read_only_note(caps_watts, current))
        if wanted is not None and (why := wanted()) is not None:
            raise SweepPreempted(f"probe on gpu {device.index} gave way: {why}")
        point = SweepPoint(current, run_point(current))
        if on_point:
            on_point(point)
        return [point]
    stopped_by: SweepPoint | None = None
    try:
        with CapGuard(device, journal) as guard:
            for cap in caps_watts:
                _stop_before(device.index, cap, abort, wanted)
                if stopped_by is not None:
                    point = skipped_point(cap, stopped_by.result,
                                          f"{stopped_by.cap_watts:.0f} W was already more than "
                                          f"{100 * stop_early:.0f}% slower than {points[0].cap_watts:.0f} W")
                else:
                    guard.set(cap)
                    if on_cap:
                        on_cap(cap)
                    read_back = guard.wait_applied(settle_seconds, abort)
                    if abort.is_set():
                        raise SweepAborted(f"sweep on gpu {device.index} aborted at {cap:.0f} W")
                    started = time.monotonic()
                    point = SweepPoint(cap, run_point(cap))
                    point.result.extra["cap_read_back_seconds"] = read_back
                    log.info(
                        "gpu %d: %s at %.0f W: %s in %.1f s",
                        device.index, point.result.probe, cap, point.result.status, time.monotonic() - started,
                    )
                points.append(point)
                if on_point:
                    on_point(point)
                if _ends_sweep(device.index, point.result):
                    break
                baseline = points[0].result
                if (stop_early is not None and stopped_by is None and len(points) > 1 and baseline.ok
                        and point.result.ok and clearly_slower(baseline, point.result, stop_early)):
                    stopped_by = point
                    log.info("gpu %d: %s at %.0f W is clearly more than %.0f%% slower than at %.0f W: "
                             "lower caps skipped", device.index, point.result.probe, cap, 100 * stop_early,
                             points[0].cap_watts)
    finally:
        if on_cap:
            on_cap(None)
    return points

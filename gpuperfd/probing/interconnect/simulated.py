"""The simulated interconnect probe: an :class:`InterconnectExecutor` over a simulated node (issue 44).

Figures come from the node's simulated topology and faults (``device/simulated_topology.py``)
through the expected-figure table (``device/interconnect_figures.py``, calibrated to the reference
2x H200 NV18 node): peer copy bandwidth per ordered pair (links up x per-link rate x the reference's
efficiency; a pair at half bandwidth copies at half), all-reduce latency and bus bandwidth per size
(a ring limited by the slowest pair), small noise, energy over the window from the GPUs' power.
A GPU whose answers are wrong (``simulation.degrade`` ``wrong_results``) fails the sums. No process
is started and no GPU is held, so an abort or a failure leaves nothing behind.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpuperfd.device.base import Device
from gpuperfd.device.interconnect_figures import allreduce_seconds, expected_copy_bandwidth
from gpuperfd.probe_data.interconnect import AllReduce, InterconnectRequest, InterconnectResult, PeerCopy, bus_bandwidth
from gpuperfd.probing.interconnect.gpu_set import check_set

if TYPE_CHECKING:
    from gpuperfd.device.simulated import SimulatedGpu
    from gpuperfd.device.simulated_topology import SimulatedTopology

#: Relative noise of one simulated repeat (the reference's two directions differ by ~1 %).
NOISE = 0.006


def select_gpus(devices: Sequence[Device], request: InterconnectRequest) -> list[Device]:
    """The request's set among ``devices`` (all of them when it names none); ValueError from
    :func:`check_set` for a GPU that is not there, one named twice, or fewer than two."""
    by_index = {device.index: device for device in devices}
    return [by_index[gpu] for gpu in check_set(request.gpus, sorted(by_index))]


class SimulatedInterconnectExecutor:
    """Runs the interconnect probe on a simulated node; ``sleep`` spends the simulated time (tests: none)."""

    def __init__(self, topology: SimulatedTopology, seed: int | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        self._topology = topology
        self._rng = random.Random(seed)
        self._sleep = sleep or (lambda seconds: None)

    def run(self, devices: Sequence[Device], request: InterconnectRequest,
            abort: threading.Event) -> InterconnectResult:
        gpus = select_gpus(devices, request)
        started, wall = time.time(), 0.0
        if abort.is_set():
            return _stopped(gpus, started)
        copies = []
        by_index = {gpu.index: gpu for gpu in gpus}
        for a, b in request.ordered_pairs(tuple(by_index)):
            copy, seconds = self._copy(by_index[a], by_index[b], request)
            copies.append(copy)
            wall += seconds
            self._sleep(seconds)
            if abort.is_set():
                return _stopped(gpus, started)
        slowest = min(self._rate(a, b) for a in gpus for b in gpus if a is not b)  # the ring's, measured or not
        reductions = []
        for size in request.allreduce_bytes:
            reduction, seconds = self._allreduce(gpus, size, slowest, request)
            reductions.append(reduction)
            wall += seconds
            self._sleep(seconds)
            if abort.is_set():
                return _stopped(gpus, started)
        return _finished(gpus, started, wall, copies, reductions)

    def _noisy(self, value: float) -> float:
        return value * (1.0 + self._rng.gauss(0.0, NOISE))

    def _rate(self, src: Device, dst: Device) -> float:
        """The pair's copy rate as its links and faults make it (bytes/s, before noise)."""
        link = self._topology.pair(src.index, dst.index)
        return (expected_copy_bandwidth(link, self._topology.pcie_generation(src.index))
                * self._topology.bandwidth_factor(src.index, dst.index))

    def _copy(self, src: Device, dst: Device, request: InterconnectRequest) -> tuple[PeerCopy, float]:
        rate = self._rate(src, dst)
        samples = [self._noisy(rate) for _ in range(request.repeats)]
        median = statistics.median(samples)
        cv = statistics.pstdev(samples) / statistics.fmean(samples) if len(samples) > 1 else None
        ok = not (_wrong(src) or _wrong(dst))
        seconds = request.copy_bytes / median * (request.repeats + request.warmup)
        return PeerCopy(src.index, dst.index, request.copy_bytes, median, request.repeats, cv, ok), seconds

    def _allreduce(self, gpus: Sequence[Device], size: int, slowest: float,
                   request: InterconnectRequest) -> tuple[AllReduce, float]:
        ranks = len(gpus)
        samples = sorted(self._noisy(allreduce_seconds(size, ranks, slowest)) for _ in range(request.repeats))
        p50 = statistics.median(samples)
        p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
        reduction = AllReduce(size, ranks, p50, p99, size / p50, bus_bandwidth(size, p50, ranks), request.repeats,
                              sum_ok=not any(_wrong(gpu) for gpu in gpus))
        return reduction, sum(samples) * (request.repeats + request.warmup) / request.repeats


def _wrong(device: Device) -> bool:
    return bool(getattr(device, "wrong_results", False))


def _energy(gpus: Sequence[Device], seconds: float) -> float | None:
    """Joules over the window: each simulated GPU's true power for the simulated time."""
    try:
        return sum(_simulated(gpu).true_power_watts() for gpu in gpus) * seconds
    except AttributeError:
        return None


def _simulated(device: Device) -> SimulatedGpu:
    return device  # type: ignore[return-value]


def _stopped(gpus: Sequence[Device], started: float) -> InterconnectResult:
    return InterconnectResult(tuple(g.index for g in gpus), "skipped", "preempted",
                              "aborted: a job arrived or the daemon is stopping", "simulated", started,
                              time.time() - started)


def _finished(gpus: Sequence[Device], started: float, wall: float, copies: Sequence[PeerCopy],
              reductions: Sequence[AllReduce]) -> InterconnectResult:
    bad = [f"{c.src}->{c.dst}" for c in copies if not c.ok] + [f"all-reduce {r.bytes} B" for r in reductions
                                                               if not r.sum_ok]
    return InterconnectResult(
        tuple(g.index for g in gpus), "failed" if bad else "ok", "wrong_result" if bad else None,
        f"sums differ: {', '.join(bad)}" if bad else None, "simulated", started, wall, tuple(copies),
        tuple(reductions), _energy(gpus, wall))

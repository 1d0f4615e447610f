"""Issues 50 and 60, proven: probes reach a busy fleet at a real probe's costs. A seeded trace of users'
jobs (exponential lengths, mean 90 s; idle gaps, mean 22 s: about 80 % busy; and a second at about 50 %)
comes and goes as foreign processes on 8 simulated GPUs, while the daemon's probe service and
scheduler (its real APScheduler jobs, gap dispatcher, idle tracker, standby children and simulated
executor) run llm every 120 s with idle_seconds 10. The simulated probe charges what a real one costs
on an H200 (``probing/simulated/costs.py``: the child's imports, 13.4 s, before the GPU is touched,
paid by a standby child started as soon as the result is due, while the job runs; its build and
overheads, 4.3 s, and the window on the GPU). Time is compressed 60-fold (every setting, the costs and the trace divided
alike; a job's wait for its GPU is measured in real seconds, against the real 0.25 s bound).

Asserted, as the issues state them: completed runs are at least 80 % of the intervals in which a gap
holds idle_seconds plus the real cost; every GPU has a result; no GPU's oldest result is older than its
longest wait for a fitting gap allows (at real costs on an 80 % busy trace those waits are long: the
median GPU's oldest result stays within 6 intervals); every job that arrived mid-probe got its GPU
back within 0.25 s.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.child.standby import StandbyChildren
from gpuperfd.probing.scheduling.service import ProbeService, RunOutcome
from gpuperfd.probing.simulated.costs import MEASURED_COSTS
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading

#: Real seconds per trace second: 1/60 (an interval of 120 s lasts 2 s).
SCALE = 1 / 60
GPUS = 8
INTERVAL = 120.0
INTERVALS = 8
IDLE = 10.0
MEASURE = 3.0  # the simulated probe's measured window
COSTS = MEASURED_COSTS["llm"]
#: From the qualifying moment to the result at a real llm probe's costs: the build and overheads on the
#: GPU and the window (the child's imports are paid by a standby child while the job runs).
COST = COSTS.build + COSTS.overhead + MEASURE
#: A gap fits a probe when it holds the idle wait, the real cost, and what seeing the GPU free and
#: starting costs: the tracker's 20 ms feed, the dispatcher's 20 ms tick and the run's own set-up
#: (~20 ms), each 1.2 s at this scale (on a real node: a 1 s sampler and a 0.5 s tick).
FITS = IDLE + COST + 3 * 1.2


@dataclass
class Trace:
    """One GPU's users' jobs: (start, end) in trace seconds, alternating with gaps."""

    jobs: list[tuple[float, float]] = field(default_factory=list)

    def gaps(self, end: float) -> list[tuple[float, float]]:
        edges, gaps, last = sorted(self.jobs), [], 0.0
        for start, stop in edges:
            if start > last:
                gaps.append((last, start))
            last = max(last, stop)
        if last < end:
            gaps.append((last, end))
        return gaps


def make_trace(rng: random.Random, busy_mean: float, gap_mean: float, end: float) -> Trace:
    trace, t = Trace(), rng.uniform(0, gap_mean)
    while t < end:
        length = rng.expovariate(1 / busy_mean)
        trace.jobs.append((t, min(t + length, end + 1)))
        t += length + rng.expovariate(1 / gap_mean)
    return trace


def fitting_intervals(trace: Trace, end: float) -> int:
    """Intervals (of each GPU's own grid from the start) in which a gap long enough for a probe began
    to qualify (its start plus idle_seconds)."""
    hits = set()
    for start, stop in trace.gaps(end):
        if stop - start >= FITS and start + IDLE < end:
            hits.add(int((start + IDLE) // INTERVAL))
    return len(hits)


def longest_wait(trace: Trace, end: float) -> float:
    """The longest stretch of the run with no fitting gap opening (from the start, between their
    qualifying moments, to the end): no daemon's result can be younger than that allows."""
    moments = [start + IDLE for start, stop in trace.gaps(end) if stop - start >= FITS and start + IDLE < end]
    edges = [0.0, *moments, end]
    return max(b - a for a, b in zip(edges, edges[1:]))


class Fleet:
    """The daemon's probing side on 8 simulated GPUs, its idle tracker fed every 20 ms as the sampler would."""

    def __init__(self, tmp_path) -> None:
        self.backend = SimulatedBackend(SimulationConfig(gpus=GPUS, seed=7))
        self.devices = self.backend.devices()
        self.registry = CollectorRegistry()
        self.tracker = IdleTracker(0.05, grace_seconds=2.0 * SCALE)
        # every setting at the trace's scale (model_copy: the config's floors are for real seconds)
        schedule = ScheduleConfig(probe="llm", interval_seconds=3600, settle_seconds=0)
        schedule = schedule.model_copy(update={"interval_seconds": INTERVAL * SCALE})
        self.config = ProbesConfig(read_only=True, state_dir=tmp_path / "state", history={"path": None},
                                   schedules=[schedule]).model_copy(update={
            "idle_seconds": IDLE * SCALE, "jitter_seconds": 0.0, "first_run_delay_seconds": 5 * SCALE,
            "schedules": [schedule]})
        executor = simulated_executor(MEASURE * SCALE, seed=1, watch_interval=0.02, cost_scale=SCALE)
        executor.standby = StandbyChildren(executor.new_child, 600, None, ready_seconds=15 * SCALE,
                                           lead_margin_seconds=5 * SCALE)
        self.service = ProbeService(self.config, self.devices, executor, ProbeMetrics(self.registry),
                                    self.tracker, standby=executor.standby)
        self.results: dict[int, list[float]] = {d.index: [] for d in self.devices}
        self.service.outcome_listeners.append(self._outcome)
        self.scheduler = ProbeScheduler(self.service, [d.index for d in self.devices], tick_seconds=0.02,
                                        recheck_seconds=2.0 * SCALE, gap_open_seconds=SCALE)
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)

    def _outcome(self, gpu: int, key: str, outcome: RunOutcome) -> None:
        if outcome.result == "ok":
            self.results[gpu].append(time.monotonic())

    def _feed(self) -> None:
        while not self._stop.wait(0.02):
            for device in self.devices:
                count = len(device.compute_processes())
                points = (Point("gpuperf_compute_processes", float(count)),)
                self.tracker.observe(device.index, "processes", Reading(points, True, None, 0.0, time.monotonic()))

    def start(self) -> None:
        self._feed_once()
        self._feeder.start()
        self.scheduler.apply(self.config)
        self.scheduler.start()

    def _feed_once(self) -> None:
        for device in self.devices:
            points = (Point("gpuperf_compute_processes", float(len(device.compute_processes()))),)
            self.tracker.observe(device.index, "processes", Reading(points, True, None, 0.0, time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self.scheduler.stop()
        self.service.stop()


def play(fleet: Fleet, traces: dict[int, Trace], t0: float, end: float, waits: list[float]) -> None:
    """Each GPU's jobs as foreign processes at their (scaled) times; a job that arrives while our probe
    holds the GPU is timed until the probe is gone from it."""
    own = os.getpid()

    def one(gpu: int, trace: Trace) -> None:
        device = fleet.devices[gpu]
        events = sorted([(s, "add", n) for n, (s, _) in enumerate(trace.jobs)]
                        + [(e, "remove", n) for n, (_, e) in enumerate(trace.jobs)], key=lambda x: (x[0], x[1] == "add"))
        for at, kind, number in events:
            if at >= end:
                break
            delay = t0 + at * SCALE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pid = 100000 + gpu * 1000 + number
            if kind == "remove":
                device.remove_foreign_process(pid)
                continue
            arrived = time.monotonic()
            probing = any(p.pid == own for p in device.compute_processes())
            device.add_foreign_process(pid, 1 << 30)
            if probing:
                while any(p.pid == own for p in device.compute_processes()):
                    time.sleep(0.002)
                waits.append(time.monotonic() - arrived)

    threads = [threading.Thread(target=one, args=(gpu, trace), daemon=True) for gpu, trace in traces.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("busy_mean,gap_mean,seed", [(90.0, 22.0, 50), (22.0, 22.0, 51)],
                         ids=["80pct_busy", "50pct_busy"])
def test_probes_reach_a_busy_fleet(tmp_path, busy_mean, gap_mean, seed) -> None:
    end = INTERVALS * INTERVAL
    rng = random.Random(seed)
    traces = {gpu: make_trace(rng, busy_mean, gap_mean, end) for gpu in range(GPUS)}
    busy = sum(min(e, end) - s for t in traces.values() for s, e in t.jobs) / (GPUS * end)
    fleet = Fleet(tmp_path)
    waits: list[float] = []
    fleet.start()
    t0 = time.monotonic()
    try:
        play(fleet, traces, t0, end, waits)
        remaining = t0 + end * SCALE - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
    finally:
        fleet.stop()
    completed = {gpu: [(t - t0) / SCALE for t in times if t - t0 <= end * SCALE] for gpu, times in fleet.results.items()}
    fits = sum(fitting_intervals(trace, end) for trace in traces.values())
    runs = sum(len(times) for times in completed.values())
    oldest = []
    for gpu, times in completed.items():
        edges = [0.0, *times, end]
        oldest.append(max(b - a for a, b in zip(edges, edges[1:])))
    report = (f"busy {busy:.0%}: {runs} completed of {fits} intervals with a fitting gap; oldest per GPU "
              f"{[round(o) for o in oldest]} s; yields {sorted(round(w, 3) for w in waits)}")
    print(report)
    assert runs >= 0.8 * fits, report
    assert all(completed.values()), report  # every GPU has a result
    # at a real probe's costs the trace itself bounds a result's age: a GPU whose fitting gaps are far
    # apart cannot be fresher, but it must not be older than its longest wait for one allows (that
    # wait, the interval the result was not yet due in, and the probe's own time)
    waits_for_gap = [longest_wait(traces[gpu], end) for gpu in range(GPUS)]
    assert all(o <= w + INTERVAL + FITS for o, w in zip(oldest, waits_for_gap)), (report, waits_for_gap)
    assert statistics.median(oldest) <= 6 * INTERVAL, report
    assert waits and max(waits) <= 0.25, report  # jobs did arrive mid-probe, and each got its GPU back in time
    # every completed run published its time from the GPU qualifying to the result, and its GPU time
    observed = fleet.registry.get_sample_value("gpuperf_probe_qualified_to_result_seconds_count", {"probe": "llm"})
    assert observed == sum(len(times) for times in fleet.results.values()), report
    took = sum(fleet.registry.get_sample_value("gpuperf_probe_gpu_seconds_total",
                                               {"gpu": str(d.index), "uuid": d.info().uuid}) or 0
               for d in fleet.devices)
    assert took >= observed * MEASURE * SCALE, report


def test_an_idle_fleet_is_probed_once_an_interval_and_a_first_delay_below_idle_seconds_loses_nothing(tmp_path) -> None:
    """No jobs at all: the first firing (5 s) finds the GPUs idle only 5 of the 10 s they need; the result
    stays due and runs once they qualify (10 s), not an interval later. After that, one result an interval:
    the early take of a gap is for GPUs that were busy, never an idle GPU's extra run."""
    fleet = Fleet(tmp_path)
    fleet.start()
    t0 = time.monotonic()
    try:
        time.sleep(3.5 * INTERVAL * SCALE)
    finally:
        fleet.stop()
    for gpu, times in fleet.results.items():
        at = [(t - t0) / SCALE for t in times]
        # the first chance was not lost to "not idle": the standby child started at the start (the result
        # fell due within its lead), so the result came its imports, build, overheads and window later
        # (+15 s: the feed, ticks and threads' slack under load, 0.25 s real; still far from an interval)
        assert IDLE <= at[0] <= COSTS.imports + COSTS.build + COSTS.overhead + MEASURE + 15, (gpu, at)
        # then once each interval: each later child started a lead before its result fell due, so only the
        # GPU's part (build, overheads, window) is added to each interval
        assert len(at) == 4, (gpu, at)
        assert all(b - a >= 0.97 * INTERVAL for a, b in zip(at, at[1:])), (gpu, at)
    skipped = fleet.registry.get_sample_value("gpuperf_probe_runs_total", {
        "gpu": "0", "uuid": fleet.devices[0].info().uuid, "probe": "llm", "preset": "gpt2",
        "result": "skipped", "reason": "not_idle"})
    assert skipped == 1  # the first firing's skip, counted as before; its result stayed due

"""Issue 60: what a user sees while a result waits. The daemon tells "no gap" (the GPU is never free)
from "gaps too short" (its jobs leave gaps shorter than idle_seconds plus the probe's own time) and
"gap open" (free now), with the last gaps' lengths: in ``/api/v1/gpus`` (``gaps``), on the landing page
and in ``gpuperfd top``.

The real scheduler (paused APScheduler jobs), probe service, idle tracker and a simulated GPU; the
tracker's clock is the test's, so a 30 s gap takes no 30 s."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading
from gpuperfd.top.frame import render
from gpuperfd.web.status import gap_words
from manual_clock import Clock

LLM = ScheduleConfig(probe="llm", interval_seconds=3600, settle_seconds=0)
IDLE_SECONDS = 10.0


class Node:
    def __init__(self, tmp_path) -> None:
        self.clock = Clock()
        self.backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5))
        self.devices = self.backend.devices()
        self.tracker = IdleTracker(0.05, clock=self.clock)
        self.config = ProbesConfig(jitter_seconds=0, first_run_delay_seconds=3600, idle_seconds=IDLE_SECONDS,
                                   state_dir=tmp_path / "state", history={"path": None}, schedules=[LLM])
        self.service = ProbeService(self.config, self.devices, simulated_executor(0.05, seed=1),
                                    ProbeMetrics(CollectorRegistry()), self.tracker)
        self.scheduler = ProbeScheduler(self.service, [0])
        self.scheduler.scheduler.start(paused=True)
        self.scheduler.apply(self.config)

    def seconds(self, busy: bool, seconds: int) -> None:
        """A reading a second, as the sampler's, busy (a user's job's utilization) or idle."""
        for _ in range(seconds):
            self.clock.now += 1.0
            self.tracker.observe(0, "utilization", Reading(
                (Point("gpuperf_gpu_utilization_ratio", 0.9 if busy else 0.0),), True, None, 0, self.clock.now))

    def fire(self) -> None:
        job = self.scheduler.scheduler.get_job("0-llm-gpu0")
        job.func(*job.args, **job.kwargs)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.scheduler.stop()


def test_the_tracker_keeps_the_free_stretches_a_job_ended_not_the_samplers_rhythm(node):
    node.seconds(True, 5)  # busy readings a second apart: no gaps
    assert node.tracker.recent_gaps(0) == []
    node.seconds(False, 8)
    node.seconds(True, 1)  # a job came back after 9 s free
    node.seconds(False, 3)
    node.seconds(True, 1)
    assert node.tracker.recent_gaps(0) == [9.0, 4.0]
    for _ in range(7):
        node.seconds(False, 4)
        node.seconds(True, 1)
    assert node.tracker.recent_gaps(0) == [5.0] * 5  # the last five


def test_a_due_result_says_no_gap_then_gap_open_then_gaps_too_short(node):
    assert node.scheduler.gap_states() == {}  # nothing due: nothing to explain
    node.seconds(True, 3)
    node.fire()  # due; the GPU is busy: skipped, stays due
    state = node.scheduler.gap_states()[0]
    assert state["state"] == "no_gap" and state["due"] == ["llm"] and state["last_gaps_seconds"] == []
    assert "no gap" in gap_words(state)
    node.seconds(False, 4)
    assert node.scheduler.gap_states()[0]["state"] == "gap_open"
    node.seconds(True, 1)  # the gap closed after 5 s, before idle_seconds
    node.scheduler._cost["llm"] = 7.0  # the probe's own time, as its last result measured it
    state = node.scheduler.gap_states()[0]
    assert state["state"] == "gaps_too_short" and state["last_gaps_seconds"] == [5.0]
    assert state["needs_seconds"] == IDLE_SECONDS + 7.0
    words = gap_words(state)
    assert "gaps too short" in words and "5 s" in words and "~17 s" in words
    node.seconds(False, 30)
    node.seconds(True, 1)  # a long gap came (and went, with the result still due: its run gave way)
    assert node.scheduler.gap_states()[0]["state"] == "waiting"


def test_top_draws_the_gap_words(node):
    node.seconds(True, 3)
    node.fire()
    state = node.scheduler.gap_states()[0]
    gpu = {"gpu": 0, "uuid": "GPU-0", "name": "H100", "up": False, "gaps": {**state, "words": gap_words(state)}}
    text = "\n".join(render({"backend": "simulated", "gpus": [gpu]}, "test", 200))
    assert "due: llm; no gap" in text


def test_the_landing_page_and_the_api_say_why_a_due_result_waits(node):
    """The same state through the daemon's two other surfaces: the landing page's GPU section and
    ``/api/v1/gpus``'s ``gaps`` (with its words); a GPU with nothing due says nothing."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "web"))
    from landing_fakes import FakeSampler

    from gpuperfd.web.landing import landing_page
    from gpuperfd.web.status import gpu_status

    node.seconds(True, 3)
    node.fire()
    node.seconds(False, 5)
    node.seconds(True, 1)
    node.scheduler._cost["llm"] = 7.0
    gaps = node.scheduler.gap_states()
    sampler = FakeSampler(2, power=(398.0, 400.0))
    page = landing_page(sampler, "simulated", "/metrics", gaps=gaps).decode()
    line = page.split('<p class="due" id="gaps-0">', 1)[1].split("</p>", 1)[0]
    assert line.startswith("due: llm; gaps too short: the last ones lasted 6 s; a result needs ~17 s free")
    assert 'id="gaps-1"' not in page
    body = gpu_status(sampler.store.snapshot(), 1.0, "simulated", gaps=gaps)
    by_gpu = {g["gpu"]: g for g in body["gpus"]}
    assert by_gpu[0]["gaps"]["state"] == "gaps_too_short" and by_gpu[0]["gaps"]["words"] == gap_words(gaps[0])
    assert by_gpu[1]["gaps"] is None

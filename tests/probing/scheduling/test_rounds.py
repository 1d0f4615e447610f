"""Probe rounds (issue 36): the schedules due on a GPU run in one probe child, each counted as its own.

The real APScheduler drives these (``ProbeScheduler`` on a started but paused ``BackgroundScheduler``,
so nothing fires by the clock); a job's firing is ``ProbeScheduler._run`` called as APScheduler calls
it. One child per round is read from ``open_session``'s hand-offs: a round's first schedule opens
with ``after=None``, each next one takes the previous session's child (``after=`` set).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.history import HistoryWriter, read_history
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.probing.sweep import owned
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading

LLM = ScheduleConfig(probe="llm", interval_seconds=3600, caps=["max", 500], settle_seconds=0)
VIT = ScheduleConfig(probe="vit", interval_seconds=3600, settle_seconds=0)
ATTENTION = ScheduleConfig(probe="attention", interval_seconds=3600, settle_seconds=0)
JOBS = {"llm": "0-llm-gpu0", "vit": "1-vit-gpu0"}


class Node:
    """A simulated node with the daemon's probe service and scheduler, and a log of opened sessions."""

    def __init__(self, tmp_path, monkeypatch, schedules, gpus=1, standby=None, **probes) -> None:
        self.backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=5, initial_power_limits={0: 680.0}))
        self.devices = self.backend.devices()
        self.registry = CollectorRegistry()
        tracker = IdleTracker(0.05)
        for d in self.devices:
            idle = Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0)
            tracker.observe(d.index, "utilization", idle)
        self.config = ProbesConfig(**{"read_only": False, "jitter_seconds": 0, "first_run_delay_seconds": 3600,
                                      "idle_seconds": 0, "state_dir": tmp_path / "state", "schedules": schedules,
                                      **probes})
        self.history = tmp_path / "history.jsonl"
        self.service = ProbeService(self.config, self.devices, simulated_executor(0.05, seed=1),
                                    ProbeMetrics(self.registry), tracker, HistoryWriter(self.history),
                                    standby=standby)
        self.scheduler = ProbeScheduler(self.service, [d.index for d in self.devices])
        self.scheduler.scheduler.start(paused=True)  # real jobs and triggers; nothing fires by the clock
        self.scheduler.apply(self.config)
        #: (gpu, probe, took over the previous session's child) per open_session call.
        self.opened: list[tuple[int, str, bool]] = []
        #: Called with the schedule at each open_session, inside the round (the GPU is held).
        self.on_open = lambda schedule: None
        real = owned.open_session

        def recording(executor, device, schedule, abort, after=None):
            self.opened.append((device.index, schedule.probe, after is not None))
            self.on_open(schedule)
            return real(executor, device, schedule, abort, after=after)

        monkeypatch.setattr(owned, "open_session", recording)

    def job(self, job_id):
        return self.scheduler.scheduler.get_job(job_id)

    def due_in(self, job_id, seconds) -> datetime:
        when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        self.job(job_id).modify(next_run_time=when)
        return self.job(job_id).next_run_time

    def fire(self, job_id) -> None:
        """What APScheduler does when the job is due: run its function with its arguments."""
        job = self.job(job_id)
        job.func(*job.args, **job.kwargs)

    def runs(self, probe, result="ok", reason="", gpu=0, preset=None):
        labels = {"gpu": str(gpu), "uuid": self.devices[gpu].info().uuid, "probe": probe,
                  "preset": preset or {"llm": "gpt2", "vit": "vit-b16", "attention": "default"}[probe],
                  "result": result, "reason": reason}
        return self.registry.get_sample_value("gpuperf_probe_runs_total", labels) or 0

    def stop(self) -> None:
        self.scheduler.stop()


@pytest.fixture
def node(tmp_path, monkeypatch):
    made = []

    def make(schedules=(LLM, VIT), **probes):
        made.append(Node(tmp_path, monkeypatch, list(schedules), **probes))
        return made[-1]

    yield make
    for n in made:
        n.stop()


def test_two_schedules_due_within_the_window_run_in_one_child_each_counted_and_published(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 120)  # due in 2 minutes: within the 5-minute window
    before = datetime.now(timezone.utc)
    n.fire(JOBS["llm"])
    after = datetime.now(timezone.utc)
    assert n.opened == [(0, "llm", False), (0, "vit", True)]  # one child: vit built in llm's
    # each schedule counted and published as its own: llm's two caps, vit's one (the operator's cap)
    assert n.runs("llm") == 2 and n.runs("vit") == 1
    records = list(read_history(n.history))
    assert [(r["result"]["probe"], r["power_cap_watts"]) for r in records] == [("llm", 700), ("llm", 500), ("vit", 680)]
    assert len({r["sweep_id"] for r in records}) == 2  # one sweep per schedule, as before
    assert {(gpu, probe) for gpu, probe, _ in n.service.latest()} == {(0, "llm"), (0, "vit")}
    uuid = n.devices[0].info().uuid
    assert n.registry.get_sample_value("gpuperf_sweep_in_progress", {"gpu": "0", "uuid": uuid}) == 0
    assert n.devices[0].power_limits().enforced_watts == 680.0
    # vit's own job does not run it again: its next run is a whole interval after this round
    hour = timedelta(seconds=3600)
    assert before + hour <= n.job(JOBS["vit"]).next_run_time <= after + hour


def test_a_job_firing_while_its_schedule_is_in_the_round_is_not_run_again(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 60)
    fired = []

    def vit_fires_during_llm(schedule):
        if schedule.probe == "llm":  # vit's job fires (as APScheduler may, at its old time) while llm runs
            thread = threading.Thread(target=lambda: fired.append(n.service.run(VIT, 0, key=JOBS["vit"])))
            thread.start()
            thread.join(30)  # returns at once: its schedule is in the running round

    n.on_open = vit_fires_during_llm
    n.fire(JOBS["llm"])
    assert [(o.result, o.reason) for o in fired] == [("in_round", "served")]
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    assert n.runs("vit") == 1 and n.runs("vit", "skipped", "overlap") == 0


def test_a_run_that_queues_on_the_gpu_during_a_round_joins_it(node):
    n = node(round_window_seconds=300, schedules=[LLM, VIT, ATTENTION])
    fired = []
    rounds = n.service._rounds[0]

    def attention_queues(schedule):
        if schedule.probe == "llm":
            thread = threading.Thread(target=lambda: fired.append(n.service.run(ATTENTION, 0, key="2-attention-gpu0")))
            thread.start()
            deadline = time.monotonic() + 30
            while "2-attention-gpu0" not in rounds._waiting and time.monotonic() < deadline:
                time.sleep(0.01)  # until it is queued (a state, not a race)
            assert "2-attention-gpu0" in rounds._waiting
            n.attention_thread = thread

    n.on_open = attention_queues
    outcome = n.service.run(LLM, 0, key=JOBS["llm"])
    n.attention_thread.join(30)
    assert outcome.result == "ok"
    assert n.opened == [(0, "llm", False), (0, "attention", True)]
    assert [(o.result, o.reason) for o in fired] == [("in_round", "served")]
    assert n.runs("attention") == 1


def test_window_zero_keeps_one_child_per_schedule(node):
    n = node(round_window_seconds=0)
    planned = n.due_in(JOBS["vit"], 60)
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False)]
    assert n.job(JOBS["vit"]).next_run_time == planned  # not claimed
    n.fire(JOBS["vit"])
    assert n.opened == [(0, "llm", False), (0, "vit", False)]  # its own child
    assert n.runs("llm") == 2 and n.runs("vit") == 1


def test_window_zero_queues_as_before_and_skips_after_queue_seconds(node):
    n = node(round_window_seconds=0, queue_seconds=0)
    fired = []

    def vit_fires_during_llm(schedule):
        if schedule.probe == "llm":
            thread = threading.Thread(target=lambda: fired.append(n.service.run(VIT, 0, key=JOBS["vit"])))
            thread.start()
            thread.join(30)

    n.on_open = vit_fires_during_llm
    n.fire(JOBS["llm"])
    assert [(o.result, o.reason) for o in fired] == [("skipped", "overlap")]
    assert n.runs("vit", "skipped", "overlap") == 1


def test_schedules_due_beyond_the_window_or_a_tenth_of_their_interval_are_not_pulled(node):
    every_10_minutes = ScheduleConfig(probe="vit", interval_seconds=600, settle_seconds=0)
    n = node(round_window_seconds=300, schedules=[LLM, every_10_minutes])
    planned = n.due_in(JOBS["vit"], 90)  # within the window, but 90 s > 600 s / 10
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False)] and n.job(JOBS["vit"]).next_run_time == planned
    far = n.due_in(JOBS["llm"], 400)  # beyond the window
    n.due_in(JOBS["vit"], 30)
    n.fire(JOBS["vit"])
    assert n.opened[1:] == [(0, "vit", False)] and n.job(JOBS["llm"]).next_run_time == far


def test_a_schedule_due_before_its_own_child_could_be_ready_joins_though_a_tenth_of_its_interval_is_less(node):
    """Issue 60 (2x H200): vit every 60 s fell due 13 s after llm's round began; a tenth of its interval
    (6 s) kept it out, and its own child, started only when the round took the GPU's standby slot, was
    not ready: 8-11 s from its turn to its result. Within the standby child's lead it joins instead."""
    from gpuperfd.probing.child.standby import StandbyChildren

    def no_child(*args):
        raise AssertionError("no standby child is started in this test")

    standby = StandbyChildren(no_child, timeout_seconds=60.0)
    lead = standby.lead_seconds("vit")
    every_minute = ScheduleConfig(probe="vit", interval_seconds=60, settle_seconds=0)
    assert 60 / 10 < lead - 5
    n = node(round_window_seconds=300, schedules=[LLM, every_minute], standby=standby)
    n.due_in(JOBS["vit"], lead - 5)
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    n.opened.clear()
    planned = n.due_in(JOBS["vit"], lead + 5)  # its own child has time to be ready: it keeps its turn
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False)] and n.job(JOBS["vit"]).next_run_time == planned
    n.opened.clear()
    window_only = node(round_window_seconds=3, schedules=[LLM, every_minute], standby=standby)
    planned = window_only.due_in(JOBS["vit"], lead - 5)  # the window still bounds it
    window_only.fire(JOBS["llm"])
    assert window_only.opened == [(0, "llm", False)] and window_only.job(JOBS["vit"]).next_run_time == planned


def test_a_schedule_that_falls_due_while_the_round_runs_joins_it_at_its_end(node):
    """Issue 60 (2x H200): attention fell due while a round of its GPU ran, then waited 9.2 s for a
    child of its own, started late; it runs in the round's child instead, once, and its next run is an
    interval later."""
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 3000)  # not due when the round begins

    def vit_falls_due(schedule):
        if schedule.probe == "llm":
            n.due_in(JOBS["vit"], 30)  # ... and due soon while llm runs

    n.on_open = vit_falls_due
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    after = n.job(JOBS["vit"]).next_run_time
    assert after - datetime.now(timezone.utc) > timedelta(seconds=3500)  # a whole interval (3600 s) on
    assert n.runs("vit", "ok") == 1


def test_cron_schedule_joins_only_when_its_time_is_within_the_window(node):
    nightly = ScheduleConfig(probe="vit", cron="0 2 * * *", settle_seconds=0)
    n = node(round_window_seconds=300, schedules=[LLM, nightly])
    nightly_next = n.job(JOBS["vit"]).next_run_time
    if nightly_next - datetime.now(timezone.utc) > timedelta(seconds=300):  # the usual case: hours away
        n.fire(JOBS["llm"])
        assert n.opened == [(0, "llm", False)] and n.job(JOBS["vit"]).next_run_time == nightly_next
    planned = n.due_in(JOBS["vit"], 120)  # its time is near: it joins, and its next is the cron's next
    n.opened.clear()
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    after = n.job(JOBS["vit"]).next_run_time
    assert after > planned and (after.hour, after.minute) == (2, 0) and after - planned <= timedelta(days=1)


def test_a_busy_gpu_skips_the_run_as_before_and_claims_nothing(node):
    n = node(round_window_seconds=300)
    planned = n.due_in(JOBS["vit"], 60)
    n.devices[0].add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire(JOBS["llm"])
    assert n.opened == []
    assert n.runs("llm", "skipped", "allocated") == 1 and n.runs("vit", "skipped", "allocated") == 0
    assert n.job(JOBS["vit"]).next_run_time == planned  # vit keeps its own turn and its own checks


def test_each_schedule_of_a_round_keeps_its_own_failure(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 60)
    real = n.service.executor

    class Failing:
        def open(self, device, request, abort, carried=None):
            if request.probe == "llm":
                raise ZeroDivisionError("bug in llm's session")
            return real.open(device, request, abort, carried)

    n.service.executor = Failing()
    n.fire(JOBS["llm"])
    assert n.runs("llm", "failed", "exception") == 1
    # the round stopped at llm's bug: vit, claimed, shares that outcome rather than vanishing
    assert n.runs("vit", "failed", "exception") == 1
    assert n.devices[0].power_limits().enforced_watts == 680.0


def test_reload_mid_round_runs_a_claimed_schedule_with_its_new_settings(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 60)
    new_vit = VIT.model_copy(update={"caps": ["max", 400]})

    def reload_during_llm(schedule):
        if schedule.probe == "llm":
            n.scheduler.apply(n.config.model_copy(update={"schedules": [LLM, new_vit]}))

    n.on_open = reload_during_llm
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    vit_caps = [r["power_cap_watts"] for r in read_history(n.history) if r["result"]["probe"] == "vit"]
    assert vit_caps == [700, 400]  # the reloaded caps
    # the trigger did not change: the claimed job keeps its moved next run
    assert n.job(JOBS["vit"]).next_run_time > datetime.now(timezone.utc) + timedelta(seconds=3500)


def test_reload_mid_round_that_removes_a_claimed_schedule_leaves_it_out(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 60)

    def remove_vit(schedule):
        if schedule.probe == "llm":
            n.scheduler.apply(n.config.model_copy(update={"schedules": [LLM]}))

    n.on_open = remove_vit
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False)]
    assert n.runs("llm") == 2 and n.runs("vit") == 0 and n.runs("vit", "aborted", "shutdown") == 0
    assert not [r for r in read_history(n.history) if r["result"]["probe"] == "vit"]
    assert n.job(JOBS["vit"]) is None


def test_serial_node_runs_the_claimed_schedule_on_every_gpu_of_the_job(node):
    n = node(round_window_seconds=300, parallel_gpus=False, gpus=2)
    jobs = {"llm": "0-llm-gpu0_1", "vit": "1-vit-gpu0_1"}
    n.due_in(jobs["vit"], 60)
    n.fire(jobs["llm"])
    assert n.opened == [(0, "llm", False), (0, "vit", True), (1, "llm", False), (1, "vit", True)]
    assert all(n.runs("vit", gpu=g) == 1 and n.runs("llm", gpu=g) == 2 for g in (0, 1))
    assert n.job(jobs["vit"]).next_run_time > datetime.now(timezone.utc) + timedelta(seconds=3500)


def test_scheduler_firing_by_the_clock_groups_the_first_runs(node):
    """Both interval jobs start at the same first-run time: the real scheduler fires both; one child serves both."""
    n = node(round_window_seconds=300)
    rounds = n.service._rounds[0]

    def wait_for_the_other(schedule):
        if len(n.opened) == 1:  # the leader: until the other job's run has fired and queued (or was claimed)
            deadline = time.monotonic() + 30
            while not rounds._waiting and len(rounds._members or ()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)

    n.on_open = wait_for_the_other
    now = datetime.now(timezone.utc)
    for job_id in JOBS.values():
        n.job(job_id).modify(next_run_time=now)
    n.scheduler.scheduler.resume()
    deadline = time.monotonic() + 60
    while (n.runs("llm") < 2 or n.runs("vit") < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    n.scheduler.scheduler.pause()
    assert n.runs("llm") == 2 and n.runs("vit") == 1
    assert sorted(after for _, _, after in n.opened) == [False, True]  # one child for both
    for job_id in JOBS.values():
        assert n.job(job_id).next_run_time >= now + timedelta(seconds=3600)


def test_a_shutdown_mid_round_counts_the_schedules_it_had_not_started_as_aborted(node):
    n = node(round_window_seconds=300)
    n.due_in(JOBS["vit"], 60)

    def stop_during_llm(schedule):
        if schedule.probe == "llm":
            n.service.abort.set()

    n.on_open = stop_during_llm
    n.fire(JOBS["llm"])
    assert n.opened == [(0, "llm", False)]
    assert n.runs("llm", "aborted", "shutdown") == 1 and n.runs("vit", "aborted", "shutdown") == 1
    assert n.runs("vit") == 0 and n.devices[0].power_limits().enforced_watts == 680.0


def test_serial_node_gpu_failing_its_checks_skips_the_claimed_schedule_there_too(node):
    n = node(round_window_seconds=300, parallel_gpus=False, gpus=2)
    n.due_in("1-vit-gpu0_1", 60)
    n.devices[1].add_foreign_process(pid=999_999, memory_bytes=1 << 30)
    n.fire("0-llm-gpu0_1")
    assert n.opened == [(0, "llm", False), (0, "vit", True)]
    assert n.runs("llm", gpu=0) == 2 and n.runs("vit", gpu=0) == 1
    # vit was due on GPU 1 too (its job covers both): skipped there with GPU 1's reason, not lost silently
    assert n.runs("llm", "skipped", "allocated", gpu=1) == 1 and n.runs("vit", "skipped", "allocated", gpu=1) == 1


def test_a_daemon_round_of_real_child_probes_spawns_one_child(node):
    """The real thing on the CPU: the two schedules of a round are measured by one probe child (one pid)."""
    pytest.importorskip("torch")
    from gpuperfd.probing.executors import ChildProcessExecutor

    fast = {"repeats": 2, "measure_seconds": 0.15, "busy_profile_seconds": 0.0}
    attention = ScheduleConfig(probe="attention", preset="tiny", interval_seconds=3600, settle_seconds=0,
                               caps=["max", 500], options=fast)
    vit = ScheduleConfig(probe="vit", preset="tiny", interval_seconds=3600, settle_seconds=0, options=fast)
    n = node(round_window_seconds=300, schedules=[attention, vit])
    n.service.executor = ChildProcessExecutor(120, torch_device="cpu", state_dir=n.config.state_dir)
    n.due_in("1-vit-gpu0", 60)
    n.fire("0-attention-gpu0")
    records = list(read_history(n.history))
    assert [(r["result"]["probe"], r["result"]["status"]) for r in records] == [
        ("attention", "ok"), ("attention", "ok"), ("vit", "ok")], [r["result"]["error_message"] for r in records]
    assert len({r["result"]["extra"]["child_pid"] for r in records}) == 1  # one child for the round
    assert n.runs("attention", preset="tiny") == 2 and n.runs("vit", preset="tiny") == 1

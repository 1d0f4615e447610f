"""Issue 50, "fit the gaps": a due result's child is started before its GPU qualifies, so the run that
starts at the qualifying moment builds in a child that has done its imports (on a lent H200 the spawn
and imports were 13 of llm's 19 s from the qualifying moment to the result).

Real probe children on the CPU (tiny preset), the real probe service, scheduler and admission, a
simulated GPU; the idle tracker's clock is the test's, so "idle for 45 s" takes no 45 s."""

from __future__ import annotations

import functools
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.gates.admission import Admission
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Turn
from gpuperfd.probing.child.session import ChildProcessExecutor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probing.child.standby import StandbyChildren
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading
from hand_scheduler import dispatch, fire, nodes_stopped_after
from manual_clock import Clock

LLM = ScheduleConfig(probe="llm", preset="tiny", interval_seconds=3600, settle_seconds=0, options={"repeats": 1})
IDLE_SECONDS = 60.0


def reading(clock: Clock, utilization: float) -> Reading:
    return Reading((Point("gpuperf_gpu_utilization_ratio", utilization),), True, None, 0, clock.now)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid: int, seconds: float = 10.0) -> bool:
    """True once ``pid`` has ended (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def released(n: Node, seconds: float = 5.0) -> bool:
    """True once no host memory is reserved (a slot's thread gives its reservation back as it ends)."""
    deadline = time.monotonic() + seconds
    while n.admission.state().reserved_bytes and time.monotonic() < deadline:
        time.sleep(0.02)
    return n.admission.state().reserved_bytes == 0


class Node:
    def __init__(self, tmp_path, limit_bytes: int = 8 << 30) -> None:
        self.clock = Clock()
        self.backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5))
        self.devices = self.backend.devices()
        self.registry = CollectorRegistry()
        self.tracker = IdleTracker(0.05, clock=self.clock)
        self.busy()  # a user's job holds the GPU when the result falls due
        self.config = ProbesConfig(jitter_seconds=0, first_run_delay_seconds=3600, idle_seconds=IDLE_SECONDS,
                                   state_dir=tmp_path / "state", history={"path": None}, schedules=[LLM],
                                   timeout_seconds=300, memory_budget=limit_bytes)
        self.admission = Admission(limit_bytes, "test budget")
        self.executor = ChildProcessExecutor(300, torch_device="cpu", state_dir=tmp_path / "state",
                                             compile_cache=False, on_peak=self.admission.peaks.record)
        # GPU 1 has no device: a line of the node's turns where a test's round on another GPU waits for memory
        self.turns = GpuTurns([0, 1], self.admission)
        self.standby = StandbyChildren(self.executor.new_child, 300, self.turns, clock=self.clock)
        self.executor.standby = self.standby
        self.service = ProbeService(self.config, self.devices, self.executor, ProbeMetrics(self.registry),
                                    self.tracker, admission=self.admission, standby=self.standby, turns=self.turns)
        self.scheduler = ProbeScheduler(self.service, [0], recheck_seconds=0.0)
        self.scheduler.scheduler.start(paused=True)
        self.scheduler.apply(self.config)
        self.results = []
        self.service.point_listeners.append(lambda gpu, probe, preset, point: self.results.append(point.result))

    def busy(self) -> None:
        self.tracker.observe(0, "utilization", reading(self.clock, 0.9))

    def idle(self, seconds: float) -> None:
        """The GPU reads idle for ``seconds`` more (a reading each second, as the sampler's)."""
        for _ in range(int(seconds)):
            self.clock.now += 1.0
            self.tracker.observe(0, "utilization", reading(self.clock, 0.0))

    def fire(self) -> None:
        fire(self.scheduler)

    def dispatch(self) -> int:
        return dispatch(self.scheduler, timeout=120)

    def stop(self) -> None:
        self.scheduler.stop()
        self.service.stop()

    def slot(self):
        return self.standby._slots.get(0)

    def wait_ready(self) -> int:
        assert self.standby.wait_ready(0, 120), "the standby child never became ready"
        slot = self.slot()
        assert slot is not None and slot.child.alive
        return slot.child.pid

    def runs(self, result="ok", reason=""):
        info = self.devices[0].info()
        return self.registry.get_sample_value("gpuperf_probe_runs_total", {
            "gpu": "0", "uuid": info.uuid, "probe": "llm", "preset": "tiny", "result": result, "reason": reason}) or 0


@pytest.fixture
def node(tmp_path):
    yield from nodes_stopped_after(functools.partial(Node, tmp_path))


def test_the_run_at_the_qualifying_moment_builds_in_a_child_started_while_the_job_ran(node):
    """Issue 60: a child's imports (13-18 s for llm on an H200) outlast a short idle_seconds, so a child
    started when the job ended made the round wait; it starts as soon as the result is due, busy GPU or
    not (it makes no CUDA call: the job loses nothing but the host memory the admission reserved)."""
    n = node()
    n.fire()  # due; the GPU is busy: skipped, stays due
    assert n.runs("skipped", "not_idle") + n.runs("skipped", "busy") == 1
    assert n.dispatch() == 0
    pid = n.wait_ready()  # started at once, while the job still runs
    assert n.admission.state().reserved_bytes > 0  # its host memory is reserved like any child's
    n.busy()  # the job goes on: the child waits, ready
    assert n.dispatch() == 0 and n.slot() is not None and n.slot().child.pid == pid
    n.idle(IDLE_SECONDS)  # the job ended; the GPU qualifies
    assert n.dispatch() == 1
    assert n.runs() == 1 and len(n.results) == 1
    assert n.results[0].extra["child_pid"] == pid  # the run built in the standby child, no spawn of its own
    assert n.standby.taken == 1 and n.slot() is None
    assert released(n)  # one reservation (the standby's), released once
    assert gone(pid)  # the round closed it


def test_a_standby_child_ends_with_its_reservation_when_no_result_is_due_and_never_holds_the_dispatcher(node):
    """On a lent H200 the dispatcher's pass that ended an importing standby child waited for the child to
    finish its imports (it reads no ``stop`` before) up to 15 s, and no dispatch happened meanwhile."""
    n = node()
    n.fire()
    n.dispatch()
    first = n.slot()
    assert first is not None and not first.done.is_set()  # still importing torch
    assert not n.standby.wait_ready(0, 0.05)  # still starting: not ready
    n.scheduler.apply(n.config.model_copy(update={"schedules": []}))  # a reload: nothing is due any more
    t0 = time.monotonic()
    assert n.scheduler.dispatch_once() == 0
    assert time.monotonic() - t0 < 0.5  # the pass did not wait for the child (old code: its imports' rest)
    assert n.slot() is None
    assert first.done.wait(10) and first.failed  # ended mid-import, at once
    assert released(n)
    assert gone(first.child.pid or 0)
    assert n.runs() == 0


def test_a_round_waiting_for_host_memory_goes_before_a_busy_gpus_standby_child(node):
    n = node()
    n.fire()
    n.dispatch()
    n.wait_ready()
    budget = n.admission.state().budget_bytes
    waiting = threading.Event()
    abort = threading.Event()
    granted = []

    def round_on_another_gpu() -> None:
        waiting.set()
        granted.append(n.turns.take(1, Holder(HolderKind.ROUND, "gpu 1"), 30, stop=abort.is_set,
                                    memory=budget - (1 << 20), memory_timeout=30))

    thread = threading.Thread(target=round_on_another_gpu)
    thread.start()
    assert waiting.wait(5)
    deadline = time.monotonic() + 5
    while n.admission.state().waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert n.turns.memory_waiters() == 1 and n.turns.holder(1) is None  # it waits for memory, holding no GPU
    n.scheduler.dispatch_once()  # the busy GPU's standby child gives its memory to the waiting round
    thread.join(10)
    assert granted == [Turn.GRANTED]
    assert n.slot() is None
    n.turns.release(1)
    assert released(n)


def test_a_round_gives_way_at_once_to_a_job_that_arrives_while_its_child_imports(node, monkeypatch):
    """Nothing of ours is on the GPU yet: the round ends (skipped, preempted) within a watch or two and
    starts no other child (old code: it waited for the imports, then 5 s of busy checks, and the
    first point could start a second child)."""
    from gpuperfd.probing.child.runner import ProbeChild

    starts = []
    real_start = ProbeChild.start

    def counted(self, *args, **kwargs):
        starts.append(self.spec.probe)
        return real_start(self, *args, **kwargs)

    monkeypatch.setattr(ProbeChild, "start", counted)
    n = node()
    n.fire()
    n.idle(45)
    n.dispatch()
    slot = n.slot()
    n.idle(IDLE_SECONDS)  # qualifies while the standby child still imports
    assert not slot.done.is_set()
    assert n.scheduler.dispatch_once() == 1
    time.sleep(0.3)  # the round waits in take() for the imports
    assert not slot.done.is_set(), "the child finished importing first: this machine is too fast for the case"
    n.devices[0].add_foreign_process(424242, 1 << 30)
    t0 = time.monotonic()
    while n.scheduler._running and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    gave_way = time.monotonic() - t0
    assert n.runs("skipped", "preempted") == 1 and n.runs() == 0
    assert gave_way < 1.0, gave_way
    assert starts == ["llm"]  # the standby child only: no other child was started for the round
    assert slot.done.wait(10) and gone(slot.child.pid or 0)
    assert released(n)


def test_no_standby_child_without_room_in_the_host_memory_budget(node):
    n = node(limit_bytes=64 << 20)  # far below a child's expected peak
    n.fire()
    n.idle(45)
    n.dispatch()
    assert n.slot() is None and n.standby.started == 0
    assert not n.standby.wait_ready(0, 0.05)  # none there


def test_a_stopping_service_ends_its_standby_child(node):
    n = node()
    n.fire()
    n.idle(45)
    n.dispatch()
    pid = n.wait_ready()
    n.service.stop()
    assert n.slot() is None and n.admission.state().reserved_bytes == 0  # stop waits for its children
    assert gone(pid)


def test_the_next_results_child_starts_while_a_round_runs_and_the_rounds_end_leaves_it(tmp_path):
    """On a lent H200 the child for the GPU's next result started only when the round before it ended, so
    that result waited out its imports (vit 14.8 s, train 25.5 s from the qualifying moment, against
    5-6 s from a ready child): a slot a round took frees the GPU's place for the next child at once."""
    from gpuperfd.probe_data.request import ProbeRequest
    from gpuperfd.probing.simulated.child import SimulatedChild

    device = SimulatedBackend(SimulationConfig(gpus=1, seed=5)).devices()[0]
    admission = Admission(8 << 30, "test budget")
    standby = StandbyChildren(lambda dev, request, also: SimulatedChild(dev, request, 0.0), 60,
                              GpuTurns([0], admission))
    abort = threading.Event()
    assert standby.ensure(device, ProbeRequest("llm", "tiny"), 1 << 30, abort)
    llm = standby.take(0, device)  # the llm round starts in it
    assert isinstance(llm, SimulatedChild) and llm.spec.probe == "llm"
    assert standby.ensure(device, ProbeRequest("vit", "tiny"), 1 << 30, abort)  # vit's child, during the round
    assert standby.reserved(0) and admission.state().reserved_bytes == 2 << 30
    standby.round_ended(0)  # llm's round ends: its slot goes, vit's child stays ready
    assert admission.state().reserved_bytes == 1 << 30
    vit = standby.take(0, device)
    assert isinstance(vit, SimulatedChild) and vit.spec.probe == "vit" and vit.alive
    standby.round_ended(0)
    assert admission.state().reserved_bytes == 0 and standby.taken == 2


def test_a_standby_child_imports_the_code_of_every_probe_its_round_may_run(node):
    """A round runs the GPU's due probes in one child; a later probe's imports (ViT's model code and the
    compiler: 4-5 s on an H200) were paid on the GPU, in its turn. The standby child imports them too."""
    n = node()
    attention = ScheduleConfig(probe="attention", preset="tiny", interval_seconds=3600, settle_seconds=0,
                               options={"repeats": 1})
    config = n.config.model_copy(update={"schedules": [LLM, attention]})
    n.service.config = config
    n.scheduler.apply(config)
    n.fire()
    assert n.dispatch() == 0
    n.wait_ready()  # the child took the extra argument and imported both probes' code
    spec = n.executor.spec(n.devices[0], ProbeRequest("attention", "tiny"))
    assert n.slot().child.also_preload == (("attention", spec.variant),)


def test_the_executor_names_each_other_probe_and_variant_once_and_leaves_out_an_invalid_one(tmp_path):
    executor = ChildProcessExecutor(60, torch_device="cpu", state_dir=tmp_path, compile_cache=False)
    device = SimulatedBackend(SimulationConfig(gpus=1, seed=5)).devices()[0]
    also = [ProbeRequest("vit", "tiny"), ProbeRequest("vit", "tiny", {"batch_size": 2}), ProbeRequest("llm", "tiny"),
            ProbeRequest("vit", "no-such-preset")]
    child = executor.new_child(device, ProbeRequest("llm", "tiny"), also)
    vit = executor.spec(device, ProbeRequest("vit", "tiny")).variant
    assert child.also_preload == (("vit", vit),)  # once; llm is its own probe; the bad preset left out


def test_the_child_says_ready_after_its_own_imports_and_imports_the_rest_while_nothing_is_asked(monkeypatch):
    """Importing every probe of its round before saying ready made llm's child ready 6 s later on a lent
    H200; the others' code is imported after ``ready``, a module at a time, and stops at a request."""
    import importlib

    from gpuperfd.probe_child import child as child_module
    from gpuperfd.probe_data.spec import ProbeSpec

    events = []

    class Conn:
        def __init__(self, request_after: int) -> None:
            self.request_after = request_after

        def send_bytes(self, data: bytes) -> None:
            events.append("ready" if b"ready" in data else data)

        def poll(self, timeout: float = 0.0) -> bool:  # a request waits once that many modules are in
            return sum(1 for e in events if "." in e) >= self.request_after

    monkeypatch.setattr(importlib, "import_module", lambda name: events.append(name))
    for request_after, imported in ((99, ["vit.model", "vit.compiler", "attention.model"]), (1, ["vit.model"])):
        events.clear()
        session = child_module._Session(ProbeSpec("llm", preset="tiny", device="cpu"), Conn(request_after), {})
        monkeypatch.setattr(session.workloads, "preload", lambda probe, variant: events.append(f"own {probe}"))
        monkeypatch.setattr(session.workloads, "build_imports",
                            lambda probe, variant: (f"{probe}.model", f"{probe}.compiler")[:2 if variant else 1])
        session.start(time.perf_counter(), defer_build=True, also=[("vit", "compiled"), ("attention", None)])
        assert events == ["own llm", "ready", *imported], request_after

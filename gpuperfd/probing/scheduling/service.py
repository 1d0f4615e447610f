"""The daemon's probe service: gate, sweep, run, publish.

For one scheduled probe on one GPU it: takes the GPU's turn (:class:`~gpuperfd.probing.gates.turns.GpuTurns`:
never two holders of one GPU; the host memory of the round's child is booked in the same step), asks
the node's gate (:class:`~gpuperfd.probing.gates.gate.GpuGate`: not lost, not allocated, idle long
enough, not busy) whether the GPU may be probed now, resolves the cap list, runs the
sweep (each point through an executor: a child process for real GPUs, the
simulator's physics for simulated ones), and publishes every result to the
metrics and the history file. Every outcome, skipped runs included, is counted
with its reason.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from gpuperfd.attribution.allocations import AllocationState
from gpuperfd.caps.journal import CapJournal
from gpuperfd.config import ProbesConfig, ScheduleConfig
from gpuperfd.device.base import Device, GpuInfo
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import SweepPoint, comparison_words, cut_short, recommend_latest
from gpuperfd.probe_data.result import PREEMPTED
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PROBES as PER_GPU_PROBES
from gpuperfd.probing.executors import Executor
from gpuperfd.probing.gates.admission import Admission, memory_limit
from gpuperfd.probing.gates.gate import GpuGate
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Memory, Release, Turn
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.scheduling.gpu_time import GpuTimeLedger
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.child.standby import StandbyChildren
from gpuperfd.probing.metrics import ProbeMetrics, cap_label
from gpuperfd.probing.scheduling.rounds import GpuRounds, RoundSource
from gpuperfd.probing.scheduling.schedule_request import planned_from_schedule, request_from_schedule
from gpuperfd.probing.scheduling.shown import ShownPoints
from gpuperfd.probing.sweep.caps import parse_cap_list, resolve_caps
from gpuperfd.probing.sweep.owned import OwnedStatus, OwnedSweep, PlannedProbe, SweepRequest, run_owned_sweep
from gpuperfd.system.memory import release_free_memory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    result: str  # ok, skipped, failed, aborted; in_round: its schedule ran in the GPU's round (counted there)
    reason: str = ""
    points: tuple[SweepPoint, ...] = ()
    #: The caps the schedule's sweep was to measure, in order (empty where it never got that far).
    caps_watts: tuple[float, ...] = ()


def preset_of(schedule: ScheduleConfig) -> str:
    return schedule.preset or DEFAULT_PRESET[schedule.probe]


class ProbeService:
    """Runs scheduled probes on GPUs; thread-safe, one run per GPU at a time."""

    def __init__(
        self,
        config: ProbesConfig,
        devices: list[Device],
        executor: Executor,
        metrics: ProbeMetrics,
        tracker: IdleTracker,
        history: HistoryWriter | None = None,
        on_cap_change: Callable[[int], None] | None = None,
        allocations: Callable[[], AllocationState] | None = None,
        kubelet_socket: str | None = None,
        admission: Admission | None = None,
        journal: CapJournal | None = None,
        standby: StandbyChildren | None = None,
        turns: GpuTurns | None = None,
    ) -> None:
        self.config = config
        #: Children started before their GPU qualifies (the child executor's; None: none are).
        self.standby = standby
        #: Host memory for probe children (None: the executor starts none, e.g. the simulator).
        self.admission = admission
        #: Told the GPU index after every cap change (the daemon re-reads its power collector).
        self.on_cap_change = on_cap_change
        self.devices = {d.index: d for d in devices}
        self.executor = executor
        self.metrics = metrics
        self.history = history
        #: The power-cap journal (the daemon's is registered in the node's registry of state directories).
        self.journal = journal if journal is not None else CapJournal(config.state_dir)
        self.abort = threading.Event()
        #: May each GPU be probed now (lost, allocated, MIG, not idle, busy, our own tail): asked by the
        #: round here, the scheduler's gap dispatcher, interconnect runs and apply mode's cap writes.
        #: ``allocations``: the kubelet's latest pod allocations (None: not on Kubernetes, processes
        #: only); ``kubelet_socket``: where the kubelet must answer first (inside a pod).
        self.gate = GpuGate(config, tracker, self.abort, allocations, kubelet_socket)
        #: Who holds each GPU and who gets it next, with the host memory of its child: rounds here,
        #: interconnect runs (probing/interconnect), apply mode's cap changes (the daemon hands these turns
        #: to its controller), standby children's reservations (the daemon builds them with these turns).
        self.turns = turns if turns is not None else GpuTurns(self.devices, admission)
        assert self.turns.memory is admission, "the turns keep the service's memory book"
        self.turns.listeners.append(self.gate.released)  # our load's tail starts at a release, then its GPU time
        self.turns.listeners.append(self._released)
        #: Per GPU: the round running on it, the runs queued for it, and whom a round served.
        self._rounds = {index: GpuRounds(self.turns.nudge) for index in self.devices}
        self._infos: dict[int, GpuInfo] = {}
        #: The latest point per (gpu, probe, preset, cap) and each GPU's sweep in progress, for the landing page.
        self.shown = ShownPoints()
        #: The operator's cap per GPU as last recorded ("current" in a cap list means this one).
        self._operator_caps: dict[int, float] = {}
        #: The operator's cap of each GPU where apply mode holds another (gpuperfd/apply): a sweep there
        #: finds the applied cap set, and this, not that, is the operator's.
        self.held_caps: dict[int, float] = {}
        #: Told every point, ``(gpu, probe, preset, point)``: apply mode's evidence.
        self.point_listeners: list[Callable[[int, str, str, SweepPoint], None]] = []
        #: Told ``(gpu, key, outcome)`` for every schedule a round ran or took on (its leader, claimed and
        #: joined members): the scheduler learns which results are fresh and which are still due.
        self.outcome_listeners: list[Callable[[int, str, RunOutcome], None]] = []
        #: ``id`` of schedules that measure the rest of a sweep taken in parts (:mod:`gpuperfd.probing.scheduling.partial`):
        #: their points alone recommend nothing (the scheduler recommends from the joined sweep).
        self.parts: set[int] = set()
        #: The GPU time probes took, per GPU (probes.max_gpu_time_ratio; gpuperf_probe_gpu_seconds_total).
        self.gpu_time = GpuTimeLedger(config.max_gpu_time_ratio)

    def publish_original_caps(self) -> None:
        """Publish each GPU's cap as the operator's; call after any left-over cap was restored."""
        for device in self.devices.values():
            try:
                watts = device.power_limits().enforced_watts
                self._operator_caps[device.index] = watts
                self.metrics.set_original_cap(device.info(), watts)
            except DeviceError as exc:
                log.warning("gpu %d: cannot read its power cap: %s", device.index, exc)

    def apply_config(self, config: ProbesConfig) -> None:
        """Take a (re)loaded config: results of caps no schedule runs any more are withdrawn.

        A GPU whose limits cannot be read now (lost) keeps what it has; its caps
        are checked at the next reload.
        """
        self.config = config
        self.gate.config = config
        self.gpu_time.ratio = config.max_gpu_time_ratio
        self.metrics.set_gpu_time_budget(config.max_gpu_time_ratio)
        if self.admission is not None:
            self.admission.set_limit(*memory_limit(config.memory_budget))
            self.turns.nudge()  # rounds waiting for memory look at the new budget now
        scheduled: dict[int, set[tuple[str, str, str]]] = {}
        for index, device in self.devices.items():
            try:
                limits = device.power_limits()
            except DeviceError:
                continue
            limits = replace(limits, enforced_watts=self._operator_caps.get(index, limits.enforced_watts))
            scheduled[index] = {
                (schedule.probe, preset_of(schedule), cap_label(watts))
                for schedule in (config.schedules if config.enabled else ())
                if (schedule.gpus is None or index in schedule.gpus) and schedule.probe in PER_GPU_PROBES
                for watts in resolve_caps(parse_cap_list(schedule.caps), limits)
            }
        gpu_of = {str(index): index for index in scheduled}
        for index, points in scheduled.items():
            info = self._info(self.devices[index])
            if not info.uuid:  # never answered: no identity to label a series with
                continue
            for probe, preset in {(p, s) for p, s, _ in points}:
                self.metrics.declare_wrong_results(info, probe, preset)

        def keep(gpu: str, probe: str, preset: str, cap: str) -> bool:
            return gpu not in gpu_of or (probe, preset, cap) in scheduled[gpu_of[gpu]]

        dropped = self.metrics.retain_caps(keep)
        self.shown.withdraw(lambda gpu, probe, preset, watts: keep(str(gpu), probe, preset, cap_label(watts)))
        if dropped:
            log.info("reload: withdrew %d probe result(s) of caps no longer scheduled", dropped)

    def latest(self) -> dict[tuple[int, str, str], list[SweepPoint]]:
        """The latest ok point at each cap, per (gpu, probe, preset), highest cap first."""
        return self.shown.latest()

    def sweeps(self) -> dict[int, SweepProgress]:
        """The sweeps holding a cap they set now, by GPU index (a copy)."""
        return self.shown.sweeps()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort running probes and wait (bounded) until their caps are restored."""
        self.abort.set()
        if self.standby is not None:
            self.standby.drop_all("stopping")
        self.turns.nudge()  # rounds waiting for a GPU's turn, its memory or the node's turn give up now
        self.turns.wait_released(timeout)

    def info(self, gpu: int) -> GpuInfo:
        """GPU ``gpu``'s identity, or the last one read while it answered (for labels of a lost GPU)."""
        return self._info(self.devices[gpu])

    def count_skip(self, gpu: int, schedule: ScheduleConfig, reason: str) -> RunOutcome:
        """Count (and log) ``schedule`` skipped on ``gpu`` for ``reason`` without a run (the scheduler's
        GPU-time share, a cron window that closed)."""
        return self._skip(self.info(gpu), schedule, reason)

    def run(self, schedule: ScheduleConfig, gpu: int, key: str | None = None,
            source: RoundSource | None = None) -> RunOutcome:
        """One scheduled run of ``schedule`` on GPU ``gpu`` (a sweep if several caps), leading a round.

        ``key`` names the schedule's job (default: the schedule itself); ``source`` (the scheduler)
        gives the other schedules of the GPU due within ``round_window_seconds``: they run in this
        run's probe child right after it (:mod:`gpuperfd.probing.scheduling.rounds`). A run whose schedule a
        round on this GPU ran after it queued returns ``in_round`` at once: counted once, where it ran.
        """
        device = self.devices[gpu]
        info = self._info(device)
        key = key or f"schedule:{schedule!r}"
        rounds = self._rounds[gpu]
        if self.abort.is_set():
            return self._skip(info, schedule, "shutting_down")
        joinable = self.config.round_window_seconds > 0
        # Runs of different schedules on one GPU queue for its turn (bounded); never two at once.
        turn = self._wait_turn(gpu, key, schedule, joinable)
        if turn is Turn.SERVED:
            log.info("gpu %d: %s ran in this GPU's round (led by %s): not run again", gpu, schedule.probe,
                     rounds.leader or "another schedule")
            return RunOutcome("in_round", "served")
        if turn is Turn.TIMEOUT:
            return self._skip(info, schedule, "overlap")
        if turn is not Turn.GRANTED:  # its child's memory never fits, or the service stops
            return self._skip_claimed(info, schedule, source,
                                      "memory_budget" if turn is Turn.REFUSED else "shutting_down")
        node_taken, load = False, None
        try:
            if not self.config.parallel_gpus:
                node_taken = self.turns.take_node(Holder(HolderKind.ROUND, key), self.config.timeout_seconds,
                                                  self.abort.is_set)
                if not node_taken:
                    reason = "shutting_down" if self.abort.is_set() else "node_busy"
                    return self._skip_claimed(info, schedule, source, reason)
            refused = self._gate(device, info, schedule, source)
            if refused is not None:
                return refused
            rounds.open(key, schedule.probe)
            started = time.monotonic()
            try:
                return self._round(device, gpu, key, schedule, source if joinable else None, joinable)
            finally:
                rounds.close()
                load = (started, time.monotonic())
                release_free_memory()  # a round's results and messages: back to the idle footprint
        finally:
            if node_taken:
                self.turns.release_node()
            if self.standby is not None:
                self.standby.round_ended(gpu)  # its child (if the round took it) is closed by now
            self.turns.release(gpu, load, wrote=load is not None)  # and the memory booked with it

    def _wait_turn(self, gpu: int, key: str, schedule: ScheduleConfig, joinable: bool) -> Turn:
        """Queue for ``gpu``'s turn (at most ``queue_seconds``) and the host memory of the round's child
        (as long as it takes, until the service stops). ``joinable``: a running round may take this run in
        (its schedule then runs in that round's child: SERVED); otherwise it only queues."""
        memory = self._round_memory(gpu, schedule)
        holder = Holder(HolderKind.ROUND, key)
        if not joinable:
            return self.turns.take(gpu, holder, self.config.queue_seconds, stop=self.abort.is_set, memory=memory)
        rounds = self._rounds[gpu]
        first = rounds.queue(key, schedule)
        try:
            return self.turns.take(gpu, holder, self.config.queue_seconds, lambda: rounds.served_since(key, first),
                                   stop=self.abort.is_set, memory=memory)
        finally:
            rounds.unqueue(key, schedule)

    def _released(self, done: Release) -> None:
        """A GPU given back (a round, an interconnect run): its load's span goes into the GPU-time ledger
        (the gate, told first, starts our load's tail). An apply change ran no load (``load`` None)."""
        if done.load is not None:
            self._took(done.gpu, *done.load)

    def _took(self, gpu: int, started: float, ended: float) -> None:
        """A span probes held ``gpu`` (a round, an interconnect hold): into the ledger and the counter."""
        seconds = self.gpu_time.record(gpu, started, ended)
        self.metrics.add_gpu_seconds(self._info(self.devices[gpu]), seconds)

    def _tell(self, gpu: int, key: str, outcome: RunOutcome) -> None:
        for listener in self.outcome_listeners:
            try:
                listener(gpu, key, outcome)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the round that ran
                log.exception("gpu %d: outcome listener failed", gpu)

    def _round_memory(self, gpu: int, schedule: ScheduleConfig) -> Memory | None:
        """The host memory the round states when it queues (None where no child is started): asked when the
        GPU's turn comes, before the idle checks, it is :meth:`_child_bytes`, or none where the GPU's standby
        child holds a reservation then (the round takes that child)."""
        if self.admission is None:
            return None
        return lambda: 0 if self.standby is not None and self.standby.reserved(gpu) else self._child_bytes(gpu, schedule)

    def _child_bytes(self, gpu: int, schedule: ScheduleConfig) -> int:
        """The expected peak of a round's one child: the largest of the probes this GPU's schedules run
        (any may join the round)."""
        assert self.admission is not None
        probes = {s.probe for s in self.config.schedules
                  if (s.gpus is None or gpu in s.gpus) and s.probe in PER_GPU_PROBES} | {schedule.probe}
        return self.admission.peaks.expected(probes)

    def stand_by(self, gpu: int, schedule: ScheduleConfig) -> bool:
        """Start ``schedule``'s child for ``gpu`` now, before the GPU qualifies (:mod:`~gpuperfd.probing.child.standby`); False
        where none can be (no standby children here, no room in the host-memory budget now, stopping)."""
        if self.standby is None or self.abort.is_set() or schedule.probe not in PER_GPU_PROBES:
            return False
        need = self._child_bytes(gpu, schedule) if self.admission is not None else 0
        # the round that takes it may run the GPU's other due probes in it: their code is imported too
        others = [request_from_schedule(s) for s in self.config.schedules
                  if s is not schedule and (s.gpus is None or gpu in s.gpus) and s.probe in PER_GPU_PROBES]
        return self.standby.ensure(self.devices[gpu], request_from_schedule(schedule), need, self.abort, others)

    def _gate(self, device: Device, info: GpuInfo, schedule: ScheduleConfig,
              source: RoundSource | None) -> RunOutcome | None:
        """The skip of a GPU the gate refuses now (lost, allocated, MIG, not idle, busy), or None."""
        refused = self.gate.refusal(device)
        if refused is not None:
            return self._skip_claimed(info, schedule, source, *refused)
        return None

    def _skip_claimed(self, info: GpuInfo, schedule: ScheduleConfig, source: RoundSource | None, reason: str,
                      detail: str = "") -> RunOutcome:
        """Skip this run, and the schedules its firing already claimed for a round (a serial node's other GPUs)."""
        if source is not None and self.config.round_window_seconds > 0:
            for _, claimed in source.claimed():
                if claimed.gpus is None or info.index in claimed.gpus:
                    self._skip(info, claimed, reason, detail)
        return self._skip(info, schedule, reason, detail)

    def _round(self, device: Device, gpu: int, key: str, schedule: ScheduleConfig, source: RoundSource | None,
               joinable: bool) -> RunOutcome:
        """The round this run leads: its schedule, then the claimed and queued ones, in one owned sweep."""
        rounds = self._rounds[gpu]
        claimed = source.claim(gpu, {key}) if source is not None else []
        if claimed:
            rounds.add(claimed)
            log.info("gpu %d: %s leads a round with %s (one probe child)", gpu, schedule.probe,
                     ", ".join(s.probe for _, s in claimed))
        claimed_keys = {k for k, _ in claimed}
        members: list[ScheduleConfig] = []  # in the order they were handed to the sweep
        key_of: dict[int, str] = {id(schedule): key}  # id(schedule handed) -> its key
        promised = list(claimed)  # every schedule the round took on: claimed, then joined
        handed: set[str] = set()  # keys handed to the sweep (or left out by a reload)

        def schedules() -> Iterator[ScheduleConfig]:
            members.append(schedule)
            yield schedule
            pending = list(claimed)
            while not self.abort.is_set():
                if not pending and joinable:
                    pending = rounds.take_waiting()
                    promised.extend(pending)
                    for _, joined in pending:
                        log.info("gpu %d: %s joins the round of %s (queued on the GPU)", gpu, joined.probe,
                                 schedule.probe)
                if not pending and source is not None:  # fell due while the round ran: its child is warm
                    pending = source.claim(gpu, {key} | handed | claimed_keys)
                    if pending:
                        rounds.add(pending)
                        claimed_keys.update(k for k, _ in pending)
                        promised.extend(pending)
                if not pending:
                    return
                member_key, member = pending.pop(0)
                handed.add(member_key)
                if member_key in claimed_keys and source is not None:
                    now = source.current(member_key)  # a reload since the claim: its settings now
                    if now is None:
                        log.info("gpu %d: %s left the round: no longer scheduled", gpu, member.probe)
                        continue
                    member = now
                members.append(member)
                key_of[id(member)] = member_key
                yield member

        told: set[int] = set()  # id(schedule) of the members already told, as their own sweep ended

        def finished(member: ScheduleConfig, outcome: RunOutcome) -> None:
            told.add(id(member))
            self._tell(gpu, key_of[id(member)], outcome)

        outcomes, owned = self._sweep(device, schedules(), members, schedule, finished)
        for member_key, member in ((k, m) for k, m in promised if k not in handed):  # the round stopped before them
            if owned.status is OwnedStatus.DONE:  # stopped between schedules: a shutdown
                self.metrics.count(self._info(device), member.probe, preset_of(member), "aborted", "shutdown")
                self._tell(gpu, member_key, RunOutcome("aborted", "shutdown"))
            else:
                self._tell(gpu, member_key, self._ended(device, self._info(device), member, owned, ()))
        for member_id, outcome in outcomes.items():
            if member_id in key_of and member_id not in told:
                self._tell(gpu, key_of[member_id], outcome)
        return outcomes[id(schedule)]

    def _info(self, device: Device) -> GpuInfo:
        """The GPU's identity, or the last one read while it answered (for labels of a lost GPU)."""
        try:
            self._infos[device.index] = device.info()
        except DeviceError:
            if device.index not in self._infos:
                return GpuInfo(device.index, "", "", "", "", "", 0, "")
        return self._infos[device.index]

    def _skip(self, info, schedule: ScheduleConfig, reason: str, detail: str = "") -> RunOutcome:  # type: ignore[no-untyped-def]
        log.info("gpu %d: %s skipped: %s%s", info.index, schedule.probe, reason, f" ({detail})" if detail else "")
        self.metrics.count(info, schedule.probe, preset_of(schedule), "skipped", reason)
        return RunOutcome("skipped", reason)

    def _sweep(self, device: Device, schedules: Iterable[ScheduleConfig], members: list[ScheduleConfig],
               leader: ScheduleConfig, finished: Callable[[ScheduleConfig, RunOutcome], None],
               ) -> tuple[dict[int, RunOutcome], OwnedSweep]:
        """The owned sweep (:func:`run_owned_sweep`) of a round; each schedule's outcome counted and logged.

        ``members`` fills with the schedules handed to the sweep as it asks for them; each of them,
        and ``leader`` even if the sweep stopped before asking (the GPU owned by another process, a
        state-directory failure), gets its outcome, keyed by ``id``. ``finished`` hears each schedule
        whose sweep ran to its end as soon as the sweep asks for the next one (its result is published
        whole then: its due flag must not wait for the round's end, issue 61).
        """
        info = self._info(device)
        live: list[OwnedSweep] = []  # the sweep's outcome object, filled as it runs

        def done_early(schedule: ScheduleConfig) -> None:
            points = next((p for probe, p in live[0].sweeps if probe.origin is schedule), None) if live else None
            if points is None:
                return
            results[id(schedule)] = replace(self._done(device, info, schedule, tuple(points),
                                                       planned.get(id(schedule), len(points))),
                                            caps_watts=caps_of.get(id(schedule), ()))
            finished(schedule, results[id(schedule)])

        request = SweepRequest(map(planned_from_schedule, _ending(schedules, done_early)), None,
                               # no wait for the cap lock: the daemon's other writers (interconnect runs, apply
                               # mode's changes) take the GPU's turn first, which this round holds; a lock
                               # held now is another process's (a CLI sweep): the GPU is counted busy at once
                               read_only=self.config.read_only, wait_seconds=0.0,
                               stop_early=self.config.max_slowdown if self.config.stop_early else None,
                               wanted=functools.partial(self.gate.wanted, device), current_watts=self.held_caps.get(device.index))

        results: dict[int, RunOutcome] = {}
        planned: dict[int, int] = {}  # id(schedule) -> how many points its sweep was to measure
        caps_of: dict[int, tuple[float, ...]] = {}  # id(schedule) -> its sweep's caps, in order

        def observer_for(probe: PlannedProbe, outcome: OwnedSweep) -> ServiceObserver:
            live[:] = [outcome]
            schedule: ScheduleConfig = probe.origin
            planned[id(schedule)] = 1 if outcome.read_only else len(outcome.caps_watts)
            caps_of[id(schedule)] = () if outcome.read_only else tuple(outcome.caps_watts)
            operator_cap = self.held_caps.get(device.index, outcome.original_cap_watts)
            assert operator_cap is not None  # read before any schedule starts
            self._operator_caps[device.index] = operator_cap
            self.metrics.set_original_cap(info, operator_cap)
            applied = outcome.original_cap_watts if device.index in self.held_caps else None
            return ServiceObserver(self, device, info, schedule, operator_cap, outcome.caps_watts, applied,
                                   planned=planned[id(schedule)])

        outcome = run_owned_sweep(device, self.journal, request, self.executor, observer_for, self.abort)
        points_of = {id(probe.origin): points for probe, points in outcome.sweeps}
        last = outcome.sweeps[-1][0].origin if outcome.sweeps else None
        for schedule in members or [leader]:
            if id(schedule) in results:  # ran to its end: told as it ended
                continue
            points = tuple(points_of.get(id(schedule), ()))
            ran_whole = id(schedule) in points_of and schedule is not last
            wanted = planned.get(id(schedule), len(points))
            results[id(schedule)] = replace(
                self._done(device, info, schedule, points, wanted) if ran_whole
                else self._ended(device, info, schedule, outcome, points, wanted),
                caps_watts=caps_of.get(id(schedule), ()))
        return results, outcome

    def _ended(self, device: Device, info: GpuInfo, schedule: ScheduleConfig, outcome: OwnedSweep,
               published: tuple[SweepPoint, ...], planned: int | None = None) -> RunOutcome:
        """The outcome of the round's last schedule (or one it never got to): the sweep's status decides."""
        preset = preset_of(schedule)
        status = outcome.status
        if status is OwnedStatus.OWNED:
            return self._skip(info, schedule, "busy", outcome.detail)
        if status is OwnedStatus.STATE_DIR:
            if not published:
                log.error("gpu %d: cannot take the power-cap lock or write the journal in %s (%s); not sweeping",
                          device.index, self.journal.state_dir, outcome.detail)
            self.metrics.count(info, schedule.probe, preset, "failed", "state_dir")
            return RunOutcome("failed", "state_dir", published)
        if status is OwnedStatus.ABORTED:
            self.metrics.count(info, schedule.probe, preset, "aborted", "shutdown")
            return RunOutcome("aborted", "shutdown", published)
        if status is OwnedStatus.PREEMPTED:  # gave way to a user's job: counted once, its point if it had one
            if not any(p.result.preempted for p in published):
                self.metrics.count(info, schedule.probe, preset, "skipped", PREEMPTED)
            return RunOutcome("skipped", PREEMPTED, published)
        if status in (OwnedStatus.DEVICE_ERROR, OwnedStatus.EXCEPTION):
            reason = outcome.reason if status is OwnedStatus.DEVICE_ERROR else "exception"
            self.metrics.count(info, schedule.probe, preset, "failed", reason)
            return RunOutcome("failed", reason, published)
        return self._done(device, info, schedule, published, planned)

    def _done(self, device: Device, info: GpuInfo, schedule: ScheduleConfig,
              published: tuple[SweepPoint, ...], planned: int | None = None) -> RunOutcome:
        """A schedule whose sweep ran to its end: its recommendation logged, ok unless a point failed.

        ``planned``: how many points it was to measure; one stopped before (a point aborted) recommends nothing."""
        failed = [p for p in published if p.result.status not in ("ok", "skipped")]
        if (why := cut_short(published, len(published) if planned is None else planned)) is not None:
            log.warning("gpu %d %s/%s: sweep %s", device.index, schedule.probe, preset_of(schedule), why)
        elif id(schedule) in self.parts:
            log.info("gpu %d %s/%s: measured the %d cap(s) a sweep taken in parts had left", device.index,
                     schedule.probe, preset_of(schedule), len(published))
        elif (best := recommend_latest(published, self.config.max_slowdown)) is not None:  # the one rule
            log.info("gpu %d %s/%s: recommended cap %.0f W (%s)", device.index, schedule.probe,
                     preset_of(schedule), best.cap_watts, comparison_words(best))
        if failed:
            return RunOutcome(failed[0].result.status, failed[0].result.failure_reason or "unknown", published)
        return RunOutcome("ok", "", published)


def _ending(schedules: Iterable[ScheduleConfig], ended: Callable[[ScheduleConfig], None]) -> Iterator[ScheduleConfig]:
    """``schedules``, with ``ended(s)`` called once the sweep asks past ``s``: the owned sweep asks for
    the next schedule only after the last one's sweep ran to its end (a preemption, an abort or an
    error raises instead), and once more after the round's last."""
    previous = None
    for schedule in schedules:
        if previous is not None:
            ended(previous)
        previous = schedule
        yield schedule
    if previous is not None:
        ended(previous)


class ServiceObserver:
    """The daemon's :class:`~gpuperfd.probing.observer.SweepObserver`: where a point goes from the sweep.

    Each point: the idle tracker is told the load is ours while it runs (:meth:`on_measuring`), then
    the result goes to the landing page's latest points (a failed point withdraws its cap's last ok
    one), the probe series (:class:`~gpuperfd.probing.metrics.ProbeMetrics`) and the history file.
    Each cap: the served power limit is refreshed, then the sweep flag set.
    """

    def __init__(self, service: ProbeService, device: Device, info: GpuInfo, schedule: ScheduleConfig,
                 operator_cap: float, caps: Iterable[float] = (), applied_cap: float | None = None,
                 planned: int | None = None) -> None:
        self.service, self.device, self.info, self.schedule = service, device, info, schedule
        self.operator_cap = operator_cap
        #: The cap apply mode held when the sweep started (None: none); each point's history line says so.
        self.applied_cap = applied_cap
        self.preset = preset_of(schedule)
        self.sweep_id = uuidlib.uuid4().hex[:12]
        #: The sweep's caps in the order it sets them (point k of n is the cap's place here).
        self.caps = list(caps)
        #: How many points it is to measure (each history line says so: a stop between points leaves none).
        self.planned = planned

    def on_cap(self, watts: float | None) -> None:
        service = self.service
        service.shown.track((self.device.index, self.schedule.probe, self.preset), watts, self.caps)
        if service.on_cap_change is not None:  # first the served limit, then the sweep flag
            service.on_cap_change(self.device.index)
        service.metrics.set_sweep_cap(self.info, watts)

    def on_measuring(self, running: bool) -> None:
        self.service.gate.tracker.mark_ours(self.device.index, running)

    def on_point(self, point: SweepPoint) -> None:
        point = dataclasses.replace(point, sweep_id=self.sweep_id)  # the one rule asks which sweep (recommend.py)
        service, result = self.service, point.result
        if self.applied_cap is not None:
            result.extra["applied_cap_watts"] = self.applied_cap
        if result.preempted:
            log.info("gpu %d: %s/%s at %.0f W gave way to a user's job: %s", self.device.index, self.schedule.probe,
                     self.preset, point.cap_watts, result.error_message)
        elif result.status != "ok":
            log.warning("gpu %d: %s/%s at %.0f W %s (%s): %s", self.device.index, self.schedule.probe, self.preset,
                        point.cap_watts, result.status, result.failure_reason, result.error_message)
        service.shown.put((self.device.index, self.schedule.probe, self.preset), point)
        for listener in service.point_listeners:
            listener(self.device.index, self.schedule.probe, self.preset, point)
        at_operator_cap = round(point.cap_watts) == round(self.operator_cap)
        service.metrics.publish(self.info, result, point.cap_watts, at_operator_cap)
        if service.history is not None:
            service.history.append(self.info, result.to_dict(), point.cap_watts, self.operator_cap, self.sweep_id,
                                   self.planned)

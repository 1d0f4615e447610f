"""APScheduler 3.x wiring: one job per (schedule, GPU), or per schedule on a serial node; and the gap
dispatcher that runs due results at the first moment their GPU qualifies (issue 50).

Freshness, not firing times: a job's firing means "this result is due now" (:mod:`gpuperfd.probing.scheduling.due`).
An interval job first fires ``first_run_delay_seconds`` after start and then an interval after each
completed result (a result is due once older than the interval); a cron job's firing opens a window
(``window_seconds``, default until its next time). At its firing the run starts at once if its GPU
qualifies (as before: a GPU that does not is counted skipped with its reason); otherwise the result
stays due and the dispatcher (a thread, every ``tick_seconds``) starts it at the first moment the GPU
qualifies (not allocated, no foreign process, idle ``idle_seconds``) plus a jitter drawn for that
moment, most overdue first, within the GPU-time share (``max_gpu_time_ratio``). A run that gave way to
a user's job stays due and takes the next gap. Jobs never overlap (max_instances=1, and the probe
service's per-GPU turn); missed runs are counted. ``apply`` brings the job set in
line with a reloaded config without a restart: a job whose trigger is unchanged
keeps its next run time (a reload, or a storm of them, never delays or adds a
run); only new jobs and jobs whose trigger changed are (re)scheduled.

Rounds (``probes.round_window_seconds`` > 0, :mod:`gpuperfd.probing.scheduling.rounds`): when a job's run
gets its GPU, the jobs of the same GPU (a serial node: the same GPU group) due within the window,
and within a tenth of their own interval, are claimed for its round: an interval job's next run
becomes a whole interval (plus jitter) after this round, so the round's members stay in step and
each runs at most once per interval from then on (the first pull runs it at most the window
early); a cron job is claimed only when its time is within the window, and its next run is the
cron's next time after the claimed one. A reload keeps a claimed job's moved next run when its
trigger is unchanged (the rule above).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from typing import Any
from datetime import datetime, timedelta, timezone

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gpuperfd.config import ProbesConfig, ScheduleConfig
from gpuperfd.probing.scheduling.due import Due, DueRuns, Qualifying
from gpuperfd.probing.scheduling.partial import Partial, PartialSweeps
from gpuperfd.probe_data.recommend import recommend
from gpuperfd.probing.interconnect.service import PROBE as INTERCONNECT
from gpuperfd.probing.interconnect.service import InterconnectService
from gpuperfd.probing.scheduling.service import ProbeService, RunOutcome, preset_of

log = logging.getLogger(__name__)


def _trigger(schedule: ScheduleConfig, jitter: float) -> IntervalTrigger | CronTrigger:
    """The job's trigger: when its result falls due. No jitter here: the jitter is drawn from the
    moment the GPU qualifies (:class:`~gpuperfd.probing.scheduling.due.Qualifying`), so the interval stays the
    bound on a result's age."""
    if schedule.cron is not None:
        return CronTrigger.from_crontab(schedule.cron, timezone=timezone.utc)
    return IntervalTrigger(seconds=schedule.interval_seconds, timezone=timezone.utc)


#: On a busy GPU a result this share of its interval from falling due takes a gap that opens now: the
#: next gap may be minutes away (the rounds' own pull is the same tenth). A GPU idle since before then
#: waits for the result to fall due, so an idle fleet still probes once an interval.
EARLY_SHARE = 0.1

#: A GPU idle this long has a gap open (``gap_states``): one sampler period; a job that ended is out of
#: NVML's process list 0.1 s after its end (benchmarks/job_tail.py).
GAP_OPEN_SECONDS = 1.0

#: Gate refusals that say a user's job holds the GPU now: a standby child waits through them (it makes no
#: CUDA call), ready for the gap after the job. Any other (a lost GPU, MIG) ends it.
JOB_REFUSALS = frozenset({"busy", "allocated", "not_idle", "own_tail"})

#: Outcomes that complete a due result (a failed run is a result too: its alerts say so; retrying it
#: at every gap would hammer a broken GPU). Anything else (skipped, preempted, aborted) leaves it due.
COMPLETES = ("ok", "failed")


class ProbeScheduler:
    """Owns the APScheduler instance that triggers the probe service."""

    def __init__(self, service: ProbeService, gpus: list[int], interconnect: InterconnectService | None = None,
                 tick_seconds: float = 0.5, clock: Callable[[], float] | None = None,
                 rng: random.Random | None = None, recheck_seconds: float = 2.0,
                 gap_open_seconds: float = GAP_OPEN_SECONDS) -> None:
        self.service = service
        #: A GPU idle this long has a gap open (GAP_OPEN_SECONDS; tests scale it).
        self.gap_open_seconds = gap_open_seconds
        #: Why the gate last refused each GPU the tracker called free (its reason word).
        self._refused_why: dict[int, str] = {}
        self.gpus = gpus
        #: How often the dispatcher looks for a due result whose GPU qualifies, seconds.
        self.tick_seconds = tick_seconds
        #: After the gate refused a GPU the idle tracker called free (a pod holds it, MIG, a lost GPU), the
        #: dispatcher asks the gate (its device reads) again only this much later.
        self.recheck_seconds = recheck_seconds
        self._refused_until: dict[int, float] = {}
        #: The idle tracker's clock (monotonic): qualifying moments and GPU time are measured on it.
        tracker = service.gate.tracker
        self.clock = clock or tracker.clock
        self.due = DueRuns()
        self.qualifying = Qualifying(tracker.idle_for, self.clock, rng, tracker.handed_since)
        #: GPUs a run of ours holds now (inline or dispatched): the dispatcher leaves them be.
        self._running: set[int] = set()
        #: The jobs the round running on each GPU runs (its leader and the members it claimed): the GPU's
        #: standby child is for another result.
        self._in_round: dict[int, set[str]] = {}
        self._running_lock = threading.Lock()
        #: The qualifying moment (on ``clock``) of the run now holding each GPU: the start of the
        #: qualified-to-result time its results are published with.
        self._qualified: dict[int, float] = {}
        #: When the turn of the probe now running on each GPU began: the qualifying moment for a round's
        #: first probe, the previous probe's result for the next (what a probe's own cost is measured from).
        self._turn_began: dict[int, float] = {}
        #: The probes of the run now holding each GPU whose first result is published (timed once a run).
        self._timed: dict[int, set[str]] = {}
        #: Each probe's last time from its turn on the GPU to its result: what a gap must hold past idle_seconds.
        self._cost: dict[str, float] = {}
        #: Seconds each (job, gpu)'s last round took: what the GPU-time share must still hold.
        self._took: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick: float | None = None
        #: Sweeps on busy GPUs taken in parts, and the runs now measuring a part's remaining caps.
        self.partials = PartialSweeps()
        self._resuming: dict[tuple[str, int], Partial] = {}
        #: Whether each (gpu, probe, preset)'s result is due now, as published (landing page, /api/v1/gpus, top).
        self._due_flags: dict[tuple[int, str, str], bool] = {}
        service.outcome_listeners.append(self._on_outcome)
        service.point_listeners.append(self._on_point)
        #: Runs ``probe: interconnect`` schedules (one job per schedule: the set at once); None: not built.
        self.interconnect = interconnect
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=max(1, len(gpus)) * 8)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 300},
            timezone=timezone.utc,
        )
        self.scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self._probe_of_job: dict[str, str] = {}
        #: The trigger settings each job was scheduled with: a reload that keeps them keeps the job's next run.
        self._trigger_of_job: dict[str, tuple] = {}

    def _on_missed(self, event: JobExecutionEvent) -> None:
        probe = self._probe_of_job.get(event.job_id, "unknown")
        log.warning("scheduled %s run missed or still running (job %s)", probe, event.job_id)
        self.service.metrics.missed_run(probe)

    def apply(self, config: ProbesConfig) -> None:
        """Make the job set that of ``config`` (start-up and reload); unchanged triggers keep their next run."""
        self.service.apply_config(config)
        self.service.metrics.declare_probes({s.probe for s in config.schedules} if config.enabled else set())
        wanted: dict[str, tuple[ScheduleConfig, list[int], tuple]] = {}
        if config.enabled:
            for number, schedule in enumerate(config.schedules):
                gpus = [g for g in self.gpus if schedule.gpus is None or g in schedule.gpus]
                if schedule.probe == INTERCONNECT:  # a node probe: one job holds the whole set
                    wanted[f"{number}-{INTERCONNECT}"] = (schedule, list(schedule.gpus or self.gpus),
                                                         (schedule.interval_seconds, schedule.cron,
                                                          int(config.jitter_seconds)))
                    continue
                groups = [[g] for g in gpus] if config.parallel_gpus else [gpus]
                for group in groups:
                    job_id = f"{number}-{schedule.probe}-gpu{'_'.join(map(str, group))}"
                    trigger_key = (schedule.interval_seconds, schedule.cron, int(config.jitter_seconds))
                    wanted[job_id] = (schedule, group, trigger_key)
        for job in self.scheduler.get_jobs():
            if job.id not in wanted or self._trigger_of_job.get(job.id) != wanted[job.id][2]:
                job.remove()
                self._trigger_of_job.pop(job.id, None)
        for gone in self.due.retain(lambda job_id, gpu: job_id in wanted and self._trigger_of_job.get(job_id) is not None):
            log.info("gpu %d: %s no longer due (its schedule changed or went)", gone.gpu, gone.schedule.probe)
        self._declare_due(wanted)
        if not config.enabled:
            self._probe_of_job.clear()
            log.info("probes disabled by config")
            return
        self._probe_of_job = {job_id: schedule.probe for job_id, (schedule, _, _) in wanted.items()}
        first_run = datetime.now(timezone.utc) + timedelta(seconds=config.first_run_delay_seconds)
        kept = 0
        for job_id, (schedule, group, trigger_key) in wanted.items():
            job = self.scheduler.get_job(job_id)
            if job is not None:  # same trigger: keep its next run time, take the new settings
                job.modify(args=(schedule, group, job_id))
                kept += 1
                continue
            extra = {"next_run_time": first_run} if schedule.interval_seconds is not None else {}
            self.scheduler.add_job(
                self._run_interconnect if schedule.probe == INTERCONNECT else self._run,
                _trigger(schedule, config.jitter_seconds),
                args=(schedule, group, job_id),
                id=job_id,
                name=f"{schedule.probe} on gpu {group}",
                replace_existing=True,
                **extra,
            )
            self._trigger_of_job[job_id] = trigger_key
        log.info("scheduled %d probe job(s) (%d kept their next run)", len(self.scheduler.get_jobs()), kept)

    def _run(self, schedule: ScheduleConfig, gpus: list[int], job_id: str) -> None:
        """The job fired: its result is due on each of its GPUs. Each runs now if its GPU qualifies
        (else it is counted skipped, as before, and stays due for the dispatcher's first gap)."""
        firing = _Firing(self, job_id, gpus)
        until = self._window_end(schedule)
        for gpu in gpus:
            entry = Due(job_id, schedule, gpu, list(gpus), time.time(), until)
            if self.due.fall_due(entry):
                self._publish_due(entry, True)
            entry = self.due.get(job_id, gpu) or entry
            start_at = self.qualifying.start_at(gpu, self.service.config.idle_seconds,
                                                self.service.config.jitter_seconds)
            if start_at is not None and start_at > self.clock():
                continue  # qualifying, its jitter not yet over: the dispatcher starts it then
            if not self._claim_gpu(gpu):
                continue  # a run of ours holds it (a dispatched one): this result waits its turn
            try:
                if not self._budget_allows(entry):
                    self.service.count_skip(gpu, schedule, "gpu_time_budget")
                    continue
                moment = self.qualifying.moment(gpu, self.service.config.idle_seconds)
                self._qualified[gpu] = max(moment if moment is not None else self.clock(),
                                           self.clock() - (time.time() - entry.since))
                self._run_entry(entry, firing)
            finally:
                self._release_gpu(gpu)

    # --- freshness: due results, the dispatcher, coverage --------------------------------------------

    def _window_end(self, schedule: ScheduleConfig) -> float | None:
        """Wall time a cron firing's window closes (its window_seconds, else its next time); None: interval."""
        if schedule.cron is None:
            return None
        now = time.time()
        if schedule.window_seconds is not None:
            return now + schedule.window_seconds
        trigger = CronTrigger.from_crontab(schedule.cron, timezone=timezone.utc)
        after = datetime.fromtimestamp(now + 1.0, timezone.utc)
        following = trigger.get_next_fire_time(None, after)
        return following.timestamp() if following is not None else None

    def _claim_gpu(self, gpu: int) -> bool:
        with self._running_lock:
            busy = gpu in self._running or (not self.service.config.parallel_gpus and bool(self._running))
            if busy:
                return False
            self._running.add(gpu)
            return True

    def _release_gpu(self, gpu: int) -> None:
        with self._running_lock:
            self._running.discard(gpu)
            self._in_round.pop(gpu, None)
        self._qualified.pop(gpu, None)
        self._turn_began.pop(gpu, None)
        self._timed.pop(gpu, None)

    def _budget_allows(self, entry: Due) -> bool:
        return self.service.gpu_time.allows(entry.gpu, self._took.get((entry.job_id, entry.gpu), 0.0))

    def _publish_due(self, entry: Due, due: bool) -> None:
        if entry.schedule.probe == INTERCONNECT or entry.gpu not in self.service.devices:
            return
        self._due_flags[(entry.gpu, entry.schedule.probe, preset_of(entry.schedule))] = due
        info = self.service.info(entry.gpu)
        if info.uuid:
            self.service.metrics.set_due(info, entry.schedule.probe, preset_of(entry.schedule), due)

    def _declare_due(self, wanted: dict[str, tuple[ScheduleConfig, list[int], tuple]]) -> None:
        """The due series of the schedules now: 1 where no result came yet (or one is due), 0 where fresh;
        those of schedules no longer run go."""
        labels: set[tuple[str, str, str]] = set()
        for job_id, (schedule, group, _) in wanted.items():
            if schedule.probe == INTERCONNECT:
                continue
            for gpu in group:
                labels.add((str(gpu), schedule.probe, preset_of(schedule)))
                entry = self.due.get(job_id, gpu)
                fresh = entry is None and (job_id, gpu) in self._took
                self._publish_due(Due(job_id, schedule, gpu, group, 0.0),
                                  entry is not None or (not fresh and schedule.cron is None))
        self.service.metrics.retain_due(lambda gpu, probe, preset: (gpu, probe, preset) in labels)
        self._due_flags = {k: v for k, v in self._due_flags.items() if (str(k[0]), k[1], k[2]) in labels}

    def hand_off(self, gpus: list[int]) -> list[int]:
        """The scheduler (Slurm's epilog) says these GPUs are free now: they qualify without waiting out
        idle_seconds (the gate's other checks stand), and the dispatcher looks at once. Returns the GPUs
        of this node among them."""
        ours = [gpu for gpu in gpus if gpu in self.gpus]
        for gpu in ours:
            self.service.gate.tracker.hand_off(gpu)
            self._refused_until.pop(gpu, None)  # the scheduler's word: ask the gate again now
        if ours:
            threading.Thread(target=self._dispatch_quietly, name="probe-handoff", daemon=True).start()
        return ours

    def _dispatch_quietly(self) -> None:
        try:
            self.dispatch_once()
        except Exception:  # noqa: BLE001 - the loop's next pass tries again
            log.exception("probe dispatch after a hand-off failed")

    def gap_states(self) -> dict[int, dict[str, Any]]:
        """Per GPU with a result due: why it is waiting, so an operator can tell "no gap" from "gaps too
        short" (landing page, ``/api/v1/gpus``, ``gpuperfd top``). ``state``: ``running`` (a run of ours
        holds it), ``gap_open`` (free now), ``no_gap`` (no free stretch seen since the daemon started, or
        none kept), ``gaps_too_short`` (every recent one shorter than ``needs_seconds``: idle_seconds and
        the due probes' last cost from their turn to their result), else ``waiting``."""
        tracker, config = self.service.gate.tracker, self.service.config
        due: dict[int, list[str]] = {}
        for entry in self.due.ordered():
            if entry.schedule.probe != INTERCONNECT:
                due.setdefault(entry.gpu, []).append(entry.schedule.probe)
        states: dict[int, dict[str, Any]] = {}
        for gpu, probes in due.items():
            gaps = [round(g, 1) for g in tracker.recent_gaps(gpu)]
            costs = [self._cost[p] for p in probes if p in self._cost]
            needs = config.idle_seconds + max(costs) if costs else None
            free = tracker.idle_for(gpu)
            with self._running_lock:
                running = gpu in self._running
            state = ("running" if running else "gap_open" if free >= self.gap_open_seconds
                     else "no_gap" if not gaps
                     else "gaps_too_short" if needs is not None and max(gaps) < needs else "waiting")
            states[gpu] = {"state": state, "due": sorted(set(probes)), "free_seconds": round(free, 1),
                           "last_gaps_seconds": gaps, "needs_seconds": None if needs is None else round(needs, 1)}
        return states

    def coverage(self) -> dict[tuple[int, str, str], bool]:
        """Whether each scheduled (gpu, probe, preset)'s result is due now (a copy)."""
        return dict(self._due_flags)

    def _run_entry(self, entry: Due, firing: _Firing) -> RunOutcome:
        """Run a due result on its GPU (the whole schedule, or the caps its sweep in parts has left)."""
        schedule = self._schedule_for(entry)
        with self._running_lock:
            self._in_round.setdefault(entry.gpu, set()).add(entry.job_id)
        try:
            return self.service.run(schedule, entry.gpu, key=entry.job_id, source=firing)
        finally:
            self.service.parts.discard(id(schedule))
            self._resuming.pop((entry.job_id, entry.gpu), None)  # told by now, or never started

    def _schedule_for(self, entry: Due) -> ScheduleConfig:
        """The schedule to run for ``entry``: itself, or, where a sweep of it gave way and its part still
        agrees and is fresh, the same schedule at the caps that part has left (:mod:`gpuperfd.probing.scheduling.partial`)."""
        schedule = entry.schedule
        if self.service.config.read_only or len(schedule.caps) < 2 or schedule.probe == INTERCONNECT:
            return schedule
        max_age = schedule.interval_seconds or schedule.window_seconds or 86400.0
        part = self.partials.resumable((entry.job_id, entry.gpu), self.service.info(entry.gpu), schedule, max_age)
        if part is None or not part.remaining():
            return schedule
        rest = schedule.model_copy(update={"caps": part.remaining()})
        self._resuming[(entry.job_id, entry.gpu)] = part
        self.service.parts.add(id(rest))
        log.info("gpu %d: %s goes on with the %d cap(s) its sweep has left (%d measured in earlier gaps)",
                 entry.gpu, schedule.probe, len(part.remaining()), len(part.points))
        return rest

    def _on_outcome(self, gpu: int, key: str, outcome: RunOutcome) -> None:
        """The probe service's word on a schedule a round ran (leader or member): complete it, or keep it due;
        a sweep that gave way keeps its part, a part that measured the rest joins it (or the sweep is due again)."""
        schedule = self.current(key)
        if schedule is None:
            return
        part = self._resuming.pop((key, gpu), None)
        if outcome.result == "skipped" and outcome.reason == "preempted" and not self.service.config.read_only:
            caps = part.caps_watts if part is not None else outcome.caps_watts
            kept = self.partials.keep((key, gpu), self.service.info(gpu), schedule, outcome.points, caps)
            if kept is not None:
                log.info("gpu %d: %s sweep gave way with %d of %d caps measured; the next gap measures the rest",
                         gpu, schedule.probe, len(kept.points), len(kept.caps_watts))
        elif outcome.result == "ok" and part is not None:
            joined, why = self.partials.join((key, gpu), outcome.points)
            if joined is None:
                log.warning("gpu %d: %s sweep in parts: %s; the whole sweep is due again", gpu, schedule.probe, why)
                entry = Due(key, schedule, gpu, [gpu], time.time(), self._window_end(schedule))
                if self.due.fall_due(entry):
                    self._publish_due(entry, True)
                return
            best = recommend(joined, self.service.config.max_slowdown)
            log.info("gpu %d: %s sweep joined from its parts (%d caps)%s", gpu, schedule.probe, len(joined),
                     f": recommended cap {best.cap_watts:.0f} W" if best is not None else "")
        elif outcome.result in COMPLETES:
            self.partials.drop((key, gpu))  # a whole sweep (or a failure) replaces any part
        if outcome.result in COMPLETES:
            entry = self.due.done(key, gpu)
            self._took[(key, gpu)] = sum(p.result.wall_seconds or 0.0 for p in outcome.points)
            self._publish_due(entry or Due(key, schedule, gpu, [gpu], 0.0), False)
            if schedule.interval_seconds is not None:  # due again an interval after this result
                job = self.scheduler.get_job(key)
                if job is not None:
                    try:
                        job.modify(next_run_time=datetime.now(timezone.utc) + timedelta(seconds=schedule.interval_seconds))
                    except JobLookupError:
                        pass
        elif outcome.result in ("skipped", "aborted") and outcome.reason != "shutdown":
            group = next((list(job.args[1]) for job in [self.scheduler.get_job(key)] if job is not None), [gpu])
            entry = Due(key, schedule, gpu, group, time.time(), self._window_end(schedule))
            if self.due.fall_due(entry):
                self._publish_due(entry, True)

    def _on_point(self, gpu: int, probe: str, preset: str, point: Any) -> None:
        """A point was published: the first ok one of each probe in a run is its result, timed from the GPU's
        qualifying moment (``gpuperf_probe_qualified_to_result_seconds``) and from its turn in the round
        (the qualifying moment, or the round's previous result: the probe's own cost, in the log)."""
        qualified = self._qualified.get(gpu)
        if qualified is None or not point.result.ok or probe in self._timed.setdefault(gpu, set()):
            return
        self._timed[gpu].add(probe)
        now = self.clock()
        turn = self._turn_began.get(gpu, qualified)
        self._turn_began[gpu] = now  # the round's next probe's turn begins with this result
        self._cost[probe] = now - turn
        self.service.metrics.qualified_to_result_seconds(probe, now - qualified)
        log.info("gpu %d: %s result published %.1f s after the GPU qualified (%.1f s after its turn in the round "
                 "began)", gpu, probe, now - qualified, now - turn)

    def dispatch_once(self) -> int:
        """One look: close expired cron windows, count free GPU time, and start the due results whose GPU
        qualifies, most overdue first (each in a thread of its own). Returns how many were started."""
        config = self.service.config
        if not config.enabled or not self.service.devices:
            return 0  # probes off (or no GPUs): nothing is due, no free time to count
        now = self.clock()
        elapsed = 0.0 if self._last_tick is None else max(0.0, now - self._last_tick)
        self._last_tick = now
        for entry in self.due.expired(time.time()):
            log.info("gpu %d: %s's cron window closed with no gap to run in", entry.gpu, entry.schedule.probe)
            self.service.count_skip(entry.gpu, entry.schedule, "window_closed")
            self._publish_due(entry, False)
        starts: dict[int, float | None] = {}
        moments: dict[int, float | None] = {}
        for gpu in self.gpus:
            moments[gpu] = moment = self.qualifying.moment(gpu, config.idle_seconds, now)
            starts[gpu] = self.qualifying.start_at(gpu, config.idle_seconds, config.jitter_seconds, now)
            # Free: idle by the tracker, no run of ours on it, and not refused by the gate lately (a pod
            # holding an idle GPU is not a gap: GpuProbeCoverageLow must say "never free" then).
            if moment is not None and gpu not in self._running and now >= self._refused_until.get(gpu, -1.0):
                self.service.metrics.add_free_seconds(self.service.info(gpu), min(elapsed, max(0.0, now - moment)))
        jobs = self._started_jobs()  # one listing for this pass's two looks at the jobs
        self._take_early_gaps(jobs, moments, now)
        self._keep_standbys(jobs, now)
        started = 0
        for entry in self.due.ordered():
            gpu = entry.gpu
            start_at = starts.get(gpu)
            if entry.schedule.probe == INTERCONNECT or start_at is None or start_at > now:
                continue
            if not self._budget_allows(entry) or now < self._refused_until.get(gpu, -1.0):
                continue
            refused = self.service.gate.refusal(self.service.devices[gpu], wait=False)
            if refused is not None:
                if refused[0] != "own_tail":  # our own run's tail passes by itself: look again next pass
                    self._refused_until[gpu] = now + self.recheck_seconds
                    self._refused_why[gpu] = refused[0]
                continue
            if not self._claim_gpu(gpu):
                continue
            self._qualified[gpu] = max(moments[gpu] or start_at, now - (time.time() - entry.since))
            thread = threading.Thread(target=self._dispatched, args=(entry,), name=f"probe-gpu{gpu}", daemon=True)
            thread.start()
            started += 1
        return started

    def _keep_standbys(self, jobs: list[Job], now: float) -> None:
        """Each GPU's standby child (:mod:`gpuperfd.probing.child.standby`): started for its most overdue
        result (or one falling due within a child's lead) at once, busy GPU or not: it makes no CUDA call,
        so a user's job loses nothing but the host memory the admission reserved, and it is ready when
        the job's gap opens (a child's imports, 13-18 s for llm on an H200, outlast idle_seconds 10: one
        started when the job ended made the round wait ~9 s). Ended when nothing is due there, the gate
        refused the GPU for a reason no job explains (lost, MIG), the GPU-time share is spent, or a round
        waits for host memory (then on busy GPUs: a round goes first). On a GPU a round of ours holds, the
        child is for the next result the round does not run: it is ready when the round ends."""
        standby, tracker = self.service.standby, self.service.gate.tracker
        if standby is None:
            return
        with self._running_lock:
            in_round = {gpu: set(jobs_) for gpu, jobs_ in self._in_round.items()}
        first: dict[int, Due] = {}
        for entry in self.due.ordered():
            if entry.schedule.probe != INTERCONNECT and entry.job_id not in in_round.get(entry.gpu, ()):
                first.setdefault(entry.gpu, entry)
        soon = self._falling_due_soon(jobs, standby.lead_seconds, in_round)
        rounds_wait = self.service.turns.memory_waiters() > 0
        for gpu in self.gpus:
            entry = first.get(gpu)
            schedule = entry.schedule if entry is not None else soon.get(gpu)
            refused = now < self._refused_until.get(gpu, -1.0) and self._refused_why.get(gpu) not in JOB_REFUSALS
            why = ("no result due" if schedule is None
                   else f"the gate refused the GPU ({self._refused_why.get(gpu)})" if refused
                   else "the GPU-time share is spent" if entry is not None and not self._budget_allows(entry)
                   else "a round waits for host memory" if rounds_wait and tracker.idle_for(gpu) < self.gap_open_seconds
                   else None)
            if why is not None:
                standby.drop(gpu, why)
            elif schedule is not None and not rounds_wait:
                self.service.stand_by(gpu, schedule)

    def _started_jobs(self) -> list[Job]:
        """The jobs with a next run (a pending one, before the scheduler starts, has none)."""
        return [job for job in self.scheduler.get_jobs()
                if len(job.args) >= 3 and getattr(job, "next_run_time", None) is not None]

    def _falling_due_soon(self, jobs: list[Job], lead_seconds: Callable[[str], float],
                          in_round: dict[int, set[str]]) -> dict[int, ScheduleConfig]:
        """Per GPU, a schedule whose result falls due within a standby child's lead (not one of the jobs the
        GPU's round runs now): on a GPU idle all along the run starts when it falls due, so its child starts
        that much before (issue 60)."""
        wall = time.time()
        soon: dict[int, ScheduleConfig] = {}
        for job in jobs:
            schedule, group = job.args[0], list(job.args[1])
            if schedule.probe == INTERCONNECT or job.next_run_time.timestamp() - wall > lead_seconds(schedule.probe):
                continue
            for gpu in group:
                if job.id not in in_round.get(gpu, ()):
                    soon.setdefault(gpu, schedule)
        return soon

    def _take_early_gaps(self, jobs: list[Job], moments: dict[int, float | None], now: float) -> None:
        """Interval results within EARLY_SHARE of their interval of falling due, on a GPU whose gap opened
        since then (it was busy when that share began), fall due now: that gap is taken."""
        wall = time.time()
        for job in jobs:
            schedule, group = job.args[0], list(job.args[1])
            if schedule.interval_seconds is None or schedule.probe == INTERCONNECT:
                continue
            opens = job.next_run_time.timestamp() - EARLY_SHARE * schedule.interval_seconds
            if wall < opens:
                continue
            for gpu in group:
                moment = moments.get(gpu)
                if (job.id, gpu) not in self._took or moment is None or moment < now - (wall - opens):
                    continue  # never run yet (first_run_delay holds), not free, or free since before
                if self.due.get(job.id, gpu) is None:
                    self.due.fall_due(Due(job.id, schedule, gpu, group, job.next_run_time.timestamp()))
                    log.info("gpu %d: %s falls due in %.0f s; a gap opened: taken now", gpu, schedule.probe,
                             job.next_run_time.timestamp() - wall)

    def _dispatched(self, entry: Due) -> None:
        try:
            if self._stop.is_set():
                return
            self._run_entry(entry, _Firing(self, entry.job_id, entry.group))
        except Exception:  # noqa: BLE001 - one run's bug must not end the dispatcher
            log.exception("gpu %d: %s run failed", entry.gpu, entry.schedule.probe)
        finally:
            self._release_gpu(entry.gpu)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            try:
                self.dispatch_once()
            except Exception:  # noqa: BLE001 - keep looking
                log.exception("probe dispatcher pass failed")

    def _run_interconnect(self, schedule: ScheduleConfig, gpus: list[int], job_id: str) -> None:
        if self.interconnect is None:
            log.warning("job %s: no interconnect probe in this daemon; not run", job_id)
            return
        self.interconnect.run(schedule)

    def claim(self, job_id: str, group: list[int], exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        """The other jobs of ``group`` due within the round window: their next run moves past the claimed one.

        Within the window, a job joins when it falls due within a tenth of its interval, or before a child
        of its own could be ready (the standby child's lead): the round's child took the GPU's one standby
        slot, so its own child would start only now and the result would wait for its imports (issue 60,
        2x H200: vit due 13 s after llm's round began waited 8-11 s for its child)."""
        window = self.service.config.round_window_seconds
        if window <= 0:
            return []
        standby = self.service.standby
        now = datetime.now(timezone.utc)
        claimed: list[tuple[str, ScheduleConfig]] = []
        for job in self.scheduler.get_jobs():
            if job.id == job_id or job.id in exclude or len(job.args) < 3 or list(job.args[1]) != list(group):
                continue
            schedule: ScheduleConfig = job.args[0]
            if schedule.probe == INTERCONNECT:  # never a member of a single-GPU round
                continue
            if any(self.due.get(job.id, gpu) is not None for gpu in group):  # due now: joins the round
                log.info("%s, due, joins the round of job %s", schedule.probe, job_id)
                claimed.append((job.id, schedule))
                continue
            planned = job.next_run_time
            lead = standby.lead_seconds(schedule.probe) if standby is not None else 0.0
            horizon = window if schedule.interval_seconds is None else min(window, max(schedule.interval_seconds / 10,
                                                                                       lead))
            if planned is None or planned > now + timedelta(seconds=horizon):
                continue
            # The trigger's next time after this run: an interval counts from now (the round's
            # members then stay in step, each a whole interval apart); a cron's next time after
            # the claimed one (never the claimed one itself, which is still ahead).
            if schedule.interval_seconds is not None:
                after = job.trigger.get_next_fire_time(now, now)
            else:
                after = job.trigger.get_next_fire_time(planned, max(now, planned) + timedelta(microseconds=1))
            if after is None:
                continue
            try:
                job.modify(next_run_time=after)
            except JobLookupError:  # removed by a reload meanwhile
                continue
            log.info("%s due in %.0f s joins the round of job %s; its next run is %s", schedule.probe,
                     max(0.0, (planned - now).total_seconds()), job_id, after.isoformat(timespec="seconds"))
            claimed.append((job.id, schedule))
        with self._running_lock:
            for gpu in group:
                self._in_round.setdefault(gpu, set()).update(job_id for job_id, _ in claimed)
        return claimed

    def current(self, job_id: str) -> ScheduleConfig | None:
        """The job's schedule as configured now; None if a reload removed the job."""
        job = self.scheduler.get_job(job_id)
        return job.args[0] if job is not None else None

    def start(self) -> None:
        self.scheduler.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="probe-dispatcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Firing:
    """One firing of one job, as the probe service's :class:`~gpuperfd.probing.scheduling.rounds.RoundSource`.

    A serial node's job runs its GPUs one after another: the jobs claimed for the first GPU's
    round run in the next GPUs' rounds too (their own jobs, moved, will not).
    """

    def __init__(self, owner: ProbeScheduler, job_id: str, group: list[int]) -> None:
        self.owner, self.job_id, self.group = owner, job_id, group
        self._claimed: list[tuple[str, ScheduleConfig]] | None = None

    def claim(self, gpu: int, exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        if self._claimed is None:
            self._claimed = []
        taken = {key for key, _ in self._claimed}
        self._claimed += self.owner.claim(self.job_id, self.group, set(exclude) | taken)  # what fell due since
        return [(key, schedule) for key, schedule in self._claimed if key not in exclude]

    def claimed(self) -> list[tuple[str, ScheduleConfig]]:
        return list(self._claimed or ())

    def current(self, key: str) -> ScheduleConfig | None:
        return self.owner.current(key)

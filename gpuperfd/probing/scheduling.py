"""APScheduler 3.x wiring: one job per (schedule, GPU), or per schedule on a serial node.

Interval schedules get jitter so a fleet does not probe at once, and a first
run after ``first_run_delay_seconds``; cron schedules use 5-field crontab
syntax. Jobs never overlap (max_instances=1, and the probe service's per-GPU
lock); missed and skipped runs are counted. ``apply`` brings the job set in
line with a reloaded config without a restart: a job whose trigger is unchanged
keeps its next run time (a reload, or a storm of them, never delays or adds a
run); only new jobs and jobs whose trigger changed are (re)scheduled.

Rounds (``probes.round_window_seconds`` > 0, :mod:`gpuperfd.probing.rounds`): when a job's run
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
from collections.abc import Collection
from datetime import datetime, timedelta, timezone

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gpuperfd.config import ProbesConfig, ScheduleConfig
from gpuperfd.probing.interconnect_service import PROBE as INTERCONNECT
from gpuperfd.probing.interconnect_service import InterconnectService
from gpuperfd.probing.service import ProbeService

log = logging.getLogger(__name__)


def _trigger(schedule: ScheduleConfig, jitter: float) -> IntervalTrigger | CronTrigger:
    jitter_seconds = int(jitter) or None
    if schedule.cron is not None:
        return CronTrigger.from_crontab(schedule.cron, timezone=timezone.utc)
    return IntervalTrigger(seconds=schedule.interval_seconds, jitter=jitter_seconds, timezone=timezone.utc)


class ProbeScheduler:
    """Owns the APScheduler instance that triggers the probe service."""

    def __init__(self, service: ProbeService, gpus: list[int], interconnect: InterconnectService | None = None) -> None:
        self.service = service
        self.gpus = gpus
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
        firing = _Firing(self, job_id, gpus)
        for gpu in gpus:
            self.service.run(schedule, gpu, key=job_id, source=firing)

    def _run_interconnect(self, schedule: ScheduleConfig, gpus: list[int], job_id: str) -> None:
        if self.interconnect is None:
            log.warning("job %s: no interconnect probe in this daemon; not run", job_id)
            return
        self.interconnect.run(schedule)

    def claim(self, job_id: str, group: list[int], exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        """The other jobs of ``group`` due within the round window: their next run moves past the claimed one."""
        window = self.service.config.round_window_seconds
        if window <= 0:
            return []
        now = datetime.now(timezone.utc)
        claimed: list[tuple[str, ScheduleConfig]] = []
        for job in self.scheduler.get_jobs():
            if job.id == job_id or job.id in exclude or len(job.args) < 3 or list(job.args[1]) != list(group):
                continue
            schedule: ScheduleConfig = job.args[0]
            if schedule.probe == INTERCONNECT:  # never a member of a single-GPU round
                continue
            planned = job.next_run_time
            horizon = window if schedule.interval_seconds is None else min(window, schedule.interval_seconds / 10)
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
        return claimed

    def current(self, job_id: str) -> ScheduleConfig | None:
        """The job's schedule as configured now; None if a reload removed the job."""
        job = self.scheduler.get_job(job_id)
        return job.args[0] if job is not None else None

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)


class _Firing:
    """One firing of one job, as the probe service's :class:`~gpuperfd.probing.rounds.RoundSource`.

    A serial node's job runs its GPUs one after another: the jobs claimed for the first GPU's
    round run in the next GPUs' rounds too (their own jobs, moved, will not).
    """

    def __init__(self, owner: ProbeScheduler, job_id: str, group: list[int]) -> None:
        self.owner, self.job_id, self.group = owner, job_id, group
        self._claimed: list[tuple[str, ScheduleConfig]] | None = None

    def claim(self, gpu: int, exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        if self._claimed is None:
            self._claimed = self.owner.claim(self.job_id, self.group, exclude)
        return [(key, schedule) for key, schedule in self._claimed if key not in exclude]

    def claimed(self) -> list[tuple[str, ScheduleConfig]]:
        return list(self._claimed or ())

    def current(self, key: str) -> ScheduleConfig | None:
        return self.owner.current(key)

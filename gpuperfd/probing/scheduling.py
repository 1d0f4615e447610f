"""APScheduler 3.x wiring: one job per (schedule, GPU), or per schedule on a serial node.

Interval schedules get jitter so a fleet does not probe at once, and a first
run after ``first_run_delay_seconds``; cron schedules use 5-field crontab
syntax. Jobs never overlap (max_instances=1, and the probe service's per-GPU
lock); missed and skipped runs are counted. ``apply`` brings the job set in
line with a reloaded config without a restart: a job whose trigger is unchanged
keeps its next run time (a reload, or a storm of them, never delays or adds a
run); only new jobs and jobs whose trigger changed are (re)scheduled.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gpuperfd.config import ProbesConfig, ScheduleConfig
from gpuperfd.probing.service import ProbeService

log = logging.getLogger(__name__)


def _trigger(schedule: ScheduleConfig, jitter: float) -> IntervalTrigger | CronTrigger:
    jitter_seconds = int(jitter) or None
    if schedule.cron is not None:
        return CronTrigger.from_crontab(schedule.cron, timezone=timezone.utc)
    return IntervalTrigger(seconds=schedule.interval_seconds, jitter=jitter_seconds, timezone=timezone.utc)


class ProbeScheduler:
    """Owns the APScheduler instance that triggers the probe service."""

    def __init__(self, service: ProbeService, gpus: list[int]) -> None:
        self.service = service
        self.gpus = gpus
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
                job.modify(args=(schedule, group))
                kept += 1
                continue
            extra = {"next_run_time": first_run} if schedule.interval_seconds is not None else {}
            self.scheduler.add_job(
                self._run,
                _trigger(schedule, config.jitter_seconds),
                args=(schedule, group),
                id=job_id,
                name=f"{schedule.probe} on gpu {group}",
                replace_existing=True,
                **extra,
            )
            self._trigger_of_job[job_id] = trigger_key
        log.info("scheduled %d probe job(s) (%d kept their next run)", len(self.scheduler.get_jobs()), kept)

    def _run(self, schedule: ScheduleConfig, gpus: list[int]) -> None:
        for gpu in gpus:
            self.service.run(schedule, gpu)

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

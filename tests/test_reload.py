"""SIGHUP re-reads the config: a valid one changes schedules without a restart; a bad one is rejected."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import requests
from daemon_configs import simulated_daemon

BASE = """
{daemon}  first_run_delay_seconds: 0.2
  simulated_measure_seconds: 0.2
  schedules:
{schedules}
"""


def daemon_config(state: Path, schedules: str, writable: bool = False) -> str:
    """A one-GPU daemon's config: ``schedules`` (YAML list items) in BASE, no history kept."""
    return BASE.format(daemon=simulated_daemon(state, gpus=1, seed=2, writable=writable, history=False), schedules=schedules)


def runs(url: str, probe: str) -> float:
    total = 0.0
    for line in requests.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("gpuperf_probe_runs_total{") and f'probe="{probe}"' in line and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_sighup_applies_a_good_config_and_rejects_a_bad_one(start_daemon, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(config_text=daemon_config(state, "    - {probe: vit, interval_seconds: 3600}"))
    config = tmp_path / "gpuperfd.yaml"
    assert wait_for(lambda: runs(daemon.url, "vit") == 1)
    assert runs(daemon.url, "attention") == 0

    # a good config: a new schedule appears and runs, without a restart (same pid)
    config.write_text(daemon_config(state, "    - {probe: attention, interval_seconds: 3600}"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: runs(daemon.url, "attention") == 1), daemon.log()
    assert "configuration reloaded: 1 probe schedule(s)" in daemon.log()

    # a bad config: rejected with a clear line, the old one keeps running
    config.write_text(daemon_config(state, "    - {probe: attention, interval_seconds: -1}"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "reload rejected, keeping the running configuration" in daemon.log())
    assert "probes.schedules.0.interval_seconds" in daemon.log()
    assert daemon.proc.poll() is None
    assert requests.get(daemon.url + "/healthz", timeout=5).status_code == 200
    assert daemon.stop() == 0


# --- issue 19, case 7: reloads never move a schedule's next run ---------------------------------


def test_case7_a_reload_that_changes_nothing_keeps_every_next_run_time(tmp_path):
    from prometheus_client import CollectorRegistry

    from gpuperfd.config import ProbesConfig, ScheduleConfig
    from gpuperfd.probing.executors import simulated_executor
    from gpuperfd.probing.gates.idle import IdleTracker
    from gpuperfd.probing.metrics import ProbeMetrics
    from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
    from gpuperfd.probing.scheduling.service import ProbeService

    config = ProbesConfig(first_run_delay_seconds=60, jitter_seconds=0, state_dir=tmp_path / "state", schedules=[
        ScheduleConfig(probe="vit", interval_seconds=3600), ScheduleConfig(probe="llm", cron="0 2 * * *"),
    ])
    # a service of no GPUs: the jobs are scheduled for GPUs 0 and 1, and nothing ever runs
    service = ProbeService(config, [], simulated_executor(0.05), ProbeMetrics(CollectorRegistry()), IdleTracker(0.05))
    scheduler = ProbeScheduler(service, [0, 1])
    scheduler.start()
    try:
        scheduler.apply(config)
        before = {job.id: job.next_run_time for job in scheduler.scheduler.get_jobs()}
        assert len(before) == 4
        time.sleep(0.05)
        for _ in range(3):
            scheduler.apply(config.model_copy())
        assert {job.id: job.next_run_time for job in scheduler.scheduler.get_jobs()} == before
        # a changed option (same trigger) keeps the time too and takes the new settings
        changed = config.model_copy(update={"schedules": [config.schedules[0].model_copy(update={"caps": ["max"]}),
                                                          config.schedules[1]]})
        scheduler.apply(changed)
        jobs = {job.id: job for job in scheduler.scheduler.get_jobs()}
        assert {i: j.next_run_time for i, j in jobs.items()} == before
        assert jobs["0-vit-gpu0"].args[0].caps == ["max"]
        # a changed interval reschedules that job only
        slower = changed.model_copy(update={"schedules": [changed.schedules[0].model_copy(update={"interval_seconds": 7200}),
                                                          changed.schedules[1]]})
        scheduler.apply(slower)
        after = {job.id: job.next_run_time for job in scheduler.scheduler.get_jobs()}
        assert after["1-llm-gpu0"] == before["1-llm-gpu0"] and after["0-vit-gpu0"] != before["0-vit-gpu0"]
    finally:
        scheduler.stop()


def test_case7_sighup_storm_neither_adds_runs_nor_starves_a_schedule(start_daemon, tmp_path):
    state = tmp_path / "state"
    schedules = "    - {probe: vit, interval_seconds: 3600}\n    - {probe: attention, interval_seconds: 10}"
    daemon = start_daemon(config_text=daemon_config(state, schedules))
    assert wait_for(lambda: runs(daemon.url, "vit") == 1 and runs(daemon.url, "attention") == 1)
    deadline = time.monotonic() + 12.5
    while time.monotonic() < deadline:  # a SIGHUP every 0.5 s, no change: before the fix 0 more attention runs
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
    assert wait_for(lambda: runs(daemon.url, "attention") >= 2, timeout=5), daemon.log()
    assert runs(daemon.url, "vit") == 1  # the hourly schedule got no extra run from 25 reloads
    assert daemon.stop() == 0


# --- issue 19, case 3: restart-only settings warn and keep the running value ---------------------


def test_case3_reload_changing_state_dir_warns_and_keeps_the_journal_where_it_was(start_daemon, tmp_path):
    state, other = tmp_path / "state", tmp_path / "other"
    config = tmp_path / "gpuperfd.yaml"
    sweep = "    - {probe: vit, interval_seconds: 3600, caps: [max, 300], settle_seconds: 0}"
    text = daemon_config(state, sweep, writable=True)
    daemon = start_daemon(config_text=text)
    assert wait_for(lambda: runs(daemon.url, "vit") == 2)  # two caps
    config.write_text(text.replace(f"state_dir: {state}", f"state_dir: {other}")
                      .replace("simulated_measure_seconds: 0.2", "simulated_measure_seconds: 0.3")
                      .replace("vit, interval_seconds: 3600", "attention, interval_seconds: 3600"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: runs(daemon.url, "attention") == 2), daemon.log()
    log = daemon.log()
    assert "reload: probes.state_dir changed; it takes effect after a restart" in log
    assert "reload: probes.simulated_measure_seconds changed" in log
    assert list(state.glob("*.cap.lock")) and not other.exists()  # the sweep after the reload used the old dir
    assert daemon.stop() == 0


def test_issue50_a_reload_with_an_interval_shorter_than_the_probe_or_a_bad_share_changes_nothing(start_daemon, tmp_path):
    state = tmp_path / "state"
    good = daemon_config(state, "    - {probe: vit, interval_seconds: 3600}")
    daemon = start_daemon(config_text=good)
    config = tmp_path / "gpuperfd.yaml"
    assert wait_for(lambda: runs(daemon.url, "vit") == 1)
    # 3 caps x 0.2 s measured is 0.6 s: fine; 200 caps would be 40 s, longer than a 10 s interval
    caps = ", ".join(str(100 + w) for w in range(200))
    config.write_text(daemon_config(state, f"    - {{probe: vit, interval_seconds: 10, caps: [{caps}]}}", writable=True))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: daemon.log().count("reload rejected") == 1)
    assert "probes.schedules.0.interval_seconds: 10 s is shorter than one run" in daemon.log()
    config.write_text(good.replace("  idle_seconds: 0", "  max_gpu_time_ratio: 2\n  idle_seconds: 0"))
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: daemon.log().count("reload rejected") == 2)
    assert "probes.max_gpu_time_ratio: Input should be less than or equal to 1" in daemon.log()
    text = requests.get(daemon.url + "/metrics", timeout=5).text
    assert "gpuperf_probe_gpu_time_budget_ratio 0.01" in text  # the running share: nothing changed
    assert daemon.proc.poll() is None and daemon.stop() == 0

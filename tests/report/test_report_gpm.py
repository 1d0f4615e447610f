"""The report carries each cap's GPM means (tensor, DRAM) from the history into the CSV rows and the HTML."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.report.aggregate import build_report, point_rows
from gpuperfd.report.html import render_html
from gpuperfd.report.records import load_history
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading


def test_gpm_means_reach_the_report(tmp_path):
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=2))
    tracker = IdleTracker(0.05)
    tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    history = tmp_path / "history.jsonl"
    service = ProbeService(
        ProbesConfig(state_dir=tmp_path / "state", idle_seconds=0, read_only=False), backend.devices(),
        simulated_executor(0.05, seed=1), ProbeMetrics(CollectorRegistry()), tracker, HistoryWriter(history),
    )
    service.run(ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 400], settle_seconds=0), 0)
    report = build_report(load_history([history]), remove_outliers=False)
    rows = {row["cap_watts"]: row for row in point_rows(report)}
    assert set(rows) == {700.0, 400.0}
    for row in rows.values():
        assert row["gpm_dram_active_ratio"] > 0.5 > row["gpm_tensor_active_ratio"]  # decode is memory-bound
    html = render_html(report, None, None, None, {})
    assert "tensor active" in html and "DRAM active" in html

"""The drift thresholds of the health checks are those of the drift alerts: one set of numbers."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuperfd.health.checks import PEER_MIN_COUNT, by_id

ROOT = Path(__file__).resolve().parents[2]


def test_alert_rules_use_the_check_table_thresholds():
    rules = {r["alert"]: r["expr"] for g in yaml.safe_load((ROOT / "deploy/prometheus/rules/alerts.yml").read_text())
             ["groups"] for r in g["rules"] if "alert" in r}
    checks = by_id()
    assert f"< {checks['probe_throughput_baseline'].threshold.default:.2f}" in rules["GpuProbeThroughputDrift"]
    assert f"> {checks['probe_energy_baseline'].threshold.default:.2f}" in rules["GpuProbeEnergyDrift"]
    assert f"< {checks['probe_slower_than_peers'].threshold.default:.2f}" in rules["GpuSlowerThanPeers"]
    assert f">= {PEER_MIN_COUNT.default:.0f}" in rules["GpuSlowerThanPeers"]

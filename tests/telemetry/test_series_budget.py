"""Series per GPU with the default probe set stays under the documented budget (docs/metrics.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.config import ScheduleConfig, config_from_mapping
from gpuperfd.daemon import Daemon

ROOT = Path(__file__).resolve().parents[2]
BUDGET_PER_GPU = 540  # docs/metrics.md, "Series budget", has the arithmetic


@pytest.mark.parametrize(
    "mig, expected",
    [
        # simulated H100 SXM: 18 NVLink links, GPM, MIG off
        (False, 420),
        # the worst case: MIG on with 7 instances (5 series each) and probes allowed on it
        (True, 420 + 7 * 5),
    ],
)
def test_default_probe_set_stays_within_the_series_budget(tmp_path, mig, expected):
    defaults = yaml.safe_load((ROOT / "examples/probes-default.yaml").read_text())["probes"]
    config = config_from_mapping({
        "device": {"backend": "simulated"},
        "simulation": {"gpus": 2, "seed": 1, "mig": [{"gpu": g, "instances": 7} for g in (0, 1)] if mig else []},
        "web": {"listen_address": "127.0.0.1:0"},
        "probes": {**defaults, "state_dir": str(tmp_path), "history": {"path": None}, "idle_seconds": 0,
                   "simulated_measure_seconds": 0.02, "allow_mig": mig,
                   "stop_early": False},  # the budget counts every cap of every probe
    })
    daemon = Daemon(config)
    daemon.sampler.sample_once()
    schedules = [ScheduleConfig(**{**s.model_dump(), "settle_seconds": 0}) for s in config.probes.schedules]
    for gpu in (0, 1):
        for schedule in schedules:
            assert daemon.probes.run(schedule, gpu).result == "ok"
        # one more run at the operator's cap: fills the latency histograms too
        for schedule in schedules:
            daemon.probes.run(schedule.model_copy(update={"caps": ["current"]}), gpu)
    daemon.health.evaluate_once()  # a healthy GPU: 4 state + 7 action series, no reason series
    daemon.scheduler.apply(config.probes)  # coverage (issue 50): a due series per probe; free time per GPU
    daemon.scheduler.dispatch_once()
    text = daemon.exporter.render().decode()
    daemon.web.stop()
    per_gpu = {"0": 0, "1": 0}
    node_level = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            gpu = sample.labels.get("gpu")
            if gpu in per_gpu:
                per_gpu[gpu] += 1
            else:
                node_level += 1
    assert per_gpu["0"] == per_gpu["1"]
    assert per_gpu["0"] == expected, per_gpu  # a change here is a change to docs/metrics.md's table
    assert 150 < per_gpu["0"] <= BUDGET_PER_GPU, per_gpu
    assert node_level < 60  # build info, process_*, scheduler counters
    print(f"series per GPU with the default probe set: {per_gpu['0']}; node-level: {node_level}")

"""Issue 34, item 1: a real CPU attention run's report has latency points (not simulated records).

The attention probe, the simulator and the report use one name for per-iteration latency
(``iteration_seconds``); records written before it (``batch_seconds``) still read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpuperfd.cli import main
from gpuperfd.probe_data.result import MAIN_LATENCY, ProbeResult

pytest.importorskip("matplotlib")

FAST = ["--repeats", "2", "--measure-seconds", "0.1", "--warmup", "1", "--no-idle-check", "--no-progress"]


def test_real_cpu_attention_run_has_latency_in_every_output(tmp_path: Path) -> None:
    runs = tmp_path / "attention.jsonl"
    assert main(["probe", "attention", "--preset", "tiny", "--n-groups", "1", "2", *FAST,
                 "--output", str(runs)]) == 0
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        latencies = record["result"]["latencies"]
        assert list(latencies) == ["iteration_seconds"] and len(latencies["iteration_seconds"]) > 2
    out = tmp_path / "r"
    assert main(["report", "--history", str(runs), "--out", str(out)]) == 0
    with (out / "points.csv").open() as handle:
        points = list(csv.DictReader(handle))
    assert len(points) == 2
    for row in points:
        assert row["latency"] == "iteration_seconds"
        assert 0 < float(row["latency_p50_seconds"]) <= float(row["latency_p99_seconds"])
        assert float(row["latency_mean_seconds"]) > 0
    from gpuperfd.report import build_report, load_history
    from gpuperfd.report.figures import axes_figure, empty_panels

    fig = axes_figure(build_report(load_history([runs])))
    assert fig is not None and empty_panels(fig) == []


def test_old_attention_records_with_batch_seconds_still_read(tmp_path: Path) -> None:
    old = ProbeResult.from_dict({"probe": "attention", "variant": "sdpa", "preset": "tiny",
                                 "latencies": {"batch_seconds": [0.001, 0.002]},
                                 "extra": {"latency_stats": {"batch_seconds": {"mean": 0.0015}}}})
    assert old.latencies == {"iteration_seconds": [0.001, 0.002]}
    assert old.extra["latency_stats"] == {"iteration_seconds": {"mean": 0.0015}}
    vit = ProbeResult.from_dict({"probe": "vit", "variant": "eager", "preset": "tiny",
                                 "latencies": {"batch_seconds": [0.01]}})
    assert vit.latencies == {"batch_seconds": [0.01]}  # vit's batch latency is its own name
    assert MAIN_LATENCY["attention"] == "iteration_seconds"

"""`gpuperfd report`: sections present, numbers equal to the recorded history, outliers, comparisons, Prometheus.

The expected numbers are computed here straight from the JSON lines (numpy for
percentiles, the rule written out again), not with the report's own code.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import re
import shutil
import statistics
import struct
import subprocess
import time
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import free_port
from daemon_configs import simulated_daemon
from child_processes import end

from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.commands import report as cli
from gpuperfd.report.outliers import split_outliers
from gpuperfd.report.prometheus import load_prometheus, parse_time
from gpuperfd.report.records import GpuId, ReportError, Run

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "history-h100-sim.jsonl"
A100 = DATA / "history-a100-sim.jsonl"
LATENCY = {"llm": "tpot_seconds", "vit": "batch_seconds", "attention": "iteration_seconds", "train": "step_seconds"}
SECTIONS = ("header", "recommendations", "power-cap", "batch-size", "compare", "points", "outliers", "files")


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gpuperfd")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", *argv])
    return args.func(args)


def lines(*paths: Path) -> list[dict]:
    return [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]


# --- expectations straight from the history ------------------------------------------------


def expected_points(records: list[dict]) -> dict[tuple, dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        result = record["result"]
        if result["status"] == "ok":
            key = (record["gpu"]["uuid"], result["probe"], result["preset"], result["params"]["batch_size"],
                   float(record["power_cap_watts"]))
            groups[key].append(result)
    out = {}
    for key, results in groups.items():
        pooled = [v for r in results for v in r["latencies"][LATENCY[key[1]]]]
        out[key] = {
            "runs": len(results),
            "rate": statistics.fmean(r["units_of_work"] / r["measured_seconds"] for r in results),
            "energy": statistics.fmean(r["energy_per_unit_joules"] for r in results),
            "power": statistics.fmean(r["average_power_watts"] for r in results),
            "p50": float(np.percentile(pooled, 50)),
            "p95": float(np.percentile(pooled, 95)),
            "p99": float(np.percentile(pooled, 99)),
        }
    return out


def latest_points(records: list[dict]) -> dict[tuple, dict]:
    """The recommendation's input, written out by hand: the latest ok run at each cap (a failed run
    withdraws its cap), as the daemon's probe series hold them."""
    out: dict[tuple, dict] = {}
    for record in sorted(records, key=lambda r: r["result"]["started_at"]):
        result = record["result"]
        key = (record["gpu"]["uuid"], result["probe"], result["preset"], result["params"]["batch_size"],
               float(record["power_cap_watts"]))
        if result["status"] == "ok":
            out[key] = {"rate": result["units_of_work"] / result["measured_seconds"],
                        "energy": result["energy_per_unit_joules"], "power": result["average_power_watts"]}
        elif result.get("failure_reason") != "preempted":
            out.pop(key, None)
    return out


def expected_recommendations(points: dict[tuple, dict], max_slowdown: float = 0.10) -> dict[tuple, dict]:
    series: dict[tuple, dict[float, dict]] = defaultdict(dict)
    for (uuid, probe, preset, batch, cap), values in points.items():
        series[(uuid, probe, preset, batch)][cap] = values
    out = {}
    for key, caps in series.items():
        base_cap = max(caps)
        base = caps[base_cap]
        eligible = [c for c in caps if caps[c]["rate"] >= (1 - max_slowdown) * base["rate"]]
        cap = min(eligible, key=lambda c: (caps[c]["energy"], -c))
        out[key] = {
            "cap": cap, "baseline": base_cap,
            "saving": 1 - caps[cap]["energy"] / base["energy"],
            "slowdown": 1 - caps[cap]["rate"] / base["rate"],
        }
    return out


# --- reading the output --------------------------------------------------------------------


class Tables(HTMLParser):
    """Rows of each <section> (by id): the row's attributes and its cells as (text, data-value)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[dict]] = defaultdict(list)
        self.ids: list[str] = []
        self.images = 0
        self._section = ""
        self._row: dict | None = None
        self._cell: list | None = None

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        attrs = dict(attrs)
        if tag in ("section", "header") and attrs.get("id"):
            self._section = attrs["id"]
            self.ids.append(attrs["id"])
        elif tag == "tr":
            self._row = {"attrs": attrs, "cells": []}
            self.sections[self._section].append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = ["", attrs.get("data-value")]
            self._row["cells"].append(self._cell)
        elif tag == "img" and (attrs.get("src") or "").startswith("data:image/png;base64,"):
            self.images += 1

    def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
        if tag == "td":
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):  # type: ignore[no-untyped-def]
        if self._cell is not None:
            self._cell[0] += data


def parse_html(path: Path) -> tuple[str, Tables]:
    text = path.read_text()
    tables = Tables()
    tables.feed(text)
    return text, tables


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def row_key(attrs: dict) -> tuple:
    return (attrs["data-gpu"], attrs["data-probe"], attrs["data-preset"], int(attrs["data-batch"]))


# --- the tests ------------------------------------------------------------------------------


def test_report_from_recorded_history_has_every_section_and_its_numbers(tmp_path, capsys):
    out = tmp_path / "report"
    assert run_cli("--history", str(H100), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    for name in ("report.html", "report.png", "summary.csv", "points.csv"):
        assert (out / name).stat().st_size > 0 and str(out / name) in printed

    html, tables = parse_html(out / "report.html")
    # one variant on one GPU: nothing to compare side by side, so that section is left out
    assert tables.ids == [s for s in SECTIONS if s != "compare"]
    assert tables.images == 2  # power-cap and parameter (batch size) figures, embedded; one variant: no bars
    assert "<script" not in html.lower()
    # header: date, nodes, GPUs, driver
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert re.search(rf'<b id="generated">{today} \d\d:\d\d UTC</b>', html)
    assert '<b id="nodes">sim-h100-node</b>' in html and '<b id="drivers">580.159.04-sim</b>' in html
    gpu_rows = [[c[0] for c in r["cells"]] for r in tables.sections["header"] if r["cells"]]
    assert gpu_rows == [["sim-h100-node", "0", "NVIDIA H100 80GB HBM3", "H100 80GB HBM3",
                         "GPU-92ad249e-166b-f163-0ec2-ffa375741149", "580.159.04-sim", "9.0", "80 GiB", "simulated", "90"]]
    assert "Simulated GPUs" in html
    assert "against power cap" in html.lower() and "against the parameters that vary" in html.lower()
    width, height = png_size(out / "report.png")
    assert width >= 1200 and height >= 1500

    records = lines(H100)
    points = expected_points(records)
    latest = latest_points(records)
    recs = expected_recommendations(latest)
    assert len(points) == 30 and all(p["runs"] == 3 for p in points.values())

    # points.csv and the HTML points table: every cap of every series
    csv_points = {(r["gpu_uuid"], r["probe"], r["preset"], int(r["batch_size"]), float(r["cap_watts"])): r
                  for r in read_csv(out / "points.csv")}
    assert set(csv_points) == set(points)
    html_points = {(*row_key(r["attrs"]), float(r["attrs"]["data-cap"])): [c[1] for c in r["cells"]]
                   for r in tables.sections["points"] if r["cells"]}
    assert set(html_points) == set(points)
    for key, want in points.items():
        row = csv_points[key]
        assert int(row["runs"]) == want["runs"] and int(row["outliers_dropped"]) == 0
        for column, name in (("units_per_second", "rate"), ("energy_per_unit_joules", "energy"),
                             ("average_power_watts", "power"), ("latency_p50_seconds", "p50"),
                             ("latency_p95_seconds", "p95"), ("latency_p99_seconds", "p99")):
            assert float(row[column]) == pytest.approx(want[name], rel=1e-9), (key, column)
        assert row["latency"] == LATENCY[key[1]]
        cells = html_points[key]
        assert float(cells[6]) == key[4] and int(float(cells[7])) == want["runs"]
        for index, name in ((9, "rate"), (11, "energy"), (12, "power"), (14, "p50"), (15, "p95"), (16, "p99")):
            assert float(cells[index]) == pytest.approx(want[name], rel=1e-9), (key, name)
        assert int(row["recommended"]) == (recs[key[:4]]["cap"] == key[4])
        assert int(row["baseline"]) == (recs[key[:4]]["baseline"] == key[4])

    # summary.csv and the recommendations table: the recommended cap, its saving and slowdown
    summary = {(r["gpu_uuid"], r["probe"], r["preset"], int(r["batch_size"])): r for r in read_csv(out / "summary.csv")}
    html_recs = {row_key(r["attrs"]): r["cells"] for r in tables.sections["recommendations"] if r["cells"]}
    assert set(summary) == set(recs) == set(html_recs)
    for key, want in recs.items():
        row = summary[key]
        assert float(row["recommended_cap_watts"]) == want["cap"] and float(row["baseline_cap_watts"]) == want["baseline"]
        assert float(row["energy_saving_ratio"]) == pytest.approx(want["saving"], rel=1e-9)
        assert float(row["slowdown_ratio"]) == pytest.approx(want["slowdown"], rel=1e-9)
        assert 0 <= want["slowdown"] <= 0.10
        # issue 35: the watts the recommended cap saves while the GPU runs the work
        watts = max(0.0, latest[(*key, want["baseline"])]["power"] - latest[(*key, want["cap"])]["power"])
        assert float(row["power_saving_watts"]) == pytest.approx(watts, rel=1e-9)
        assert f"{100 * want['slowdown']:.1f}% slower than {want['baseline']:.0f} W; {watts:.0f} W less while busy)" in printed
        assert row["kind"] == ("training" if key[1] == "train" else "inference")
        cells = html_recs[key]
        assert cells[0][0] == "H100 80GB HBM3" and cells[1][0] == key[1]
        assert float(cells[6][1]) == want["cap"] and cells[6][0] == f"{want['cap']:.0f} W"
        assert float(cells[8][1]) == pytest.approx(want["saving"], rel=1e-9)
        assert cells[8][0] == f"{100 * want['saving']:.1f}%" and cells[9][0] == f"{100 * want['slowdown']:.1f}%"
        assert f"{want['cap']:.0f} W ({100 * want['saving']:.1f}% less energy" in printed
    # the simulated H100 has a non-trivial optimum for llm: below the highest cap
    assert recs[("GPU-92ad249e-166b-f163-0ec2-ffa375741149", "llm", "gpt2", 8)]["cap"] < 700


def test_comparison_of_two_histories_names_both_gpus(tmp_path, capsys):
    out = tmp_path / "compare"
    assert run_cli("--history", str(H100), str(A100), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 GPU(s), 12 series, 180 runs")
    html, tables = parse_html(out / "report.html")
    assert tables.ids == list(SECTIONS)
    assert '<b id="nodes">sim-a100-node, sim-h100-node</b>' in html
    names = {r["cells"][2][0] for r in tables.sections["header"] if r["cells"]}
    assert names == {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}
    labels = {(r["cells"][0][0], r["cells"][1][0]) for r in tables.sections["recommendations"] if r["cells"]}
    assert labels == {(gpu, probe) for gpu in ("H100 80GB HBM3", "A100-SXM4-80GB") for probe in ("llm", "vit", "train")}
    summary = read_csv(out / "summary.csv")
    assert {r["gpu_name"] for r in summary} == {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}
    recs = expected_recommendations(latest_points(lines(H100, A100)))
    for row in summary:
        want = recs[(row["gpu_uuid"], row["probe"], row["preset"], int(row["batch_size"]))]
        assert float(row["recommended_cap_watts"]) == want["cap"]
        assert float(row["energy_saving_ratio"]) == pytest.approx(want["saving"], rel=1e-9)
    assert "A100-SXM4-80GB llm/gpt2 b=8" in printed and "H100 80GB HBM3 llm/gpt2 b=8" in printed
    png_size(out / "report.png")


def test_outliers_are_removed_by_the_documented_rule(tmp_path):
    records = lines(H100)
    target = next(r for r in records if r["result"]["probe"] == "llm" and r["result"]["params"]["batch_size"] == 8
                  and r["power_cap_watts"] == 700)
    slow = copy.deepcopy(target)
    slow["time"] += 1
    slow["result"]["units_of_work"] *= 0.7  # a disturbed run: 30% slower, 43% more energy per token
    slow["result"]["energy_per_unit_joules"] /= 0.7
    failed = copy.deepcopy(target)
    failed["time"] += 2
    failed["result"] = ProbeResult.failure("llm", "simulated", "gpt2", "oom", "CUDA out of memory",
                                           params={"batch_size": 8}).to_dict()
    history = tmp_path / "history.jsonl"
    history.write_text(H100.read_text() + json.dumps(slow) + "\n" + json.dumps(failed) + "\n" + "{not json\n"
                       + json.dumps({"time": 1, "result": {"probe": "llm"}}) + "\n")

    out = tmp_path / "out"
    assert run_cli("--history", str(history), "--out", str(out)) == 0
    key = (target["gpu"]["uuid"], "llm", "gpt2", 8, 700.0)
    want = expected_points(records)[key]  # the three undisturbed runs
    row = next(r for r in read_csv(out / "points.csv")
               if (r["gpu_uuid"], r["probe"], r["preset"], int(r["batch_size"]), float(r["cap_watts"])) == key)
    assert (int(row["runs"]), int(row["outliers_dropped"])) == (3, 1)
    assert float(row["units_per_second"]) == pytest.approx(want["rate"], rel=1e-9)
    html, tables = parse_html(out / "report.html")
    dropped = [[c[0] for c in r["cells"]] for r in tables.sections["outliers"] if r["cells"]]
    assert len(dropped) == 2  # one outlier, one failed run
    assert dropped[0][3:7] == ["llm", "gpt2", "8", "700"] and dropped[0][7].startswith("throughput ")
    assert dropped[1][3:] == ["llm", "gpt2", "8", "700", "failed", "oom"]
    assert "Runs: <b>92</b> (90 kept, 1 outliers removed, 0 skipped, 1 failed)" in html
    assert "2 line(s) skipped as not runs" in html  # the malformed line and the record that is not a run  # the record that is not a probe run

    kept = tmp_path / "kept"
    assert run_cli("--history", str(history), "--out", str(kept), "--keep-outliers") == 0
    row = next(r for r in read_csv(kept / "points.csv")
               if (r["gpu_uuid"], r["probe"], r["preset"], int(r["batch_size"]), float(r["cap_watts"])) == key)
    assert (int(row["runs"]), int(row["outliers_dropped"])) == (4, 0)


def test_early_stop_skips_are_counted_apart_from_failed_runs(tmp_path, capsys):
    """A sweep's early stop is not a failure: the header counts it as skipped (early stop)."""
    records = lines(H100)
    target = next(r for r in records if r["result"]["probe"] == "llm" and r["power_cap_watts"] == 700)
    skipped = copy.deepcopy(target)
    skipped["time"] += 1
    skipped["power_cap_watts"] = 200
    skipped["result"] = ProbeResult.failure("llm", "simulated", "gpt2", "early_stop", "300 W was already slower",
                                            status="skipped", params={"batch_size": 8}).to_dict()
    history = tmp_path / "history.jsonl"
    history.write_text(H100.read_text() + json.dumps(skipped) + "\n")
    out = tmp_path / "out"
    assert run_cli("--history", str(history), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "(90 kept, 0 outliers removed, 1 skipped (early stop), 0 failed)" in printed
    html, tables = parse_html(out / "report.html")
    assert "Runs: <b>91</b> (90 kept, 0 outliers removed, 1 skipped (early stop), 0 failed)" in html
    assert "<h3>Failed (0)</h3>" in html and "<h3>Skipped on purpose (1)</h3>" in html


def _run(rate: float, energy: float = 1.0, cap: float = 500.0) -> Run:
    return Run(time=0.0, gpu=GpuId("n", 0, "GPU-x"), cap_watts=cap, probe="llm", preset="gpt2", batch_size=8,
               rate=rate, energy_per_unit=energy)


def test_outlier_rule_edges():
    # Three runs with ordinary noise: the MAD is tiny, the 5% floor keeps them all.
    kept, dropped = split_outliers([_run(100.0), _run(100.4), _run(101.5)])
    assert len(kept) == 3 and not dropped
    # Five runs, one 20% off: dropped; by energy alone too.
    runs = [_run(v) for v in (100, 101, 99, 100.5, 80)] + [_run(100, e) for e in (1.0, 1.01, 0.99, 1.3)]
    kept, dropped = split_outliers(runs)
    assert sorted((d.metric, d.value) for d in dropped) == [("energy per unit", 1.3), ("throughput", 80)]
    # Identical runs (MAD 0) and one 10% off: dropped by the relative bound; 3% off: kept.
    kept, dropped = split_outliers([_run(100), _run(100), _run(100), _run(90), _run(97)])
    assert [d.value for d in dropped] == [90]
    # Two runs, or runs at different caps, are never judged against each other.
    assert not split_outliers([_run(100), _run(50)])[1]
    assert not split_outliers([_run(100, cap=700), _run(100, cap=700), _run(50, cap=300)])[1]


def test_cli_usage_and_input_errors(tmp_path, capsys):
    assert run_cli("--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path)) == 2
    assert "needs --start" in capsys.readouterr().err
    assert run_cli("--history", str(H100), "--max-slowdown", "1.5") == 2
    assert run_cli("--history", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)) == 1
    assert "no such file or folder" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert run_cli("--history", str(empty), "--out", str(tmp_path)) == 1
    assert "no probe runs" in capsys.readouterr().err
    assert run_cli("--prometheus", "http://127.0.0.1:9", "--start", "now-1h", "--out", str(tmp_path)) == 1
    assert "Prometheus http://127.0.0.1:9" in capsys.readouterr().err
    assert run_cli("--prometheus", "http://127.0.0.1:9", "--start", "yesterday", "--out", str(tmp_path)) == 2


def test_time_parsing():
    assert parse_time("1700000000") == 1700000000.0
    assert parse_time("2025-06-01T12:00:00Z") == 1748779200.0
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("now-1h", now=10_000.0) == parse_time("-1h", now=10_000.0) == 6400.0
    with pytest.raises(ReportError):
        parse_time("soon")


def test_prometheus_gauges_become_one_run_per_change():
    labels = {"instance": "node-a:9400", "job": "gpuperfd", "gpu": "0", "uuid": "GPU-1", "probe": "llm",
              "preset": "gpt2", "unit": "token"}

    def matrix(metric, by_cap):
        return [{"metric": {**labels, "power_cap": cap}, "values": [[t, str(v)] for t, v in values]}
                for cap, values in by_cap.items()]

    rates = {"700": [(100, 1000.0), (115, 1000.0), (130, 1000.0), (145, 1010.0), (160, 1010.0)],
             "400": [(100, 800.0), (115, 800.0)]}
    energy = {"700": [(100, 0.5), (115, 0.5), (130, 0.5), (145, 0.49), (160, 0.49)], "400": [(100, 0.4), (115, 0.4)]}
    power = {"700": [(t, 500.0) for t in (100, 115, 130, 145, 160)], "400": [(100, 320.0), (115, 320.0)]}
    info = [{"metric": {"__name__": "gpuperf_gpu_info", "instance": "node-a:9400", "gpu": "0", "uuid": "GPU-1",
                        "name": "NVIDIA H100 80GB HBM3", "driver_version": "550.1", "compute_capability": "9.0",
                        "backend": "nvml", "pci_bus_id": "x"}, "values": [[100, "1"]]}]
    answers = {
        "gpuperf_probe_work_units_per_second": matrix("rate", rates),
        "gpuperf_probe_energy_per_unit_joules": matrix("energy", energy),
        "gpuperf_probe_average_power_watts": matrix("power", power),
        "gpuperf_probe_gpu_busy_ratio": [],
        "gpuperf_gpu_info": info,
    }
    asked = []

    def fetch(url):
        asked.append(url)
        query = re.search(r"query=([^&]+)", url).group(1)
        assert "/api/v1/query_range?" in url and "step=15" in url
        return {"status": "success", "data": {"resultType": "matrix", "result": answers[query]}}

    loaded = load_prometheus("http://prom:9090/", 100.0, 200.0, fetch=fetch)
    assert len(asked) == 5 and all(u.startswith("http://prom:9090/api/v1/query_range") for u in asked)
    runs = sorted(loaded.runs, key=lambda r: (r.cap_watts, r.time))
    assert [(r.cap_watts, r.time, r.rate, r.energy_per_unit, r.power) for r in runs] == [
        (400.0, 100, 800.0, 0.4, 320.0), (700.0, 100, 1000.0, 0.5, 500.0), (700.0, 145, 1010.0, 0.49, 500.0)]
    assert runs[0].gpu.name == "NVIDIA H100 80GB HBM3" and runs[0].gpu.node == "node-a:9400"
    assert runs[0].batch_size == 128 and runs[0].work_unit == "token"  # gpt2 preset default


# --- end to end through a real Prometheus ----------------------------------------------------

DAEMON_CONFIG = """
{daemon}  first_run_delay_seconds: 0.5
  simulated_measure_seconds: 0.3
  schedules:
    - probe: llm
      interval_seconds: 3600
      caps: [max, 550, 400, 250]
      settle_seconds: 0.1
    - probe: train
      interval_seconds: 3600
      caps: [max, 550, 400]
      settle_seconds: 0.1
"""


def wait_for(predicate, timeout, what):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except requests.RequestException:
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def gauge_values(metrics: str, name: str) -> dict[tuple[str, str], float]:
    out = {}
    for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", metrics, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[(pairs["probe"], pairs["power_cap"])] = float(value)
    return out


@pytest.mark.prometheus
def test_report_from_a_real_prometheus(start_daemon, tmp_path, capsys):
    exe = shutil.which("prometheus")
    assert exe, "prometheus is required (apt-get install prometheus); scripts/test.sh installs it"
    daemon = start_daemon(config_text=DAEMON_CONFIG.format(daemon=simulated_daemon(tmp_path / "state", gpus=1, seed=4, writable=True)))
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: gpuperfd\n    static_configs: [{{targets: ['127.0.0.1:{daemon.port}']}}]\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def published() -> bool:
            metrics = requests.get(daemon.url + "/metrics", timeout=5).text
            return metrics.count("gpuperf_probe_energy_per_unit_joules{") == 7 and not re.search(
                r"^gpuperf_sweep_in_progress\{[^}]*\} 1", metrics, re.M)

        wait_for(published, 60, "both sweeps")
        metrics = requests.get(daemon.url + "/metrics", timeout=5).text

        def scraped() -> bool:
            body = requests.get(url + "/api/v1/query", params={"query": "count(gpuperf_probe_energy_per_unit_joules)"},
                                timeout=5).json()
            result = body["data"]["result"]
            return bool(result) and result[0]["value"][1] == "7"

        wait_for(scraped, 60, "Prometheus to scrape every probe series")
        out = tmp_path / "report"
        assert run_cli("--prometheus", url, "--start", "now-10m", "--end", "now", "--step", "1s", "--out", str(out)) == 0
    finally:
        end(prom)
        log.close()
    assert "1 GPU(s), 2 series, 7 runs" in capsys.readouterr().out
    rates = gauge_values(metrics, "gpuperf_probe_work_units_per_second")
    energy = gauge_values(metrics, "gpuperf_probe_energy_per_unit_joules")
    rows = read_csv(out / "points.csv")
    assert len(rows) == 7
    for row in rows:
        key = (row["probe"], f"{float(row['cap_watts']):.0f}")
        assert row["gpu_name"] == "NVIDIA H100 80GB HBM3" and row["node"] == f"127.0.0.1:{daemon.port}"
        assert float(row["units_per_second"]) == pytest.approx(rates[key], rel=1e-12)
        assert float(row["energy_per_unit_joules"]) == pytest.approx(energy[key], rel=1e-12)
        assert row["latency_p50_seconds"] == ""  # Prometheus keeps no per-cap latency samples
    html, tables = parse_html(out / "report.html")
    # Prometheus gives no batch sizes and one GPU: no parameter or comparison charts, so no such sections
    assert tables.ids == [s for s in SECTIONS if s not in ("batch-size", "compare")]
    assert "no per-cap latency percentiles" in html


def test_simulated_train_loss_has_a_panel_and_inference_columns_say_they_have_none(tmp_path):
    """Seed 001: the simulated train sweep fills the loss, so the cap grid gets its loss row; the
    inference column's loss panel is not counted as missing data (llm has no loss by nature)."""
    from gpuperfd.cli import main
    from gpuperfd.report import build_report, load_history
    from gpuperfd.report.figures import cap_figure, cap_rows, empty_panels

    config = tmp_path / "sim.yaml"
    config.write_text("probes:\n  simulated_measure_seconds: 0.2\n")
    out = tmp_path / "runs.jsonl"
    assert main(["sweep", "--simulate", "1", "--config", str(config), "--probe", "llm,train", "--caps", "700,400",
                 "--no-stop-early", "--settle", "0", "--state-dir", str(tmp_path / "s"), "--no-progress",
                 "--output", str(out)]) == 0
    report = build_report(load_history([out]))
    assert "loss" in cap_rows(report, [("llm", "gpt2"), ("train", "gpt2")])
    train = [s for s in report.series if s.probe == "train"]
    assert train and all(p.loss is not None and p.loss > 0 for s in train for p in s.points)
    assert empty_panels(cap_figure(report)) == []


def test_runs_with_wrong_results_are_marked(tmp_path, capsys):
    records = lines(H100)
    target = next(r for r in records if r["result"]["probe"] == "llm" and r["power_cap_watts"] == 700)
    wrong = copy.deepcopy(target)
    wrong["time"] += 3
    result = ProbeResult.failure("llm", "simulated", "gpt2", "wrong_result", "wrong result: repeat, slice",
                                 params={"batch_size": 8}, device=target["result"]["device"],
                                 gpu_uuid=target["gpu"]["uuid"], gpu_name=target["gpu"]["name"])
    result.correctness = {"status": "mismatch", "checks": 2, "max_abs_error": 0.5, "max_rel_error": 0.4,
                          "elements_checked": 4096}
    wrong["result"] = result.to_dict()
    history = tmp_path / "history.jsonl"
    history.write_text(H100.read_text() + json.dumps(wrong) + "\n")
    out = tmp_path / "out"
    assert run_cli("--history", str(history), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert f"WRONG RESULTS: 1 run(s) computed wrong numbers on GPU(s) sim-h100-node/{target['gpu']['index']} " in printed
    html, tables = parse_html(out / "report.html")
    failed = [[c[0] for c in r["cells"]] for r in tables.sections["outliers"] if r["cells"]]
    assert failed[-1][-1] == "WRONG RESULT (wrong_result)"
    assert '<tr class="wrong-result">' in html and "1 run(s) computed wrong numbers" in html

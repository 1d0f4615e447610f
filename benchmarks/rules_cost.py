"""What gpuperfd's Prometheus rules cost as the fleet grows (issue 15).

For each fleet size (GPUs, 8 per node): write a synthetic fleet as OpenMetrics
(a week, or --history-days, of probe results at the 15-minute points the
baselines sample, plus a live window of telemetry and probe series around
"now"), turn it into TSDB blocks with `promtool tsdb create-blocks-from
openmetrics`, start a real Prometheus on them with the repository's rule files
(every group's interval set to --interval so each evaluates within the run;
expressions unchanged, gpuperfd.fleet.accelerate_rules), and record:

  * per rule group: evaluationTime from /api/v1/rules (seconds, the last
    evaluation, after --evaluations rounds),
  * Prometheus memory: process RSS (/proc) and go_memstats_heap_inuse_bytes,
    head series (prometheus_tsdb_head_series),
  * dashboard query latency: every query of gpuperfd.dashboards.all_panel_queries()
    as an instant query at now, p50 / p95 / max / sum.

The live window runs into the future (to --live-minutes after the start), so
the rules find current samples however long the backfill takes.

Usage (outside CI; a few minutes per 1,000 GPUs on 2 cores):
  python benchmarks/rules_cost.py --sizes 100 1000 5000 --history-days 7 7 1 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuperfd.dashboards import all_panel_queries
from gpuperfd.fleet.prometheus import LOOPBACK_OPENER, accelerate_rules, free_ports, http_get_json
from gpuperfd.fleet.spec import RULE_FILES, RULES_DIR

GPUS_PER_NODE = 8
MODEL = "NVIDIA H100 80GB HBM3"
PROBES = {"llm": ("gpt2", "token", 9000.0), "vit": ("vit-b16", "image", 3000.0),
          "attention": ("default", "iteration", 800.0), "train": ("gpt2", "step", 12.0)}
CAPS = (700, 600, 500, 400, 300)  # docs/scaling.md's 4 probes x 5 caps
CLOCK_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                 "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")
COLLECTORS = ("info", "utilization", "memory", "temperature", "power", "power_limits", "energy", "clocks",
              "clock_events", "pcie", "ecc", "processes")
STEP_HISTORY = 900
STEP_LIVE = 120


def gpu_labels(node: int, gpu: int) -> str:
    return f'job="gpuperfd",instance="node-{node:05d}:10187",gpu="{gpu}",uuid="GPU-{node:05d}-{gpu}"'


def fleet_lines(gpus: int, now: int, history_days: float, live_minutes: float):
    """OpenMetrics lines of a synthetic fleet; families contiguous, samples in time order."""
    hist = [t for t in range(int(now - history_days * 86400) // STEP_HISTORY * STEP_HISTORY, now - 1800, STEP_HISTORY)]
    live = list(range(now - 16 * 60, int(now + live_minutes * 60), STEP_LIVE))
    ids = [(g // GPUS_PER_NODE, g % GPUS_PER_NODE) for g in range(gpus)]

    def gauge(name: str, points, series):  # series: (labels, value function of t)
        yield f"# TYPE {name} gauge"
        for labels, value in series:
            for t in points:
                yield f"{name}{{{labels}}} {value(t):g} {t}"

    def counter(name: str, series):
        yield f"# TYPE {name} counter"
        for labels, value in series:
            for t in live:
                yield f"{name}_total{{{labels}}} {value(t):g} {t}"

    # Probe results: history at the 15-min points, then the live window.
    probe_points = hist + live
    for name, scale in (("gpuperf_probe_work_units_per_second", 1.0), ("gpuperf_probe_energy_per_unit_joules", None)):
        series = []
        for n, g in ids:
            for probe, (preset, unit, rate) in PROBES.items():
                for cap in CAPS:
                    speed = rate * min(1.0, (cap / 700) ** 0.35) * (1 + 0.002 * ((n * 7 + g * 3 + cap) % 5 - 2))
                    v = speed if scale else cap * 0.8 / speed
                    series.append((f'{gpu_labels(n, g)},probe="{probe}",preset="{preset}",power_cap="{cap}",unit="{unit}"',
                                   lambda t, v=v: v))
        yield from gauge(name, probe_points, series)
    yield from gauge("gpuperf_probe_power_cap_watts", live, [
        (f'{gpu_labels(n, g)},probe="{p}",preset="{s}",power_cap="{c}"', lambda t, c=c: c)
        for n, g in ids for p, (s, _, _) in PROBES.items() for c in CAPS])
    yield from gauge("gpuperf_probe_last_run_timestamp_seconds", live, [
        (f'{gpu_labels(n, g)},probe="{p}",preset="{s}"', lambda t: t - 600) for n, g in ids for p, (s, _, _) in PROBES.items()])
    yield from counter("gpuperf_probe_runs", [
        (f'{gpu_labels(n, g)},probe="{p}",preset="{s}",result="{r}",reason="{r}"', lambda t: 10)
        for n, g in ids for p, (s, _, _) in PROBES.items() for r in ("ok", "failed")])
    # Telemetry the rules read.
    yield from gauge("gpuperf_gpu_info", live, [
        (f'{gpu_labels(n, g)},name="{MODEL}",driver_version="550.54.15"', lambda t: 1) for n, g in ids])
    for name, value in (("gpuperf_gpu_up", 1), ("gpuperf_power_draw_watts", 450), ("gpuperf_power_limit_watts", 700),
                        ("gpuperf_power_cap_original_watts", 700), ("gpuperf_sweep_in_progress", 0)):
        yield from gauge(name, live, [(gpu_labels(n, g), lambda t, v=value: v) for n, g in ids])
    yield from gauge("gpuperf_clock_event_active", live, [
        (f'{gpu_labels(n, g)},reason="{r}"', lambda t: 0) for n, g in ids for r in CLOCK_REASONS])
    yield from gauge("gpuperf_collector_success", live, [
        (f'{gpu_labels(n, g)},collector="{c}"', lambda t: 1) for n, g in ids for c in COLLECTORS])
    yield from counter("gpuperf_xid_events", [(gpu_labels(n, g), lambda t: 0) for n, g in ids])
    yield from counter("gpuperf_ecc_errors", [
        (f'{gpu_labels(n, g)},type="{k}"', lambda t: 0) for n, g in ids for k in ("corrected", "uncorrected")])
    nodes = sorted({n for n, _ in ids})
    yield from gauge("up", live, [(f'job="gpuperfd",instance="node-{n:05d}:10187"', lambda t: 1) for n in nodes])
    yield "# EOF"


def backfill(directory: Path, data: Path, gpus: int, now: int, history_days: float, live_minutes: float) -> dict:
    """Write the fleet one UTC day per file (promtool re-reads its input once per 2 h block) and backfill."""
    started = time.monotonic()
    files: dict[int, object] = {}
    paths = []
    samples = 0
    family_header: dict[int, str] = {}
    current_type = ""
    for line in fleet_lines(gpus, now, history_days, live_minutes):
        if line.startswith("# TYPE"):
            current_type = line
            family_header.clear()
            continue
        if line == "# EOF":
            continue
        day = int(line.rsplit(" ", 1)[1]) // 86400
        handle = files.get(day)
        if handle is None:
            path = directory / f"day-{day}.om.txt"
            paths.append(path)
            handle = files[day] = path.open("w")
        if family_header.get(day) != current_type:
            handle.write(current_type + "\n")
            family_header[day] = current_type
        handle.write(line + "\n")
        samples += 1
    for handle in files.values():
        handle.write("# EOF\n")
        handle.close()
    written = time.monotonic() - started
    started = time.monotonic()
    running = []
    for path in paths:
        running.append(subprocess.Popen(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                                         str(path), str(data)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        if len(running) >= (os.cpu_count() or 1):
            out = running.pop(0)
            if out.wait() != 0:
                raise RuntimeError(out.stdout.read().decode())
    for out in running:
        if out.wait() != 0:
            raise RuntimeError(out.stdout.read().decode())
    for path in paths:
        path.unlink()
    return {"samples": samples, "write_seconds": round(written, 1), "promtool_seconds": round(time.monotonic() - started, 1)}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def own_metric(url: str, name: str) -> float:
    """A sample of Prometheus' own /metrics (nothing scrapes it in this run)."""
    with LOOPBACK_OPENER.open(url + "/metrics", timeout=600) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


def scalar(url: str, expr: str) -> float:
    result = http_get_json(url + "/api/v1/query", {"query": expr}, timeout=600)["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def measure(gpus: int, history_days: float, interval: str, evaluations: int, live_minutes: float, work: Path) -> dict:
    data = work / "data"
    data.mkdir(parents=True)
    now = int(time.time())
    out: dict = {"gpus": gpus, "history_days": history_days}
    out["backfill"] = backfill(work, data, gpus, now, history_days, live_minutes)
    rules = []
    for name in RULE_FILES:
        path = work / name
        path.write_text(accelerate_rules((RULES_DIR / name).read_text(), interval, "0s", source=name))
        rules.append(str(path))
    # The backfilled blocks reach into the future (so the rules find live samples however
    # long the backfill took); the out-of-order window lets the rule outputs be written
    # below the blocks' end, where a plain head refuses them as "out of bounds".
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"evaluation_interval": interval}, "rule_files": rules, "scrape_configs": [],
        "storage": {"tsdb": {"out_of_order_time_window": f"{int(live_minutes) + 60}m"}}}))
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    log = (work / "prometheus.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
                             "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                with LOOPBACK_OPENER.open(url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((work / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        out["ready_seconds"] = round(time.monotonic() - started, 1)
        seconds = float(interval.rstrip("s"))
        time.sleep(seconds * evaluations + 2)
        groups = http_get_json(url + "/api/v1/rules", timeout=600)["data"]["groups"]
        for _ in range(60):  # every group evaluated at least once
            if all(g.get("lastEvaluation", "").startswith("0001") is False and g["evaluationTime"] > 0 for g in groups):
                break
            time.sleep(seconds)
            groups = http_get_json(url + "/api/v1/rules", timeout=600)["data"]["groups"]
        out["groups"] = {g["name"]: round(g["evaluationTime"], 4) for g in groups}
        out["rule_errors"] = sorted({r.get("lastError") for g in groups for r in g["rules"] if r.get("lastError")})
        out["rules_total_seconds"] = round(sum(out["groups"].values()), 4)
        out["head_series"] = own_metric(url, "prometheus_tsdb_head_series")
        out["recommended_gpus"] = scalar(url, "count(gpuperf:power_cap_recommended_watts)") / len(PROBES)
        out["baseline_series"] = scalar(url, "count(last_over_time(gpuperf:probe_work_units_per_second:median_7d[1h]))")
        latencies = []
        failed = 0
        for _, _, expr in all_panel_queries():
            t0 = time.monotonic()
            answer = http_get_json(url + "/api/v1/query", {"query": expr}, timeout=600)
            latencies.append(time.monotonic() - t0)
            failed += answer.get("status") != "success"
        latencies.sort()
        out["dashboard_queries"] = {
            "count": len(latencies), "failed": failed,
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
            "max_ms": round(1000 * latencies[-1], 1), "sum_s": round(sum(latencies), 2),
        }
        out["loadavg_1m"] = os.getloadavg()[0]
        out["rss_bytes"] = rss_bytes(proc.pid)
        out["heap_inuse_bytes"] = own_metric(url, "go_memstats_heap_inuse_bytes")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--history-days", type=float, nargs="+", default=[7.0],
                        help="per size (the last value repeats)")
    parser.add_argument("--interval", default="20s", help="every rule group's interval in the run (default 20s)")
    parser.add_argument("--evaluations", type=int, default=2)
    parser.add_argument("--live-minutes", type=float, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} not found (apt-get install prometheus)")
    results = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv), "sizes": []}
    for index, gpus in enumerate(args.sizes):
        days = args.history_days[min(index, len(args.history_days) - 1)]
        with tempfile.TemporaryDirectory(prefix=f"rules-cost-{gpus}-") as work:
            started = time.monotonic()
            row = measure(gpus, days, args.interval, args.evaluations, args.live_minutes, Path(work))
            row["wall_seconds"] = round(time.monotonic() - started, 1)
        results["sizes"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issues 50 and 60 on a real node, read-only: users' jobs come and go on a GPU while the daemon probes;
does a result land in every gap that holds idle_seconds plus a probe's cost, and how fast does every
probe give its GPU back?

    # issue 60: one GPU, its jobs and the daemon's four probes; gaps uniform in 10-90 s
    python3 benchmarks/busy_node.py --gpus 0 --busy-gpu 0 --probes llm,vit,attention,train --interval 60 \\
        --seconds 480 --idle 10 --gaps 10,90 --jobs 10,40 --seed 60 --no-kubelet --json busy_gpu.json
    # issue 50: two GPUs, jobs on one (exponential lengths and gaps)
    python3 benchmarks/busy_node.py --gpus 0,1 --busy-gpu 1 --interval 120 --intervals 6 --seed 50 --json busy_node.json

It starts ``gpuperfd run`` (read_only: caps are never changed; each probe every ``--interval`` s,
idle_seconds ``--idle``, jitter 0) on the GPUs named, and on ``--busy-gpu`` plays a seeded trace of users'
jobs (torch matrix products, each seeing its GPU alone as Slurm and the device plugin give it): lengths and
gaps uniform in ``--jobs``/``--gaps`` (seconds, MIN,MAX), else exponential with means ``--job-mean`` and
``--gap-mean``. Every 10 ms it reads the busy GPU's compute processes (NVML, its own process): a job whose
process appears while a probe child is on the GPU is timed until the child is gone (a yield), and the gaps
are read the same way (from a job's process leaving the GPU to the next one's appearing). Every 0.5 s it
reads /metrics: each new ok result is stamped with its time, so each gap's results are known. At the end:
per gap its length, whether it holds idle_seconds plus the target (the probe's measured window + 3 s,
issue 60) and the results in it; per probe the daemon's own qualifying-moment-to-result and turn-to-result
(its log) with median and p95 beside the window; every yield. Needs torch and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import sys, time, torch
gpu, seconds = int(sys.argv[1]), float(sys.argv[2])
a = torch.randn(4096, 4096, device=f"cuda:{gpu}")
end = time.time() + seconds
while time.time() < end:
    a = a @ a
    a = a / a.norm()
    torch.cuda.synchronize()
"""

#: The issue's target from the qualifying moment to the result: the measured window plus this.
TARGET_EXTRA_SECONDS = 3.0
PUBLISHED = re.compile(r"gpu (\d+): (\w+) result published ([\d.]+) s after the GPU qualified \(([\d.]+) s after its turn")


def is_probe_child(pid: int) -> bool:
    try:
        return b"gpuperfd.probe_child" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def make_trace(args: argparse.Namespace, end: float) -> list[tuple[float, float]]:
    """(start, length) of each job, seeded."""
    rng = random.Random(args.seed)

    def draw(spec: str | None, mean: float) -> float:
        if spec:
            low, high = (float(x) for x in spec.split(","))
            return rng.uniform(low, high)
        return rng.expovariate(1 / mean)

    jobs, t = [], draw(args.gaps, args.gap_mean)
    while t < end:
        length = draw(args.jobs, args.job_mean)
        jobs.append((t, min(length, end - t)))
        t += length + draw(args.gaps, args.gap_mean)
    return jobs


def ok_counts(metrics: str) -> dict[tuple[str, str], float]:
    """(gpu, probe) -> ok runs, from a /metrics text."""
    counts: dict[tuple[str, str], float] = {}
    for line in metrics.splitlines():
        if line.startswith("gpuperf_probe_runs_total{") and 'result="ok"' in line:
            gpu = line.split('gpu="', 1)[1].split('"', 1)[0]
            probe = line.split('probe="', 1)[1].split('"', 1)[0]
            counts[(gpu, probe)] = counts.get((gpu, probe), 0) + float(line.rsplit(" ", 1)[1])
    return counts


def windows_from_history(path: Path) -> dict[str, list[float]]:
    """probe -> measured seconds of each ok point the daemon recorded."""
    out: dict[str, list[float]] = {}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        result = record.get("result", record)
        if result.get("status", record.get("status")) != "ok":
            continue
        probe = result.get("probe") or record.get("probe")
        measured = result.get("measured_seconds", record.get("measured_seconds"))
        if probe and measured:
            out.setdefault(probe, []).append(float(measured))
    return out


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0,1")
    parser.add_argument("--busy-gpu", type=int, default=1)
    parser.add_argument("--probes", default="llm", help="the daemon's schedules, each every --interval s")
    parser.add_argument("--interval", type=float, default=120.0)
    parser.add_argument("--intervals", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=None, help="how long the trace runs (default: intervals x interval)")
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--job-mean", type=float, default=90.0)
    parser.add_argument("--gap-mean", type=float, default=22.0)
    parser.add_argument("--jobs", default=None, help="job lengths uniform in MIN,MAX seconds (else exponential)")
    parser.add_argument("--gaps", default=None, help="gaps uniform in MIN,MAX seconds (else exponential)")
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument("--port", type=int, default=10199)
    parser.add_argument("--state-dir", default=None,
                        help="the daemon's state directory (its compile cache: one a node's daemon has filled before)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", default=None,
                        help="copy the daemon's log here, and its history (every result with its phases' seconds) "
                             "beside it as history.jsonl")
    parser.add_argument("--no-kubelet", action="store_true",
                        help="attribution.kubernetes.required: false (a container with no kubelet socket)")
    args = parser.parse_args()

    import pynvml
    import requests

    gpus = [int(g) for g in args.gpus.split(",")]
    probes = args.probes.split(",")
    work = Path(tempfile.mkdtemp(prefix="gpuperfd-busy-"))
    config = work / "gpuperfd.yaml"
    schedules = "\n".join(f"    - {{probe: {p}, interval_seconds: {args.interval}}}" for p in probes)
    config.write_text(f"""
web: {{listen_address: "127.0.0.1:{args.port}"}}
device: {{gpus: {gpus}}}
# a lent machine is a Kubernetes container with no kubelet socket: inside a pod the daemon rightly calls
# every GPU allocated until the kubelet answers (issue 50's first run here got no result for that reason)
attribution: {{kubernetes: {{required: {'false' if args.no_kubelet else 'auto'}}}}}
probes:
  read_only: true
  state_dir: {args.state_dir or work / 'state'}
  history: {{path: {work / 'history.jsonl'}}}
  idle_seconds: {args.idle}
  jitter_seconds: 0
  first_run_delay_seconds: 5
  schedules:
{schedules}
""")
    url = f"http://127.0.0.1:{args.port}"
    log_path = work / "daemon.log"
    daemon = subprocess.Popen([sys.executable, "-m", "gpuperfd", "run", "--config", str(config)],
                              stdout=open(log_path, "w"), stderr=subprocess.STDOUT, cwd=ROOT)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.busy_gpu)
    end = args.seconds if args.seconds is not None else args.intervals * args.interval
    jobs = make_trace(args, end)
    planned = list(jobs)
    yields: list[dict] = []
    running: list[subprocess.Popen] = []
    job_pids: set[int] = set()
    pending: dict[int, float] = {}  # job pid -> when it appeared beside a probe child
    results: list[dict] = []  # each ok result: when it was seen, GPU, probe
    gaps: list[dict] = []
    job_on, gap_began = False, 0.0
    last_counts: dict[tuple[str, str], float] = {}
    next_scrape = 0.0
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < end + 10:
            now = time.monotonic() - t0
            while jobs and jobs[0][0] <= now:
                _, length = jobs.pop(0)
                # the job sees its GPU alone, as Slurm and the device plugin give it one: a job that sees every
                # GPU puts a context on GPU 0 too (torch.cuda.synchronize() without a device), and the daemon
                # then rightly gives GPU 0 up as well (what the first run on a lent node showed)
                proc = subprocess.Popen([sys.executable, "-c", JOB, "0", str(length)],
                                        env={**os.environ, "CUDA_VISIBLE_DEVICES": str(args.busy_gpu)})
                running.append(proc)
                job_pids.add(proc.pid)
            pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            children = {pid for pid in pids if is_probe_child(pid)}
            for pid in (pids & job_pids) - set(pending) - {y["job_pid"] for y in yields}:
                if children:
                    pending[pid] = time.monotonic()
            if not children:
                for pid, since in list(pending.items()):
                    yields.append({"job_pid": pid, "at_seconds": since - t0, "yield_seconds": time.monotonic() - since})
                    del pending[pid]
            on = bool(pids & job_pids)
            if on and not job_on and now > 0:
                gaps.append({"start": gap_began, "end": now, "length": now - gap_began})
            elif job_on and not on:
                gap_began = now
            job_on = on
            if now >= next_scrape:
                next_scrape = now + 0.5
                try:
                    counts = ok_counts(requests.get(url + "/metrics", timeout=2).text)
                except requests.RequestException:
                    counts = last_counts
                for key, value in counts.items():
                    for _ in range(int(value - last_counts.get(key, 0))):
                        results.append({"at": now, "gpu": key[0], "probe": key[1]})
                last_counts = counts
            time.sleep(0.01)
        if not job_on:
            gaps.append({"start": gap_began, "end": end + 10, "length": end + 10 - gap_began, "last": True})
        metrics = requests.get(url + "/metrics", timeout=10).text
        status = requests.get(url + "/api/v1/gpus", timeout=10).json()
    finally:
        for proc in running:
            proc.kill()
        daemon.terminate()
        daemon.wait(60)
    log_text = log_path.read_text(errors="replace")
    if args.keep:
        Path(args.keep).write_text(log_text)
        if (work / "history.jsonl").exists():  # where each turn's time went (build, settle, windows)
            shutil.copyfile(work / "history.jsonl", Path(args.keep).with_name("history.jsonl"))
    windows = windows_from_history(work / "history.jsonl")
    per_probe: dict[str, dict] = {}
    for gpu, probe, qualified, turn in PUBLISHED.findall(log_text):
        row = per_probe.setdefault(probe, {"qualified_to_result": [], "turn_to_result": []})
        row["qualified_to_result"].append(float(qualified))
        row["turn_to_result"].append(float(turn))
    for probe, row in per_probe.items():
        window = statistics.median(windows[probe]) if windows.get(probe) else None
        row["window_seconds"] = window
        for key in ("qualified_to_result", "turn_to_result"):
            row[f"{key}_median"] = quantile(row[key], 0.5)
            row[f"{key}_p95"] = quantile(row[key], 0.95)
            # the first result after the daemon's start waits for its child's first imports (12-20 s on
            # an H200): shown apart, so a steady daemon's p95 can be read beside the whole run's
            row[f"{key}_p95_after_first"] = quantile(row[key][1:], 0.95)
        if window is not None:
            row["target_median"] = window + TARGET_EXTRA_SECONDS
            row["target_p95"] = 2 * window
    known = [w for probe in probes for w in windows.get(probe, [])]
    target = (min(windows[p] and statistics.median(windows[p]) for p in windows) + TARGET_EXTRA_SECONDS
              if known else None)
    busy_gpu = str(args.busy_gpu)
    for gap in gaps:
        gap["results"] = [r["probe"] for r in results if r["gpu"] == busy_gpu and gap["start"] <= r["at"] <= gap["end"] + 0.5]
        gap["holds_idle_plus_target"] = target is not None and gap["length"] >= args.idle + target
    fitting = [g for g in gaps if g["holds_idle_plus_target"]]
    with_result = [g for g in fitting if g["results"]]
    report = {"busy_gpu": args.busy_gpu, "probes": probes, "planned_jobs": planned, "ok_runs": {
        f"{g}/{p}": v for (g, p), v in last_counts.items()}, "yields": yields,
        "max_yield_seconds": max((y["yield_seconds"] for y in yields), default=None),
        "gaps": gaps, "target_seconds": target, "fitting_gaps": len(fitting), "fitting_gaps_with_result": len(with_result),
        "per_probe": per_probe,
        "coverage": {g["gpu"]: g.get("coverage") for g in status["gpus"]},
        "runs": [line for line in metrics.splitlines() if line.startswith("gpuperf_probe_runs_total{")],
        "standby_log": [line for line in log_text.splitlines()
                        if "standby" in line or "starts now (imports" in line or "gave way" in line][-60:],
        "daemon_log_tail": log_text.splitlines()[-60:]}
    print(json.dumps({k: v for k, v in report.items() if k not in ("daemon_log_tail", "standby_log", "planned_jobs", "runs")},
                     indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    covered = all(any(v for (g, _), v in last_counts.items() if g == str(gpu)) for gpu in gpus)
    fast = all(y["yield_seconds"] <= 0.25 for y in yields)
    return 0 if covered and fast and (not fitting or len(with_result) >= 0.8 * len(fitting)) else 1


if __name__ == "__main__":
    raise SystemExit(main())

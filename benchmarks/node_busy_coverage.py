#!/usr/bin/env python3
"""Issue 50 on a real node of 2+ GPUs, read-only: the daemon's probes reach a GPU that users keep busy.

The daemon runs on NVML (read-only, one llm schedule every INTERVAL s, idle_seconds IDLE) while a
foreign job pattern runs on GPU ``--busy-gpu`` (a torch matmul loop in another process: BUSY s on,
GAP s off, repeated) and the other GPUs stay free. Watched from outside, every 0.05 s through NVML:

* each yield: from the moment a foreign job's process appears on the GPU to the moment no gpuperfd
  probe child is left on it (the user's job got its GPU back); ``null`` where no probe was there;
* coverage: every ok result per GPU (from the daemon's history file), its time, and the oldest age;
* the daemon's own coverage and qualifying-to-result series at the end (/metrics).

Writes ``OUT/busy_coverage.json``. Usage (device machine, repo root, PYTHONPATH with the wheels):
python3 benchmarks/node_busy_coverage.py OUT [--seconds 240] [--interval 60] [--busy 35] [--gap 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

JOB = """
import sys, time, torch
d = torch.device('cuda:0')
a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def processes(handles: list) -> dict[int, set[int]]:
    import pynvml

    out = {}
    for index, handle in enumerate(handles):
        try:
            out[index] = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        except pynvml.NVMLError:
            out[index] = set()
    return out


def is_probe(pid: int) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b.startswith(b"gpuperfd.probe_child") for a, b in zip(args, args[1:]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--interval", type=int, default=60)
    parser.add_argument("--idle", type=float, default=5)
    parser.add_argument("--busy", type=float, default=35)
    parser.add_argument("--gap", type=float, default=20)
    parser.add_argument("--busy-gpu", type=int, default=1)
    parser.add_argument("--port", type=int, default=19188)
    args = parser.parse_args()
    import pynvml

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = out / "state"
    config = out / "daemon.yaml"
    config.write_text(f"""log_level: info
device: {{backend: nvml}}
probes:
  read_only: true
  state_dir: {state}
  history: {{path: {state}/history.jsonl}}
  idle_seconds: {args.idle}
  jitter_seconds: 2
  first_run_delay_seconds: 1
  schedules:
    - {{probe: llm, interval_seconds: {args.interval}}}
""")
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    daemon = subprocess.Popen([sys.executable, "-m", "gpuperfd", "run", "--config", str(config),
                               "--web.listen-address", f"127.0.0.1:{args.port}"],
                              stdout=open(out / "daemon.log", "wb"), stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)
    t0 = time.time()
    jobs: list[dict] = []
    job: subprocess.Popen | None = None
    next_job = t0 + args.gap
    yields: list[dict] = []
    pending: dict | None = None  # a job whose arrival found a probe child on the GPU
    try:
        while time.time() - t0 < args.seconds:
            now = time.time()
            if job is None and now >= next_job and now - t0 < args.seconds - args.busy:
                job_env = dict(env, CUDA_VISIBLE_DEVICES=str(args.busy_gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
                job = subprocess.Popen([sys.executable, "-c", JOB, str(args.busy)], env=job_env)
                jobs.append({"start": now - t0, "pid": job.pid})
                pending = {"job_start": now - t0, "pid": job.pid, "seen": None}
            if job is not None and job.poll() is not None:
                jobs[-1]["end"] = time.time() - t0
                job, next_job = None, time.time() + args.gap
            procs = processes(handles)
            on_gpu = procs.get(args.busy_gpu, set())
            if pending is not None:
                probes = [p for p in on_gpu if is_probe(p)]
                if pending["seen"] is None and pending["pid"] in on_gpu:
                    pending["seen"] = now - t0
                    pending["probe_children_then"] = probes
                if pending["seen"] is not None:
                    if not pending["probe_children_then"]:
                        yields.append({**pending, "yield_s": None})
                        pending = None
                    elif not probes:
                        yields.append({**pending, "yield_s": round(now - t0 - pending["seen"], 3)})
                        pending = None
            time.sleep(0.05)
    finally:
        metrics = ""
        try:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{args.port}/metrics", timeout=5).read().decode()
        except OSError as exc:
            metrics = f"# scrape failed: {exc}"
        if job is not None:
            job.kill()
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
    (out / "metrics.txt").write_text(metrics)
    results: dict[str, list[float]] = {}
    history = state / "history.jsonl"
    if history.exists():
        for line in history.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            result = row.get("result") or {}
            gpu = str((row.get("gpu") or {}).get("index", row.get("gpu_index")))
            results.setdefault(gpu, []).append({"t": round(float(row.get("time", 0)) - t0, 1),
                                                "status": result.get("status"), "reason": result.get("failure_reason")})
    coverage = [line for line in metrics.splitlines() if line.startswith(("gpuperf_probe_result_age", "gpuperf_probe_due",
                                                                        "gpuperf_probe_qualify", "gpuperf_probe_gpu_time",
                                                                        "gpuperf_probe_runs_total"))]
    body = {"seconds": args.seconds, "interval": args.interval, "idle_seconds": args.idle, "busy_gpu": args.busy_gpu,
            "pattern": {"busy_s": args.busy, "gap_s": args.gap}, "jobs": jobs, "yields": yields,
            "results": results, "coverage_series": coverage[:80],
            "gpus": [pynvml.nvmlDeviceGetName(h) for h in handles],
            "power_limits_w": [pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000 for h in handles]}
    (out / "busy_coverage.json").write_text(json.dumps(body, indent=1))
    print(json.dumps({k: body[k] for k in ("jobs", "yields", "power_limits_w")}, indent=None))
    for gpu, rows in sorted(results.items()):
        print(f"GPU {gpu}: " + ", ".join(f"{r['t']:.0f}s {r['status']}{'/' + r['reason'] if r['reason'] else ''}"
                                         for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

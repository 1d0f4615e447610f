#!/usr/bin/env python3
"""Issue 50 on a real node, read-only: users' jobs come and go on one GPU while the daemon probes both;
are both GPUs covered, and how fast does every probe give its GPU back?

    python3 benchmarks/busy_node.py --gpus 0,1 --busy-gpu 1 --interval 120 --intervals 6 --seed 50 --json busy_node.json

It starts ``gpuperfd run`` (read_only: caps are never changed; llm every ``--interval`` s, idle_seconds
``--idle``, jitter 0) on the GPUs named, and on ``--busy-gpu`` plays a seeded trace of users' jobs
(torch matrix products; lengths exponential with mean ``--job-mean`` s, gaps with mean ``--gap-mean`` s:
90 and 22 give about 80 % busy). Every 20 ms it reads the GPU's compute processes (NVML): a job whose
process appears while a probe child is on the GPU is timed until the child is gone (a yield). At the end
it reads /metrics and prints, per GPU, completed runs, the oldest result age and whether a result is
due, the intervals in which a probe fitted a gap, and every yield. Needs torch and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def is_probe_child(pid: int) -> bool:
    try:
        return b"gpuperfd.probe_child" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0,1")
    parser.add_argument("--busy-gpu", type=int, default=1)
    parser.add_argument("--interval", type=float, default=120.0)
    parser.add_argument("--intervals", type=int, default=6)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--job-mean", type=float, default=90.0)
    parser.add_argument("--gap-mean", type=float, default=22.0)
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument("--port", type=int, default=10199)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-kubelet", action="store_true",
                        help="attribution.kubernetes.required: false (a container with no kubelet socket)")
    args = parser.parse_args()

    import pynvml
    import requests

    gpus = [int(g) for g in args.gpus.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpuperfd-busy-"))
    config = work / "gpuperfd.yaml"
    config.write_text(f"""
web: {{listen_address: "127.0.0.1:{args.port}"}}
device: {{gpus: {gpus}}}
# a lent machine is a Kubernetes container with no kubelet socket: inside a pod the daemon rightly calls
# every GPU allocated until the kubelet answers (issue 50's first run here got no result for that reason)
attribution: {{kubernetes: {{required: {'false' if args.no_kubelet else 'auto'}}}}}
probes:
  read_only: true
  state_dir: {work / 'state'}
  history: {{path: {work / 'history.jsonl'}}}
  idle_seconds: {args.idle}
  jitter_seconds: 0
  first_run_delay_seconds: 5
  schedules:
    - {{probe: llm, interval_seconds: {args.interval}}}
""")
    url = f"http://127.0.0.1:{args.port}"
    daemon = subprocess.Popen([sys.executable, "-m", "gpuperfd", "run", "--config", str(config)],
                              stdout=open(work / "daemon.log", "w"), stderr=subprocess.STDOUT, cwd=ROOT)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.busy_gpu)
    rng = random.Random(args.seed)
    end = args.intervals * args.interval
    jobs, t = [], rng.expovariate(1 / args.gap_mean)
    while t < end:
        length = rng.expovariate(1 / args.job_mean)
        jobs.append((t, min(length, end - t)))
        t += length + rng.expovariate(1 / args.gap_mean)
    yields: list[dict] = []
    running: list[subprocess.Popen] = []
    job_pids: set[int] = set()
    pending: dict[int, float] = {}  # job pid -> when it appeared beside a probe child
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
            time.sleep(0.02)
        metrics = requests.get(url + "/metrics", timeout=10).text
        status = requests.get(url + "/api/v1/gpus", timeout=10).json()
    finally:
        for proc in running:
            proc.kill()
        daemon.terminate()
        daemon.wait(60)
    ok = {}
    for line in metrics.splitlines():
        if line.startswith("gpuperf_probe_runs_total{") and 'result="ok"' in line:
            gpu = line.split('gpu="', 1)[1].split('"', 1)[0]
            ok[gpu] = ok.get(gpu, 0) + float(line.rsplit(" ", 1)[1])
    report = {"busy_gpu": args.busy_gpu, "ok_runs": ok, "yields": yields,
              "max_yield_seconds": max((y["yield_seconds"] for y in yields), default=None),
              "coverage": {g["gpu"]: g.get("coverage") for g in status["gpus"]}, "daemon_log": str(work / "daemon.log"),
              # every run's outcome and the daemon's own words: a run with no ok result once left nothing
              # to tell why (the log stayed in a temporary directory on the lent machine)
              "runs": [line for line in metrics.splitlines() if line.startswith("gpuperf_probe_runs_total{")],
              # the daemon's own figure from each GPU's qualifying moment to the published result
              "qualified_to_result": [line for line in metrics.splitlines()
                                      if line.startswith(("gpuperf_probe_qualified_to_result_seconds_sum",
                                                          "gpuperf_probe_qualified_to_result_seconds_count"))],
              "standby_log": [line for line in (work / "daemon.log").read_text(errors="replace").splitlines()
                              if "standby" in line or "starts now (imports" in line][-40:],
              "daemon_log_tail": (work / "daemon.log").read_text(errors="replace").splitlines()[-80:]}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(ok.get(str(g)) for g in gpus) and all(y["yield_seconds"] <= 0.5 for y in yields) else 1


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""How long a user's job stays visible on the GPU after it ends: the "tail" that ``probes.idle_seconds``
must still cover where the kubelet's allocation map (or Slurm's epilog) already says the GPU is free
(issue 50, "the scheduler's word"). Read-only.

    python3 benchmarks/job_tail.py --gpu 0 --trials 5 --json job_tail.json

Each trial starts a job (torch matrix products on the GPU, as a user's would), lets it run
``--seconds``, then ends it (SIGTERM, as the kubelet and Slurm do, or a normal exit on alternate trials),
and polls NVML every 10 ms from that moment: when the job's process leaves the GPU's process list, and
when SM utilization first reads at or below ``--threshold`` (the daemon's idle threshold). Needs torch
and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

JOB = """
import sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + seconds
while time.time() < end:
    a = a @ a
    a = a / a.norm()
torch.cuda.synchronize()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threshold", type=float, default=0.05)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    rows = []
    for trial in range(args.trials):
        sigterm = trial % 2 == 0
        job = subprocess.Popen([sys.executable, "-c", JOB, str(3600 if sigterm else args.seconds)],
                               env={**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu)},
                               stdout=subprocess.PIPE, text=True)
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        time.sleep(args.seconds if sigterm else 0.0)
        if sigterm:
            job.send_signal(signal.SIGTERM)
        else:
            job.wait()
        ended = time.monotonic()  # SIGTERM sent, or the process has exited
        gone = idle = None
        while time.monotonic() - ended < 30 and (gone is None or idle is None):
            now = time.monotonic() - ended
            pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            if gone is None and job.pid not in pids:
                gone = now
            if idle is None and pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100 <= args.threshold:
                idle = now
            time.sleep(0.01)
        job.wait(30)
        row = {"trial": trial, "end": "SIGTERM" if sigterm else "exit", "process_gone_seconds": gone,
               "utilization_idle_seconds": idle}
        rows.append(row)
        print(json.dumps(row), flush=True)
        time.sleep(2.0)
    worst = {k: max((r[k] or 30.0) for r in rows) for k in ("process_gone_seconds", "utilization_idle_seconds")}
    print("worst:", json.dumps(worst))
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": args.gpu, "rows": rows, "worst": worst}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

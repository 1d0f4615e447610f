#!/usr/bin/env python3
"""Resident memory of the daemon idle and after a round of real child probes; no torch in it.

    python3 benchmarks/daemon_rss.py --json daemon_rss.json              # GPU node: NVML, read-only probes
    python3 benchmarks/daemon_rss.py --cpu --json daemon_rss_cpu.json    # CPU: simulated GPU, tiny probes

Starts ``gpuperfd run`` (the real daemon) with the child executor, reads its VmRSS
from /proc after it has idled (``--idle`` seconds), waits until every default probe
has written a history line (one round of real child probes: default presets on the
GPU, read-only at the current cap so no limit changes; tiny presets on the CPU, where
the simulated GPU is swept over two caps through one warm child), then reads VmRSS
again and lists any torch, numpy or transformers file in the daemon's memory maps
(there must be none). Target (issue 12): <= 60 MB idle and after probes on a GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from load import free_port  # benchmarks/load.py: this script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
PROBES = ("llm", "vit", "attention", "train")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        return next(int(line.split()[1]) / 1024 for line in handle if line.startswith("VmRSS:"))


def children(pid: int) -> list[dict]:
    """The processes whose parent is ``pid``: command line and RSS (MB)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != pid:
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            out.append({"pid": int(entry), "cmdline": cmd[:120], "rss_mb": round(rss_mb(int(entry)), 1)})
        except (OSError, ValueError, StopIteration):
            continue
    return out


def heavy_maps(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as handle:
        # package folders, not any path with "torch" in it (a venv at /opt/torch/.venv holds yaml too)
        marks = tuple(f"-packages/{name}" for name in ("torch/", "torch.libs/", "numpy/", "numpy.libs/", "transformers/"))
        return sorted({line.split()[-1] for line in handle if any(k in line.split()[-1] for k in marks)})


def skipped_runs(port: int) -> float:
    """Runs the daemon counted as skipped (a probe that will never write a history line)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpuperf_probe_runs_total{") and 'result="skipped"' in line)


def config(cpu: bool, state: Path) -> str:
    if cpu:
        schedules = "\n".join(
            f"    - {{probe: {p}, preset: tiny, interval_seconds: 3600, caps: [max, 500], settle_seconds: 0.5}}"
            for p in PROBES)
        head = "device: {backend: simulated}\nsimulation: {gpus: 1, seed: 1}\n"
        extra = "  read_only: false\n  torch_device: cpu\n"
    else:
        schedules = "\n".join(f"    - {{probe: {p}, interval_seconds: 3600, caps: [current]}}" for p in PROBES)
        head = "device: {backend: nvml}\n"
        extra = "  read_only: true\n"
    return (f"{head}probes:\n{extra}  executor: child\n  state_dir: {state}\n"
            f"  history: {{path: {state}/history.jsonl}}\n  idle_seconds: 0\n  jitter_seconds: 0\n"
            f"  first_run_delay_seconds: {{delay}}\n  parallel_gpus: false\n  timeout_seconds: 900\n"
            f"  schedules:\n{schedules}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="simulated GPU, tiny probes on the CPU")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds idle before the first reading")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the round of probes")
    parser.add_argument("--malloc-arena-max", type=int, default=2,
                        help="MALLOC_ARENA_MAX for the daemon, as the systemd unit and the image set it (0: unset)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "gpuperfd.yaml").write_text(config(args.cpu, state).replace("{delay}", str(args.idle + 5)))
        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))}
        if args.malloc_arena_max:
            env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
        log = open(state / "daemon.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "gpuperfd", "run", "--config", str(state / "gpuperfd.yaml"),
                                 "--web.listen-address", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp)
        try:
            time.sleep(args.idle)
            idle = rss_mb(proc.pid)
            idle_maps = heavy_maps(proc.pid)
            history = state / "history.jsonl"
            deadline = time.monotonic() + args.timeout
            want = len(PROBES) * (2 if args.cpu else 1)
            while time.monotonic() < deadline and proc.poll() is None:
                lines = history.read_text().splitlines() if history.exists() else []
                if len(lines) >= want or skipped_runs(port) >= len(PROBES):
                    break  # every probe ran, or every one was skipped (its reason is in the log)
                time.sleep(1)
            time.sleep(2)
            after = rss_mb(proc.pid)
            after_maps = heavy_maps(proc.pid)
            beside = children(proc.pid)  # issue 36: none (was multiprocessing's resource tracker)
            skipped = skipped_runs(port)
            statuses = [json.loads(line)["result"]["status"] for line in history.read_text().splitlines()] \
                if history.exists() else []
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            log.close()
        out = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "backend": "simulated" if args.cpu else "nvml", "command": " ".join([sys.executable, *sys.argv]),
               "malloc_arena_max": args.malloc_arena_max or None,
               "idle_rss_mb": round(idle, 1), "after_probes_rss_mb": round(after, 1), "probe_statuses": statuses, "skipped_runs": skipped,
               "heavy_maps_idle": idle_maps, "heavy_maps_after": after_maps,
               "processes_beside_after_probes": beside,
               "shutdown_warnings": [line for line in (state / "daemon.log").read_text(errors="replace").splitlines()
                                     if "leaked" in line or "resource_tracker" in line]}
        ok = statuses and all(s == "ok" for s in statuses) and not after_maps
        if not ok:  # why: the daemon's own account
            out["daemon_exit"] = proc.returncode
            out["daemon_log_tail"] = (state / "daemon.log").read_text(errors="replace").splitlines()[-25:]
        print(json.dumps(out, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Peak host memory of a probe's process tree: what the container's memory limit must hold.

    python3 benchmarks/probe_rss.py --device cuda:0                      # on a GPU node: default presets
    python3 benchmarks/probe_rss.py --device cpu --preset tiny           # on a CPU (checks the script)

For each probe it runs ``gpuperfd probe NAME --repeats 1 --device DEV`` as a
subprocess (the CLI parent plus the spawn child that imports torch, as the
daemon runs them) and reports two peaks:

* ``maxrss_mib``: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` taken around the
  run, in a fresh interpreter per probe so earlier probes do not mask it: the
  largest resident set of any single process of the tree (the torch child);
* ``tree_rss_mib``: the largest sum of VmRSS over the whole tree, sampled from
  /proc every 20 ms: closer to what the container's cgroup counts (file-backed
  pages such as torch's shared libraries are counted once per process here,
  so it can overstate a cgroup's figure a little, never understate the RSS part).

The memory limit of the probes DaemonSet is set from the largest of these plus
the daemon (docs/benchmarks.md, "Memory of the daemon and its probe child").
Prints a table and, with --json FILE, writes every figure with the machine,
torch version and command. Exit 1 if a probe failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

PROBES = ("llm", "vit", "attention", "train")


def _children(pid: int) -> list[int]:
    """Every descendant of pid, read from /proc/*/stat (no psutil)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler(threading.Thread):
    """Samples the summed RSS of a process and its descendants until stopped."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_kib, self.done = pid, interval, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            total = sum(_rss_kib(p) for p in [self.pid, *_children(self.pid)])
            self.peak_kib = max(self.peak_kib, total)
            self.done.wait(self.interval)


def measure_one(argv: list[str]) -> dict[str, object]:
    """Run one probe command, in this (fresh) interpreter, and return its peaks."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    sampler.done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"
    return {"maxrss_mib": round(max(after, before) / 1024, 1), "tree_rss_mib": round(sampler.peak_kib / 1024, 1),
            "seconds": round(time.monotonic() - started, 1), "status": status, "stdout_tail": out[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="cpu, cuda or cuda:N (default cuda:0)")
    parser.add_argument("--preset", help="one preset for every probe (e.g. tiny); default: each probe's own")
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # internal: child mode
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one)))
        return 0

    rows = []
    for name in args.probes:
        argv = [sys.executable, "-m", "gpuperfd", "probe", name, "--repeats", "1", "--device", args.device,
                "--no-progress"]
        if args.preset:
            argv += ["--preset", args.preset]
        # A fresh interpreter per probe: RUSAGE_CHILDREN only ever grows within one process.
        done = subprocess.run([sys.executable, __file__, "--one", *argv], capture_output=True, text=True, check=True)
        row = {"probe": name, "preset": args.preset or "default", **json.loads(done.stdout),
               "command": " ".join(["gpuperfd", *argv[3:]])}
        rows.append(row)
        print(f"{name:10s} {row['preset']:8s} maxrss {row['maxrss_mib']:8.1f} MiB   tree {row['tree_rss_mib']:8.1f} MiB"
              f"   {row['seconds']:6.1f} s   {row['status']}", flush=True)
    if args.json:
        try:
            import torch  # only for the record of which build measured it

            torch_version = torch.__version__
        except ImportError:
            torch_version = None
        args.json.write_text(json.dumps({
            "machine": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch_version, "date": time.strftime("%Y-%m-%d"), "device": args.device, "rows": rows}, indent=1))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The daemon probing every GPU of a node for DURATION seconds, watched from outside. Read-only.

Started in its own session (setsid) so it outlives the command that started it; writes
``DIR/summary.json`` and ``DIR/progress.txt`` as it goes. The daemon runs as the DaemonSet runs it:
inside a cgroup whose memory.max is the manifest's limit (2560Mi) where this machine's cgroup v2
lets us make one, else with ``probes.memory_budget`` set to the same figure. Beside it:

* a scrape of /metrics every second (a failed or slow one counted);
* the process tree's resident memory (daemon and every child) every 0.25 s, and the cgroup's
  ``memory.peak``; the daemon's CPU while it is idle (before the first probe, per GPU);
* ``gpuperfd check --quick`` every CHECK_EVERY seconds (exit codes; 139 is the NVML crash);
* a foreign job (a torch matmul loop, another process) on GPU FOREIGN_GPU once that GPU's probe
  child has run for 15 s: that GPU must yield (skipped/preempted, its last results kept on
  /metrics) and the others keep probing.

Usage (device machine, repo root, PYTHONPATH with the wheels): python3 benchmarks/node_daemon_proof.py DIR DURATION
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LIMIT_BYTES = 2560 << 20
PORT = 10187
CHECK_EVERY = 10.0
FOREIGN_GPU = 1
FOREIGN_SECONDS = 90
CONFIG = """log_level: info
device: {{backend: nvml}}
probes:
  read_only: true
  state_dir: {state}
  history: {{path: {state}/history.jsonl}}
  idle_seconds: 5
  jitter_seconds: 0
  first_run_delay_seconds: 30
  timeout_seconds: 400
{budget}  schedules:
    - {{probe: llm, interval_seconds: 150, caps: [current], options: {{repeats: 2}}}}
    - {{probe: vit, interval_seconds: 150, caps: [current], options: {{repeats: 2}}}}
"""
FOREIGN = """
import time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    y = x @ x
torch.cuda.synchronize()
"""


def cgroup_for(limit: int, out: Path) -> Path | None:
    """A cgroup v2 group with memory.max = limit, or None where this machine does not allow one."""
    root = Path("/sys/fs/cgroup")
    try:
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            return None
        (root / "cgroup.subtree_control").write_text("+memory")
        group = root / "gpuperfd-proof"
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(limit))
        return group
    except OSError as exc:
        (out / "cgroup_error.txt").write_text(str(exc))
        return None


def tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of ``pid`` and all its descendants (/proc): (VmRSS summed, RssAnon summed).

    VmRSS sums count every shared page once per process (torch's CUDA libraries, mapped by the
    child, are file pages held once in the page cache) and a CUDA process's device mappings; the
    anonymous part is each process's own memory, and the cgroup's memory.peak the node's truth."""
    total = anon = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            for name, value in re.findall(r"(VmRSS|RssAnon):\s+(\d+)", status):
                if name == "VmRSS":
                    total += int(value) * 1024
                else:
                    anon += int(value) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return total, anon


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(timeout: float = 2.0) -> tuple[bool, float, str]:
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=timeout) as response:
            body = response.read().decode()
        return response.status == 200, time.monotonic() - start, body
    except OSError:
        return False, time.monotonic() - start, ""


def gpus_with_processes() -> set[int]:
    """NVML indices of GPUs with a compute process on them now (the probe children; one thread here)."""
    import pynvml

    if not getattr(gpus_with_processes, "initialized", False):  # once: nvmlInit counts its callers
        pynvml.nvmlInit()
        gpus_with_processes.initialized = True  # type: ignore[attr-defined]
    return {i for i in range(pynvml.nvmlDeviceGetCount())
            if pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}


def main() -> None:
    out, duration = Path(sys.argv[1]), float(sys.argv[2])
    simulate = os.environ.get("PROOF_SIMULATE") == "1"  # a dry run of this script on a machine without GPUs
    out.mkdir(parents=True, exist_ok=True)
    state = out / "state"
    state.mkdir(exist_ok=True)
    group = cgroup_for(LIMIT_BYTES, out)
    budget = "" if group else f"  memory_budget: {LIMIT_BYTES}\n"
    config = CONFIG.format(state=state, budget=budget)
    if simulate:
        config = config.replace("device: {backend: nvml}", "device: {backend: simulated}\nsimulation: {gpus: 4}")
    (out / "gpu.yaml").write_text(config)
    (out / "check.yaml").write_text(f"probes: {{state_dir: {state}}}\n"
                                    + ("device: {backend: simulated}\nsimulation: {gpus: 4}\n" if simulate else ""))
    prefix = f"echo $$ > {group}/cgroup.procs && " if group else ""
    daemon = subprocess.Popen(
        ["sh", "-c", f"{prefix}exec {sys.executable} -m gpuperfd run --config {out}/gpu.yaml "
                     f"--web.listen-address 127.0.0.1:{PORT}"],
        stdout=open(out / "daemon.log", "w"), stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    summary: dict[str, object] = {"limit_bytes": LIMIT_BYTES, "cgroup": str(group) if group else None,
                                  "duration_seconds": duration}
    scrapes_ok = scrapes_failed = 0
    latencies: list[float] = []
    peak_rss = peak_anon = 0
    checks: dict[str, int] = {}
    foreign: subprocess.Popen[bytes] | None = None
    seen_busy: dict[int, float] = {}
    idle_cpu: tuple[float, float] | None = None
    next_check = t0 + 20
    while time.monotonic() - t0 < duration:
        tick = time.monotonic()
        ok, latency, body = scrape()
        if body or scrapes_ok:
            scrapes_ok += ok
            scrapes_failed += not ok
            latencies.append(latency)
        if ok and idle_cpu is None and tick - t0 > 5:
            idle_cpu = (tick, cpu_seconds(daemon.pid))
        if ok and idle_cpu is not None and tick - t0 > 28 and "idle_cpu_percent_of_core" not in summary:
            summary["idle_cpu_percent_of_core"] = 100 * (cpu_seconds(daemon.pid) - idle_cpu[1]) / (tick - idle_cpu[0])
        if foreign is None and not simulate:
            for gpu in gpus_with_processes():
                seen_busy.setdefault(gpu, tick)
        if foreign is None and FOREIGN_GPU in seen_busy and tick - seen_busy[FOREIGN_GPU] > 15:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(FOREIGN_GPU)}
            foreign = subprocess.Popen([sys.executable, "-c", FOREIGN.format(seconds=FOREIGN_SECONDS)], env=env)
            summary["foreign_started_at_seconds"] = round(tick - t0, 1)
            (out / "scrape_before_foreign.txt").write_text(body)
        while time.monotonic() < tick + 1.0:
            rss, anon = tree_rss(daemon.pid)
            peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
            time.sleep(0.25)
        if time.monotonic() >= next_check:
            next_check += CHECK_EVERY
            rc = subprocess.run([sys.executable, "-m", "gpuperfd", "check", "--quick", "--json", "--config",
                                 str(out / "check.yaml")], capture_output=True).returncode
            checks[str(rc)] = checks.get(str(rc), 0) + 1
        if int(time.monotonic() - t0) % 30 == 0:
            (out / "progress.txt").write_text(f"t={time.monotonic() - t0:.0f}s scrapes ok {scrapes_ok} failed "
                                              f"{scrapes_failed} peak_rss {peak_rss / 2**20:.0f} MiB checks {checks}\n")
    ok, _, body = scrape()
    (out / "scrape_final.txt").write_text(body)
    summary.update({
        "daemon_alive": daemon.poll() is None, "scrapes_ok": scrapes_ok, "scrapes_failed": scrapes_failed,
        "scrape_p50_ms": 1000 * sorted(latencies)[len(latencies) // 2] if latencies else None,
        "scrape_max_ms": 1000 * max(latencies) if latencies else None,
        "process_tree_peak_rss_mib": peak_rss / 2**20,
        "process_tree_peak_anon_mib": peak_anon / 2**20, "quick_checks_by_exit_code": checks,
        "foreign_exit": foreign.wait() if foreign else None,
    })
    if group is not None:
        for name in ("memory.peak", "memory.events"):
            try:
                summary[name] = (group / name).read_text().strip()
            except OSError:
                pass
    daemon.send_signal(signal.SIGTERM)
    try:
        summary["daemon_exit"] = daemon.wait(60)
    except subprocess.TimeoutExpired:
        daemon.kill()
        summary["daemon_exit"] = "killed after 60 s"
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

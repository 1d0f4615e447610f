"""Scrape-path benchmark: latency of /metrics, idle RSS and CPU of the daemon.

Starts the real daemon (`gpuperfd run`) as a child process, on simulated GPUs
(--simulate N) or on NVML (--nvml), then:
  1. scrapes /metrics sequentially (keep-alive, as Prometheus does) and reports p50/p99/max;
  2. where `nvidia-smi` exists, times `nvidia-smi --query-gpu=<18 fields> --format=csv`
     (the per-scrape cost of exporters that shell out to it) in the same run, and
     prints the ratio;
  3. measures the daemon's RSS and CPU share over an idle window with 1 s sampling;
  4. reports how many GPM series the scrape carried (GPM is on by default on Hopper; the
     figures above are then "with GPM on"), and with --save-probe-scrape writes one scrape
     taken while a probe runs (after --gpm-wait seconds, so GPM covers the probe) to a file,
     checked with `promtool check metrics` where promtool exists.

Usage:
  python benchmarks/scrape.py --simulate 8 [--scrapes 2000] [--idle-seconds 60] [--json OUT]
  python benchmarks/scrape.py --nvml ...
  python benchmarks/scrape.py --nvml --during-probe --probe vit --probe-preset vit-b16 \
      --save-probe-scrape docs/data/scrape-gpm-vit-h100.prom --json OUT
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

SMI_FIELDS = (
    "index,uuid,name,utilization.gpu,utilization.memory,memory.total,memory.used,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,clocks.mem,pstate,fan.speed,ecc.errors.uncorrected.volatile.total,"
    "clocks_event_reasons.active,enforced.power.limit,compute_processes_count"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": 1000 * statistics.median(values),
        "p99_ms": 1000 * percentile(values, 0.99),
        "max_ms": 1000 * max(values),
        "mean_ms": 1000 * statistics.fmean(values),
    }


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


PROBE_LOAD = (
    "probes: {{state_dir: {workdir}, history: {{path: null}}, read_only: true, idle_seconds: 0, jitter_seconds: 0,"
    " first_run_delay_seconds: 0, executor: child, torch_device: {device}, timeout_seconds: 600,"
    " schedules: [{{probe: {probe}, preset: {preset}, interval_seconds: 10, gpus: [0], options: {{repeats: 40, measure_seconds: 1.0}}}}]}}\n"
)


def start_daemon(args: argparse.Namespace, workdir: Path, probe_load: bool = False) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = workdir / "bench.yaml"
    backend = "simulated" if args.simulate else "nvml"
    if probe_load:
        probes = PROBE_LOAD.format(workdir=workdir, device="cuda" if args.nvml else "cpu", probe=args.probe,
                                   preset=args.probe_preset)
    else:
        probes = f"probes: {{enabled: false, state_dir: {workdir}, history: {{path: null}}}}\n"
    config.write_text(
        f"device: {{backend: {backend}}}\n"
        f"simulation: {{gpus: {args.simulate or 1}, seed: 1}}\n"
        f"sampler: {{interval_seconds: 1.0, collectors: {{{args.collectors}}}}}\n" + probes
    )
    cmd = [sys.executable, "-m", "gpuperfd", "run", "--config", str(config), "--web.listen-address", f"127.0.0.1:{port}"]
    env = dict(os.environ)
    if args.malloc_arena_max:
        env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)  # as the systemd unit sets it
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(workdir / "daemon.log", "wb"), env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited: {(workdir / 'daemon.log').read_text()}")
        try:
            if requests.get(url + "/healthz", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.1)
    raise SystemExit("daemon did not become ready")


def bench_scrapes(url: str, n: int, while_alive: Callable[[], bool] | None = None) -> tuple[list[float], int]:
    """Sequential keep-alive scrapes with http.client (little client overhead, like Prometheus's Go client)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)

    def scrape() -> bytes:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"scrape returned {response.status}")
        return body

    for _ in range(20):  # warm up
        scrape()
    times = []
    size = 0
    for _ in range(n):
        if while_alive is not None and not while_alive():
            break
        start = time.perf_counter()
        size = len(scrape())
        times.append(time.perf_counter() - start)
    conn.close()
    return times, size


def has_child(pid: int) -> bool:
    """True while the daemon has a child process (a running probe)."""
    for children in Path(f"/proc/{pid}/task").glob("*/children"):  # probes start from scheduler threads
        try:
            if children.read_text().strip():
                return True
        except OSError:
            continue
    return False


def bench_during_probe(args: argparse.Namespace, workdir: Path) -> dict:
    """Scrape latency while a real probe child runs, beside the idle figure of the same run."""
    proc, url = start_daemon(args, workdir, probe_load=True)
    try:
        deadline = time.monotonic() + 120
        while not has_child(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # past the child's start-up: torch import, model build
        saved = None
        if args.save_probe_scrape:
            time.sleep(args.gpm_wait)  # two GPM reads inside the probe's measured windows
            if not has_child(proc.pid):
                raise SystemExit("the probe ended before the scrape could be saved: raise its repeats or lower --gpm-wait")
            saved = save_scrape(url, Path(args.save_probe_scrape))
        times, _ = bench_scrapes(url, args.scrapes, while_alive=lambda: has_child(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if not times:
        raise SystemExit(f"no scrape while the probe ran: {(workdir / 'daemon.log').read_text()[-3000:]}")
    result: dict = summary_ms(times)
    if saved is not None:
        result["saved_scrape"] = saved
    return result


def gpm_values(text: str) -> dict[str, float]:
    """GPU 0's GPM series of one scrape, by name (+ label), for the record."""
    out = {}
    for line in text.splitlines():
        if line.startswith("gpuperf_gpm_") and 'gpu="0"' in line:
            series, _, value = line.rpartition(" ")
            name = series.split("{")[0]
            extra = [v for k, v in re.findall(r'(\w+)="([^"]*)"', series) if k not in ("gpu", "uuid")]
            out[name + "".join(f"[{v}]" for v in extra)] = float(value)
    return out


def save_scrape(url: str, path: Path) -> dict:
    """Write one /metrics text to ``path``; lint it with promtool (if installed); return what it showed."""
    text = requests.get(url + "/metrics", timeout=5).text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    lint = None
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        lint = "clean" if check.returncode == 0 and not check.stdout.strip() else (check.stdout + check.stderr).strip()
    return {"path": str(path), "promtool_check_metrics": lint, "gpm_gpu0": gpm_values(text)}


def bench_nvidia_smi(n: int) -> list[float] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv"], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--simulate", type=int, metavar="N")
    group.add_argument("--nvml", action="store_true")
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--smi-calls", type=int, default=30)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--during-probe", action="store_true",
                        help="also measure scrapes while a real probe child runs (read-only, current cap)")
    parser.add_argument("--probe", default="vit", help="probe for --during-probe")
    parser.add_argument("--probe-preset", default="vit-b16", help="preset for --during-probe (tiny on CPU)")
    parser.add_argument("--malloc-arena-max", type=int, default=2, help="MALLOC_ARENA_MAX for the daemon (0: unset)")
    parser.add_argument("--save-probe-scrape", metavar="FILE",
                        help="with --during-probe: write one scrape taken while the probe runs to FILE (docs/data/)")
    parser.add_argument("--gpm-wait", type=float, default=25.0,
                        help="seconds into the probe before that scrape (GPM reads every 10 s)")
    parser.add_argument("--collectors", default="", metavar="YAML",
                        help="sampler.collectors flow mapping, e.g. 'xid: {enabled: false}, pcie: {interval_seconds: 30}'")
    args = parser.parse_args()
    if args.save_probe_scrape and not args.during_probe:
        parser.error("--save-probe-scrape needs --during-probe")

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_daemon(args, Path(tmp))
        try:
            time.sleep(3)  # let the slow lane fill
            scrape_times, size = bench_scrapes(url, args.scrapes)
            smi_times = bench_nvidia_smi(args.smi_calls)
            cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
            rss_samples = []
            while time.monotonic() - t0 < args.idle_seconds:
                rss_samples.append(proc_rss_bytes(proc.pid))
                time.sleep(1.0)
            cpu_share = (proc_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            lines = [line for line in requests.get(url + "/metrics", timeout=5).text.splitlines()
                     if line and not line.startswith("#")]
            series = len(lines)
            gpm_series = sum(1 for line in lines if line.startswith("gpuperf_gpm_"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)

    result = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "backend": "nvml" if args.nvml else f"simulated x{args.simulate}",
        "collectors": args.collectors,
        "malloc_arena_max": args.malloc_arena_max,
        "scrape": summary_ms(scrape_times),
        "scrape_bytes": size,
        "series": series,
        "gpm_series": gpm_series,
        "idle_rss_mb_max": max(rss_samples) / 2**20,
        "idle_cpu_percent_of_core": 100 * cpu_share,
        "idle_seconds": args.idle_seconds,
    }
    if args.during_probe:
        with tempfile.TemporaryDirectory() as tmp:
            result["scrape_during_probe"] = bench_during_probe(args, Path(tmp))
        result["during_probe_p99_over_idle_p99"] = result["scrape_during_probe"]["p99_ms"] / result["scrape"]["p99_ms"]
    if smi_times:
        result["nvidia_smi"] = summary_ms(smi_times)
        result["nvidia_smi_p50_over_scrape_p50"] = result["nvidia_smi"]["p50_ms"] / result["scrape"]["p50_ms"]
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

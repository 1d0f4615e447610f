"""Soak test: run the daemon for a long time with probes scheduled often; watch for leaks.

Starts the real daemon on simulated GPUs with power-cap sweeps on every GPU as
often as the config allows (every 10 s, simulated executor, a short measured
window, history with rotation), a Prometheus-like scraper (one keep-alive
connection, --scrape-interval) and, every --scrape-interval * 10, a fresh
connection that is dropped mid-response (as a scrape timeout does). Every
--sample-interval seconds it records the daemon's RSS, thread count and open
file descriptors from /proc.

After --warmup seconds the samples are split into two halves; growth is the
second half against the first, which ignores the one-off growth of start-up
and the first sweeps (imports, thread pools, the history file). Targets: mean
RSS growth <= --max-rss-growth-mb (5 MB); threads and fds: the second half's
floor (its fewest, counted while the probes have quiesced between sweeps) no
higher than the first half's floor. A leak raises every later sample, the quiet
ones included; a sweep's lock files, a history append or a scrape's socket raise
only the samples that catch them, so medians and maxima of open fds move by
chance (a 45 s soak once read medians 8 then 9, range 7-12, with no leak) and
are reported but not judged (see :func:`leak_targets`). Prints one JSON object;
exit code 1 if a target is missed, a scrape failed, or the daemon died.

Usage:
  python benchmarks/soak.py                      # one hour
  python benchmarks/soak.py --duration 600 --json soak.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import ROOT, die_with_parent, free_port, proc_stats  # noqa: E402

#: cost_scale 0: the soak looks for leaks (threads, fds, RSS) in the scrape and probe paths; a real child's
#: costs (simulation.cost_scale) only lengthen the rounds, so the scheduler's thread pool grows to its
#: steady size (26 threads either way on this config, 2026-11-29) after the warm-up instead of within it.
CONFIG = """
log_level: info
device: {{backend: simulated}}
sampler: {{interval_seconds: 1.0}}
simulation: {{gpus: {gpus}, seed: 1, state_file: {dir}/sim-limits.json, cost_scale: 0}}
probes:
  read_only: false
  state_dir: {dir}/state
  history: {{path: {dir}/history.jsonl, max_bytes: 65536, backups: 2}}
  idle_seconds: 0
  jitter_seconds: 2
  first_run_delay_seconds: 1
  simulated_measure_seconds: {measure}
  schedules:
    - probe: llm
      interval_seconds: 10
      caps: [max, 0.7, min]
      settle_seconds: 0
    - probe: vit
      interval_seconds: 10
      settle_seconds: 0
"""


def leak_targets(first: list[dict[str, float]], second: list[dict[str, float]], max_rss_growth_mb: float) -> dict[str, bool]:
    """Whether each resource stayed flat from the first half of the steady samples to the second.

    Threads and fds are judged by their floor (minimum): the count when nothing transient is open,
    which the probes reach between sweeps (sampled often enough that each half holds such moments).
    A leak of even one fd per sweep raises the floor; transient fds never do. RSS by its mean.
    """
    rss1 = statistics.fmean(s["rss_bytes"] for s in first) / 2**20
    rss2 = statistics.fmean(s["rss_bytes"] for s in second) / 2**20
    return {
        "rss": rss2 - rss1 <= max_rss_growth_mb,
        "threads": min(s["threads"] for s in second) <= min(s["threads"] for s in first),
        "fds": min(s["fds"] for s in second) <= min(s["fds"] for s in first),
    }


def probe_counts(text: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuperf_probe_runs_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = counts.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


class Scraper(threading.Thread):
    """Keep-alive scrapes at a fixed interval, plus now and then one that hangs up mid-response."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.stop = threading.Event()
        self.ok = 0
        self.errors: list[str] = []
        self.dropped = 0
        self.last_text = ""

    def _drop_mid_response(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(100)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        sock.close()
        self.dropped += 1

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        n = 0
        while not self.stop.wait(self.interval):
            n += 1
            try:
                conn.request("GET", "/metrics")
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    self.errors.append(f"status {response.status}")
                else:
                    self.ok += 1
                    self.last_text = body.decode()
                if n % 10 == 0:
                    self._drop_mid_response()
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.close()


def halves(values: list[float]) -> tuple[list[float], list[float]]:
    middle = len(values) // 2
    return values[:middle], values[middle:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds ignored at the start (default 10%%, 10-300 s)")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--measure-seconds", type=float, default=0.5, help="simulated probe window")
    parser.add_argument("--sample-interval", type=float, default=5.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--max-rss-growth-mb", type=float, default=5.0)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else min(300.0, max(10.0, 0.1 * args.duration))

    workdir = Path(tempfile.mkdtemp(prefix="gpuperfd-soak-"))
    config = workdir / "gpuperfd.yaml"
    config.write_text(CONFIG.format(gpus=args.gpus, dir=workdir, measure=args.measure_seconds))
    port = free_port()
    log_path = workdir / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuperfd", "run", "--config", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            preexec_fn=die_with_parent,
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            print(log_path.read_text(errors="replace"), file=sys.stderr)
            return 1
        time.sleep(0.1)

    scraper = Scraper(port, args.scrape_interval)
    scraper.start()
    started = time.monotonic()
    samples: list[dict[str, float]] = []
    died = False
    try:
        while (elapsed := time.monotonic() - started) < args.duration:
            if proc.poll() is not None:
                died = True
                break
            stats = proc_stats(proc.pid)
            stats["t"] = elapsed
            samples.append(stats)
            time.sleep(min(args.sample_interval, max(0.0, args.duration - elapsed)))
    finally:
        scraper.stop.set()
        scraper.join(15)
        counts = probe_counts(scraper.last_text)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    log_text = log_path.read_text(errors="replace")

    steady = [s for s in samples if s["t"] >= warmup]
    first, second = halves(steady)
    result: dict[str, object] = {
        "duration_s": round(samples[-1]["t"] if samples else 0.0, 1),
        "warmup_s": warmup,
        "gpus": args.gpus,
        "samples": len(samples),
        "scrapes_ok": scraper.ok,
        "scrape_errors": len(scraper.errors),
        "scrape_error_examples": scraper.errors[:5],
        "connections_dropped_mid_response": scraper.dropped,
        "probe_runs": counts,
        "daemon_alive_until_stop": not died,
        "exit_code": proc.returncode,
        "tracebacks_in_log": log_text.count("Traceback"),
    }
    ok = not died and proc.returncode == 0 and not scraper.errors and result["tracebacks_in_log"] == 0
    if len(first) >= 2 and len(second) >= 2:
        rss1 = statistics.fmean(s["rss_bytes"] for s in first) / 2**20
        rss2 = statistics.fmean(s["rss_bytes"] for s in second) / 2**20
        growth = {
            "rss_mb_first_half_mean": round(rss1, 2),
            "rss_mb_second_half_mean": round(rss2, 2),
            "rss_growth_mb": round(rss2 - rss1, 2),
            "rss_mb_start": round(samples[0]["rss_bytes"] / 2**20, 2),
            "rss_mb_end": round(samples[-1]["rss_bytes"] / 2**20, 2),
            "threads_first_half_floor": min(s["threads"] for s in first),
            "threads_second_half_floor": min(s["threads"] for s in second),
            "fds_first_half_floor": min(s["fds"] for s in first),
            "fds_second_half_floor": min(s["fds"] for s in second),
            "threads_first_half_median": statistics.median(s["threads"] for s in first),
            "threads_second_half_median": statistics.median(s["threads"] for s in second),
            "threads_first_half_max": max(s["threads"] for s in first),
            "threads_second_half_max": max(s["threads"] for s in second),
            "threads_range": [min(s["threads"] for s in samples), max(s["threads"] for s in samples)],
            "fds_first_half_median": statistics.median(s["fds"] for s in first),
            "fds_second_half_median": statistics.median(s["fds"] for s in second),
            "fds_first_half_max": max(s["fds"] for s in first),
            "fds_second_half_max": max(s["fds"] for s in second),
            "fds_range": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
            "daemon_cpu_seconds": round(samples[-1]["cpu_seconds"] - samples[0]["cpu_seconds"], 1),
        }
        result["growth"] = growth
        targets = leak_targets(first, second, args.max_rss_growth_mb)
        result["targets_met"] = targets
        ok = ok and all(targets.values())
    else:
        result["growth"] = None
        ok = False
    result["ok"] = ok
    result["trajectory"] = {  # every sample: seconds, RSS MB, threads, fds
        "t_s": [round(s["t"]) for s in samples],
        "rss_mb": [round(s["rss_bytes"] / 2**20, 2) for s in samples],
        "threads": [s["threads"] for s in samples],
        "fds": [s["fds"] for s in samples],
    }
    result["workdir"] = str(workdir)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

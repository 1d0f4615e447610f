"""Scrape success with a real Prometheus: does every scrape of gpuperfd succeed?

Starts `gpuperfd run --simulate N` (probe sweeps every 10 s, so the probe
registry changes between some scrapes and not between others) and a stock
Prometheus (default scrape protocols: OpenMetrics first) scraping it every
``--interval`` seconds for ``--seconds``. Then it reports:
  * the scrape success ratio: sum_over_time(up[..]) / count_over_time(up[..]);
  * the last scrape error Prometheus recorded (from /api/v1/targets);
  * stored vs served: for stable series, the value Prometheus stored at the last
    scrape against the value the text format serves now (mismatches listed).

Usage:
  python benchmarks/scrape_success.py [--simulate 2] [--seconds 40] [--interval 1] [--json OUT]
Exit code 0 when every scrape succeeded and no stored value differs, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: Series whose value does not change between scrapes (same for every scrape of one daemon).
STABLE_SERIES = ("gpuperf_build_info", "gpuperf_gpu_info", "gpuperf_memory_total_bytes",
                 "gpuperf_power_cap_original_watts", "gpuperf_probe_power_cap_watts")

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def get(url: str, params: dict[str, str] | None = None, accept: str | None = None) -> bytes:
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with _OPENER.open(request, timeout=10) as response:
        return response.read()


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    body = json.loads(get(prom + "/api/v1/query", {"query": expr}))
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            get(url)
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready:\n{log.read_text()[-3000:]}")


def daemon_config(port: int, state: Path) -> str:
    """Sweeps over three caps every 10 s (the shortest interval allowed) so several probe runs happen."""
    return f"""
web: {{listen_address: "127.0.0.1:{port}"}}
probes:
  state_dir: {state}
  read_only: false  # the sweeps change simulated caps
  executor: simulated
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 1
  simulated_measure_seconds: 0.3
  history: {{path: {state / 'history.jsonl'}}}
  schedules:
    - {{probe: llm, interval_seconds: 10, caps: [300, 500, 700], settle_seconds: 0}}
"""


def compare_stored(prom: str, daemon: str) -> tuple[int, list[str]]:
    """(series compared, mismatches) between Prometheus' latest stored sample and the text format served now."""
    Key = tuple[str, tuple[tuple[str, str], ...]]
    served: dict[Key, float] = {}
    for family in text_string_to_metric_families(get(daemon + "/metrics", accept="text/plain").decode()):
        for sample in family.samples:
            if sample.name in STABLE_SERIES:
                served[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    stored: dict[Key, float] = {}
    for name in STABLE_SERIES:
        for result in query(prom, name):
            labels = {k: v for k, v in result["metric"].items() if k not in ("__name__", "job", "instance")}
            stored[(name, tuple(sorted(labels.items())))] = float(result["value"][1])
    mismatches = [
        f"{name}{dict(labels)}: stored {stored.get((name, labels))}, served {served.get((name, labels))}"
        for name, labels in sorted(served.keys() | stored.keys())
        if stored.get((name, labels)) != served.get((name, labels))
    ]
    return len(served), mismatches


def measure(gpus: int, seconds: float, interval: float, workdir: Path, prometheus: str = "prometheus") -> dict[str, Any]:
    daemon_port, prom_port = free_ports(2)
    state = workdir / "state"
    state.mkdir(parents=True)
    (workdir / "gpuperfd.yaml").write_text(daemon_config(daemon_port, state))
    prom_dir = workdir / "prometheus"
    prom_dir.mkdir()
    # Stock settings: no scrape_protocols, so Prometheus asks for OpenMetrics first.
    (prom_dir / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {interval:g}s, scrape_timeout: {interval:g}s}}\n"
        f"scrape_configs:\n  - job_name: gpuperfd\n    static_configs: [{{targets: ['127.0.0.1:{daemon_port}']}}]\n"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    processes: list[subprocess.Popen] = []
    logs = []
    try:
        daemon_log = workdir / "daemon.log"
        logs.append(daemon_log.open("wb"))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "gpuperfd", "run", "--simulate", str(gpus), "--config", str(workdir / "gpuperfd.yaml")],
            stdout=logs[-1], stderr=subprocess.STDOUT, cwd=workdir, env=env))
        daemon = f"http://127.0.0.1:{daemon_port}"
        wait_http(daemon + "/healthz", processes[0], daemon_log)
        prom_log = prom_dir / "prometheus.log"
        logs.append(prom_log.open("wb"))
        processes.append(subprocess.Popen(
            [prometheus, f"--config.file={prom_dir / 'prometheus.yml'}", f"--storage.tsdb.path={prom_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=logs[-1], stderr=subprocess.STDOUT, cwd=prom_dir))
        prom = f"http://127.0.0.1:{prom_port}"
        wait_http(prom + "/-/ready", processes[1], prom_log)
        started = time.monotonic()
        time.sleep(seconds)
        window = f"{int(seconds) + 10}s"
        count = query(prom, f"count_over_time(up[{window}])")
        total = query(prom, f"sum_over_time(up[{window}])")
        target = json.loads(get(prom + "/api/v1/targets"))["data"]["activeTargets"][0]
        compared, mismatches = compare_stored(prom, daemon)
        history = (state / "history.jsonl")
        probe_runs = len(history.read_text().splitlines()) if history.exists() else 0
        scrapes = float(count[0]["value"][1]) if count else 0.0
        ok = float(total[0]["value"][1]) if total else 0.0
        return {
            "prometheus_version": subprocess.run([prometheus, "--version"], capture_output=True, text=True).stdout.split("\n")[0],
            "machine": platform.node(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
            "gpus": gpus, "seconds": round(time.monotonic() - started, 1), "interval_seconds": interval,
            "scrapes": scrapes, "scrapes_ok": ok, "success_ratio": ok / scrapes if scrapes else 0.0,
            "last_error": target.get("lastError", ""),
            "probe_points": probe_runs, "series_compared": compared, "mismatches": mismatches,
            "daemon_alive": processes[0].poll() is None,
        }
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for handle in logs:
            handle.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", type=int, default=2, help="simulated GPUs")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long Prometheus scrapes")
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval, seconds")
    parser.add_argument("--prometheus", default="prometheus", help="prometheus binary")
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, TSDB)")
    args = parser.parse_args()
    if not shutil.which(args.prometheus):
        print(f"{args.prometheus} not found (apt-get install prometheus)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gpuperfd-scrape-success-"))
    try:
        result = measure(args.simulate, args.seconds, args.interval, workdir, args.prometheus)
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if result["success_ratio"] == 1.0 and not result["mismatches"] and result["scrapes"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

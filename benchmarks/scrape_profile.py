#!/usr/bin/env python3
"""Where a /metrics scrape's time goes, and how it compares with prometheus_client's own path.

    python3 benchmarks/scrape_profile.py --simulate 8 --json OUT.json            # dev VM
    python3 benchmarks/scrape_profile.py --nvml --json OUT.json                  # GPU node (read-only)
    python3 benchmarks/scrape_profile.py --simulate 8 --before /path/to/old/tree # same-run before/after

One process builds the daemon's own pieces (config, backend, sampler with every
default collector, GPM included, exporter, web server) without its scheduler, takes
one sampling round, and then times, side by side in one run:

* ``telemetry``: ``Exporter.telemetry_families()`` (the readings as exposition lines);
* ``process``: the process_* part (prometheus_client's ProcessCollector, /proc reads);
* ``render``: ``Exporter.render()``, the whole body (text 0.0.4);
* ``http_keepalive``: GET /metrics over one keep-alive connection (as Prometheus scrapes), from a
  separate client process (an in-process client would share the server's GIL);
* ``http_keepalive_worker``: the same, with the connection loop handing each request to a worker
  thread (as before issue 36's inline serving);
* ``http_new_conn``: GET /metrics on a new connection each time;
* ``pc_generate_latest``: prometheus_client's ``generate_latest`` of an equal registry (the same
  families and samples, parsed back from our scrape into a custom collector);
* ``pc_wsgi_new_conn``: that registry behind prometheus_client's stock server
  (``start_http_server``: wsgiref, HTTP/1.0, one connection per request).

With ``--before DIR`` the in-process measures are also taken in a subprocess on the
tree at DIR (the landed code), on the same machine and backend, and the ratios printed.
Nothing changes any GPU setting: NVML is only read.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {"n": len(values), "p50_ms": 1000 * statistics.median(values), "p99_ms": 1000 * q(0.99),
            "max_ms": 1000 * ordered[-1], "mean_ms": 1000 * statistics.fmean(values)}


def timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    for _ in range(min(20, n)):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return summary(out)


def build_daemon(args: argparse.Namespace) -> Any:
    from gpuperfd.config import config_from_mapping
    from gpuperfd.daemon import Daemon

    data: dict[str, Any] = {"web": {"listen_address": "127.0.0.1:0"}}
    if args.simulate:
        data.update({"device": {"backend": "simulated"}, "simulation": {"gpus": args.simulate, "seed": 1}})
    else:
        data["device"] = {"backend": "nvml"}
    daemon = Daemon(config_from_mapping(data, "<scrape_profile>"))
    daemon.sampler.sample_once()
    if getattr(daemon, "health", None) is not None:
        daemon.health.evaluate_once()  # as the daemon's start: the verdict families are on /metrics
    return daemon


CLIENT = """
import http.client, json, sys, time
port, n, keep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "keep"
conn = None
out = []
for i in range(n + 20):
    t0 = time.perf_counter()
    if conn is None or not keep:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    r = conn.getresponse(); r.read()
    assert r.status == 200
    if not keep:
        conn.close()
    if i >= 20:
        out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def http_client(port: int, n: int, keep: bool) -> dict[str, float]:
    """Scrapes from a separate process (a client in this one would share our GIL with the server)."""
    done = subprocess.run([sys.executable, "-c", CLIENT, str(port), str(n), "keep" if keep else "new"],
                          capture_output=True, text=True, check=True)
    return summary(json.loads(done.stdout))


def get(conn: http.client.HTTPConnection, path: str = "/metrics") -> bytes:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, response.status
    return body


def measure_ours(args: argparse.Namespace) -> dict[str, Any]:
    """The in-process and HTTP measures of the gpuperfd tree on sys.path (this one or --tree's)."""
    daemon = build_daemon(args)
    exporter = daemon.exporter
    body = exporter.render()
    out: dict[str, Any] = {
        "tree": str(Path(__import__("gpuperfd").__file__).parents[1]),
        "series": sum(1 for line in body.decode().splitlines() if line and not line.startswith("#")),
        "bytes": len(body),
        "gpm_series": sum(1 for line in body.decode().splitlines() if line.startswith("gpuperf_gpm")),
        "gpus": len(daemon.devices),
    }
    # An older tree may lack a piece: each measure is taken where the tree has it, never the whole run lost.
    if hasattr(exporter, "telemetry_families"):
        out["telemetry"] = timed(exporter.telemetry_families, args.n)
    process = [r for r, _ in getattr(exporter, "registries", ())
               if any(m.name.startswith("process") for m in r.collect())]
    if process:
        from prometheus_client import generate_latest

        out["process_uncached"] = timed(lambda: generate_latest(process[0]), args.n)
    out["render"] = timed(exporter.render, args.n)
    daemon.web.start()
    try:
        out["http_keepalive"] = http_client(daemon.port, args.n, keep=True)
        out["http_new_conn"] = http_client(daemon.port, max(args.n // 4, 50), keep=False)
        loop = daemon.web.loop
        if getattr(loop, "inline", None) is not None:  # the same scrape through a worker thread, for comparison
            loop.inline = None
            out["http_keepalive_worker"] = http_client(daemon.port, args.n, keep=True)
    finally:
        daemon.web.stop()
        daemon.backend.close()
    out["_body"] = body.decode()
    return out


class EqualCollector:
    """The same families and samples as a scrape of ours, as a prometheus_client collector."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.families = list(text_string_to_metric_families(text))

    def collect(self) -> Any:
        return iter(self.families)


def measure_prometheus_client(body: str, n: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(EqualCollector(body))
    out = {"pc_generate_latest": timed(lambda: generate_latest(registry), n)}
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = server.server_port

    try:
        out["pc_wsgi_new_conn"] = http_client(port, max(n // 4, 50), keep=False)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    return out


#: Runs THIS script's measuring code (``--tree-only``) with the old tree's ``gpuperfd`` first on
#: sys.path: the old tree's own benchmarks (which may lack this script or its helpers) are never used.
BEFORE_BOOT = """
import runpy, sys
root, script = sys.argv[1], sys.argv[2]
sys.path[:] = [root] + [p for p in sys.path if p not in ("", ".")] + [__import__("os").path.dirname(script)]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def measure_before(args: argparse.Namespace) -> dict[str, Any]:
    """The in-process and HTTP measures of the tree at ``--before``, taken by this script's code."""
    root = Path(args.before).resolve()
    if not (root / "gpuperfd" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: no gpuperfd/ package there")
    cmd = [sys.executable, "-c", BEFORE_BOOT, str(root), str(Path(__file__).resolve()), "--tree-only", "-n", str(args.n)]
    cmd += ["--simulate", str(args.simulate)] if args.simulate else ["--nvml"]
    # the old tree first, then whatever PYTHONPATH already held (a GPU node's site folder of wheels)
    path = os.pathsep.join([str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"--before {root}: the measurement failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["tree"]).resolve() != root:
        raise SystemExit(f"--before {root}: measured {result['tree']} instead")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulate", type=int, default=0, help="N simulated GPUs (default: NVML)")
    parser.add_argument("--nvml", action="store_true", help="NVML backend (the default when --simulate is 0)")
    parser.add_argument("-n", type=int, default=2000, help="timed calls per measure")
    parser.add_argument("--before", help="a directory holding the landed tree (its gpuperfd/) to measure too")
    parser.add_argument("--tree-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.tree_only:
        result = measure_ours(args)
        result.pop("_body")
        print(json.dumps(result))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    before = measure_before(args) if args.before else None
    after = measure_ours(args)
    body = after.pop("_body")
    after.update(measure_prometheus_client(body, args.n))
    report = {"machine": platform.node(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv), "after": after, "before": before}
    keys = ["telemetry", "process_uncached", "render", "http_keepalive", "http_keepalive_worker", "http_new_conn",
            "pc_generate_latest", "pc_wsgi_new_conn"]
    print(f"{after['gpus']} GPU(s), {after['series']} series ({after['gpm_series']} GPM), {after['bytes']} bytes")
    print(f"{'measure':22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}" + ("   before p50/p99   ratio p50" if before else ""))
    for key in keys:
        if key not in after:
            continue
        s = after[key]
        line = f"{key:22} {s['p50_ms']:8.3f} {s['p99_ms']:8.3f} {s['max_ms']:8.3f}"
        if before and key in before:
            b = before[key]
            line += f"   {b['p50_ms']:7.3f}/{b['p99_ms']:7.3f}   {b['p50_ms'] / s['p50_ms']:6.1f}x"
        print(line)
    pc = after["pc_generate_latest"]["p50_ms"]
    print(f"prometheus_client generate_latest / our render, p50: {pc / after['render']['p50_ms']:.1f}x; "
          f"stock WSGI (new conn) / our keep-alive, p50: "
          f"{after['pc_wsgi_new_conn']['p50_ms'] / after['http_keepalive']['p50_ms']:.1f}x; "
          f"/ our new conn: {after['pc_wsgi_new_conn']['p50_ms'] / after['http_new_conn']['p50_ms']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

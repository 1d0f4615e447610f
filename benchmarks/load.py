"""Load test: many concurrent scrapers against one daemon, on loopback.

Starts the real daemon (``gpuperfd run --simulate N``) unless --url is given,
then runs --clients scrapers for --duration seconds. Each scraper holds one
keep-alive connection (as Prometheus does) and scrapes in a closed loop: the
next request goes out when the last response is in, optionally paced to
--rate requests per second per client. The clients are coroutines on one
asyncio loop with raw sockets (no HTTP library): on a 2-core machine the
load generator competes with the daemon for CPU, so it has to be cheap. Its
own CPU use is reported next to the daemon's, so a run that was limited by
the client can be told apart from one limited by the server.

Every response is checked: status 200, a Content-Length body read in full,
the text ending in a newline. Anything else (refused or reset connection,
timeout, short body, other status) is an error, by kind.

Prints one JSON object (and writes it to --json if given):
requests, errors, throughput, latency p50/p90/p99/p999/max in ms, CPU of the
client and the daemon, the daemon's RSS and thread count before and after.

With --idle N it runs the attack scenario instead: N connections that are
silent (connect, send nothing; over --tls never a ClientHello) or slowloris
(half a request head, a byte now and then; over --tls after the handshake)
held for --duration seconds, while one legitimate scraper scrapes once a
second on a new connection each time. Reports the daemon's thread count
(before, max during, after), RSS growth, the scrape latencies and failures,
and how many attack connections the daemon closed (deadlines, the cap).

Usage:
  python benchmarks/load.py --idle 3000 --idle-kind slowloris --duration 30
  python benchmarks/load.py --idle 3000 --idle-kind silent --tls --duration 30
  python benchmarks/load.py --clients 200 --duration 60 --simulate 8
  python benchmarks/load.py --clients 50 --duration 5 --rate 5
  python benchmarks/load.py --url http://127.0.0.1:10187/metrics --clients 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """preexec_fn: the daemon gets SIGTERM when this script dies, even by SIGKILL (Linux prctl)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds, RSS bytes, threads and open fds of a process, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().decode().rsplit(")", 1)[1].split()
    status = Path(f"/proc/{pid}/status").read_text()
    values = {line.split(":")[0]: line.split(":", 1)[1].strip() for line in status.splitlines() if ":" in line}
    return {
        "cpu_seconds": (int(fields[11]) + int(fields[12])) / CLK_TCK,
        "rss_bytes": int(values["VmRSS"].split()[0]) * 1024,
        "threads": int(values["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Daemon:
    """A `gpuperfd run --simulate N` child on a free loopback port (benchmarks/auth_flood.py subclasses it)."""

    prefix = "gpuperfd-load-"
    probes = "{state_dir: %s/state, history: {path: null}}"  # %s: the daemon's temporary directory
    ready_seconds = 30.0

    def __init__(self, gpus: int, extra_config: str = "", tls: bool = False, extra_args: list[str] | None = None) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=self.prefix))
        self.cert = make_certificate(self.dir) if tls else None
        if self.cert:
            (self.dir / "web.yml").write_text(f"tls_server_config: {{cert_file: {self.cert[0]}, key_file: {self.cert[1]}}}\n")
            extra_args = [*(extra_args or []), "--web.config.file", str(self.dir / "web.yml")]
        config = self.dir / "gpuperfd.yaml"
        config.write_text(
            "log_level: warning\n"
            "device: {backend: simulated}\n"
            f"simulation: {{gpus: {gpus}, seed: 1}}\n"
            f"probes: {self.probes % self.dir}\n" + self.setup() + extra_config
        )
        self.log_path = self.dir / "daemon.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuperfd", "run", "--config", str(config),
             "--web.listen-address", f"127.0.0.1:{self.port}", *(extra_args or [])],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            preexec_fn=die_with_parent,
        )
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        deadline = time.monotonic() + self.ready_seconds
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.ready():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"daemon not ready:\n{self.log()}")
            time.sleep(0.1)

    def setup(self) -> str:
        """More configuration (files may go in ``self.dir``), before the daemon starts."""
        return ""

    def ready(self) -> bool:
        """Whether the daemon answers (OSError: not listening yet)."""
        return scrape_once(self.port, self.cert, "/healthz")[0] == 200

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self.proc.returncode == 0:  # keep the log of a daemon that failed
            shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for localhost (openssl), for the --tls runs."""
    crt, key = directory / "server.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    return crt, key


def connect(port: int, cert: tuple[Path, Path] | None, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if cert is None:
        return sock
    import ssl

    return ssl.create_default_context(cafile=str(cert[0])).wrap_socket(sock, server_hostname="localhost")


def scrape_once(port: int, cert: tuple[Path, Path] | None, path: str = "/metrics") -> tuple[int, float]:
    """One GET on a new connection (TLS handshake included): (status, seconds)."""
    start = time.monotonic()
    with connect(port, cert) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), time.monotonic() - start


def run_idle(args: argparse.Namespace) -> int:
    """The attack scenario: --idle silent or slowloris connections, one legitimate scraper."""
    extra = ["--web.max-connections", str(args.max_connections)] if args.max_connections else []
    daemon = Daemon(args.simulate, tls=args.tls, extra_args=extra)
    pid, cert = daemon.proc.pid, daemon.cert
    held: list[socket.socket] = []
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    try:
        for _ in range(5):  # warm: first scrapes fill caches
            scrape_once(daemon.port, cert)
        time.sleep(1.0)
        before = proc_stats(pid)
        opened_at = time.monotonic()
        for i in range(args.idle):
            try:
                if args.idle_kind == "silent":
                    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
                else:  # slowloris: over TLS the handshake completes first, then half a head
                    sock = connect(daemon.port, cert)
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                sock.setblocking(False)
                held.append(sock)
            except OSError as exc:
                failures[f"attack_connect_{type(exc).__name__}"] += 1
        open_seconds = time.monotonic() - opened_at
        threads_max, rss_max, fds_max = before["threads"], before["rss_bytes"], before["fds"]
        stop_at = time.monotonic() + args.duration
        while time.monotonic() < stop_at:
            try:
                status, seconds = scrape_once(daemon.port, cert)
                if status == 200:
                    latencies.append(seconds)
                else:
                    failures[f"status_{status}"] += 1
            except OSError as exc:
                failures[type(exc).__name__] += 1
            if args.idle_kind == "slowloris":
                for sock in held:
                    try:
                        sock.send(b"a")
                    except (OSError, ValueError):
                        pass
            stats = proc_stats(pid)
            threads_max, rss_max = max(threads_max, stats["threads"]), max(rss_max, stats["rss_bytes"])
            fds_max = max(fds_max, stats["fds"])  # open fds ~ connections the daemon holds
            time.sleep(1.0)
        during = proc_stats(pid)
        closed_by_daemon = 0
        for sock in held:
            try:
                if sock.recv(1) == b"":
                    closed_by_daemon += 1
            except (BlockingIOError, OSError):
                pass  # ssl.SSLWantReadError is an OSError: still open
        for sock in held:
            sock.close()
        time.sleep(2.0)
        after = proc_stats(pid)
        alive = daemon.proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        code = daemon.stop()
    ordered = sorted(latencies)
    result = {
        "scenario": f"{args.idle} {args.idle_kind} connections{' over TLS' if args.tls else ''}",
        "max_connections": args.max_connections or "default (512)",
        "seconds_to_open": round(open_seconds, 1),
        "held_seconds": args.duration,
        "attack_connections_closed_by_daemon": closed_by_daemon,
        "scrapes_ok": len(ordered),
        "scrape_failures": dict(failures),
        "scrape_latency_ms": {name: round(1000 * percentile(ordered, q), 1)
                              for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
        "daemon": {
            "threads_before": before["threads"], "threads_max": threads_max, "threads_after": after["threads"],
            "rss_mb_before": round(before["rss_bytes"] / 2**20, 1), "rss_mb_max": round(rss_max / 2**20, 1),
            "rss_mb_during_end": round(during["rss_bytes"] / 2**20, 1), "rss_mb_after": round(after["rss_bytes"] / 2**20, 1),
            "rss_growth_mb": round((rss_max - before["rss_bytes"]) / 2**20, 1),
            "fds_max": fds_max, "fds_during_end": during["fds"], "fds_after": after["fds"],
            "alive": alive, "exit_code": code,
        },
    }
    result["targets_met"] = {
        "threads_constant": threads_max == before["threads"],
        "rss_growth_under_10_mb": result["daemon"]["rss_growth_mb"] < 10,
        "scrape_p99_under_100_ms": bool(ordered) and result["scrape_latency_ms"]["p99"] < 100,
        "no_scrape_failures": not any(k for k in failures if not k.startswith("attack_")),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if all(result["targets_met"].values()) and alive else 1


class Stats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.bytes = 0
        self.connections = 0


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, keep_alive) of one HTTP/1.1 response with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    keep_alive = True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            keep_alive = False
    if length is None:
        raise ValueError("response without Content-Length")
    body = await reader.readexactly(length)
    return status, body, keep_alive


async def client(host: str, port: int, path: str, stop_at: float, rate: float, timeout: float, stats: Stats,
                 start_delay: float) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: gpuperfd-load\r\nAccept: */*\r\n\r\n".encode()
    period = 1.0 / rate if rate > 0 else 0.0
    await asyncio.sleep(start_delay)
    reader = writer = None
    next_at = time.monotonic()
    while time.monotonic() < stop_at:
        if period:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += period
            if time.monotonic() >= stop_at:
                break
        start = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                stats.connections += 1
            writer.write(request)
            status, body, keep_alive = await asyncio.wait_for(read_response(reader), timeout)
        except asyncio.TimeoutError:
            stats.errors["timeout"] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            continue
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
            stats.errors[type(exc).__name__] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.01)
            continue
        elapsed = time.monotonic() - start
        if status != 200:
            stats.errors[f"status_{status}"] += 1
        elif not body.endswith(b"\n"):
            stats.errors["truncated_body"] += 1
        else:
            stats.latencies.append(elapsed)
            stats.bytes += len(body)
        if not keep_alive:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def run_clients(url: str, clients: int, duration: float, rate: float, timeout: float, ramp: float) -> tuple[Stats, float]:
    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/metrics"
    stats = Stats()
    started = time.monotonic()
    stop_at = started + duration
    tasks = [
        asyncio.create_task(client(host, port, path, stop_at, rate, timeout, stats, ramp * i / max(1, clients)))
        for i in range(clients)
    ]
    await asyncio.gather(*tasks)
    return stats, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="scrape this URL instead of starting a daemon")
    parser.add_argument("--simulate", type=int, default=8, help="simulated GPUs of the daemon started (default 8)")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s per client (0: as fast as possible)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a request counts as an error")
    parser.add_argument("--ramp", type=float, default=1.0, help="seconds over which clients start")
    parser.add_argument("--json", metavar="OUT", help="also write the result here")
    parser.add_argument("--idle", type=int, default=0, metavar="N", help="run the attack scenario with N connections")
    parser.add_argument("--idle-kind", choices=["silent", "slowloris"], default="slowloris")
    parser.add_argument("--tls", action="store_true", help="serve TLS (self-signed) in the attack scenario")
    parser.add_argument("--max-connections", type=int, default=0, help="the daemon's --web.max-connections")
    args = parser.parse_args(argv)
    if args.idle:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < args.idle + 256:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.idle + 256), hard))
        return run_idle(args)

    # 200 keep-alive sockets plus the daemon's: make sure the client may hold them.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * args.clients + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * args.clients + 64), hard))

    daemon = None if args.url else Daemon(args.simulate)
    url = args.url or daemon.url
    pid = daemon.proc.pid if daemon else None
    try:
        before = proc_stats(pid) if pid else None
        client_before = resource.getrusage(resource.RUSAGE_SELF)
        stats, elapsed = asyncio.run(run_clients(url, args.clients, args.duration, args.rate, args.timeout, args.ramp))
        client_after = resource.getrusage(resource.RUSAGE_SELF)
        after = proc_stats(pid) if pid else None
        alive = daemon.proc.poll() is None if daemon else True
    finally:
        code = daemon.stop() if daemon else 0
    ordered = sorted(stats.latencies)
    client_cpu = (client_after.ru_utime + client_after.ru_stime) - (client_before.ru_utime + client_before.ru_stime)
    result = {
        "url": url,
        "gpus": None if args.url else args.simulate,
        "clients": args.clients,
        "duration_s": round(elapsed, 2),
        "rate_per_client": args.rate or None,
        "requests_ok": len(ordered),
        "errors": sum(stats.errors.values()),
        "errors_by_kind": dict(stats.errors),
        "connections_opened": stats.connections,
        "throughput_rps": round(len(ordered) / elapsed, 1),
        "mean_body_bytes": round(stats.bytes / len(ordered)) if ordered else 0,
        "latency_ms": {
            name: round(1000 * percentile(ordered, q), 2)
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))
        },
        "client_cpu_seconds": round(client_cpu, 2),
        "client_cpu_share": round(client_cpu / elapsed, 2),
        "cpu_count": os.cpu_count(),
    }
    if before and after:
        result["daemon"] = {
            "cpu_seconds": round(after["cpu_seconds"] - before["cpu_seconds"], 2),
            "cpu_share": round((after["cpu_seconds"] - before["cpu_seconds"]) / elapsed, 2),
            "rss_mb_before": round(before["rss_bytes"] / 2**20, 1),
            "rss_mb_after": round(after["rss_bytes"] / 2**20, 1),
            "threads_before": before["threads"],
            "threads_after": after["threads"],
            "alive_after_load": alive,
            "exit_code": code,
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if result["errors"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())

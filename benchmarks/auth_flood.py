"""Auth flood: does a scrape with cached credentials stay fast while clients guess passwords?

Starts the real daemon (``gpuperfd run``, simulated GPUs) with basic auth at
bcrypt cost --cost (12 by default, what the issue measured), scrapes it with
the right password once (its check is then cached), and measures that
legitimate scraper (one keep-alive connection, a scrape every --interval
seconds) in two phases of one run:

* quiet: --quiet seconds with nothing else going on;
* flood: --duration seconds while --clients attackers (a separate process,
  asyncio, raw sockets, one keep-alive connection each, reconnecting when
  closed) send scrapes with a new random password each time, as fast as the
  answers come, ignoring ``Retry-After``.

The attackers run in their own process so that their event loop never delays
the legitimate scraper's own reads (its latencies are the daemon's).

Prints one JSON object (and writes it to --json): the scraper's latency
(p50/p99/max ms, how many over 100 ms, failures) per phase, the attackers'
answers by status, ``gpuperf_web_auth_refused_total`` after the flood, and the
daemon's CPU seconds, threads and RSS.

Usage:
  python benchmarks/auth_flood.py                     # cost 12, 64 clients, 30 s flood, 10 s quiet
  python benchmarks/auth_flood.py --clients 16 --duration 10 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import secrets
import socket
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import Daemon as LoadDaemon  # noqa: E402
from load import percentile, proc_stats  # noqa: E402

USER, PASSWORD = "prometheus", "the-right-password"


def auth_header(user: str, password: str) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()) + b"\r\n"


def request(password: str) -> bytes:
    return b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth_header(USER, password) + b"\r\n"


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """(status, body) of one Content-Length response from a blocking socket; ``buf`` keeps leftovers."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    while len(buf) < end + length:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        buf += data
    body = bytes(buf[end:end + length])
    del buf[:end + length]
    return status, body


class Daemon(LoadDaemon):
    """`gpuperfd run` with basic auth (bcrypt ``cost``) on a free loopback port; probes off."""

    prefix = "gpuperfd-authflood-"
    probes = "{enabled: false, state_dir: %s/state, history: {path: null}}"
    ready_seconds = 60.0

    def __init__(self, gpus: int, cost: int) -> None:
        self.cost = cost
        super().__init__(gpus)

    def setup(self) -> str:
        import bcrypt

        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=self.cost)).decode()
        (self.dir / "web.yml").write_text(json.dumps({"basic_auth_users": {USER: hashed}}))
        return f"web: {{config_file: {self.dir / 'web.yml'}}}\n"

    def ready(self) -> bool:
        """/healthz wants credentials too: any HTTP answer means it is up."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/1.1")


# --- the attackers (their own process) ---------------------------------------------------------


async def _attacker(port: int, stop_at: float, counts: Counter) -> None:
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["connect_error"] += 1
            await asyncio.sleep(0.01)
            continue
        try:
            while time.monotonic() < stop_at:
                writer.write(request(secrets.token_hex(8)))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                lines = head.split(b"\r\n")
                length = next(int(v.split(b":")[1]) for v in lines if v.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                counts[lines[0].split()[1].decode()] += 1
                if any(v.lower() == b"connection: close" for v in lines):
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            counts["reset"] += 1
        finally:
            writer.close()


def attack(port: int, clients: int, duration: float, out: multiprocessing.Queue) -> None:
    async def run() -> Counter:
        counts: Counter = Counter()
        stop_at = time.monotonic() + duration
        await asyncio.gather(*(_attacker(port, stop_at, counts) for _ in range(clients)))
        return counts

    out.put(dict(asyncio.run(run())))


# --- the legitimate scraper --------------------------------------------------------------------


def scrape_phase(port: int, seconds: float, interval: float) -> dict:
    latencies: list[float] = []
    failures: Counter = Counter()
    sock, buf = None, bytearray()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                buf.clear()
            sock.sendall(request(PASSWORD))
            status, body = read_response(sock, buf)
            elapsed = time.monotonic() - start
            if status == 200 and b"gpuperf_gpu_up" in body:
                latencies.append(elapsed)
            else:
                failures[str(status)] += 1
        except OSError as exc:
            failures[type(exc).__name__] += 1
            sock = None
        time.sleep(max(0.0, interval - (time.monotonic() - start)))
    if sock is not None:
        sock.close()
    ordered = sorted(latencies)
    return {
        "scrapes": len(latencies),
        "failures": dict(failures),
        "p50_ms": round(percentile(ordered, 0.5) * 1000, 2),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 2),
        "max_ms": round(max(ordered, default=float("nan")) * 1000, 2),
        "over_100ms": sum(1 for x in ordered if x > 0.1),
    }


def refused_counter(port: int) -> float | None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request(PASSWORD))
        status, body = read_response(sock, bytearray())
    for line in body.decode().splitlines():
        if line.startswith("gpuperf_web_auth_refused_total "):
            return float(line.split()[1])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of flood")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds measured before the flood")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between legitimate scrapes")
    parser.add_argument("--cost", type=int, default=12, help="bcrypt cost of the stored hash")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    daemon = Daemon(args.gpus, args.cost)
    try:
        t0 = time.monotonic()
        scrape_phase(daemon.port, 0.01, 0.0)  # the one bcrypt check of the right password; cached from now on
        first_check = time.monotonic() - t0
        quiet = scrape_phase(daemon.port, args.quiet, args.interval)
        before = proc_stats(daemon.proc.pid)
        queue: multiprocessing.Queue = multiprocessing.Queue()
        attackers = multiprocessing.Process(target=attack, args=(daemon.port, args.clients, args.duration, queue))
        attackers.start()
        time.sleep(min(1.0, args.duration / 10))  # let every attacker connect and start guessing
        flood = scrape_phase(daemon.port, args.duration - min(1.0, args.duration / 10), args.interval)
        answers = queue.get(timeout=args.duration + 60)
        attackers.join(30)
        after = proc_stats(daemon.proc.pid)
        result = {
            "bcrypt_cost": args.cost,
            "first_check_seconds": round(first_check, 3),
            "clients": args.clients,
            "flood_seconds": args.duration,
            "quiet": quiet,
            "flood": flood,
            "attacker_answers": answers,
            "gpuperf_web_auth_refused_total": refused_counter(daemon.port),
            "daemon_cpu_seconds_during_flood": round(after["cpu_seconds"] - before["cpu_seconds"], 2),
            "daemon_threads": [before["threads"], after["threads"]],
            "daemon_rss_mb": [round(before["rss_bytes"] / 1e6, 1), round(after["rss_bytes"] / 1e6, 1)],
        }
    finally:
        code = daemon.stop()
    result["daemon_exit"] = code
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

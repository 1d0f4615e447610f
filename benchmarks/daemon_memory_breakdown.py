#!/usr/bin/env python3
"""What each MB of the idle daemon is: imports, mappings, threads, malloc.

    python3 benchmarks/daemon_memory_breakdown.py --json OUT.json            # CPU: simulated GPU
    python3 benchmarks/daemon_memory_breakdown.py --nvml --json OUT.json     # GPU node (NVML, read-only)

Three views, all of resident memory (VmRSS, what the issue's target is about):

* ``imports``: a fresh interpreter imports the daemon's dependencies one group at a time,
  in the order the daemon needs them, and the RSS each group adds (cumulative, so the
  rows sum to the total; a module shared by two groups counts in the first). With
  ``--nvml``, ``import pynvml`` and ``nvmlInit()`` (libnvidia-ml, which maps libcuda)
  are a row of their own. Then the daemon itself is built, started and scraped.
* ``removals``: the daemon's modules imported with and without one dependency (and what only
  it brings): what dropping prometheus_client, APScheduler or yaml from the daemon would save.
* ``daemon``: the real daemon (``gpuperfd run``, probes scheduled an hour away, so it is
  idle) after ``--idle`` seconds: its ``/proc/PID/smaps`` summed by what each mapping is
  (python and libpython, each shared library, the main heap, malloc arenas, thread
  stacks, other anonymous memory: Python's object arenas), and its threads.

Nothing changes any GPU setting: NVML is only read.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from load import free_port  # benchmarks/load.py: this script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]

#: (row, statements) in the daemon's import order; each row's RSS is what it adds to those above.
GROUPS: list[tuple[str, str]] = [
    ("stdlib: logging, json, threading, socket, selectors", "import logging, json, threading, socket, selectors"),
    ("stdlib: email (http's header parsing)", "import email.parser, email.message"),
    ("stdlib: http.client (imports ssl: libssl, libcrypto)", "import http.client"),
    ("stdlib: http.server", "import http.server"),
    ("stdlib: urllib.request, wsgiref (prometheus_client's exposition)", "import urllib.request, wsgiref.simple_server"),
    ("prometheus_client", "import prometheus_client"),
    ("yaml", "import yaml"),
    ("asyncio (APScheduler's util imports it)", "import asyncio"),
    ("concurrent.futures, multiprocessing (APScheduler's pool executor)",
     "import concurrent.futures.process, multiprocessing"),
    ("apscheduler (+ tzlocal, zoneinfo)", "import apscheduler.schedulers.background"),
    ("NVML: import pynvml", "import pynvml"),
    ("NVML: nvmlInit (libnvidia-ml, libcuda)", "import pynvml; pynvml.nvmlInit()"),
    ("gpuperfd: config", "import gpuperfd.config"),
    ("gpuperfd: device, telemetry", "import gpuperfd.device.base, gpuperfd.telemetry.exporter, gpuperfd.telemetry.sampler"),
    ("gpuperfd: web", "import gpuperfd.web.server, gpuperfd.web.security"),
    ("gpuperfd: probing, probe_data", "import gpuperfd.probing.scheduling.service, gpuperfd.probing.scheduling.scheduler"),
    ("gpuperfd: health", "import gpuperfd.health.monitor"),
    ("gpuperfd: daemon and the rest", "import gpuperfd.daemon"),
]

LADDER = r"""
import gc, json, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS:"))
groups, nvml, gpus = json.loads(sys.argv[1]), sys.argv[2] == "nvml", int(sys.argv[3])
rows = [("interpreter (python, libpython, site)", rss(), len(sys.modules))]
for name, code in groups:
    if name.startswith("NVML") and not nvml:
        continue
    before, mods = rss(), len(sys.modules)
    exec(code, {})
    rows.append((name, rss() - before, len(sys.modules) - mods))
before, mods = rss(), len(sys.modules)
from gpuperfd.config import config_from_mapping
from gpuperfd.daemon import Daemon
data = {"web": {"listen_address": "127.0.0.1:0"}, "device": {"backend": "nvml" if nvml else "simulated"}}
if not nvml:
    data["simulation"] = {"gpus": gpus, "seed": 1}
daemon = Daemon(config_from_mapping(data, "<memory breakdown>"))
rows.append(("the daemon built (config, backend, sampler, exporter, web)", rss() - before, len(sys.modules) - mods))
def libcuda():
    with open("/proc/self/maps") as f:
        return any("libcuda" in line for line in f)
collectors = []  # each collector's first read of every GPU: which NVML call brings what (libcuda?)
for collector in daemon.sampler.collectors:
    before, had = rss(), libcuda()
    for device in daemon.devices:
        daemon.sampler.read_one(device, collector)
    collectors.append((collector.name, rss() - before, libcuda() and not had))
daemon.sampler.sample_once()
rows.append(("first sampling round, every collector (see collectors)", sum(c[1] for c in collectors), 0))
before, mods = rss(), len(sys.modules)
daemon.web.start()
import http.client
conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
for _ in range(20):
    conn.request("GET", "/metrics"); conn.getresponse().read()
conn.close()
rows.append(("web server started, 20 scrapes", rss() - before, len(sys.modules) - mods))
loaded = sorted(sys.modules)
daemon.web.stop()
daemon.backend.close()
print(json.dumps({"rows": rows, "total": rss(), "modules": len(loaded), "collectors": collectors,
                  "libcuda_mapped": libcuda(),
                  "loaded": {m: m in sys.modules for m in ("ssl", "bcrypt", "h2", "grpc", "yaml", "asyncio", "email",
                                                             "wsgiref", "multiprocessing", "torch", "numpy")}}))
"""


#: Dependencies the daemon could drop (with what only they bring), for the ``removals`` view.
REMOVALS: dict[str, tuple[str, ...]] = {
    "prometheus_client and http.server (our own registry and request handler)":
        ("prometheus_client", "http.server", "http.client", "wsgiref", "urllib.request", "urllib.error",
         "urllib.response", "socketserver", "mimetypes", "html"),
    "APScheduler (with asyncio, multiprocessing, tzlocal)":
        ("apscheduler", "asyncio", "concurrent.futures.process", "multiprocessing", "tzlocal"),
    "yaml": ("yaml", "_yaml"),
    "ssl where only ours imports it (web.connections, for TLS)": ("ssl", "_ssl"),
}

#: Imports every module named in argv[1] (ignoring failures) and prints VmRSS in MB.
IMPORT_SET = r"""
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
with open("/proc/self/status") as f:
    print(next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS:")), len(sys.modules))
"""


#: The modules gpuperfd's loaded modules import when they load (not inside functions), by name.
DIRECT_IMPORTS = r"""
import ast, json, sys
import gpuperfd.daemon
NVML
def imported(tree):
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        stack.extend(ast.iter_child_nodes(node))
names = set()
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name.startswith("gpuperfd") and path and path.endswith(".py"):
        with open(path, encoding="utf-8") as f:
            names.update(n for n in imported(ast.parse(f.read())) if not n.startswith("gpuperfd"))
print(json.dumps(sorted(n for n in names if n in sys.modules)))
"""


def removals(nvml: bool, runs: int = 3) -> dict:
    """What the daemon's imports would weigh without each dependency in :data:`REMOVALS`.

    The modules gpuperfd's own modules import at load time (found in their source) are imported
    in a fresh interpreter, all of them and then all but one dependency's; whatever the rest
    imports comes along, so each row is what only that dependency brings (the ladder above
    charges a shared module, ssl say, to whoever imports it first). Median of ``runs``."""
    env = _env()
    nvml_code = "import pynvml; pynvml.nvmlInit()" if nvml else ""
    done = subprocess.run([sys.executable, "-c", DIRECT_IMPORTS.replace("NVML", nvml_code)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"module list failed:\n{done.stderr[-3000:]}")
    direct = json.loads(done.stdout.strip().splitlines()[-1])

    def measure(names: list[str]) -> tuple[float, int]:
        results = []
        for _ in range(runs):
            out = subprocess.run([sys.executable, "-c", nvml_code + "\n" + IMPORT_SET, json.dumps(names)],
                                 capture_output=True, text=True, env=env, cwd=ROOT, check=True)
            mb, count = out.stdout.split()
            results.append((float(mb), int(count)))
        return sorted(results)[runs // 2]

    everything, count = measure(direct)
    rows = []
    for what, roots in [*REMOVALS.items(), ("all of the above", tuple(r for v in REMOVALS.values() for r in v))]:
        kept = [m for m in direct if not any(m == r or m.startswith(r + ".") for r in roots)]
        mb, kept_count = measure(kept)
        rows.append({"without": what, "rss_mb": mb, "saves_mb": everything - mb, "modules": kept_count})
    return {"direct_imports": direct, "all_mb": everything, "modules": count, "rows": rows}


def _env() -> dict[str, str]:
    """This tree first on PYTHONPATH, then whatever it already held."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def imports(nvml: bool, gpus: int) -> dict:
    env = _env()
    done = subprocess.run([sys.executable, "-c", LADDER, json.dumps(GROUPS), "nvml" if nvml else "sim", str(gpus)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"import ladder failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def smaps(pid: int) -> list[dict]:
    """Each mapping of ``pid``: start, size, perms, path, Rss (kB)."""
    out: list[dict] = []
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            match = _MAP.match(line)
            if match:
                start, end = int(match[1], 16), int(match[2], 16)
                out.append({"start": start, "size_kb": (end - start) // 1024, "perms": match[3],
                            "path": match[4].strip(), "rss_kb": 0})
            elif line.startswith("Rss:") and out:
                out[-1]["rss_kb"] = int(line.split()[1])
    return out


def classify(maps: list[dict], exe: str) -> dict[str, float]:
    """RSS (MB) by what a mapping is. Anonymous rw mappings right above a 4 kB no-access guard are
    glibc thread stacks; 64 MiB-aligned ones are malloc arenas; other anonymous memory is
    mostly Python's object arenas (1 MiB mmaps) and large buffers."""
    rows: dict[str, float] = {}

    def add(key: str, kb: int) -> None:
        rows[key] = rows.get(key, 0.0) + kb / 1024

    for i, m in enumerate(maps):
        path = m["path"]
        if not m["rss_kb"]:
            continue
        if path == "[heap]":
            add("malloc: main heap (brk)", m["rss_kb"])
        elif path == "[stack]":
            add("main thread stack", m["rss_kb"])
        elif path.startswith("["):
            add(f"kernel {path}", m["rss_kb"])
        elif path:
            name = os.path.basename(path.replace(" (deleted)", ""))
            if os.path.realpath(path) == exe or name.startswith("libpython"):
                add("python executable, libpython", m["rss_kb"])
            elif name.startswith("libnvidia-ml"):
                add("NVML: libnvidia-ml", m["rss_kb"])
            elif name.startswith("libcuda"):
                add("NVML: libcuda (mapped by libnvidia-ml)", m["rss_kb"])
            elif name.startswith(("libssl", "libcrypto", "_ssl")):
                add("ssl: libssl, libcrypto, _ssl", m["rss_kb"])
            elif name.startswith(("libc.so", "libm.so", "ld-linux", "libstdc++", "libgcc")):
                add("libc, libm, ld.so, libstdc++", m["rss_kb"])
            elif ".so" in name:
                add("other shared libraries (extension modules)", m["rss_kb"])
            else:
                add("other files", m["rss_kb"])
        else:
            below = maps[i - 1] if i else None
            guarded = (below is not None and below["perms"].startswith("---") and below["size_kb"] == 4
                       and below["start"] + 4096 == m["start"])
            if guarded:
                add("thread stacks", m["rss_kb"])
            elif m["start"] % (64 << 20) == 0:
                add("malloc arenas (threads' heaps)", m["rss_kb"])
            else:
                add("anonymous: Python object arenas, buffers", m["rss_kb"])
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]))


def config(nvml: bool, state: Path) -> str:
    device = "device: {backend: nvml}\n" if nvml else "device: {backend: simulated}\nsimulation: {gpus: 1, seed: 1}\n"
    return (f"{device}probes:\n  read_only: true\n  executor: child\n  state_dir: {state}\n"
            f"  history: {{path: {state}/history.jsonl}}\n  first_run_delay_seconds: 3600\n"
            f"  schedules:\n    - {{probe: attention, interval_seconds: 3600, caps: [current]}}\n")


def daemon(nvml: bool, idle: float, arena_max: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "gpuperfd.yaml").write_text(config(nvml, state))
        port = free_port()
        env = _env()
        if arena_max:
            env["MALLOC_ARENA_MAX"] = str(arena_max)
        with open(state / "daemon.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "gpuperfd", "run", "--config", str(state / "gpuperfd.yaml"),
                                     "--web.listen-address", f"127.0.0.1:{port}"], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp)
            try:
                time.sleep(idle)
                if proc.poll() is not None:
                    raise SystemExit("the daemon exited:\n" + (state / "daemon.log").read_text()[-3000:])
                import urllib.request

                for _ in range(10):  # scraped, as in production
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                        response.read()
                time.sleep(1)
                with open(f"/proc/{proc.pid}/status") as handle:
                    status = {k: v.strip() for k, _, v in (line.partition(":") for line in handle)}
                maps = smaps(proc.pid)
                exe = os.path.realpath(f"/proc/{proc.pid}/exe")
                threads = sorted(Path(f"/proc/{proc.pid}/task/{t}/comm").read_text().strip()
                                 for t in os.listdir(f"/proc/{proc.pid}/task"))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    return {"vmrss_mb": int(status["VmRSS"].split()[0]) / 1024,
            "rss_anon_mb": int(status["RssAnon"].split()[0]) / 1024,
            "rss_file_mb": int(status["RssFile"].split()[0]) / 1024,
            "by_mapping_mb": {k: round(v, 2) for k, v in classify(maps, exe).items()},
            "threads": threads, "malloc_arena_max": arena_max or None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvml", action="store_true", help="NVML backend (GPU node, read-only)")
    parser.add_argument("--gpus", type=int, default=1, help="simulated GPUs for the import ladder's daemon")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the real daemon idles before reading")
    parser.add_argument("--malloc-arena-max", type=int, default=2,
                        help="MALLOC_ARENA_MAX for the daemon, as the systemd unit and the image set it (0: unset)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    ladder = imports(args.nvml, args.gpus)
    dropped = removals(args.nvml)
    real = daemon(args.nvml, args.idle, args.malloc_arena_max)
    report = {"machine": platform.node(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join([sys.executable, *sys.argv]), "imports": ladder, "removals": dropped,
              "daemon": real}
    print("RSS each step adds, fresh interpreter (MB):")
    for name, mb, mods in ladder["rows"]:
        print(f"  {name:78} {mb:6.1f}  ({mods} modules)")
    print(f"  {'total':78} {ladder['total']:6.1f}  ({ladder['modules']} modules)")
    for name, mb, brought_libcuda in ladder["collectors"]:
        if mb >= 0.1 or brought_libcuda:
            print(f"    first read of collector {name:56} {mb:6.1f}" + ("  (mapped libcuda)" if brought_libcuda else ""))
    print(f"  libcuda mapped: {ladder['libcuda_mapped']}")
    print(f"  loaded: {', '.join(k for k, v in ladder['loaded'].items() if v)}; "
          f"not: {', '.join(k for k, v in ladder['loaded'].items() if not v)}")
    print(f"the daemon's imports without a dependency (all: {dropped['all_mb']:.1f} MB, {dropped['modules']} modules):")
    for row in dropped["rows"]:
        print(f"  without {row['without']:70} {row['rss_mb']:6.1f}  saves {row['saves_mb']:4.1f}  ({row['modules']} modules)")
    print(f"the real daemon, idle {args.idle:.0f} s: VmRSS {real['vmrss_mb']:.1f} MB "
          f"(anonymous {real['rss_anon_mb']:.1f}, file-backed {real['rss_file_mb']:.1f}), by mapping (MB):")
    for name, mb in real["by_mapping_mb"].items():
        print(f"  {name:78} {mb:6.1f}")
    print(f"  threads ({len(real['threads'])}): {', '.join(real['threads'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

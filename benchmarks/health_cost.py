"""What evaluating the health verdicts costs, on the daemon's own code path; and the verdict.

Builds the real :class:`gpuperfd.daemon.Daemon` (same config handling, backend, collectors,
sampler and HealthMonitor as `gpuperfd run`), starts only its sampler and its health thread
(no probes, no scheduler, no power-cap change, no web serving: the web socket is bound to a
loopback port and closed unused), lets it run for --seconds, then prints:

- the health thread's CPU seconds per minute (``HealthMonitor.cpu_seconds``: thread CPU time
  of every evaluation) at the configured interval, and per evaluation;
- the whole process's CPU per minute over the same window (sampler included), for scale;
- the node's verdict JSON, exactly as ``GET /api/v1/health`` would answer.

Read-only on a real GPU: NVML reads only; the saved verdicts go to a temporary state
directory (never /var/lib/gpuperfd), the probe history is read only if --history is given.
A healthy card must come out ``healthy`` with no reasons (exit 0); otherwise exit 1.

Usage:
  python benchmarks/health_cost.py --simulate 8 [--seconds 60] [--interval 5] [--synthetic-history 40]
  python benchmarks/health_cost.py --nvml [--seconds 300] [--history /var/lib/gpuperfd/history.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuperfd.config import Config  # noqa: E402
from gpuperfd.daemon import Daemon  # noqa: E402
from gpuperfd.health.verdict import node_verdict_json  # noqa: E402


def build_config(args: argparse.Namespace, state_dir: str) -> Config:
    data: dict = {
        "web": {"listen_address": "127.0.0.1:0"},
        "device": {"backend": "nvml" if args.nvml else "simulated"},
        "probes": {"state_dir": state_dir, "history": {"path": args.history}},
        "health": {"interval_seconds": args.interval},
    }
    if not args.nvml:
        data["simulation"] = {"gpus": args.simulate, "seed": 1}
    return Config.model_validate(data)


def write_synthetic_history(gpus: int, per_key: int, directory: Path) -> str:
    """A healthy probe history of the simulated GPUs, as the fleet simulation writes it."""
    from gpuperfd.config import SimulationConfig
    from gpuperfd.device.simulated import SimulatedBackend
    from gpuperfd.fleet.backfill import healthy_run_records
    from gpuperfd.fleet.spec import FleetGpu, FleetSpec

    path = directory / "history.jsonl"
    backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=1))
    now = time.time()
    with path.open("w", encoding="utf-8") as handle:
        for device in backend.devices():
            gpu = FleetGpu(node="", instance="", index=device.index, uuid=device.info().uuid, model="H100")
            handle.writelines(line + "\n" for line in healthy_run_records(gpu, FleetSpec(), now, per_key=per_key))
    backend.close()
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--nvml", action="store_true", help="real GPUs through NVML (read-only)")
    source.add_argument("--simulate", type=int, metavar="N", help="N simulated GPUs")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the health thread runs")
    parser.add_argument("--interval", type=float, default=5.0, help="health.interval_seconds (daemon default 5)")
    parser.add_argument("--history", default=None, help="probe history file to read (default: none)")
    parser.add_argument("--synthetic-history", type=int, default=0, metavar="RUNS",
                        help="--simulate only: first write RUNS healthy results per probe and cap of every "
                             "simulated GPU (4 probes x 11 caps) to a temporary history file and read it")
    parser.add_argument("--json", default=None, help="also write the figures and the verdict here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpuperfd-health-cost-") as state_dir:
        if args.synthetic_history:
            if args.nvml:
                parser.error("--synthetic-history needs --simulate")
            args.history = write_synthetic_history(args.simulate, args.synthetic_history, Path(state_dir))
        daemon = Daemon(build_config(args, state_dir))
        health = daemon.health
        assert health is not None, "health.enabled is on by default"
        try:
            daemon.sampler.sample_once()
            daemon.sampler.start()
            health.evaluate_once()  # as Daemon.start: the first verdict before serving
            first_cpu, first_evals = health.cpu_seconds, health.evaluations
            process_start, wall_start = time.process_time(), time.monotonic()
            health.start()
            time.sleep(args.seconds)
            health.stop()
            wall = time.monotonic() - wall_start
            process_cpu = time.process_time() - process_start
            cpu = health.cpu_seconds - first_cpu
            evaluations = health.evaluations - first_evals
            body = node_verdict_json(health.verdicts(), health.node)
        finally:
            daemon.sampler.stop()
            try:
                daemon.web.stop()
            except Exception:  # never started: only its socket to close
                pass
            daemon.backend.close()

    figures = {
        "backend": daemon.backend.name,
        "gpus": len(daemon.devices),
        "interval_seconds": args.interval,
        "history_runs": sum(len(runs) for runs in health.history.runs.values()),
        "wall_seconds": round(wall, 1),
        "evaluations": evaluations,
        "health_cpu_seconds_per_minute": round(cpu / wall * 60.0, 5),
        "health_cpu_ms_per_evaluation": round(cpu / max(evaluations, 1) * 1000.0, 3),
        "process_cpu_seconds_per_minute": round(process_cpu / wall * 60.0, 4),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(figures, indent=2))
    print(json.dumps(body, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "verdict": body}, indent=2) + "\n")
    healthy = body["state"] == "healthy" and all(not g["reasons"] for g in body["gpus"])
    print("node verdict:", body["state"], body["action"], "(healthy, no reasons)" if healthy else "(NOT healthy)")
    return 0 if healthy else 1


if __name__ == "__main__":
    raise SystemExit(main())

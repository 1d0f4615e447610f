"""How long does ``gpuperfd check`` take, end to end, and does its probe meet the shipped figures?

Runs the real command (``python -m gpuperfd check --json``) as a fresh process each time (a cold
start: Python, NVML, one probe child per GPU importing torch and building the model), measures its
wall time from outside, and reads the per-phase times the command reports (open, passive, gate,
probe, judge, total) and each GPU's measured rate against the expected figure.

On a GPU node (read-only: the check changes no power cap):
  python benchmarks/check_time.py --out benchmarks/results/check_time_h100.json
  python benchmarks/check_time.py --gpus 0 --runs 3          # one H100, three cold runs
  python benchmarks/check_time.py --quick                    # passive checks only

Without a GPU (this is what CI and the dev VMs can run):
  python benchmarks/check_time.py --simulate 8               # the simulator's executor
  python benchmarks/check_time.py --simulate 2 --cpu-tiny    # a real torch child per GPU on the CPU,
                                                             # tiny preset (build cost of the real path)
Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def one_run(args: argparse.Namespace, config: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gpuperfd", "check", "--json", "--timeout", str(args.timeout)]
    if args.simulate:
        cmd += ["--simulate", str(args.simulate)]
    if args.gpus:
        cmd += ["--gpus", args.gpus]
    if args.quick:
        cmd.append("--quick")
    if config:
        cmd += ["--config", config]
    if args.cpu_tiny:
        cmd += ["--preset", "tiny"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=args.timeout + 120)
    wall = time.monotonic() - start
    out: dict[str, Any] = {"exit_code": proc.returncode, "wall_seconds": round(wall, 3)}
    try:
        body = json.loads(proc.stdout)
    except json.JSONDecodeError:
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
        return out
    out["state"] = body["state"]
    out["phases_seconds"] = body.get("check", {}).get("phases_seconds")
    out["not_probed"] = body.get("check", {}).get("not_probed")
    gpus = []
    for gpu in body["gpus"]:
        measured = next((r["evidence"] for r in gpu["reasons"] if r["check"] == "check_probe_measured"), {})
        expected = (measured.get("expected") or {}).get("units_per_second")
        rate = measured.get("units_per_second")
        gpus.append({"gpu": gpu["gpu"], "state": gpu["state"], "units_per_second": rate,
                     "energy_per_unit_joules": measured.get("energy_per_unit_joules"),
                     "expected_units_per_second": expected,
                     "ratio_to_expected": round(rate / expected, 4) if rate and expected else None,
                     "reasons": [f"{r['check']}: {r['message']}" for r in gpu["reasons"] if r["severity"] != "info"]})
    out["gpus"] = gpus
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, help="cold runs (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="the check's --timeout (default 60)")
    parser.add_argument("--gpus", help="the check's --gpus")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--simulate", type=int, help="N simulated GPUs")
    parser.add_argument("--cpu-tiny", action="store_true",
                        help="with --simulate: the real child executor on the CPU, tiny preset")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    config = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.cpu_tiny:
            if not args.simulate:
                parser.error("--cpu-tiny needs --simulate N")
            config = str(Path(tmp) / "check.yaml")
            Path(config).write_text(f"device: {{backend: simulated}}\nprobes: {{executor: child, torch_device: cpu, "
                                    f"state_dir: {tmp}}}\n")
        elif args.simulate:
            config = str(Path(tmp) / "check.yaml")
            Path(config).write_text(f"device: {{backend: simulated}}\nprobes: {{state_dir: {tmp}}}\n")
        runs = [one_run(args, config) for _ in range(args.runs)]
    walls = [r["wall_seconds"] for r in runs]
    result = {
        "benchmark": "check_time", "date": time.strftime("%Y-%m-%d"), "host": platform.node(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "argv": sys.argv[1:],
        "wall_seconds_max": max(walls), "wall_seconds_min": min(walls), "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(r["exit_code"] in (0, 10, 11, 12) for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Answer checks on a real GPU: false mismatches (must be 0) and their cost (target <= 2 %).

    PYTHONUNBUFFERED=1 python3 benchmarks/correctness_gpu.py --out "$OUT"

Read-only towards the card (no power limit, clock or mode is changed). For each probe at its
default preset (llm gpt2 fp16 CUDA graphs, vit vit-b16 bf16 compiled + graph, attention bf16
4096 tokens, train gpt2 bf16 autocast), in this process:

1. build the workload once (``harness.prepare``), then ``--runs`` points (``harness.measure``)
   of ``--repeats`` measured windows each: every point runs the answer checks after its
   windows, as the daemon does. ``runs x windows`` >= 50 measured repeats per probe;
2. ``--extra-checks`` more check rounds on the warm workload (more chances for a false
   mismatch, and the fingerprint must stay the same across all of them for the
   peer-comparable probes: same inputs, same path, same bits);
3. the two test-only faults (``wrong_result_element``, ``wrong_result_bit``) once each, which
   must be caught on the GPU as on the CPU.

Figures per probe: false mismatches (clean checks that said mismatch), fingerprint changes,
max errors against the tolerance, and the cost: ``correctness.seconds`` over the point's
measured seconds and over its whole wall time (the GPU time the point holds the card).
Writes ``correctness_gpu.json`` under ``--out`` after each probe. About 5 minutes on an H100
with the defaults. ``--cpu-smoke`` runs it on the CPU with tiny presets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["GPUPERFD_TEST_FAULTS"] = "1"  # step 3 only: the faults are injected by this script, explicitly

import torch  # noqa: E402

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_child.correctness import TOLERANCES, run_checks  # noqa: E402
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PROBES, WRONG_RESULT_FAULTS, ProbeSpec  # noqa: E402

TARGET_OVERHEAD = 0.02


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "command": " ".join(sys.argv)}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            env["power_limit_watts"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
        except Exception as exc:  # noqa: BLE001 - identity only
            env["driver_error"] = str(exc)
    return env


def bench_probe(probe: str, preset: str, device: str, runs: int, repeats: int, measure_seconds: float | None,
                extra_checks: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"repeats": repeats, "device": device, "busy_profile_seconds": 0.0}
    if measure_seconds is not None:
        fields["measure_seconds"] = measure_seconds
    spec = ProbeSpec(probe, preset=preset, **fields)
    t0 = time.perf_counter()
    prepared = harness.prepare(spec)
    setup = time.perf_counter() - t0
    points, checks, fingerprints = [], [], []
    for _ in range(runs):
        result = harness.measure(prepared)
        c = result.correctness
        checks.append(c)
        fingerprints.append(c.get("fingerprint"))
        points.append({
            "status": result.status, "windows": len(result.repeats), "measured_seconds": result.measured_seconds,
            "wall_seconds": result.wall_seconds, "check_seconds": c.get("seconds"),
            "overhead_of_measured": c["seconds"] / result.measured_seconds if result.measured_seconds else None,
            "overhead_of_wall": c["seconds"] / result.wall_seconds if result.wall_seconds else None,
            "correctness": c,
        })
        print(f"{probe}: point {len(points)}: {c['status']} ({c['seconds']:.3f} s of checks, "
              f"{points[-1]['overhead_of_measured']:.2%} of {result.measured_seconds:.1f} measured s)", flush=True)
    for _ in range(extra_checks):
        c = run_checks(prepared.workload.check_plan(), prepared.ctx.synchronize)
        checks.append(c)
        fingerprints.append(c.get("fingerprint"))
    faults = {}
    for fault in WRONG_RESULT_FAULTS:
        c = run_checks(prepared.workload.check_plan(), prepared.ctx.synchronize, fault)
        faults[fault] = {"status": c["status"], "failed_checks": c["failed_checks"], "max_rel_error": c["max_rel_error"]}
    comparable = all(c.get("peer_comparable", True) for c in checks)
    false_mismatches = sum(c["status"] != "ok" for c in checks)
    precision = checks[0]["precision"]
    windows = sum(p["windows"] for p in points)
    worst = max(p["overhead_of_measured"] or 0.0 for p in points)
    out = {
        "probe": probe, "preset": preset, "setup_seconds": setup, "measured_repeats": windows, "checks": len(checks),
        "false_mismatches": false_mismatches,
        "fingerprint_changes": len(set(fingerprints)) - 1 if comparable else None,
        "peer_comparable": comparable, "precision": precision, "path": checks[0]["path"],
        "tolerance": {"norm": TOLERANCES[precision].norm, "element": TOLERANCES[precision].element},
        "max_norm_rel_error": max((c["norm_rel_error"] or 0.0) for c in checks),
        "max_rel_error": max((c["max_rel_error"] or 0.0) for c in checks),
        "elements_checked": checks[0]["elements_checked"],
        "check_seconds_median": sorted(p["check_seconds"] for p in points)[len(points) // 2],
        "overhead_of_measured_max": worst,
        "overhead_of_wall_max": max(p["overhead_of_wall"] or 0.0 for p in points),
        "faults_caught": all(f["status"] == "mismatch" for f in faults.values()),
        "faults": faults, "points": points,
        "pass": (false_mismatches == 0 and windows >= 50 and worst <= TARGET_OVERHEAD
                 and all(f["status"] == "mismatch" for f in faults.values())
                 and (not comparable or len(set(fingerprints)) == 1)),
    }
    del prepared
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".", help="folder for correctness_gpu.json")
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES)
    parser.add_argument("--runs", type=int, default=3, help="points per probe (each runs the checks once)")
    parser.add_argument("--repeats", type=int, default=17, help="measured windows per point (runs x repeats >= 50)")
    parser.add_argument("--measure-seconds", type=float, default=1.0, help="window length (the presets use 1.5 s)")
    parser.add_argument("--extra-checks", type=int, default=47, help="more check rounds on the warm workload")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny presets on the CPU (to try the script)")
    args = parser.parse_args()
    device = "cpu" if args.cpu_smoke else "cuda"
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("correctness_gpu: no CUDA device (use --cpu-smoke to try the script on the CPU)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    report: dict[str, Any] = {"environment": _environment(), "target_overhead": TARGET_OVERHEAD, "probes": []}
    path = os.path.join(args.out, "correctness_gpu.json")
    for probe in args.probes:
        preset = "tiny" if args.cpu_smoke else DEFAULT_PRESET[probe]
        report["probes"].append(bench_probe(probe, preset, device, args.runs, args.repeats,
                                            0.05 if args.cpu_smoke else args.measure_seconds, args.extra_checks))
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1, default=str)
    print(f"{'probe':10} {'repeats':>7} {'checks':>6} {'false':>5} {'fp chg':>6} {'max rel':>9} {'tol':>7} "
          f"{'check s':>8} {'% meas':>7} {'% wall':>7} faults pass")
    for p in report["probes"]:
        print(f"{p['probe']:10} {p['measured_repeats']:7d} {p['checks']:6d} {p['false_mismatches']:5d} "
              f"{str(p['fingerprint_changes']):>6} {p['max_rel_error']:9.2e} {p['tolerance']['element']:7.0e} "
              f"{p['check_seconds_median']:8.4f} {p['overhead_of_measured_max']:7.2%} {p['overhead_of_wall_max']:7.2%} "
              f"{'caught' if p['faults_caught'] else 'MISSED':6} {'yes' if p['pass'] else 'NO'}")
    print(f"wrote {path}")
    return 0 if all(p["pass"] for p in report["probes"]) else 1


if __name__ == "__main__":
    sys.exit(main())

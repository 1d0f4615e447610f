#!/usr/bin/env python3
"""The profiled busy pass, side by side: timed on the host (as before) against the iterations the
windows say fill its seconds (``harness.busy_iterations``, issue 60), per probe, in one process.

    python3 benchmarks/busy_pass.py --gpu 0 --probes llm,vit,attention,train --rounds 3 --json busy.json

Each probe is built and measured once (its default preset: the daemon's), then both passes run in
alternation ``--rounds`` times. Printed per pass: its wall time (what the GPU is out of service for),
the kernel records, the iterations and the busy ratio; and the wall time's ratio, new over old.
Read-only (no cap, clock or mode is touched); the GPU must be idle. ``--cpu`` runs the tiny presets
on the CPU, to check the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--probes", default="llm,vit,attention,train")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from gpuperfd.probe_child import harness
    from gpuperfd.probe_child.busy import measure_busy
    from gpuperfd.probe_data.spec import ProbeSpec

    out: dict[str, dict[str, object]] = {}
    for probe in args.probes.split(","):
        spec = (ProbeSpec(probe, preset="tiny", device="cpu") if args.cpu
                else ProbeSpec(probe, device=f"cuda:{args.gpu}"))
        prepared = harness.prepare(spec)
        result = harness.measure(prepared)
        counted = harness.busy_iterations(result.repeats, spec.busy_profile_seconds)
        rows: dict[str, list[dict[str, float]]] = {"host_timed": [], "windows_counted": []}
        for _ in range(args.rounds):
            for name, iterations in (("host_timed", None), ("windows_counted", counted)):
                t0 = time.perf_counter()
                ratio, info = measure_busy(prepared.ctx, prepared.workload, spec.busy_profile_seconds, iterations)
                rows[name].append({"wall_seconds": time.perf_counter() - t0, "ratio": ratio,
                                   "records": info.get("busy_activities"), "iterations": info.get("busy_iterations")})
        summary = {name: {key: statistics.median(float(r[key] or 0.0) for r in rs)
                          for key in ("wall_seconds", "ratio", "records", "iterations")} for name, rs in rows.items()}
        ratio = summary["windows_counted"]["wall_seconds"] / summary["host_timed"]["wall_seconds"]
        out[probe] = {"rows": rows, "summary": summary, "new_over_old_wall": ratio, "counted_iterations": counted}
        for name, s in summary.items():
            print(f"{probe:9s} {name:15s}: wall {s['wall_seconds']:.3f} s, records {s['records']:.0f}, "
                  f"iterations {s['iterations']:.0f}, busy ratio {s['ratio']:.4f}", flush=True)
        print(f"{probe:9s} new/old wall: {ratio:.2f}", flush=True)
        del prepared
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Why would the same inputs give different bits? Each probe's check output, run several times.

For each probe at its default preset on the GPU: build, measure one short point (the state the
daemon's checks start from), then run the check plan's ``output()`` ``--times`` times and compare
every output tensor with the first call's: differing elements and the largest difference. For the
LLM probe the prefill and decode graphs are also replayed apart, to say which one varies.
Read-only towards the card. Usage: python3 benchmarks/repeat_diag.py [--times 6] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PROBES, ProbeSpec  # noqa: E402


def compare(first: list[torch.Tensor], other: list[torch.Tensor]) -> list[dict]:
    out = []
    for a, b in zip(first, other):
        diff = (a.double() - b.double()).abs()
        out.append({"shape": list(a.shape), "dtype": str(a.dtype), "differ": int((a != b).sum()),
                    "max_abs_diff": float(diff.max()) if diff.numel() else 0.0})
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=6)
    parser.add_argument("--probes", nargs="+", default=list(PROBES))
    parser.add_argument("--json")
    args = parser.parse_args()
    report = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "probes": {}}
    for probe in args.probes:
        spec = ProbeSpec(probe, preset=DEFAULT_PRESET[probe], device="cuda:0", repeats=2, measure_seconds=0.5,
                         busy_profile_seconds=0.0)
        prepared = harness.prepare(spec)
        harness.measure(prepared)
        plan = prepared.workload.check_plan()
        first = [t.clone() for t in plan.output()]
        runs = [compare(first, [t.clone() for t in plan.output()]) for _ in range(args.times - 1)]
        entry = {"path": plan.path, "runs": runs}
        static = getattr(prepared.workload, "static", None)
        if static is not None and getattr(static, "graphs", None):
            T = static.prompt_tokens
            parts = {}
            for name in ("prefill", "decode"):
                outs = []
                for _ in range(4):
                    with torch.inference_mode():
                        static.seq[:, :T].copy_(prepared.workload.prompts[0])
                        static.run_prefill()
                        if name == "decode":
                            static.run_decode()
                        outs.append([static.last_logits().clone(), static.k_cache[:, :, :, :T + 2].clone(),
                                     static.v_cache[:, :, :, :T + 2].clone()])
                parts[name] = [compare(outs[0], o) for o in outs[1:]]
            entry["graphs"] = parts
            entry["sdpa_decode"] = getattr(prepared.workload, "decode_sdpa_backend", None)
        report["probes"][probe] = entry
        worst = max((t["differ"] for r in runs for t in r), default=0)
        print(f"{probe}: path {plan.path}: worst differing elements across {args.times} calls: {worst}", flush=True)
        if "graphs" in entry:
            for name, rs in entry["graphs"].items():
                print(f"  {name}: differing (logits, k_cache, v_cache): "
                      f"{[[t['differ'] for t in r] for r in rs]}", flush=True)
            print(f"  decode sdpa backend: {entry['sdpa_decode']}", flush=True)
        del prepared
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

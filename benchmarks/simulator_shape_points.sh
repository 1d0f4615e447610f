#!/usr/bin/env bash
# Real points for the simulated GPU's shape (issue 43): the LLM probe at two model sizes and two batch
# sizes, ViT at batch 1 and 128, and the attention probe with and without grouped heads, on one GPU
# at the cap it holds (read-only: `gpuperfd probe` never sets a cap). Compare with the simulator:
#   gpuperfd probe llm --simulate 1 --preset gpt2 gpt2-xl --batch-size 1 32 --json
# Usage (device machine, repo root, wheels in /tmp/site): bash benchmarks/simulator_shape_points.sh OUT [GPU]
set -uo pipefail
OUT=${1:?OUT}; GPU=${2:-0}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader -i "$GPU" | tee "$OUT/shape_card.txt"
run() {  # run NAME ARGS...
  local name=$1; shift
  python3 -m gpuperfd probe "$@" --device "cuda:$GPU" --repeats 3 --no-progress --json > "$OUT/shape_$name.json" 2> "$OUT/shape_$name.err"
  echo "$name exit $?"
}
run llm llm --preset gpt2 gpt2-xl --batch-size 1 32
run vit vit --batch-size 1 128
run attention attention --preset default gqa
python3 - "$OUT" <<'PY'
import json, sys, glob
for path in sorted(glob.glob(f"{sys.argv[1]}/shape_*.json")):
    try:
        rows = json.load(open(path))
    except ValueError as exc:
        print(path, "unreadable", exc); continue
    for r in rows:
        p = r.get("params") or {}
        t = r.get("throughput") or {}
        lat = {k: round(sorted(v)[len(v) // 2] * 1e3, 3) for k, v in (r.get("latencies") or {}).items() if v}
        print(r.get("probe"), r.get("preset"), "bs", p.get("batch_size"), "groups", p.get("n_groups", ""), r.get("status"),
              {k: round(v, 1) for k, v in t.items()}, "peak MiB", round((r.get("peak_memory_bytes") or 0) / 2**20),
              "W", r.get("average_power_watts"), "p50 ms", lat)
PY

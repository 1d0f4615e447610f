#!/usr/bin/env bash
# Per-GPU probe figures with every GPU probing at once against one GPU alone (the CPU contention of
# parallel probe children), then the default sweep (sweep_cost.py --paths shared) on every GPU at
# once. Read-only: the probes run at the current cap; sweep_cost records caps, never sets them.
# Usage (device machine, repo root, wheels installed in /tmp/site): bash benchmarks/node_parallel_probes.sh OUT [PROBE]
set -uo pipefail
OUT=${1:?OUT}; PROBE=${2:-llm}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
N=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader | tee "$OUT/limits_before.txt"
python3 -m gpuperfd probe "$PROBE" --device cuda:0 --repeats 3 --json > "$OUT/probe_alone.json" 2> "$OUT/probe_alone.err"
for i in $(seq 0 $((N - 1))); do
  python3 -m gpuperfd probe "$PROBE" --device cuda:$i --repeats 3 --json > "$OUT/probe_parallel_$i.json" 2> "$OUT/probe_parallel_$i.err" &
done
wait
python3 - "$OUT" "$N" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
def rate(path):
    try:
        r = json.load(open(path))[0]
    except (OSError, ValueError, IndexError) as exc:
        return f"no result ({exc})"
    t = r.get("throughput") or {}
    main = next(iter(t.values()), None)
    return f"{main:,.0f}/s  {r.get('energy_per_unit_joules')} J/unit  wall {r.get('wall_seconds', 0):.1f} s  {r.get('status')}"
alone = rate(f"{out}/probe_alone.json")
print(f"alone   gpu0: {alone}")
for i in range(n):
    print(f"parallel gpu{i}: {rate(f'{out}/probe_parallel_{i}.json')}")
PY
for i in $(seq 0 $((N - 1))); do
  python3 benchmarks/sweep_cost.py --gpu $i --paths shared --probes attention,llm,vit,train \
    --json "$OUT/sweep_cost_gpu$i.json" > "$OUT/sweep_cost_gpu$i.log" 2>&1 &
done
wait
for i in $(seq 0 $((N - 1))); do echo "== gpu $i"; grep -v -i warn "$OUT/sweep_cost_gpu$i.log" | tail -8; done
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader | tee "$OUT/limits_after.txt"
diff "$OUT/limits_before.txt" "$OUT/limits_after.txt" && echo "power limits unchanged"

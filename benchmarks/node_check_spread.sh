#!/usr/bin/env bash
# Issue 55 on a lent node of several GPUs, read-only: the peer copies' spread per size
# (interconnect_spread.py, only with SPREAD=1), then full `gpuperfd check --json` runs until RUNS of
# them are done or SECONDS_BUDGET is spent; with BESIDE=N, N more runs beside a daemon (its own state
# directory, an llm probe every 20 s on every GPU) whose probe children disturb the check. One JSON
# line per check in OUT/checks.jsonl. Power limits printed before and after; nothing changes a cap.
# Usage (device machine, repo root): SPREAD=1 BESIDE=0 bash benchmarks/node_check_spread.sh OUT RUNS SECONDS_BUDGET
set -uo pipefail
OUT=${1:?OUT}; RUNS=${2:-30}; BUDGET=${3:-540}; START=$(date +%s)
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v -i warning | tail -1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
limits() { nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader | tee -a "$OUT/power_limits.txt"; }
limits
if [ "${SPREAD:-0}" = 1 ]; then
  timeout 200 python3 benchmarks/interconnect_spread.py --out "$OUT/spread.json" --rounds 20 --repeats 5 10 2>&1 | tail -60
fi
STATE=$(mktemp -d); printf 'probes: {state_dir: %s}\n' "$STATE" > "$STATE/check.yaml"
one() {  # one full check; its line in checks.jsonl
  local label=$1 t0 rc; t0=$(date +%s%N)
  python3 -m gpuperfd check --config "$STATE/check.yaml" --json --timeout 120 > "$OUT/last.json" 2> "$OUT/last.err"; rc=$?
  python3 - "$OUT/last.json" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$label" >> "$OUT/checks.jsonl" <<'PY'
import json, sys
path, rc, ms, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
try:
    c = json.load(open(path))
except Exception as exc:
    print(json.dumps({"label": label, "rc": rc, "ms": ms, "error": str(exc)})); sys.exit()
ic = (c.get("check") or {}).get("interconnect") or {}
extra = ic.get("extra") or {}
print(json.dumps({"label": label, "rc": rc, "ms": ms, "state": c.get("state"), "action": c.get("action"),
    "ic_status": ic.get("status") or ic.get("not_run"), "ic_reason": ic.get("failure_reason"),
    "copy_bytes": (ic.get("copies") or [{}])[0].get("bytes"),
    "copies": {f"{x['src']}->{x['dst']}": round(x["bandwidth_bytes_per_second"] / 1e9, 1) for x in ic.get("copies") or ()},
    "busbw": {str(a["bytes"]): round(a["bus_bandwidth_bytes_per_second"] / 1e9, 1) for a in ic.get("allreduce") or ()},
    "retests": extra.get("retests"), "unconfirmed": extra.get("unconfirmed"), "disturbed": extra.get("disturbed_attempts"),
    "ic_wall_s": ic.get("wall_seconds"),
    "non_healthy": [f"GPU {g['gpu']} {r['check']}: {r['message'][:160]}" for g in c.get("gpus", []) for r in g.get("reasons", []) if r.get("severity") != "info"]}))
PY
  tail -1 "$OUT/checks.jsonl" | cut -c1-400
}
n=0
while [ $n -lt "$RUNS" ] && [ $(( $(date +%s) - START + 45 )) -lt "$BUDGET" ]; do n=$((n + 1)); one "alone-$n"; done
if [ "${BESIDE:-0}" -gt 0 ]; then
  D=$(mktemp -d); cat > "$D/d.yaml" <<YAML
probes:
  state_dir: $D/state
  read_only: true
  idle_seconds: 2
  jitter_seconds: 0
  first_run_delay_seconds: 3
  schedules:
    - {probe: llm, interval_seconds: 20}
YAML
  python3 -m gpuperfd run --config "$D/d.yaml" --web.listen-address 127.0.0.1:19187 > "$OUT/daemon.log" 2>&1 &
  DPID=$!; sleep 8
  b=0; while [ $b -lt "$BESIDE" ] && [ $(( $(date +%s) - START + 50 )) -lt "$BUDGET" ]; do b=$((b + 1)); one "beside-$b"; done
  kill -TERM $DPID; wait $DPID; tail -5 "$OUT/daemon.log"
fi
python3 - "$OUT/checks.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
from collections import Counter
print("runs:", len(rows), Counter((r["label"].split("-")[0], r.get("state"), r.get("rc")) for r in rows))
v = [g for r in rows for g in (r.get("copies") or {}).values()]
if v: print("copies GB/s min", min(v), "max", max(v))
print("retests:", sum(1 for r in rows if r.get("retests")), "unconfirmed:", sum(1 for r in rows if r.get("unconfirmed")))
PY
limits

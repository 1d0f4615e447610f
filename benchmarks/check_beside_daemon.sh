#!/usr/bin/env bash
# `gpuperfd check` beside a probing daemon that keeps ANOTHER state directory (issue 52): on a 2x H100
# node the check's probe was "preempted ... by the daemon's own probe child" and answered unknown (exit
# 12). With the fix the check waits for the daemon's child within its deadline and probes after it.
# Read-only: the daemon runs read_only (probes at the current cap); the check changes no cap.
# Usage (device machine, repo root, wheels installed in /tmp/site): bash benchmarks/check_beside_daemon.sh OUT [RUNS]
# Prints one line per check: exit code, wall seconds, and each GPU's probe status or not-probed reason.
set -uo pipefail
OUT=${1:?OUT}; RUNS=${2:-10}
mkdir -p "$OUT/daemon-state" "$OUT/check-state"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader | tee "$OUT/limits_before.txt"
cat > "$OUT/daemon.yaml" <<YAML
web: {listen_address: "127.0.0.1:0"}
probes:
  state_dir: $OUT/daemon-state
  read_only: true
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 1
  schedules:
    - {probe: llm, preset: gpt2, interval_seconds: 10}
YAML
cat > "$OUT/check.yaml" <<YAML
probes: {state_dir: $OUT/check-state}
YAML
python3 -m gpuperfd run --config "$OUT/daemon.yaml" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
sleep 20  # its first round is under way: its children come and go every ~10 s
for run in $(seq 1 "$RUNS"); do
  start=$(date +%s.%N)
  python3 -m gpuperfd check --config "$OUT/check.yaml" --json > "$OUT/check_$run.json" 2> "$OUT/check_$run.err"
  code=$?
  end=$(date +%s.%N)
  python3 - "$OUT/check_$run.json" "$code" "$start" "$end" <<'PY'
import json, sys
path, code, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
try:
    body = json.load(open(path))
except (OSError, ValueError) as exc:
    print(f"exit {code} {end - start:.1f} s: no JSON ({exc})"); sys.exit()
check = body.get("check") or {}
words = []
for gpu in body.get("gpus", []):
    why = (check.get("not_probed") or {}).get(str(gpu["gpu"]))
    words.append(f"gpu {gpu['gpu']} {gpu['state']}" + (f" ({why})" if why else ""))
print(f"exit {code} {end - start:.1f} s: " + "; ".join(words))
PY
  sleep 3
done | tee "$OUT/summary.txt"
kill -TERM "$DAEMON"; wait "$DAEMON"
grep -c "preempted" "$OUT"/check_*.json | awk -F: '{s += $2} END {print "checks that met a preemption:", s + 0}'
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader | tee "$OUT/limits_after.txt"

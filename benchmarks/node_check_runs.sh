#!/usr/bin/env bash
# gpuperfd check on a node of several GPUs, many times, read-only; with the same runs of an older
# tree (BEFORE, e.g. `git archive 442c92b gpuperfd | tar -x -C .before`) first when it is given,
# and the NVML race and the gate's cost (benchmarks/nvml_serial.py).
# Counts exit codes: 139 is SIGSEGV (the crash of libnvidia-ml with two threads inside it).
# Power limits are printed before and after; nothing here changes a cap (check is read-only).
# Usage (device machine, repo root): bash benchmarks/node_check_runs.sh OUT QUICK FULL [BEFORE]
set -uo pipefail
OUT=${1:?OUT}; QUICK=${2:-50}; FULL=${3:-10}; BEFORE=${4:-}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -1
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
STATE=$(mktemp -d)
printf 'probes: {state_dir: %s}\n' "$STATE" > "$STATE/check.yaml"
limits() { nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader | tee -a "$OUT/power_limits.txt"; }
limits

# runs TREE LABEL N ARGS...: N runs of gpuperfd check from TREE; one line each: exit code, seconds.
runs() {
  local tree=$1 label=$2 n=$3; shift 3
  local log="$OUT/check_${label}.tsv"
  : > "$log"
  for i in $(seq 1 "$n"); do
    local t0; t0=$(date +%s%N)
    PYTHONPATH=/tmp/site:$tree python3 -m gpuperfd check --config "$STATE/check.yaml" --json "$@" \
      > "$OUT/check_${label}_last.json" 2> "$OUT/check_${label}_last.err"
    local rc=$? t1; t1=$(date +%s%N)
    local state; state=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['state'])" "$OUT/check_${label}_last.json" 2>/dev/null || echo none)
    printf '%s\t%s\t%d.%02d\n' "$rc" "$state" $(( (t1 - t0) / 1000000000 )) $(( (t1 - t0) / 10000000 % 100 )) >> "$log"
  done
  echo "$label: $(cut -f1 "$log" | sort | uniq -c | awk '{printf "exit %s x%s  ", $2, $1}')" \
       "median $(cut -f3 "$log" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') s" | tee -a "$OUT/summary.txt"
}

if [ -n "$BEFORE" ]; then
  runs "$(cd "$BEFORE" && pwd)" before_quick 20 --quick
fi
runs "$PWD" quick "$QUICK" --quick
runs "$PWD" full "$FULL"
cp "$OUT/check_full_last.json" "$OUT/check_full_example.json" 2>/dev/null
PYTHONPATH=/tmp/site:$PWD python3 benchmarks/nvml_serial.py race 40 --json "$OUT/nvml_race.json" | tee -a "$OUT/summary.txt"
PYTHONPATH=/tmp/site:$PWD python3 benchmarks/nvml_serial.py cost 20 --json "$OUT/nvml_gate_cost.json" | tee -a "$OUT/summary.txt"
limits

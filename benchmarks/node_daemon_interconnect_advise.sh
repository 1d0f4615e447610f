#!/usr/bin/env bash
# The daemon on a lent node of two or more GPUs, read-only (issues 44 and 45): NVML topology and
# fabric state in the verdicts, the scheduled interconnect probe across every GPU, a read-only llm
# schedule, and apply mode `advise` end to end. Nothing here changes a cap: probes.read_only is true,
# apply is advise (it journals and sets nothing); power limits are printed before and after.
# Usage (device machine, repo root): bash benchmarks/node_daemon_interconnect_advise.sh OUT [SECONDS]
# Dry run here: BACKEND=simulated SIMULATION='simulation: {gpus: 2, topology: nvlink-pair}' bash ...
set -uo pipefail
OUT=${1:?usage: node_daemon_interconnect_advise.sh OUT [SECONDS]}; SECONDS_UP=${2:-150}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PORT=10188
STATE=$(mktemp -d)
cat > "$STATE/node.yaml" <<YAML
log_level: info
web: {listen_address: 127.0.0.1:$PORT}
device: {backend: ${BACKEND:-nvml}}
${SIMULATION:-}
health: {interval_seconds: 10}
probes:
  read_only: true
  state_dir: $STATE
  history: {path: $STATE/history.jsonl}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 3
  timeout_seconds: 300
  schedules:
    - probe: interconnect
      interval_seconds: 3600
    - probe: llm
      interval_seconds: 3600
      caps: [current]
apply:
  mode: advise
  workload: llm
  interval_seconds: 5
YAML
limits() { nvidia-smi --query-gpu=index,name,power.limit,power.default_limit --format=csv,noheader | tee -a "$OUT/power_limits.txt"; }
echo "before:" >> "$OUT/power_limits.txt"; limits
python3 -m gpuperfd run --config "$STATE/node.yaml" > "$OUT/daemon.log" 2>&1 &
PID=$!
for i in $(seq 1 150); do curl -sf localhost:$PORT/healthz >/dev/null && break; sleep 0.2; done
t0=$(date +%s)
# the interconnect run and an llm point on every GPU: wait for both to publish (or SECONDS_UP)
while [ $(( $(date +%s) - t0 )) -lt "$SECONDS_UP" ]; do
  curl -s localhost:$PORT/metrics > "$OUT/scrape.txt"
  ic=$(grep -c '^gpuperf_interconnect_allreduce_bus_bandwidth_bytes_per_second' "$OUT/scrape.txt")
  llm=$(grep -c '^gpuperf_probe_work_units_per_second{.*probe="llm"' "$OUT/scrape.txt")
  [ "$ic" -gt 0 ] && [ "$llm" -ge 2 ] && break
  sleep 2
done
echo "published after $(( $(date +%s) - t0 )) s: interconnect busbw series $ic, llm throughput series $llm" | tee "$OUT/summary.txt"
sleep 12  # a health pass and two apply passes after the last point
curl -s localhost:$PORT/metrics > "$OUT/scrape.txt"
curl -s localhost:$PORT/api/v1/apply > "$OUT/api_apply.json"
curl -s localhost:$PORT/api/v1/health > "$OUT/api_health.json"
python3 -m gpuperfd apply --status --config "$STATE/node.yaml" > "$OUT/apply_status.txt" 2>&1; echo "apply --status exit $?" >> "$OUT/summary.txt"
kill -TERM $PID; wait $PID; echo "daemon exit $?" | tee -a "$OUT/summary.txt"
echo "after:" >> "$OUT/power_limits.txt"; limits
ls "$STATE" > "$OUT/state_files.txt"; cat "$STATE"/*.interconnect.jsonl > "$OUT/interconnect_history.jsonl" 2>/dev/null
grep -E '^gpuperf_(nvlink_up|nvlink_links|fabric|interconnect_|apply_|health_state|gpu_health)' "$OUT/scrape.txt" | grep -vE '^gpuperf_nvlink_up\{.*link="([2-9]|1[0-9])"' | grep -vE 'gpuperf_gpu_health_(state|action)\{.*\} 0' | head -60
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
apply = json.load(open(f"{out}/api_apply.json"))
health = json.load(open(f"{out}/api_health.json"))
print("apply:", json.dumps(apply)[:1500])
for gpu in health.get("gpus", []):
    print("health gpu", gpu.get("gpu"), gpu.get("state"), [(r.get("check"), r.get("severity"), r.get("message", "")[:140]) for r in gpu.get("reasons", [])][:8])
PY
grep -iE "error|traceback|interconnect|apply" "$OUT/daemon.log" | head -20

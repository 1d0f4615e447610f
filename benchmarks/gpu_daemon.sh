#!/usr/bin/env bash
# Prove the NVML path on a real GPU, read-only: run the daemon against NVML, keep a scrape,
# run a read-only scheduled probe, and benchmark the scrape path against nvidia-smi.
# Never changes power limits or clocks (probes.read_only: true, caps: [current]).
# Usage (device machine, repo root): bash benchmarks/gpu_daemon.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: gpu_daemon.sh OUTDIR}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
STATE=$(mktemp -d)
cat > "$STATE/gpu.yaml" <<YAML
log_level: info
device: {backend: nvml}
probes:
  read_only: true
  state_dir: $STATE
  history: {path: $STATE/history.jsonl}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 3
  timeout_seconds: 300
  schedules:
    - probe: vit
      interval_seconds: 3600
      caps: [current]
      options: {repeats: 1}
YAML
nvidia-smi --query-gpu=name,driver_version,power.limit,power.default_limit,clocks.max.sm --format=csv > "$OUT/nvidia_smi_before.csv" 2>&1
python3 -m gpuperfd run --config "$STATE/gpu.yaml" --web.listen-address 127.0.0.1:10187 > "$OUT/daemon.log" 2>&1 &
PID=$!
for i in $(seq 1 100); do curl -sf localhost:10187/healthz >/dev/null && break; sleep 0.2; done
sleep 3
curl -s localhost:10187/metrics > "$OUT/scrape_idle.txt"
curl -s -H 'Accept: application/openmetrics-text; version=1.0.0' localhost:10187/metrics > "$OUT/scrape_openmetrics.txt"
# wait for the read-only vit probe (child process on the GPU) to publish
for i in $(seq 1 150); do grep -q '^gpuperf_probe_work_units_per_second' <(curl -s localhost:10187/metrics) && break; sleep 1; done
curl -s localhost:10187/metrics > "$OUT/scrape_after_probe.txt"
kill -TERM $PID; wait $PID; echo "daemon exit: $?" >> "$OUT/daemon.log"
cp "$STATE/history.jsonl" "$OUT/history.jsonl" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,power.limit,power.default_limit,clocks.max.sm --format=csv > "$OUT/nvidia_smi_after.csv" 2>&1
python3 benchmarks/scrape.py --nvml --scrapes 2000 --smi-calls 30 --idle-seconds 30 --json "$OUT/scrape_bench.json" > /dev/null 2>&1 || echo "scrape bench failed" >&2
grep -E '^gpuperf_(gpu_info|power_draw|power_limit_watts|energy|probe_work|probe_energy|probe_gpu_busy|collector_success\{collector="pcie")' "$OUT/scrape_after_probe.txt" | head -20
cat "$OUT/scrape_bench.json"
diff "$OUT/nvidia_smi_before.csv" "$OUT/nvidia_smi_after.csv" && echo "power limit unchanged"
tail -5 "$OUT/daemon.log"

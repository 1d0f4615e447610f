#!/usr/bin/env bash
# One lent node of two or more GPUs, read-only, everything for issues 44 and 45 in one call:
# NVML topology and fabric state as gpuperfd reads them (against nvidia-smi topo -m), the
# interconnect probe's figures, repeatability, yield and failures (interconnect_node.py), the
# one-shot CLI, a full `gpuperfd check` with its interconnect step, and the daemon with the scheduled
# interconnect probe and apply `advise` (node_daemon_interconnect_advise.sh). No cap is changed.
# Usage (device machine, repo root): bash benchmarks/node_interconnect_all.sh OUT
set -uo pipefail
OUT=${1:?OUT}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv,noheader
  nvidia-smi topo -m
  nvidia-smi -q | grep -iA4 "fabric" | head -20
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
  python3 - <<'PY'
import time
from gpuperfd.device.nvml import NvmlBackend
from gpuperfd.device.base import NotSupported
b = NvmlBackend(indices=None)
t = time.perf_counter(); links = b.topology(); dt = time.perf_counter() - t
print(f"gpuperfd topology ({dt * 1e3:.1f} ms):", links)
for d in b.devices():
    try:
        print(f"GPU {d.index} fabric:", d.fabric_state())
    except NotSupported as e:
        print(f"GPU {d.index} fabric: not supported ({e})")
    print(f"GPU {d.index} nvlink up:", sum(1 for _, up in d.nvlink().links if up), "of", len(d.nvlink().links))
b.close()
PY
} > "$OUT/topology.txt" 2>&1
cat "$OUT/topology.txt"
echo "== interconnect_node.py"
t0=$(date +%s); timeout 300 python3 benchmarks/interconnect_node.py --out "$OUT/ic_node.json" 2>&1 | tail -25; echo "took $(( $(date +%s) - t0 )) s"
echo "== probe interconnect (CLI)"
timeout 120 python3 -m gpuperfd probe interconnect --gpus 0,1 --size 256MiB 1GiB --repeats 20 --no-progress --output "$OUT/ic_cli.csv" 2>&1 | tail -15
echo "== check (full, JSON)"
S=$(mktemp -d); printf 'probes: {state_dir: %s}\n' "$S" > "$S/c.yaml"
t0=$(date +%s%N); timeout 150 python3 -m gpuperfd check --config "$S/c.yaml" --json --timeout 120 > "$OUT/check.json" 2> "$OUT/check.err"; rc=$?
echo "check exit $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; tail -3 "$OUT/check.err"
python3 -c "
import json; c=json.load(open('$OUT/check.json')); print(c['state'], c['action']); print(json.dumps(c.get('check', {}).get('interconnect'))[:1200])
for g in c['gpus']: print(g['gpu'], g['state'], [(r['check'], r['severity'], r['message'][:160]) for r in g['reasons']])"
echo "== daemon: scheduled interconnect + apply advise"
bash benchmarks/node_daemon_interconnect_advise.sh /tmp/daemon 150 2>&1 | tail -45
tar -czf "$OUT/daemon.tgz" -C /tmp daemon
nvidia-smi --query-gpu=index,power.limit --format=csv,noheader

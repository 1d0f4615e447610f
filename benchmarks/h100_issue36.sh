#!/usr/bin/env bash
# Issue 36's before/after figures on a GPU node, read-only (caps recorded, never set; the power
# limit is printed before and after). BEFORE is a copy of the landed tree, made with
#   git archive 520d9ac gpuperfd benchmarks pyproject.toml | tar -x -C BEFORE
# Usage (repo root of this tree): bash benchmarks/h100_issue36.sh sweep|daemon BEFORE OUTDIR
set -uo pipefail
PART=${1:?sweep|daemon}; BEFORE=$(cd "${2:?BEFORE}" && pwd); OUT=${3:?OUTDIR}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
fi
SITE=/tmp/site
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE:$PWD
limit() { nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$OUT/power_limit.txt"; }
limit
case $PART in
sweep)  # the landed warm path, then one child per round (compile cache filled by an earlier round)
  python3 benchmarks/sweep_cost.py --paths shared --probes attention,llm,vit,train --before "$BEFORE" \
    --json "$OUT/sweep_cost_h100.json" 2>&1 | grep -v -i warn | tail -16 ;;
daemon)  # scrape (in-process breakdown, then the daemon over HTTP), memory, processes beside it
  python3 benchmarks/scrape_profile.py --nvml -n 3000 --before "$BEFORE" --json "$OUT/scrape_profile_h100.json" 2>&1 | tail -14
  (cd "$BEFORE" && PYTHONPATH=$SITE:$PWD python3 benchmarks/scrape.py --nvml --scrapes 3000 --smi-calls 30 \
    --idle-seconds 30 --json "$OUT/scrape_h100_before.json" 2>&1 | tail -4)
  python3 benchmarks/scrape.py --nvml --scrapes 3000 --smi-calls 30 --idle-seconds 30 --json "$OUT/scrape_h100_after.json" 2>&1 | tail -4
  python3 benchmarks/daemon_memory_breakdown.py --nvml --idle 20 --json "$OUT/daemon_memory_h100.json" 2>&1 | tail -30
  PYTHONPATH=$SITE:$BEFORE python3 benchmarks/daemon_rss.py --idle 20 --json "$OUT/daemon_rss_h100_before.json" 2>&1 | tail -6
  python3 benchmarks/daemon_rss.py --idle 20 --json "$OUT/daemon_rss_h100_after.json" 2>&1 | tail -6 ;;
esac
limit

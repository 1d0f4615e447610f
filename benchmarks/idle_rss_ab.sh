#!/usr/bin/env bash
# Idle RSS of two trees' daemons, alternated: `gpuperfd run --simulate 1` (or --nvml: the real
# backend, read-only) from each tree in turn, VmRSS after 10 s idle, then SIGTERM. For a change
# whose effect is smaller than daemon_rss.py's run-to-run spread (one number per tree there).
# Usage: bash benchmarks/idle_rss_ab.sh BEFORE_TREE AFTER_TREE [RUNS] [--nvml]
set -euo pipefail
BEFORE=$(cd "${1:?BEFORE_TREE}" && pwd); AFTER=$(cd "${2:?AFTER_TREE}" && pwd); RUNS=${3:-3}
BACKEND=(--simulate 1); [ "${4:-}" = "--nvml" ] && BACKEND=()
PY=$(command -v "${PYTHON:-python3}")
for _ in $(seq "$RUNS"); do
  for tree in "$BEFORE" "$AFTER"; do
    port=$(cd "$(dirname "$0")" && "$PY" -c 'from load import free_port; print(free_port())')
    (cd "$tree" && MALLOC_ARENA_MAX=2 PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m gpuperfd run \
       "${BACKEND[@]}" --web.listen-address "127.0.0.1:$port" --log-level warning >/dev/null 2>&1) &
    pid=$!
    sleep 10
    echo "$tree $(awk '/^VmRSS/ {printf "%.2f MB", $2 / 1024}' "/proc/$pid/status")"
    kill -TERM "$pid"; wait "$pid" || true
  done
done

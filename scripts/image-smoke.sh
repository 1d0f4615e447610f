#!/usr/bin/env bash
# Smoke test of the images that scripts/image.sh builds, run as the DaemonSet runs them:
# uid 65534, read-only root file system, every capability dropped, no new privileges,
# writable only the state directory (a host folder here, so what lands there can be
# checked), the cache directory and /tmp (tmpfs, as in the DaemonSet).
#
#   bash scripts/image-smoke.sh [VERSION]     # after: bash scripts/image.sh
#
# gpuperfd (telemetry): `gpuperfd run --simulate 2`, /metrics scraped from the host.
# gpuperfd-probes: the same daemon with a scheduled tiny llm probe in a torch child
# process on the CPU, which must land in the state directory's history and in /metrics;
# then a one-shot `gpuperfd probe llm --preset tiny --device cpu` in the running container.
# Both: `podman diff` must show no change to the image's file system, and every file
# written to the state directory must belong to uid 65534.
# Prints "smoke: N passed, 0 failed" and exits 0, or names the first failed check and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
PODMAN=(podman --runtime runc)
WORK=$(mktemp -d /tmp/gpuperfd-smoke.XXXXXX)
NAME=gpuperfd-smoke-$$
passed=0

cleanup() {
  "${PODMAN[@]}" rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "smoke: FAILED: $*" >&2
  "${PODMAN[@]}" logs --tail 30 "$NAME" >&2 2>&1 || true
  echo "smoke: $passed passed, 1 failed"
  exit 1
}
ok() { passed=$((passed + 1)); echo "smoke: ok: $*"; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

start() {  # start IMAGE CONFIG_TEXT: run the daemon the way the DaemonSet does
  rm -rf "$WORK/state" "$WORK/cache" "$WORK/etc"; mkdir -p "$WORK/state" "$WORK/cache" "$WORK/etc"
  chown 65534:65534 "$WORK/state" "$WORK/cache"
  printf '%s\n' "$2" >"$WORK/etc/gpuperfd.yaml"
  "${PODMAN[@]}" rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
  # --read-only-tmpfs=false: no implicit writable /run, /var/tmp; /tmp is an explicit tmpfs
  # like the DaemonSet's emptyDir. --network host and the ulimits: this sandbox needs them.
  "${PODMAN[@]}" run -d --name "$NAME" --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --user 65534:65534 --read-only --read-only-tmpfs=false --cap-drop=all --security-opt no-new-privileges \
    -v "$WORK/etc:/etc/gpuperfd:ro" -v "$WORK/state:/var/lib/gpuperfd" \
    -v "$WORK/cache:/var/cache/gpuperfd" \
    --tmpfs /tmp:rw,size=64m,mode=1777 \
    "localhost/$1:$VERSION" run --config=/etc/gpuperfd/gpuperfd.yaml --simulate 2 >/dev/null \
    || fail "$1: podman run"
  "${PODMAN[@]}" inspect "$NAME" --format '{{.Config.User}}' | grep -qx 65534:65534 || fail "$1: not uid 65534"
}

scrape() {  # scrape PATTERN TRIES: /metrics from the host until PATTERN shows
  local i
  for i in $(seq 1 "$2"); do
    if curl -sf "http://127.0.0.1:$port/metrics" >"$WORK/metrics" 2>/dev/null && grep -q "$1" "$WORK/metrics"; then
      return 0
    fi
    "${PODMAN[@]}" container exists "$NAME" && [ "$("${PODMAN[@]}" inspect "$NAME" --format '{{.State.Running}}')" = true ] \
      || fail "the container stopped"
    sleep 1
  done
  return 1
}

untouched() {  # untouched IMAGE: nothing written outside the volumes; state files owned by 65534
  local diff
  # podman itself bind-mounts /etc/hosts, /etc/hostname and /etc/resolv.conf, which marks
  # /etc changed even in a container that does nothing; a file written under /etc would
  # still show as its own line.
  diff=$("${PODMAN[@]}" diff "$NAME" | grep -vx 'C /etc' || true)
  [ -z "$diff" ] || fail "$1 changed the image's file system: $diff"
  local foreign
  foreign=$(find "$WORK/state" -mindepth 1 ! -uid 65534 -print)
  [ -z "$foreign" ] || fail "$1 left files not owned by 65534 in the state dir: $foreign"
  # The cache and /tmp are writable for torch, Triton and Hugging Face on a GPU; on the CPU
  # path no file may land there (importing torch makes an empty torchinductor folder):
  # the state directory is the only place files are written.
  local others
  others=$(find "$WORK/cache" ! -type d -print; "${PODMAN[@]}" exec "$NAME" find /tmp ! -type d -print)
  [ -z "$others" ] || fail "$1 wrote outside the state dir: $others"
  ok "$1: podman diff empty, no file in the cache or /tmp; state dir holds only uid 65534's files: $(cd "$WORK/state" && ls -A | tr '\n' ' ')"
}

# --- gpuperfd (telemetry) ---------------------------------------------------------------------
start gpuperfd "web: {listen_address: 127.0.0.1:$port}
probes: {enabled: false, state_dir: /var/lib/gpuperfd}"
scrape 'gpuperf_power_draw_watts{.*gpu="1"' 60 || fail "gpuperfd: no power of simulated gpu 1 in /metrics"
ok "gpuperfd: /metrics from the host, $(grep -c '^gpuperf_' "$WORK/metrics") gpuperf_ samples for 2 simulated GPUs"
"${PODMAN[@]}" exec "$NAME" python -c 'import torch' 2>/dev/null && fail "gpuperfd: torch is installed in the telemetry image"
ok "gpuperfd: no torch in the telemetry image"
untouched gpuperfd

# --- gpuperfd-probes ----------------------------------------------------------------------------
start gpuperfd-probes "web: {listen_address: 127.0.0.1:$port}
probes:
  read_only: true
  executor: child          # a real torch child process, on the CPU
  torch_device: cpu
  state_dir: /var/lib/gpuperfd
  history: {path: /var/lib/gpuperfd/history.jsonl}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0
  schedules:
    - {probe: llm, preset: tiny, interval_seconds: 3600, gpus: [0]}"
scrape 'gpuperf_probe_work_units_per_second{.*probe="llm"' 180 \
  || fail "gpuperfd-probes: no llm probe result in /metrics after 180 s"
ok "gpuperfd-probes: scheduled tiny llm probe in a torch child process, result in /metrics"
grep -q '"status":"ok"' "$WORK/state/history.jsonl" || fail "gpuperfd-probes: no ok result in the history"
ok "gpuperfd-probes: result written to the state dir's history.jsonl"
"${PODMAN[@]}" exec "$NAME" gpuperfd probe llm --preset tiny --device cpu --repeats 1 --no-idle-check \
  --no-progress --json >"$WORK/probe.json" 2>"$WORK/probe.err" || { cat "$WORK/probe.err" >&2; fail "gpuperfd probe llm"; }
python3 - "$WORK/probe.json" <<'EOF' || fail "gpuperfd probe llm: no ok result in its JSON"
import json, sys
text = open(sys.argv[1]).read()
results = json.loads(text)
results = results if isinstance(results, list) else [results]
assert results and all(r["status"] == "ok" for r in results), text[:500]
EOF
ok "gpuperfd-probes: one-shot 'gpuperfd probe llm --preset tiny --device cpu' in the container"
untouched gpuperfd-probes

echo "smoke: $passed passed, 0 failed"

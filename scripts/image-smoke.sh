#!/usr/bin/env bash
# Smoke test of the images that scripts/image.sh builds, run as the DaemonSet runs them:
# uid 0 with every capability dropped (root only to reach the kubelet's root-owned socket),
# no new privileges, read-only root file system, the kubelet's PodResources directory
# mounted read-only, writable only the state directory (a host folder here, so what lands
# there can be checked), the cache directory and /tmp (tmpfs, as in the DaemonSet).
#
#   bash scripts/image-smoke.sh [VERSION]     # after: bash scripts/image.sh
#
# gpuperfd (telemetry): `gpuperfd run --simulate 2`, /metrics scraped from the host.
# gpuperfd-probes: the same daemon with a scheduled tiny llm probe in a torch child
# process on the CPU, which must land in the state directory's history and in /metrics;
# then a one-shot `gpuperfd probe llm --preset tiny --device cpu` in the running container;
# and, started as in a pod (KUBERNETES_SERVICE_HOST set) with no kubelet socket in the
# mounted directory, the same schedule is skipped as "allocated" (allocation unknown).
# Both: `podman diff` must show no change to the image's file system, and every file
# written to the state directory must belong to the user the manifests run (uid 0).
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
  local image=$1 config=$2; shift 2  # the rest: extra podman run arguments
  rm -rf "$WORK/state" "$WORK/cache" "$WORK/etc" "$WORK/pod-resources"
  mkdir -p "$WORK/state" "$WORK/cache" "$WORK/etc" "$WORK/pod-resources"
  chown 0:0 "$WORK/state" "$WORK/cache"
  printf '%s\n' "$config" >"$WORK/etc/gpuperfd.yaml"
  "${PODMAN[@]}" rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
  # --read-only-tmpfs=false: no implicit writable /run, /var/tmp; /tmp is an explicit tmpfs
  # like the DaemonSet's emptyDir. --network host and the ulimits: this sandbox needs them.
  "${PODMAN[@]}" run -d --name "$NAME" --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --user 0:0 --read-only --read-only-tmpfs=false --cap-drop=all --security-opt no-new-privileges \
    -v "$WORK/etc:/etc/gpuperfd:ro" -v "$WORK/state:/var/lib/gpuperfd" \
    -v "$WORK/cache:/var/cache/gpuperfd" -v "$WORK/pod-resources:/var/lib/kubelet/pod-resources:ro" \
    --tmpfs /tmp:rw,size=64m,mode=1777 "$@" \
    "localhost/$image:$VERSION" run --config=/etc/gpuperfd/gpuperfd.yaml --simulate 2 >/dev/null \
    || fail "$image: podman run"
  "${PODMAN[@]}" inspect "$NAME" --format '{{.Config.User}}' | grep -qx 0:0 || fail "$image: not uid 0"
  [ "$("${PODMAN[@]}" inspect "$NAME" --format '{{.EffectiveCaps}}')" = "[]" ] || fail "$image: holds capabilities"
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

untouched() {  # untouched IMAGE: nothing written outside the volumes; state files owned by uid 0
  local diff
  # podman itself bind-mounts /etc/hosts, /etc/hostname and /etc/resolv.conf, which marks
  # /etc changed even in a container that does nothing; a file written under /etc would
  # still show as its own line.
  diff=$("${PODMAN[@]}" diff "$NAME" | grep -vx 'C /etc' || true)
  [ -z "$diff" ] || fail "$1 changed the image's file system: $diff"
  local foreign
  foreign=$(find "$WORK/state" -mindepth 1 ! -uid 0 -print)
  [ -z "$foreign" ] || fail "$1 left files not owned by uid 0 in the state dir: $foreign"
  [ -z "$(find "$WORK/pod-resources" -mindepth 1 -print)" ] || fail "$1 wrote into the kubelet's directory"
  # The cache and /tmp are writable for torch, Triton and Hugging Face on a GPU; on the CPU
  # path no file may land there (importing torch makes an empty torchinductor folder):
  # the state directory is the only place files are written.
  local others
  others=$(find "$WORK/cache" ! -type d -print; "${PODMAN[@]}" exec "$NAME" find /tmp ! -type d -print)
  [ -z "$others" ] || fail "$1 wrote outside the state dir: $others"
  ok "$1: podman diff empty, no file in the cache or /tmp; state dir holds only uid 0's files: $(cd "$WORK/state" && ls -A | tr '\n' ' ')"
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
PROBES_CONFIG="web: {listen_address: 127.0.0.1:$port}
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
# As in a pod whose kubelet socket is missing: who holds the GPU is unknown, so nothing is probed.
start gpuperfd-probes "$PROBES_CONFIG" -e KUBERNETES_SERVICE_HOST=10.96.0.1
scrape 'gpuperf_probe_runs_total{.*reason="allocated".*result="skipped"' 60 \
  || fail "gpuperfd-probes: in a pod without the kubelet socket the probe was not skipped as allocated"
grep -q 'gpuperf_probe_work_units_per_second{' "$WORK/metrics" && fail "gpuperfd-probes: probed without the kubelet"
ok "gpuperfd-probes: in a pod without the kubelet's socket the scheduled probe is skipped (allocated)"
# Bare metal (no KUBERNETES_SERVICE_HOST): the probe runs.
start gpuperfd-probes "$PROBES_CONFIG"
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

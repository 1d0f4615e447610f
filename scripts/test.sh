#!/usr/bin/env bash
# Install everything gpuperfd needs (CPU torch, the project with all extras,
# Prometheus/promtool from Debian) into .venv and run the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests drive for real: Prometheus/promtool, Alertmanager/amtool, systemd-analyze, curl,
# headless Chromium, and podman/runc/debootstrap for the container image build and smoke test (tests/deploy/test_image.py).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v podman >/dev/null 2>&1 || need+=(podman buildah)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi
# Debian's package starts a Prometheus service where systemd runs; tests start their own.
for unit in prometheus prometheus-alertmanager; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
    systemctl stop "$unit" || true
  fi
done

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, pinned: a plain 'torch' requirement would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[all]'

exec .venv/bin/python -m pytest -q "$@"

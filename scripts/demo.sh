#!/usr/bin/env bash
# Install gpuperfd (no torch needed) and start the daemon on 2 simulated GPUs.
# Metrics: http://127.0.0.1:10187/metrics  Landing page: http://127.0.0.1:10187/
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e .
exec .venv/bin/gpuperfd run --simulate "${GPUS:-2}" --config examples/demo.yaml "$@"

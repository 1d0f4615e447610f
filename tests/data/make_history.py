"""Regenerate the recorded histories in this folder from the simulator (no GPU needed).

    .venv/bin/python tests/data/make_history.py

Runs the daemon's own ProbeService (simulated GPUs, simulated executor, real
HistoryWriter) over a few power-cap sweeps, three sweeps per workload so the
report's outlier rule has groups to work on, and keeps the latency lists short
so the files stay small. The files are inputs to tests/report/test_report.py and to the
sample image in docs/reports.md; the simulator does not model batch-size
efficiency, so throughput is flat against batch size while latency grows with it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig  # noqa: E402
from gpuperfd.device.simulated import SimulatedBackend  # noqa: E402
from gpuperfd.probing.executors import simulated_executor  # noqa: E402
from gpuperfd.probing.history import HistoryWriter  # noqa: E402
from gpuperfd.probing.gates.idle import IdleTracker  # noqa: E402
from gpuperfd.probing.metrics import ProbeMetrics  # noqa: E402
from gpuperfd.probing.scheduling.service import ProbeService  # noqa: E402
from gpuperfd.telemetry.collectors.base import Point  # noqa: E402
from gpuperfd.telemetry.sampler import Reading  # noqa: E402

CAPS = ["max", 0.85, 0.7, 0.55, 0.4]
WORKLOADS = [
    ("llm", {"batch_size": 8}),
    ("llm", {"batch_size": 32}),
    ("llm", {"batch_size": 128}),
    ("vit", {"batch_size": 128}),
    ("train", {"batch_size": 8}),
    ("train", {"batch_size": 16}),
]
SWEEPS = 3
LATENCY_SAMPLES = 8


def _rounded(value, key=""):
    """Floats to 7 significant digits (the simulator's noise is far coarser), timestamps kept: smaller files."""
    if isinstance(value, float) and key not in ("time", "started_at"):
        return float(f"{value:.7g}")
    if isinstance(value, dict):
        return {k: _rounded(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def record(model: str, node: str, target: Path, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        backend = SimulatedBackend(SimulationConfig(gpus=1, model=model, seed=seed))
        devices = backend.devices()
        tracker = IdleTracker(0.05)
        tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
        raw = Path(tmp) / "history.jsonl"
        history = HistoryWriter(raw)
        history.node = node
        config = ProbesConfig(state_dir=Path(tmp) / "state", idle_seconds=0, read_only=False)
        service = ProbeService(
            config, devices, simulated_executor(0.2, seed=seed), ProbeMetrics(CollectorRegistry()), tracker, history
        )
        for _ in range(SWEEPS):
            for probe, options in WORKLOADS:
                schedule = ScheduleConfig(probe=probe, interval_seconds=3600, caps=CAPS, settle_seconds=0, options=options)
                outcome = service.run(schedule, 0)
                assert outcome.result == "ok", outcome
        backend.close()
        lines = []
        for line in raw.read_text().splitlines():
            data = json.loads(line)
            result = data["result"]
            result["latencies"] = {k: v[:LATENCY_SAMPLES] for k, v in result["latencies"].items()}
            lines.append(json.dumps(_rounded(data), separators=(",", ":")))
        target.write_text("\n".join(lines) + "\n")
        print(f"{target}: {len(lines)} lines, {target.stat().st_size} bytes")


if __name__ == "__main__":
    record("H100", "sim-h100-node", HERE / "history-h100-sim.jsonl", seed=11)
    record("A100", "sim-a100-node", HERE / "history-a100-sim.jsonl", seed=12)

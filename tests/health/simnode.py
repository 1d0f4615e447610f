"""A simulated node with a sampler and a health monitor on a hand-driven clock."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.health.monitor import HealthMonitor
from gpuperfd.probe_data.record import build_record
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.sampler import Sampler


class Node:
    def __init__(self, tmp_path: Path, gpus: int = 4, thresholds: dict | None = None, **simulation) -> None:
        self.tmp = tmp_path
        self.backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=1, **simulation))
        self.gpus = self.backend.devices()
        collectors = [cls() for name, cls in COLLECTORS.items() if name not in ("xid", "allocation")]
        self.sampler = Sampler(self.backend, self.gpus, collectors, interval_seconds=1.0)
        self.now = 1_800_000_000.0
        self.boot = "boot-1"
        self.history = tmp_path / "history.jsonl"
        self.thresholds = {"busy_min_samples": 3, **(thresholds or {})}
        self.monitor = self.new_monitor()

    def new_monitor(self) -> HealthMonitor:
        return HealthMonitor(self.sampler, self.tmp, self.history, thresholds=self.thresholds,
                             clock=lambda: self.now, boot_id=lambda: self.boot, node="node-a")

    def uuid(self, gpu: int) -> str:
        return self.gpus[gpu].info().uuid

    def step(self, seconds: float = 5.0, skip: frozenset[str] = frozenset()) -> dict[int | None, object]:
        """Advance the monitor's clock, read every collector but those in ``skip`` (not due yet: a
        longer interval) and due XIDs, evaluate."""
        self.now += seconds
        if skip:
            for device in self.gpus:
                for collector in self.sampler.collectors:
                    if collector.name not in skip:
                        self.sampler.read_one(device, collector)
        else:
            self.sampler.sample_once()
        for event in self.backend.wait_xid_events(0):
            self.sampler.xid_counts.add(event)
        return {v.gpu if v.gpu is not None else v.uuid: v for v in self.monitor.evaluate_once()}

    def run(self, gpu: int, rate: float = 1000.0, energy: float = 0.5, status: str = "ok",
            reason: str | None = None, probe: str = "llm", at: float | None = None,
            fingerprint: str | None = None) -> None:
        """Append one probe run record to the history, as the daemon's HistoryWriter does."""
        self.now += 1.0
        result = ProbeResult(
            probe=probe, variant="decode", preset="default", status=status, failure_reason=reason,
            measured_seconds=1.0 if status == "ok" else None, units_of_work=rate if status == "ok" else None,
            work_unit="token", energy_per_unit_joules=energy if status == "ok" else None,
            started_at=self.now if at is None else at, device="cuda:0",
        )
        if fingerprint is not None or reason == "wrong_result":
            result.correctness = {"status": "ok" if status == "ok" else "mismatch", "checks": 2,
                                  "elements_checked": 4096, "fingerprint": fingerprint or "",
                                  "failed_checks": [] if status == "ok" else ["repeat"]}
        info = dataclasses.asdict(self.gpus[gpu].info())
        info.pop("serial")
        record = build_record(result, "daemon", gpu=info, host="node-a", power_cap_watts=700.0)
        with open(self.history, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def busy(self, gpu: int, on: bool = True) -> None:
        from gpuperfd.device.simulated import WORKLOAD_PROFILES

        if on:
            self.gpus[gpu].begin_load(next(iter(WORKLOAD_PROFILES.values())))
        else:
            self.gpus[gpu].end_load()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """A 4-GPU simulated node (a fixture here, not in a conftest.py: a second module named
    ``conftest`` would shadow tests/conftest.py for the modules that import from it)."""
    return Node(tmp_path)

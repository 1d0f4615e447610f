"""A simulated node for the apply tests: real simulated GPUs, the real probe service sweeping them
(simulated executor), the real cap journal, and the apply controller wired as the daemon wires it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuperfd.apply.controller import ApplyController
from gpuperfd.apply.metrics import ApplyMetrics
from gpuperfd.apply.policy import ApplySettings
from gpuperfd.caps.journal import CapJournal
from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.health.verdict import Reason, Verdict
from gpuperfd.probing.executors import simulated_executor
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import Reading

SCHEDULE = ScheduleConfig(probe="llm", interval_seconds=60, caps=["max", 600, 500, 400, 300], settle_seconds=0)


@dataclass
class Node:
    backend: SimulatedBackend
    service: ProbeService
    controller: ApplyController
    metrics: ApplyMetrics
    journal: CapJournal
    #: Verdicts by GPU index the controller reads (healthy unless a test sets reasons).
    reasons: dict[int, list[Reason]] = field(default_factory=dict)
    idle: dict[int, bool] = field(default_factory=dict)

    @property
    def devices(self):  # type: ignore[no-untyped-def]
        return self.backend.devices()

    def verdicts(self) -> list[Verdict]:
        return [Verdict(d.index, d.info().uuid, list(self.reasons.get(d.index, []))) for d in self.devices]

    def sweep(self, schedule: ScheduleConfig = SCHEDULE) -> None:
        for device in self.devices:
            self.service.run(schedule, device.index)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def drift(check: str = "probe_throughput_baseline") -> Reason:
    return Reason(check, "degraded", "check_hardware", "throughput below its baseline", 1.0)


def make_node(tmp_path: Path, gpus: int = 4, settings: ApplySettings | None = None, history: Path | None = None,
              **simulation) -> Node:
    backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=7, **simulation))
    devices = backend.devices()
    tracker = IdleTracker(0.05)
    for d in devices:
        tracker.observe(d.index, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    config = ProbesConfig(read_only=False, state_dir=tmp_path / "state", idle_seconds=0, schedules=[SCHEDULE])
    service = ProbeService(config, devices, simulated_executor(0.05, seed=1), ProbeMetrics(CollectorRegistry()), tracker,
                           HistoryWriter(history) if history is not None else None)
    metrics = ApplyMetrics()
    settings = settings or ApplySettings(mode="on", probe="llm", budget_ratio=0.10)
    node = Node(backend, service, None, metrics, service.journal)  # type: ignore[arg-type]
    node.controller = ApplyController(settings, devices, service.journal, verdicts=node.verdicts,
                                      idle=lambda i: node.idle.get(i, True), metrics=metrics,
                                      held_caps=service.held_caps, busy_now=service.gate.claimed_now,
                                      turns=service.turns)
    service.point_listeners.append(node.controller.observe)
    service.turns.listeners.append(node.controller.gpu_released)
    return node

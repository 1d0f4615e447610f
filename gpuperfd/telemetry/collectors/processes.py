"""Compute processes running on the GPU: count, memory, and who the biggest ones are.

Per process, only the ``top_n`` holding the most device memory are published
(default 5), so a GPU shared by hundreds of processes costs at most 2 x top_n
series. Each gets ``gpuperf_compute_process_memory_bytes{pid}`` and
``gpuperf_compute_process_info{pid,name,user,unit,slurm_job}``; name, user and
unit stay empty unless ``expose_names`` is on, since operators may consider
them private. Identities come from /proc (:mod:`gpuperfd.attribution.procinfo`),
read once per PID while it stays on the GPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gpuperfd.attribution.procinfo import ProcessIdentity, identify
from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register

if TYPE_CHECKING:
    from gpuperfd.config import Config


@register
class ProcessesCollector(Collector):
    name = "processes"
    help = "Number of compute processes, the memory they hold, and the top N by memory"
    metrics = (
        MetricSpec("gpuperf_compute_processes", "Compute processes running on the GPU."),
        MetricSpec("gpuperf_compute_processes_memory_bytes", "Device memory held by compute processes, bytes (where reported)."),
        MetricSpec("gpuperf_compute_process_memory_bytes",
                   "Device memory held by one compute process (the top N by memory), bytes.", labels=("pid",)),
        MetricSpec("gpuperf_compute_process_info",
                   "1 per compute process among the top N by memory; name, user and unit only if "
                   "attribution.processes.expose_names is on; slurm_job when it runs under Slurm.",
                   labels=("pid", "name", "user", "unit", "slurm_job")),
    )

    def __init__(self, top_n: int = 5, expose_names: bool = False, proc_root: Path = Path("/proc")) -> None:
        self.top_n = top_n
        self.expose_names = expose_names
        self.proc_root = proc_root
        self._lock = threading.Lock()
        self._identities: dict[int, dict[int, ProcessIdentity]] = {}  # gpu -> pid -> identity

    @classmethod
    def from_config(cls, config: Config) -> ProcessesCollector:
        """Its options live under ``attribution.processes`` (top_n, expose_names, proc_root)."""
        processes = config.attribution.processes
        return cls(top_n=processes.top_n, expose_names=processes.expose_names, proc_root=processes.proc_root)

    def _identity(self, pid: int, known: dict[int, ProcessIdentity]) -> ProcessIdentity:
        identity = known.get(pid)
        return identity if identity is not None else identify(pid, self.proc_root, self.expose_names)

    def read(self, device: Device) -> list[Point]:
        processes = device.compute_processes()
        used = [p.used_memory_bytes for p in processes if p.used_memory_bytes is not None]
        points = [
            Point("gpuperf_compute_processes", len(processes)),
            Point("gpuperf_compute_processes_memory_bytes", sum(used)),
        ]
        top = sorted(processes, key=lambda p: (-(p.used_memory_bytes or 0), p.pid))[: self.top_n]
        with self._lock:
            known = self._identities.get(device.index, {})
        current = {p.pid: self._identity(p.pid, known) for p in top}
        with self._lock:
            self._identities[device.index] = current  # PIDs that left are forgotten (PID reuse)
        for process in top:
            pid = str(process.pid)
            if process.used_memory_bytes is not None:
                points.append(Point("gpuperf_compute_process_memory_bytes", process.used_memory_bytes, (pid,)))
            who = current[process.pid]
            points.append(Point("gpuperf_compute_process_info", 1.0, (pid, who.name, who.user, who.unit, who.slurm_job)))
        return points

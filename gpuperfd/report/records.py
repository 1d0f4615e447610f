"""The report's input: one :class:`Run` per probe run at one cap, from history files.

History lines (see :mod:`gpuperfd.probing.history`) and Prometheus range queries
(:mod:`gpuperfd.report.prometheus`) both become the same records, so everything
after loading (outliers, aggregation, figures) does not care where data came from.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuperfd.probes.result import ProbeResult
from gpuperfd.probing.history import read_history
from gpuperfd.probing.sweep.sweeper import work_rate

log = logging.getLogger(__name__)

#: Which probes are inference and which are training (the report puts them side by side).
INFERENCE_PROBES: tuple[str, ...] = ("llm", "vit", "attention")
TRAINING_PROBES: tuple[str, ...] = ("train",)
PROBE_ORDER: tuple[str, ...] = (*INFERENCE_PROBES, *TRAINING_PROBES)

#: The latency each probe's charts show (all latencies are in the tables and CSV).
PRIMARY_LATENCY: dict[str, str] = {
    "llm": "tpot_seconds",
    "vit": "batch_seconds",
    "attention": "iteration_seconds",
    "train": "step_seconds",
}
LATENCY_TITLES: dict[str, str] = {
    "ttft_seconds": "time to first token",
    "tpot_seconds": "time per output token",
    "request_seconds": "request latency",
    "batch_seconds": "batch latency",
    "iteration_seconds": "iteration time",
    "step_seconds": "step time",
}
#: Work unit per probe, as the metrics label it (a result may lack one).
WORK_UNIT: dict[str, str] = {"llm": "token", "vit": "image", "attention": "iteration", "train": "token"}


class ReportError(Exception):
    """Input the report cannot use (no data, unreachable Prometheus, bad time range)."""


def kind_of(probe: str) -> str:
    return "training" if probe in TRAINING_PROBES else "inference"


@dataclass(frozen=True)
class GpuId:
    """One GPU of one node, as its history lines (or gpuperf_gpu_info) describe it."""

    node: str
    index: int
    uuid: str
    name: str = "?"
    driver_version: str = "?"
    compute_capability: str = "?"
    memory_total_bytes: int | None = None
    backend: str = "?"
    pci_bus_id: str = "?"

    @property
    def key(self) -> tuple[str, str]:
        return (self.node, self.uuid)

    @property
    def model(self) -> str:
        """The model name without the vendor prefix: ``H100 80GB HBM3``."""
        name = self.name
        return name[len("NVIDIA "):] if name.startswith("NVIDIA ") else name


@dataclass
class Run:
    """One probe run at one power cap (ok or not)."""

    time: float
    gpu: GpuId
    cap_watts: float
    probe: str
    preset: str
    batch_size: int | None
    status: str = "ok"
    failure_reason: str | None = None
    work_unit: str | None = None
    #: Units of work per second over the measured window.
    rate: float | None = None
    energy_per_unit: float | None = None
    power: float | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    gpu_busy_ratio: float | None = None
    #: GPM means over the measured windows: tensor active (any precision), DRAM bandwidth active.
    gpm_tensor_active_ratio: float | None = None
    gpm_dram_active_ratio: float | None = None
    sweep_id: str | None = None
    source: str = ""

    @property
    def group(self) -> tuple[Any, ...]:
        """Runs that measure the same thing: (GPU, probe, preset, batch size, cap)."""
        return (self.gpu.key, self.probe, self.preset, self.batch_size, round(self.cap_watts))


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def default_batch_size(probe: str, preset: str) -> int | None:
    """The batch size a preset runs with when the run's params do not say."""
    from gpuperfd.probes.spec import PRESETS

    value = PRESETS.get(probe, {}).get(preset, {}).get("batch_size")
    return int(value) if isinstance(value, int) else None


def run_from_history(record: dict[str, Any], source: str = "") -> Run:
    """A history line as a :class:`Run`; ValueError/TypeError/KeyError on a line that is not one."""
    result = ProbeResult.from_dict(record["result"])
    gpu = record.get("gpu") or {}
    identity = GpuId(
        node=str(record.get("node") or "?"),
        index=int(gpu.get("index", -1)),
        uuid=str(gpu.get("uuid") or result.gpu_uuid or "?"),
        name=str(gpu.get("name") or result.gpu_name or "?"),
        driver_version=str(gpu.get("driver_version") or "?"),
        compute_capability=str(gpu.get("compute_capability") or result.compute_capability or "?"),
        memory_total_bytes=gpu.get("memory_total_bytes"),
        backend=str(gpu.get("backend") or "?"),
        pci_bus_id=str(gpu.get("pci_bus_id") or "?"),
    )
    cap = _finite(record.get("power_cap_watts"))
    if cap is None:
        cap = _finite(result.power_limit_watts)
    if cap is None:
        raise ValueError("no power cap")
    batch = result.params.get("batch_size") if isinstance(result.params, dict) else None
    if not isinstance(batch, int) or isinstance(batch, bool):
        batch = default_batch_size(result.probe, result.preset)
    latencies = {
        name: [float(v) for v in values if _finite(v) is not None]
        for name, values in (result.latencies or {}).items()
        if isinstance(values, list)
    }
    ok = result.status == "ok"
    return Run(
        time=float(record.get("time") or result.started_at or 0.0),
        gpu=identity,
        cap_watts=cap,
        probe=result.probe,
        preset=result.preset,
        batch_size=batch,
        status=result.status,
        failure_reason=result.failure_reason,
        work_unit=result.work_unit or WORK_UNIT.get(result.probe),
        rate=_finite(work_rate(result)) if ok else None,
        energy_per_unit=_finite(result.energy_per_unit_joules) if ok else None,
        power=_finite(result.average_power_watts) if ok else None,
        latencies=latencies if ok else {},
        peak_memory_bytes=result.peak_memory_bytes if ok else None,
        gpu_busy_ratio=_finite(result.gpu_busy_ratio) if ok else None,
        gpm_tensor_active_ratio=_finite(result.gpm_tensor_active_mean_ratio) if ok else None,
        gpm_dram_active_ratio=_finite(result.gpm_dram_active_mean_ratio) if ok else None,
        sweep_id=record.get("sweep_id"),
        source=source,
    )


@dataclass
class Loaded:
    """Runs read from the sources, with what was skipped and why."""

    runs: list[Run]
    sources: list[str]
    skipped: int = 0
    notes: list[str] = field(default_factory=list)


def load_history(
    paths: Iterable[str | Path], start: float | None = None, end: float | None = None, include_rotated: bool = True
) -> Loaded:
    """Runs from JSON-lines history files (and their rotated backups), optionally within [start, end]."""
    runs: list[Run] = []
    sources: list[str] = []
    skipped = 0
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ReportError(f"{path}: no such history file")
        sources.append(str(path))
        for record in read_history(path, include_rotated=include_rotated):
            try:
                run = run_from_history(record, str(path))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                skipped += 1
                log.warning("%s: skipped a history record that is not a probe run: %s", path, exc)
                continue
            if (start is not None and run.time < start) or (end is not None and run.time > end):
                continue
            runs.append(run)
    notes = [f"{skipped} history line(s) skipped: not a probe run"] if skipped else []
    return Loaded(runs, sources, skipped, notes)

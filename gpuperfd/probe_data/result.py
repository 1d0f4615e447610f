"""What a probe returns: :class:`ProbeResult` and the statistics over its repeats.

One result per probe point (one child process). Inside it, ``repeats`` holds one
:class:`RepeatResult` per measured window; both are :class:`WindowStats` (one field list); the top-level numbers pool the windows
(units over total measured time, energy summed, latency samples concatenated),
and :func:`summarize` gives mean, median, stdev and coefficient of variation of
the per-window rates plus p50/p95/p99 of the latencies.

Units are SI: seconds, joules, watts, bytes, hertz, ratios in [0, 1].

Pure Python (no torch): the daemon imports this to store and export results.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data.dict_fields import known_fields
from gpuperfd.probe_data.kinds import KINDS, spec_kinds

__all__ = [
    "STATUSES",
    "FAILURE_REASONS",
    "PREEMPTED",
    "CORRECTNESS_STATUSES",
    "not_checked",
    "WORK_UNITS",
    "PRIMARY_METRIC",
    "MAIN_LATENCY",
    "canonical_latencies",
    "WindowStats",
    "RepeatResult",
    "ProbeResult",
    "Stats",
    "describe",
    "percentile",
    "summarize",
]

#: "skipped": a sweep's point not run on purpose (its reason says why, e.g. ``early_stop``), or one
#: that gave the GPU back to a user's job (``preempted``): neither says anything about the GPU.
STATUSES: tuple[str, ...] = ("ok", "failed", "aborted", "skipped")
#: ``oom`` is the GPU's memory (a CUDA allocation failed); ``host_oom`` the host's (the kernel's OOM
#: killer ended the child for the cgroup's memory limit), which says nothing about the GPU.
#: ``gpu_busy``: the GPU could not be read before a start (and, in records older than
#: ``preempted``, a user's job that arrived first).
#: ``no_room`` (status ``skipped``): the card's free memory (a CPU child's memory limit) cannot hold the
#: point, found before anything was built: the preset does not fit this card, which says nothing about it.
FAILURE_REASONS: tuple[str, ...] = ("exception", "timeout", "oom", "crash", "cuda_error", "gpu_busy", "aborted",
                                    "early_stop", "wrong_result", "host_oom", "preempted", "no_room")
NO_ROOM = "no_room"
#: The reason of a point (status ``skipped``) that gave way to a user's job: a compute process or a
#: pod allocation appeared before its build, between points or mid-measurement.
PREEMPTED = "preempted"
#: What the answer checks said (probe_child/correctness.py): "not_checked" for failed points and records
#: written before the checks existed.
CORRECTNESS_STATUSES: tuple[str, ...] = ("ok", "mismatch", "not_checked")


def not_checked() -> dict[str, Any]:
    """The ``correctness`` of a point whose answers were not checked."""
    return {"status": "not_checked", "checks": 0, "max_abs_error": None, "max_rel_error": None,
            "elements_checked": 0}
WORK_UNITS: tuple[str, ...] = ("token", "image", "step", "iteration")
LATENCY_NAMES: tuple[str, ...] = ("ttft_seconds", "tpot_seconds", "request_seconds", "batch_seconds",
                                   "iteration_seconds", "step_seconds")

#: The per-iteration latency each probe reports, under one name in the probe, the simulator, the
#: record and the report (tables and charts show this one; every latency is in the CSV).
MAIN_LATENCY: dict[str, str] = {kind.name: kind.main_latency for kind in spec_kinds() if kind.main_latency}


def canonical_latencies(probe: str, latencies: dict[str, Any]) -> dict[str, Any]:
    """``latencies`` (samples or statistics by name) under today's names: old records keep reading."""
    renames = KINDS[probe].legacy_latencies if probe in KINDS else None
    if not renames or not isinstance(latencies, dict):
        return latencies
    out = dict(latencies)
    for old, new in renames.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out

#: The headline rate of each probe (tables, sweeps, docs).
PRIMARY_METRIC: dict[str, str] = {kind.name: kind.primary_metric for kind in spec_kinds() if kind.primary_metric}

SCHEMA_VERSION = 1


@dataclass(kw_only=True)
class WindowStats:
    """What a measured window says, for one window (:class:`RepeatResult`) or pooled over a point's
    windows (:class:`ProbeResult`): one field list, built in one place (the child's harness)."""

    throughput: dict[str, float] = field(default_factory=dict)
    #: Hardware energy counter's difference over the window(s) (summed when pooled).
    energy_joules: float | None = None
    average_power_watts: float | None = None
    energy_per_unit_joules: float | None = None
    sm_clock_hertz_mean: float | None = None
    memory_clock_hertz_mean: float | None = None
    clock_events_seen: list[str] = field(default_factory=list)
    temperature_celsius_max: float | None = None
    gpu_utilization_mean_ratio: float | None = None
    memory_utilization_mean_ratio: float | None = None
    #: GPM means over the window(s) (time-weighted): SM active, tensor active (any precision), DRAM
    #: bandwidth active; they say whether a point was compute- or memory-bound.
    gpm_sm_active_mean_ratio: float | None = None
    gpm_tensor_active_mean_ratio: float | None = None
    gpm_dram_active_mean_ratio: float | None = None

    @staticmethod
    def energy_rates(energy_joules: float | None, seconds: float, units: float) -> dict[str, float | None]:
        """Average power and energy per unit from an energy difference (None where it cannot be told)."""
        return {
            "energy_joules": energy_joules,
            "average_power_watts": energy_joules / seconds if energy_joules is not None and seconds > 0 else None,
            "energy_per_unit_joules": energy_joules / units if energy_joules is not None and units else None,
        }

    def window_fields(self) -> dict[str, Any]:
        """This object's window statistics only, as keyword arguments for a result."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(WindowStats)}


@dataclass
class RepeatResult(WindowStats):
    """One measured window: the numbers whose spread over repeats gives the CV."""

    index: int
    measured_seconds: float
    units_of_work: float
    telemetry_samples: int = 0
    #: Iterations (requests, batches, calls, steps) in the window.
    iterations: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepeatResult:
        return cls(**known_fields(cls, data))


@dataclass
class ProbeResult(WindowStats):
    """The outcome of one probe point, successful or not (the runner never raises)."""

    probe: str
    variant: str
    preset: str
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    failure_reason: str | None = None
    error_message: str | None = None
    device: str = "cpu"
    gpu_name: str | None = None
    compute_capability: str | None = None
    gpu_uuid: str | None = None
    started_at: float = 0.0
    #: Parent-side wall time of the whole point: spawn, setup, warmup, windows, profiling.
    wall_seconds: float = 0.0
    #: Sum of the measured windows only.
    measured_seconds: float | None = None
    work_unit: str | None = None
    units_of_work: float | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    #: CUDA: caching allocator's peak/current bytes. CPU: the process's peak/current resident set.
    peak_memory_bytes: int | None = None
    allocated_memory_bytes: int | None = None
    #: Share of wall time the device was executing work (see docs/probes.md for the method).
    gpu_busy_ratio: float | None = None
    low_gpu_busy: bool = False
    power_limit_watts: float | None = None
    repeats: list[RepeatResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: The answer checks: status (ok | mismatch | not_checked), checks, max_abs_error, max_rel_error,
    #: elements_checked, fingerprint, seconds (their cost), ... (docs/probes.md, "Correctness").
    correctness: dict[str, Any] = field(default_factory=not_checked)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: {self.status!r} is not one of {STATUSES}")
        if self.failure_reason is not None and self.failure_reason not in FAILURE_REASONS:
            raise ValueError(f"failure_reason: {self.failure_reason!r} is not one of {FAILURE_REASONS}")
        if self.work_unit is not None and self.work_unit not in WORK_UNITS:
            raise ValueError(f"work_unit: {self.work_unit!r} is not one of {WORK_UNITS}")
        self.repeats = [r if isinstance(r, RepeatResult) else RepeatResult.from_dict(r) for r in self.repeats]
        if not isinstance(self.correctness, dict) or self.correctness.get("status") not in CORRECTNESS_STATUSES:
            self.correctness = not_checked()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def preempted(self) -> bool:
        """Gave the GPU back to a user's job: not a failure, and no measurement (the last one stands)."""
        return self.status == "skipped" and self.failure_reason == PREEMPTED

    @property
    def primary_metric(self) -> str:
        return PRIMARY_METRIC.get(self.probe, "")

    @property
    def label(self) -> str:
        """Short identity for tables: ``llm/graph gpt2 b=128``."""
        parts = [f"{self.probe}/{self.variant}", str(self.params.get("model", self.preset))]
        for key, short in (("batch_size", "b"), ("seq_len", "s"), ("n_groups", "g")):
            if key in self.params:
                parts.append(f"{short}={self.params[key]}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        values = known_fields(cls, data)
        values["repeats"] = [RepeatResult.from_dict(r) for r in values.get("repeats", [])]
        probe = str(values.get("probe") or "")
        if isinstance(values.get("latencies"), dict):
            values["latencies"] = canonical_latencies(probe, values["latencies"])
        extra = values.get("extra")
        if isinstance(extra, dict) and isinstance(extra.get("latency_stats"), dict):
            values["extra"] = {**extra, "latency_stats": canonical_latencies(probe, extra["latency_stats"])}
        return cls(**values)

    @classmethod
    def failure(
        cls,
        probe: str,
        variant: str,
        preset: str,
        reason: str,
        message: str,
        status: str = "failed",
        **fields: Any,
    ) -> ProbeResult:
        """A result for a point that did not complete; every measurement stays empty."""
        return cls(
            probe=probe, variant=variant, preset=preset, status=status, failure_reason=reason,
            error_message=message, **fields,
        )


# --- statistics -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Spread of one metric over repeats (stdev is the sample stdev; 0 with one repeat)."""

    n: int
    mean: float
    median: float
    stdev: float
    cv: float | None
    minimum: float
    maximum: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe(values: list[float]) -> Stats | None:
    """Mean, median, stdev and CV (stdev / mean) of ``values``; None if empty."""
    clean = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not clean:
        return None
    mean = statistics.fmean(clean)
    stdev = statistics.stdev(clean) if len(clean) > 1 else 0.0
    cv = stdev / mean if mean else None
    return Stats(len(clean), mean, statistics.median(clean), stdev, cv, min(clean), max(clean))


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    data = sorted(float(v) for v in values)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(result: ProbeResult) -> dict[str, Any]:
    """Statistics for tables and exports.

    ``{"throughput": {name: Stats}, "energy_per_unit_joules": Stats, "average_power_watts": Stats,
    "energy_joules": Stats, "measured_seconds": Stats, "latencies": {name: {"p50","p95","p99","mean","n"}}}``
    (Stats as dicts). Rates are per repeat window, so their CV is the repeatability
    of the probe; latencies pool every sample of every window.
    """
    out: dict[str, Any] = {"throughput": {}, "latencies": {}}
    names: list[str] = []
    for rep in result.repeats:
        names.extend(k for k in rep.throughput if k not in names)
    for name in names:
        stats = describe([rep.throughput[name] for rep in result.repeats if name in rep.throughput])
        if stats is not None:
            out["throughput"][name] = stats.to_dict()
    for name in ("energy_per_unit_joules", "average_power_watts", "energy_joules", "measured_seconds",
                 "gpu_utilization_mean_ratio", "sm_clock_hertz_mean"):
        stats = describe([getattr(rep, name) for rep in result.repeats if getattr(rep, name) is not None])
        out[name] = stats.to_dict() if stats is not None else None
    for name, samples in result.latencies.items():
        if not samples:
            continue
        out["latencies"][name] = {
            "n": len(samples),
            "mean": statistics.fmean(samples),
            "p50": percentile(samples, 50),
            "p95": percentile(samples, 95),
            "p99": percentile(samples, 99),
        }
    return out

"""``GET /api/v1/gpus``: each GPU's state now, in one JSON shape (what ``gpuperfd top`` draws).

Per GPU: identity, up or lost, the telemetry an operator reads at a glance (utilization, memory,
power against the cap, temperature, SM clock, active clock-event reasons), the health verdict,
each (probe, preset)'s latest result at its highest cap against the shipped expected figure, the
recommended cap and what it saves, and the sweep holding the GPU now (cap, point k of n).

The telemetry values are the sampler's readings, the very points ``/metrics`` renders, so the two
never disagree; a field the sampler has no good reading of is null. Built from one store snapshot
and copies of small dicts: no device call. ``gpuperfd top --local`` builds the same shape from its
own one-shot read (:func:`gpu_status` over its own sampler), so one renderer serves both sources.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuperfd.health.judge import expected_figure
from gpuperfd.health.verdict import Verdict
from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import SweepPoint, recommend_latest, watts_saved_while_busy, work_rate
from gpuperfd.telemetry.sampler import StoreSnapshot, lost_gpus

#: The shape's name and version, first key of the answer.
SCHEMA = "gpuperfd.gpus/1"

#: JSON field -> (collector, metric) of the single-valued telemetry fields.
FIELDS: Mapping[str, tuple[str, str]] = {
    "utilization_ratio": ("utilization", "gpuperf_gpu_utilization_ratio"),
    "memory_used_bytes": ("memory", "gpuperf_memory_used_bytes"),
    "memory_total_bytes": ("memory", "gpuperf_memory_total_bytes"),
    "power_draw_watts": ("power", "gpuperf_power_draw_watts"),
    "power_limit_watts": ("power", "gpuperf_power_limit_watts"),
    "temperature_celsius": ("temperature", "gpuperf_temperature_celsius"),
    "sm_clock_hertz": ("clocks", "gpuperf_sm_clock_hertz"),
    "sm_clock_max_hertz": ("clocks", "gpuperf_sm_clock_max_hertz"),
}


def _value(snap: StoreSnapshot, gpu: int, collector: str, metric: str) -> float | None:
    reading = snap.readings.get((gpu, collector))
    if reading is None or not reading.ok:
        return None
    return next((p.value for p in reading.points if p.metric == metric and not p.labels), None)


def _clock_events(snap: StoreSnapshot, gpu: int) -> list[str] | None:
    """The active clock-event (throttle) reasons, or None when unread."""
    reading = snap.readings.get((gpu, "clock_events"))
    if reading is None or not reading.ok:
        return None
    return [p.labels[0] for p in reading.points if p.metric == "gpuperf_clock_event_active" and p.value >= 0.5]


def probe_summary(probe: str, preset: str, points: Sequence[SweepPoint], max_slowdown: float,
                  gpu_name: str) -> dict[str, Any] | None:
    """The latest ok result at the highest cap, its expected figure, and the recommendation (None: no ok point)."""
    ok = [p for p in points if p.result.status == "ok" and work_rate(p.result)]
    if not ok:
        return None
    top = max(ok, key=lambda p: p.cap_watts)
    expected, why_not = expected_figure(gpu_name, probe, preset, top.cap_watts)
    summary: dict[str, Any] = {
        "probe": probe, "preset": preset, "unit": top.result.work_unit or "unit", "cap_watts": top.cap_watts,
        "units_per_second": work_rate(top.result), "energy_per_unit_joules": top.result.energy_per_unit_joules,
        "ended_at": top.result.started_at + (top.result.wall_seconds or 0.0),
        "expected_units_per_second": expected["units_per_second"] if expected else None,
        "expected_note": why_not, "recommendation": None,
    }
    best = recommend_latest(points, max_slowdown)  # the one rule (probe_data/recommend.py)
    if best is not None:
        saved = watts_saved_while_busy(points, best)
        summary["recommendation"] = {
            "cap_watts": best.cap_watts, "baseline_cap_watts": best.baseline_cap_watts,
            "energy_saving_ratio": best.energy_saving_ratio, "slowdown_ratio": best.slowdown_ratio,
            "watts_saved_while_busy": saved}
    return summary


def age_words(seconds: float) -> str:
    """A result's age for people: "45 s", "12 min", "3.2 h", "2.1 d"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def coverage_entries(gpu: int, summaries: Sequence[dict[str, Any]],
                     coverage: Mapping[tuple[int, str, str], bool] | None, now: float) -> list[dict[str, Any]]:
    """Per scheduled (or measured) probe of ``gpu``: its result's age (None: none yet) and whether it is due
    (None: not known, e.g. a local read without the daemon's scheduler)."""
    ended = {(s["probe"], s["preset"]): s["ended_at"] for s in summaries}
    keys = sorted({(p, s) for (g, p, s) in (coverage or {}) if g == gpu} | set(ended))
    return [{"probe": probe, "preset": preset,
             "age_seconds": max(0.0, now - ended[(probe, preset)]) if (probe, preset) in ended else None,
             "due": (coverage or {}).get((gpu, probe, preset))} for probe, preset in keys]


def _seconds_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values) + " s"


def gap_words(state: Mapping[str, Any]) -> str:
    """One line on why a GPU's due results wait (``ProbeScheduler.gap_states()``): "no gap" and "gaps too
    short" are different answers for an operator (the first: the GPU is never free; the second: the jobs
    leave gaps the probes cannot use, see probes.idle_seconds and docs/probes.md, "Coverage")."""
    due = ", ".join(state.get("due") or ())
    gaps, needs = state.get("last_gaps_seconds") or [], state.get("needs_seconds")
    need = f"; a result needs ~{needs:.0f} s free (idle_seconds and the probe's own time)" if needs else ""
    words = {
        "running": "a probe of ours runs on it now",
        "gap_open": f"the GPU is free (for {state.get('free_seconds', 0):.0f} s): it qualifies once idle_seconds pass",
        "no_gap": "no gap: the GPU has not been free since the daemon started (or for its last 5 jobs)",
        "gaps_too_short": f"gaps too short: the last ones lasted {_seconds_list(gaps)}{need}",
    }.get(str(state.get("state")), f"waiting for a gap (the last ones lasted {_seconds_list(gaps)}){need}")
    return f"due: {due}; {words}"


def gpu_status(snap: StoreSnapshot, interval_seconds: float, backend: str,
               latest: Mapping[tuple[int, str, str], Sequence[SweepPoint]] | None = None,
               verdicts: Sequence[Verdict] | None = None, sweeps: Mapping[int, SweepProgress] | None = None,
               max_slowdown: float = 0.10, source: str = "daemon",
               coverage: Mapping[tuple[int, str, str], bool] | None = None,
               applied: Mapping[int, Mapping[str, Any]] | None = None,
               gaps: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The whole answer: ``{"schema", "source", "backend", "time", "gpus": [...]}``, GPUs by index.

    ``verdicts`` None (health off, or a local read): each GPU's ``health`` is null. ``coverage``: the
    scheduler's due flag per (gpu, probe, preset) (each GPU's ``coverage`` list, with each result's age). ``applied``: apply
    mode's state per GPU (``ApplyController.status()``); a GPU whose cap apply mode holds says so
    (``apply``: the applied and the operator's cap), null otherwise: a cap that reads 300 W with no word
    of who set it misled. ``gaps``: ``ProbeScheduler.gap_states()``: a GPU with a result due says why it
    waits (``gaps``, with ``words``), null otherwise.
    """
    now = time.time()
    by_gpu = {v.gpu: v for v in verdicts or () if v.gpu is not None}
    lost = lost_gpus(snap.readings, interval_seconds)
    gpus = []
    for gpu, identity in sorted(snap.identities.items()):
        info = snap.last_good_info.get(gpu, ())
        name = info[0].labels[0] if info else ""
        entry: dict[str, Any] = {"gpu": gpu, "uuid": identity.uuid, "name": name, "up": gpu not in lost}
        for key, (collector, metric) in FIELDS.items():
            entry[key] = None if gpu in lost else _value(snap, gpu, collector, metric)
        entry["clock_events"] = None if gpu in lost else _clock_events(snap, gpu)
        verdict = by_gpu.get(gpu)
        entry["health"] = verdict.to_dict() if verdict is not None else None
        entry["probes"] = [s for (index, probe, preset), points in sorted((latest or {}).items()) if index == gpu
                           if (s := probe_summary(probe, preset, points, max_slowdown, name)) is not None]
        entry["coverage"] = coverage_entries(gpu, entry["probes"], coverage, now)
        cover = {(c["probe"], c["preset"]): c for c in entry["coverage"]}
        for summary in entry["probes"]:
            found = cover[(summary["probe"], summary["preset"])]
            summary["age_seconds"], summary["due"] = found["age_seconds"], found["due"]
        progress = (sweeps or {}).get(gpu)
        entry["sweep"] = progress.to_dict() if progress is not None else None
        held = (applied or {}).get(gpu) or {}
        entry["apply"] = ({"applied_watts": held["applied_watts"], "operator_watts": held.get("operator_watts")}
                          if held.get("applied_watts") is not None else None)
        waiting = (gaps or {}).get(gpu)
        entry["gaps"] = {**waiting, "words": gap_words(waiting)} if waiting else None
        gpus.append(entry)
    return {"schema": SCHEMA, "source": source, "backend": backend, "time": now, "gpus": gpus}

"""Pure evaluation: one GPU's inputs + a check row -> the reasons that fire now.

One function per *kind* of signal (EVALUATORS); every row of the table in
:mod:`gpuperfd.health.checks` is read by the function of its kind, so no check has code
of its own. Stickiness and clearing are not decided here but in the monitor, from the
row's ``clears``.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.health import xid_catalog
from gpuperfd.health.checks import CHECKS, NON_GPU_FAILURES, PROBE_OUTCOMES, Check
from gpuperfd.health.interconnect import findings
from gpuperfd.health.verdict import Reason
from gpuperfd.probe_data.peers import peer_disagreement

log = logging.getLogger(__name__)

#: Warnings already logged: an unknown value stays in the verdict for its whole window, and the
#: evaluation runs every few seconds; the log says it once per process, not once per evaluation.
_WARNED: set[str] = set()


def reset_warnings() -> None:
    """Forget what was logged (a new monitor logs each unknown value once again)."""
    _WARNED.clear()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)

#: Series value: (labels by name, value).
Series = list[tuple[dict[str, str], float]]


@dataclass
class GpuInputs:
    """What the checks read for one GPU, gathered by the monitor.

    ``points``: latest value of every series by metric name; ``busy_samples``: (time,
    points) of the samples taken while the GPU was busy, within the busy window;
    ``counters``: (time, value) of rate signals; ``xids``: XID code -> time of its last
    event within the quiet window; ``runs``: this GPU's probe runs as flat record rows
    (time, status, failure_reason, probe, preset, power_cap_watts, units_per_second,
    energy_per_unit_joules), oldest first. ``missing``: a GPU seen at the first start and
    absent now (gpu is None). ``store_error``: the saved verdicts could not be read.
    """

    gpu: int | None
    uuid: str
    name: str = ""
    lost: bool = False
    missing: bool = False
    points: dict[str, Series] = field(default_factory=dict)
    busy_samples: list[tuple[float, dict[str, Series]]] = field(default_factory=list)
    counters: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    xids: dict[int, float] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    store_error: str | None = None
    #: ``gpuperfd check`` only: expected figures by "probe/preset" (unit, units_per_second,
    #: energy_per_unit_joules, model, power_limit), and why the GPU was not probed (None: probed).
    expected: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_probed: str | None = None
    #: per-evaluation memo of what the checks derive from ``runs`` (runs by key, the latest per key by
    #: value field, fingerprints): filled on first use (the peer check reads every GPU's for every GPU;
    #: GpuInputs are built anew for each evaluation).
    latest_cache: dict[str, dict[tuple[str, str, str], Mapping[str, Any]]] = field(
        default_factory=dict, repr=False, compare=False)
    #: The node's interconnect: :func:`gpuperfd.health.interconnect.interconnect_inputs` (NVLink pairs'
    #: links and the last run's copies against their figures); the same dict for every GPU. Empty:
    #: no topology read and no run, nothing judged.
    interconnect: dict[str, Any] = field(default_factory=dict)


def metric_name(signal: str) -> str:
    return signal.split("{", 1)[0].split(" ", 1)[0]


def _matching(series: Series, labels: Mapping[str, str]) -> Series:
    return [(lab, v) for lab, v in series if all(lab.get(k) == want for k, want in labels.items())]


def _fmt(template: str, values: Mapping[str, Any]) -> str:
    try:
        return template.format(**values)
    except (KeyError, ValueError, IndexError):
        return template


def _reason(check: Check, now: float, evidence: dict[str, Any], key: str = "",
            severity: str | None = None, action: str | None = None) -> Reason:
    return Reason(check.id, severity or check.severity, action or check.action, _fmt(check.summary, evidence),
                  since=now, evidence=evidence, key=key)


def _free_key(check: Check, labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in check.labels)


# -- kinds ------------------------------------------------------------------------------


def _compare(check: Check, gpu: GpuInputs, settings: Mapping[str, float], now: float,
             ok: Callable[[float, float], bool]) -> list[Reason]:
    assert check.threshold is not None
    limit = settings[check.threshold.key]
    out = []
    for labels, value in _matching(gpu.points.get(metric_name(check.signal), []), check.labels):
        if ok(value, limit):
            evidence = {"series": metric_name(check.signal), **labels, "value": value, "threshold": limit}
            out.append(_reason(check, now, evidence, _free_key(check, labels)))
    return out


def at_least(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
             now: float) -> list[Reason]:
    return _compare(check, gpu, settings, now, lambda v, t: v >= t)


def at_most(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
            now: float) -> list[Reason]:
    return _compare(check, gpu, settings, now, lambda v, t: v <= t)


def busy_share(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
               now: float) -> list[Reason]:
    """Share of busy samples in the window where the condition held (value < reference, or
    value >= 1 without a reference); fires above the threshold with enough samples. A sample
    without the signal (the monitor drops values read before the busy streak began) is skipped."""
    assert check.threshold is not None
    start = now - settings["busy_window_seconds"]
    name = metric_name(check.signal)
    samples = hits = 0
    last: dict[str, Any] = {}
    for when, points in gpu.busy_samples:
        if when < start:
            continue
        values = _matching(points.get(name, []), check.labels)
        if not values:
            continue
        value = values[0][1]
        if check.reference is not None:
            refs = points.get(check.reference, [])
            if not refs:
                continue
            hit = value < refs[0][1]
            reference: float | None = refs[0][1]
        else:
            hit, reference = value >= 1, None
        samples += 1
        if hit:
            hits += 1
            last = {"value": value, "reference": reference}
    if samples < settings["busy_min_samples"] or samples == 0:
        return []
    share = hits / samples
    limit = settings[check.threshold.key]
    if share <= limit:
        return []
    evidence = {"series": name, **check.labels, "share": share, "busy_samples": samples, "threshold": limit, **last}
    return [_reason(check, now, evidence)]


def rate_above(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
               now: float) -> list[Reason]:
    """Per-minute increase of a counter over the rate window (a counter that went back is a reset: no rate)."""
    assert check.threshold is not None
    window = settings["rate_window_seconds"]
    samples = [(t, v) for t, v in gpu.counters.get(metric_name(check.signal), []) if t >= now - window]
    if len(samples) < 2:
        return []
    (t0, v0), (t1, v1) = samples[0], samples[-1]
    if t1 - t0 < min(60.0, window / 2) or v1 < v0:
        return []
    per_minute = (v1 - v0) / (t1 - t0) * 60.0
    limit = settings[check.threshold.key]
    if per_minute <= limit:
        return []
    return [_reason(check, now, {"series": metric_name(check.signal), "value": per_minute, "threshold": limit,
                                  "increase": v1 - v0, "seconds": t1 - t0})]


def enum(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
         now: float) -> list[Reason]:
    out = []
    for _labels, value in gpu.points.get(metric_name(check.signal), []):
        code = int(value)
        if code == 0:
            continue
        if code in check.mapping:
            severity, action, meaning = check.mapping[code]
        else:
            warn_once(f"gpu {gpu.gpu}: {check.id} value {code} is not one this daemon knows; verdict unknown")
            severity, action, meaning = "unknown", "contact_support", f"unknown value {code}"
        out.append(_reason(check, now, {"series": metric_name(check.signal), "value": code, "meaning": meaning},
                           str(code), severity, action))
    return out


def xid(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
        now: float) -> list[Reason]:
    """One reason per XID code seen in the quiet window, with the catalog's bucket."""
    out = []
    seen = frozenset(gpu.xids)
    for code, when in sorted(gpu.xids.items()):
        severity, action, bucket = xid_catalog.resolve(code, seen)
        entry = xid_catalog.CATALOG.get(code)
        name = entry.name if entry is not None else "not in the catalog"
        if bucket == "UNKNOWN":
            why = "listed without a bucket" if entry is not None else "code not listed"
            warn_once(f"gpu {gpu.gpu}: XID {code} has no action in gpuperfd's XID catalog ({why}); verdict unknown")
        evidence = {"xid": code, "name": name, "bucket": bucket, "last_event": when,
                    "catalog": f"{xid_catalog.CATALOG_URL} (transcribed {xid_catalog.CATALOG_CHECKED})"}
        reason = _reason(check, now, evidence, str(code), severity, action)
        reason.since = min(when, now)
        reason.last_seen = when
        out.append(reason)
    return out


def flag(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
         now: float) -> list[Reason]:
    return [_reason(check, now, {"lost": True})] if gpu.lost else []


def gpu_count(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
              now: float) -> list[Reason]:
    present = sum(1 for g in node if not g.missing)
    return [_reason(check, now, {"uuid": gpu.uuid, "present": present, "at_first_start": len(node)})] \
        if gpu.missing else []


def store(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
          now: float) -> list[Reason]:
    return [_reason(check, now, {"error": gpu.store_error})] if gpu.store_error else []


def run_key(run: Mapping[str, Any]) -> tuple[str, str, str]:
    """A run's (probe, preset, cap in whole watts or ""): the key its baseline and clearing go by."""
    cap = run.get("power_cap_watts")
    return (str(run.get("probe")), str(run.get("preset")), "" if cap is None else f"{float(cap):.0f}")


def _walk_runs(gpu: GpuInputs) -> None:
    """One walk over this GPU's runs per evaluation: its ok runs grouped by (probe, preset, cap),
    oldest first (cache key ""), and the latest finished run, ok or failed, per key ("finished")."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    finished: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for run in gpu.runs:
        status = run.get("status")
        if status in ("ok", "failed"):
            key = run_key(run)
            finished[key] = run
            if status == "ok":
                groups.setdefault(key, []).append(run)
    gpu.latest_cache[""] = groups  # type: ignore[assignment]
    gpu.latest_cache["finished"] = finished


def _ok_by_key(gpu: GpuInputs) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """This GPU's ok runs grouped by (probe, preset, cap), oldest first; once per evaluation."""
    if "" not in gpu.latest_cache:
        _walk_runs(gpu)
    return gpu.latest_cache[""]  # type: ignore[return-value]


def _latest_finished(gpu: GpuInputs) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """The latest ok or failed run per (probe, preset, cap); from the same walk as _ok_by_key."""
    if "finished" not in gpu.latest_cache:
        _walk_runs(gpu)
    return gpu.latest_cache["finished"]


def _field_runs(gpu: GpuInputs, value_field: str) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """Ok runs with a number in ``value_field``, by key, oldest first."""
    out = {}
    for key, runs in _ok_by_key(gpu).items():
        kept = [r for r in runs if isinstance(r.get(value_field), (int, float))]
        if kept:
            out[key] = kept
    return out


def _latest_of(gpu: GpuInputs, value_field: str) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """The latest ok run per key with a number in ``value_field``, once per evaluation."""
    cached = gpu.latest_cache.get(value_field)
    if cached is None:
        cached = gpu.latest_cache[value_field] = {key: runs[-1] for key, runs in _field_runs(gpu, value_field).items()}
    return cached


def _bad(check: Check, ratio: float, limit: float) -> bool:
    return ratio < limit if check.bad == "below" else ratio > limit


def _ratio_reason(check: Check, key: tuple[str, str, str], latest: Mapping[str, Any], reference: Sequence[float],
                  limit: float, now: float, median_name: str, extra: dict[str, Any]) -> Reason | None:
    """The latest run's ``check.field`` against the median of ``reference`` (a baseline or the peers):
    a reason when the ratio is on the row's bad side of ``limit``, else None."""
    median = statistics.median(reference)
    if median <= 0:
        return None
    ratio = float(latest[check.field]) / median
    if not _bad(check, ratio, limit):
        return None
    evidence = {"probe": key[0], "preset": key[1], "cap": key[2], "value": latest[check.field],
                median_name: median, **extra, "ratio": ratio, "threshold": limit}
    return _reason(check, now, evidence, "/".join(key))


def baseline(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
             now: float) -> list[Reason]:
    """The latest ok run of each (probe, preset, cap) against the median of this GPU's earlier
    ok runs of that key within ``baseline_days``."""
    assert check.threshold is not None
    limit = settings[check.threshold.key]
    span = settings["baseline_days"] * 86400.0
    out = []
    # Runs grouped by key once per evaluation (a week of history is thousands of runs).
    for key, runs in _field_runs(gpu, check.field).items():
        latest = runs[-1]
        t = float(latest.get("time") or 0.0)
        earlier = [float(r[check.field]) for r in runs[:-1] if t - span <= float(r.get("time") or 0) <= t]
        if len(earlier) < settings["baseline_min_runs"]:
            continue
        reason = _ratio_reason(check, key, latest, earlier, limit, now, "baseline_median",
                               {"baseline_runs": len(earlier), "run_time": t})
        if reason is not None:
            out.append(reason)
    return out


def peers(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
          now: float) -> list[Reason]:
    """The latest ok run of each key against the median of the latest ok runs of the same key on
    every GPU of the same model on this node (itself included, as the peer alert)."""
    assert check.threshold is not None
    limit = settings[check.threshold.key]
    group = [g for g in node if g.name == gpu.name and not g.missing]
    latest_by_gpu = [_latest_of(g, check.field) for g in group]
    out = []
    for key, latest in _latest_of(gpu, check.field).items():
        values = [float(latest_runs[key][check.field]) for latest_runs in latest_by_gpu if key in latest_runs]
        if len(values) < settings["peer_min_count"]:
            continue
        reason = _ratio_reason(check, key, latest, values, limit, now, "peer_median",
                               {"peers": len(values), "name": gpu.name, "run_time": float(latest.get("time") or 0.0)})
        if reason is not None:
            out.append(reason)
    return out


def consecutive_failures(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                         now: float) -> list[Reason]:
    """Failed runs since this GPU's last ok run (runs failed for reasons that say nothing about
    the GPU, such as gpu_busy, and skipped runs neither count nor break the streak)."""
    assert check.threshold is not None
    count, reasons = 0, []
    for run in reversed(gpu.runs):
        if run.get("status") == "ok":
            break
        if run.get("status") == "failed" and run.get("failure_reason") not in NON_GPU_FAILURES:
            count += 1
            reasons.append(str(run.get("failure_reason")))
    limit = settings[check.threshold.key]
    if count < limit:
        return []
    return [_reason(check, now, {"count": count, "reasons": ", ".join(sorted(set(reasons))), "threshold": limit})]


# -- kinds of the one-shot check (ACTIVE_CHECKS): they read the check's run, gpu.runs[-1] ----------


def _check_run(gpu: GpuInputs) -> Mapping[str, Any] | None:
    return gpu.runs[-1] if gpu.runs and gpu.not_probed is None else None


def probe_outcome(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                  now: float) -> list[Reason]:
    """A check probe that did not pass: severity and action by its failure reason (PROBE_OUTCOMES)."""
    run = _check_run(gpu)
    if run is None or run.get("status") == "ok":
        return []
    why = str(run.get("failure_reason") or run.get("status") or "unknown")
    severity, action = PROBE_OUTCOMES.get(why, ("unknown", "contact_support"))
    evidence = {"probe": run.get("probe"), "preset": run.get("preset"), "status": run.get("status"),
                "failure_reason": why, "error": run.get("error") or "no message"}
    return [_reason(check, now, evidence, why, severity, action)]


def correctness(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                now: float) -> list[Reason]:
    """The probe's own correctness check said ``mismatch`` (read defensively: absent is not_checked)."""
    run = _check_run(gpu)
    verdict = (run or {}).get("correctness") or {}
    if not isinstance(verdict, Mapping) or verdict.get("status") != "mismatch":
        return []
    evidence = {"probe": run.get("probe"), "preset": run.get("preset"),  # type: ignore[union-attr]
                **{k: verdict.get(k) for k in ("status", "checks", "max_abs_error", "max_rel_error",
                                               "elements_checked")}}
    return [_reason(check, now, evidence)]


def expected(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
             now: float) -> list[Reason]:
    """The check's ok run against the figure shipped for this model (none shipped: nothing fires;
    the measured row says "peers only")."""
    assert check.threshold is not None
    run = _check_run(gpu)
    if run is None or run.get("status") != "ok" or not isinstance(run.get(check.field), (int, float)):
        return []
    figure = gpu.expected.get(f"{run.get('probe')}/{run.get('preset')}")
    want = (figure or {}).get(check.field)
    if not isinstance(want, (int, float)) or want <= 0:
        return []
    ratio = float(run[check.field]) / float(want)
    limit = settings[check.threshold.key]
    if not _bad(check, ratio, limit):
        return []
    evidence = {"probe": run.get("probe"), "preset": run.get("preset"), "value": run[check.field],
                "expected": want, "ratio": ratio, "threshold": limit, "unit": figure.get("unit"),  # type: ignore[union-attr]
                "model": figure.get("model"), "power_limit": figure.get("power_limit")}  # type: ignore[union-attr]
    return [_reason(check, now, evidence)]


def not_probed(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
               now: float) -> list[Reason]:
    """Says why the GPU was not probed: info, or unknown where a probe is required (burn-in)."""
    if gpu.not_probed is None or gpu.missing:
        return []
    severity = "unknown" if settings.get("require_probe", 0.0) >= 1 else check.severity
    return [_reason(check, now, {"why": gpu.not_probed}, severity=severity)]


def _measured_text(run: Mapping[str, Any], figure: Mapping[str, Any] | None) -> str:
    if run.get("status") != "ok":
        return f"{run.get('status')} ({run.get('failure_reason')})"
    unit = run.get("work_unit") or "unit"
    rate, energy = run.get("units_per_second"), run.get("energy_per_unit_joules")
    parts = [f"{rate:,.0f} {unit}/s" if isinstance(rate, (int, float)) else "no rate"]
    if figure and isinstance(rate, (int, float)) and figure.get("units_per_second"):
        parts[0] += f" ({rate / figure['units_per_second']:.0%} of expected {figure['units_per_second']:,.0f})"
    if isinstance(energy, (int, float)):
        parts.append(f"{energy * 1e3:.3g} mJ/{unit}")
    if not figure or not figure.get("units_per_second"):
        parts.append((figure or {}).get("note") or "no expected figure for this model/preset: peers only")
    status = ((run.get("correctness") or {}).get("status") if isinstance(run.get("correctness"), Mapping)
              else None) or "not_checked"
    parts.append(f"correctness {status}")
    return ", ".join(parts)


def measured(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
             now: float) -> list[Reason]:
    """An info reason carrying what the check's probe measured and what was expected (the table's columns)."""
    run = _check_run(gpu)
    if run is None or run.get("status") != "ok":
        return []  # a run that did not pass is check_probe_failed's
    key = f"{run.get('probe')}/{run.get('preset')}"
    figure = gpu.expected.get(key)
    correct = run.get("correctness") if isinstance(run.get("correctness"), Mapping) else None
    evidence = {"probe": run.get("probe"), "preset": run.get("preset"), "status": run.get("status"),
                "work_unit": run.get("work_unit"), "units_per_second": run.get("units_per_second"),
                "energy_per_unit_joules": run.get("energy_per_unit_joules"),
                "power_limit_watts": run.get("power_cap_watts"), "wall_seconds": run.get("wall_seconds"),
                "expected": dict(figure) if figure else None,
                "correctness": dict(correct) if correct else {"status": "not_checked"},
                "fingerprint": run.get("fingerprint"), "measured": _measured_text(run, figure)}
    return [_reason(check, now, evidence, key)]


def failure_reason(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                   now: float) -> list[Reason]:
    """The latest finished run of each (probe, preset, cap) failed with the row's failure reason
    (``field``); the verdict book keeps the reason until it clears."""
    out = []
    for key, run in sorted(_latest_finished(gpu).items()):
        if run.get("status") == "failed" and run.get("failure_reason") == check.field:
            evidence = {"probe": key[0], "preset": key[1], "cap": key[2], "failure_reason": check.field,
                        "at_cap": f" at {key[2]} W" if key[2] else "", "set": run.get("set") or "of the set",
                        "failed_checks": run.get("failed_checks") or "checks", "run_time": float(run.get("time") or 0)}
            out.append(_reason(check, now, evidence, "/".join(key)))
    return out


def _latest_fingerprints(gpu: GpuInputs) -> dict[tuple[str, ...], str]:
    """The latest ok answer fingerprint per comparable key (probe_data/peers.peer_key), once per evaluation."""
    cached = gpu.latest_cache.get("fingerprints")
    if cached is None:
        cached = {}
        for run in gpu.runs:
            if run.get("peer_key") and run.get("fingerprint"):
                cached[tuple(run["peer_key"])] = str(run["fingerprint"])
        gpu.latest_cache["fingerprints"] = cached  # type: ignore[assignment]
    return cached  # type: ignore[return-value]


def peer_fingerprint(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                     now: float) -> list[Reason]:
    """This GPU's latest answer fingerprint of each comparable key against the latest of every other
    GPU of the node (a strict majority of at least three: probe_data/peers.py)."""
    out = []
    for key, fingerprint in sorted(_latest_fingerprints(gpu).items()):
        fps = {g.uuid: _latest_fingerprints(g).get(key) for g in node if not g.missing}
        fps = {uuid: fp for uuid, fp in fps.items() if fp}
        if gpu.uuid in peer_disagreement(fps):
            majority = Counter(fps.values()).most_common(1)[0][0]
            evidence = {"probe": key[3], "variant": key[4], "preset": key[5], "fingerprint": fingerprint,
                        "majority_fingerprint": majority, "peers": len(fps) - 1, "name": key[0]}
            out.append(_reason(check, now, evidence, "/".join(key[3:6])))
    return out


def _interconnect(check: Check, gpu: GpuInputs, settings: Mapping[str, float], now: float,
                  part: str) -> list[Reason]:
    assert check.threshold is not None
    limit = settings[check.threshold.key]
    out = []
    for found in findings(gpu.gpu if gpu.gpu is not None else -1, gpu.interconnect.get(part, {}), limit):
        evidence = {**found, "threshold": limit, "expected_gbps": found["expected"] / 1e9}
        out.append(_reason(check, now, evidence, f"{found['src']}-{found['dst']}"))
    return out


def interconnect_links(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                       now: float) -> list[Reason]:
    """NVLink pairs of this GPU with fewer links up than the board has (blame: health/interconnect.py)."""
    return _interconnect(check, gpu, settings, now, "links")


def interconnect_expected(check: Check, gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float],
                          now: float) -> list[Reason]:
    """Peer copies of this GPU's NVLink pairs below the expected figure of a healthy link."""
    return _interconnect(check, gpu, settings, now, "copies")


Evaluator = Callable[[Check, GpuInputs, Sequence[GpuInputs], Mapping[str, float], float], list[Reason]]

EVALUATORS: dict[str, Evaluator] = {
    "at_least": at_least, "at_most": at_most, "busy_share": busy_share, "rate_above": rate_above,
    "enum": enum, "xid": xid, "flag": flag, "gpu_count": gpu_count, "store": store,
    "baseline": baseline, "peers": peers, "consecutive_failures": consecutive_failures,
    "failure_reason": failure_reason, "peer_fingerprint": peer_fingerprint,
    "probe_outcome": probe_outcome, "correctness": correctness, "expected": expected, "not_probed": not_probed,
    "measured": measured, "interconnect_links": interconnect_links, "interconnect_expected": interconnect_expected,
}


def evaluate_gpu(gpu: GpuInputs, node: Sequence[GpuInputs], settings: Mapping[str, float], now: float,
                 checks: Sequence[Check] = CHECKS) -> list[Reason]:
    """Every reason that fires now for one GPU. A missing GPU is judged by gpu_count only."""
    out: list[Reason] = []
    for check in checks:
        if gpu.missing and check.kind != "gpu_count":
            continue
        out.extend(EVALUATORS[check.kind](check, gpu, node, settings, now))
    return out

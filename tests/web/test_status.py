"""``GET /api/v1/gpus``'s shape from a store snapshot: the readings' own values, null where unread or lost."""

from __future__ import annotations

from gpuperfd.device.errors import GpuLost
from gpuperfd.health.verdict import Reason, Verdict
from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import GpuIdentity, Reading, ReadingStore
from gpuperfd.web.status import SCHEMA, gpu_status


def store() -> ReadingStore:
    s = ReadingStore()
    for gpu in (0, 1):
        s.set_identity(GpuIdentity(gpu, f"GPU-{gpu}"))
        s.put(gpu, "info", Reading((Point("gpuperf_gpu_info", 1.0, ("NVIDIA H100 80GB HBM3", "0", "1", "9.0", "x")),),
                                   True, None, 0, 10.0))
    s.put(0, "power", Reading((Point("gpuperf_power_draw_watts", 612.5), Point("gpuperf_power_limit_watts", 700.0)),
                              True, None, 0, 10.0))
    s.put(0, "clock_events", Reading((Point("gpuperf_clock_event_active", 1.0, ("sw_power_cap",)),
                                      Point("gpuperf_clock_event_active", 0.0, ("gpu_idle",))), True, None, 0, 10.0))
    s.put(0, "memory", Reading((), False, "timeout", 0, 10.0))  # a failed read: null, not a stale number
    s.put(1, "power", Reading((), False, GpuLost.reason, 0, 10.0))
    return s


def point(cap: float, rate: float, energy: float, power: float) -> SweepPoint:
    result = ProbeResult("llm", "sim", "gpt2", measured_seconds=1.0, units_of_work=rate, energy_per_unit_joules=energy,
                         work_unit="token", started_at=1e9, wall_seconds=5.0)
    result.average_power_watts = power
    return SweepPoint(cap, result)


def test_the_shape_carries_readings_verdict_probe_and_sweep() -> None:
    latest = {(0, "llm", "gpt2"): [point(700, 1000, 0.40, 400), point(500, 950, 0.30, 285)]}
    verdicts = [Verdict(0, "GPU-0", [Reason("xid", "degraded", "restart_app", "XID 13", since=1e9)])]
    sweeps = {0: SweepProgress(0, "llm", "gpt2", 400.0, 3, 5, 1e9)}
    body = gpu_status(store().snapshot(), 1.0, "simulated", latest, verdicts, sweeps, 0.10)
    assert body["schema"] == SCHEMA and body["backend"] == "simulated" and body["source"] == "daemon"
    gpu0, gpu1 = body["gpus"]
    assert (gpu0["power_draw_watts"], gpu0["power_limit_watts"]) == (612.5, 700.0)
    assert gpu0["clock_events"] == ["sw_power_cap"]
    assert gpu0["memory_used_bytes"] is None and gpu0["utilization_ratio"] is None  # failed, never read
    assert gpu0["health"]["state"] == "degraded" and gpu0["health"]["reasons"][0]["message"] == "XID 13"
    probe = gpu0["probes"][0]
    assert (probe["cap_watts"], probe["units_per_second"], probe["unit"]) == (700, 1000.0, "token")
    assert probe["expected_units_per_second"] is not None  # an H100 at 700 W: the shipped figure
    rec = probe["recommendation"]
    assert rec["cap_watts"] == 500 and rec["watts_saved_while_busy"] == 115.0
    assert abs(rec["energy_saving_ratio"] - 0.25) < 1e-9
    assert gpu0["sweep"] == {"gpu": 0, "probe": "llm", "preset": "gpt2", "cap_watts": 400.0, "point": 3, "points": 5,
                             "since": 1e9}
    assert gpu1["up"] is False and gpu1["power_draw_watts"] is None and gpu1["health"] is None
    assert gpu1["probes"] == [] and gpu1["sweep"] is None


def test_no_expected_figure_off_700_watts() -> None:
    latest = {(0, "llm", "gpt2"): [point(650, 1000, 0.40, 400)]}
    probe = gpu_status(store().snapshot(), 1.0, "simulated", latest)["gpus"][0]["probes"][0]
    assert probe["expected_units_per_second"] is None and "peers only" in probe["expected_note"]
    assert probe["recommendation"] is None  # one cap: nothing to recommend


def test_a_gpu_whose_cap_apply_mode_holds_says_so() -> None:
    applied = {0: {"gpu": 0, "reason": "applied", "applied_watts": 450.0, "operator_watts": 700.0},
               1: {"gpu": 1, "reason": "no_saving", "applied_watts": None, "operator_watts": 700.0}}
    gpu0, gpu1 = gpu_status(store().snapshot(), 1.0, "simulated", applied=applied)["gpus"]
    assert gpu0["apply"] == {"applied_watts": 450.0, "operator_watts": 700.0}
    assert gpu1["apply"] is None

"""ShownPoints: the landing page's latest point per cap and each GPU's sweep in progress."""

from __future__ import annotations

from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import PREEMPTED, ProbeResult
from gpuperfd.probing.scheduling.shown import ShownPoints

KEY = (0, "vit", "vit-b16")


def point(cap: float, status: str = "ok", sweep: str = "s1", reason: str | None = None) -> SweepPoint:
    return SweepPoint(cap, ProbeResult(probe="vit", variant="simulated", preset="vit-b16", status=status,
                                      failure_reason=reason), sweep)


def test_a_failed_point_withdraws_its_caps_last_ok_one_and_a_preemption_keeps_it() -> None:
    shown = ShownPoints()
    for cap in (700.0, 500.0):
        shown.put(KEY, point(cap))
    assert [p.cap_watts for p in shown.latest()[KEY]] == [700.0, 500.0]  # highest cap first
    shown.put(KEY, point(500.0, "failed", "s2", "exception"))
    assert [p.cap_watts for p in shown.latest()[KEY]] == [700.0]
    shown.put(KEY, point(700.0, "skipped", "s1", PREEMPTED))
    kept = shown.latest()[KEY]
    assert [p.cap_watts for p in kept] == [700.0] and kept[0].sweep_cut_short  # its sweep recommends nothing


def test_the_sweep_in_progress_counts_point_k_of_n_and_ends_with_none() -> None:
    shown = ShownPoints()
    shown.track(KEY, 500.0, [700.0, 500.0, 300.0])
    progress = shown.sweeps()[0]
    assert (progress.cap_watts, progress.point, progress.points) == (500.0, 2, 3)
    shown.track(KEY, None, [700.0, 500.0, 300.0])
    assert shown.sweeps() == {}


def test_withdraw_drops_the_caps_a_reload_no_longer_schedules() -> None:
    shown = ShownPoints()
    for cap in (700.0, 500.0):
        shown.put(KEY, point(cap))
    shown.withdraw(lambda gpu, probe, preset, watts: watts != 500.0)
    assert [p.cap_watts for p in shown.latest()[KEY]] == [700.0]

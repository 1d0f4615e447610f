"""Further points of a warm sweep cost what their noise needs (gpuperfd.probe_child.harness)."""

from __future__ import annotations

import math
import statistics

import pytest

pytest.importorskip("torch")

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_data.result import RepeatResult  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402


def _windows(*rates: float) -> list[RepeatResult]:
    return [RepeatResult(index=i, measured_seconds=2.0, units_of_work=2.0 * r) for i, r in enumerate(rates)]


def test_rate_cv_of_the_windows() -> None:
    assert harness._rate_cv(_windows(100.0)) == math.inf  # one window tells nothing
    assert harness._rate_cv(_windows(100.0, 100.0, 100.0)) == 0.0
    cv = harness._rate_cv(_windows(99.0, 100.0, 101.0))
    assert cv == pytest.approx(0.01)  # stdev 1 over mean 100
    assert harness._rate_cv(_windows(99.6, 100.0, 100.4)) <= harness.SWEEP_TARGET_CV < harness._rate_cv(
        _windows(98.0, 100.0, 102.0))


def test_first_point_measures_every_window_and_later_points_stop_once_steady() -> None:
    spec = ProbeSpec("attention", preset="tiny", device="cpu", repeats=6, measure_seconds=0.06,
                     warmup_seconds=0.0, busy_profile_seconds=0.0)
    prepared = harness.prepare(spec)
    first = harness.measure(prepared)  # a one-shot probe (no settle, no NVML): every window, full length
    assert first.extra["windows_measured"] == 6 and len(first.repeats) == 6
    assert first.extra["window_seconds"] == 0.06 and min(r.measured_seconds for r in first.repeats) >= 0.06
    later = harness.measure(prepared)
    n = later.extra["windows_measured"]
    most = 6 * harness.SWEEP_LATER_WINDOW_DIVISOR  # shorter windows, as many more at most: the same longest time
    assert later.extra["window_seconds"] == pytest.approx(0.06 / harness.SWEEP_LATER_WINDOW_DIVISOR)
    assert statistics.median(r.measured_seconds for r in later.repeats) < statistics.median(
        r.measured_seconds for r in first.repeats)
    assert harness.SWEEP_MIN_REPEATS <= n <= most and len(later.repeats) == n
    if n < most:  # it stopped early only because the windows agreed
        assert harness._windows_agree(later.repeats)
    else:
        assert not harness._windows_agree(later.repeats[:-1])


def test_windows_agree_needs_enough_windows_with_steady_rates() -> None:
    assert not harness._windows_agree(_windows(100.0))  # too few windows
    assert harness._windows_agree(_windows(100.0, 100.1))  # two whole-cycle windows 0.1 % apart
    assert not harness._windows_agree(_windows(100.0, 101.5))  # 1.5 % apart: CV 1.06 %
    assert harness._windows_agree(_windows(100.0, 100.0, 100.0))
    assert not harness._windows_agree(_windows(98.0, 100.0, 102.0))  # rates 2 % apart
    assert harness._windows_agree(_windows(99.9, 100.0, 100.1, 100.0))


def test_gpu_sweep_points_measure_whole_controller_cycles() -> None:
    """On a GPU under a settle loop, first and later points measure windows of one power-controller
    cycle (H100: 0.75 s windows cut the ~1 s cycle at different phases and scattered by 0.5-1 %),
    at most as long in all as the spec's windows; a one-shot probe and a CPU sweep keep the spec's."""
    from types import SimpleNamespace

    spec = ProbeSpec("attention", preset="default", repeats=5, measure_seconds=1.5)
    gpu = SimpleNamespace(nvml=object())
    for measured in (0, 1, 2):
        prepared = SimpleNamespace(spec=spec, ctx=gpu, measured_points=measured + 1)
        plan = harness._plan(prepared, settle_seconds=5.0)
        assert plan.window_seconds == harness.POWER_CONTROLLER_PERIOD_SECONDS == 1.0
        assert plan.max_windows == 8 and plan.adaptive  # 8 x 1.0 s >= 5 x 1.5 s, the same longest time
    one_shot = harness._plan(SimpleNamespace(spec=spec, ctx=gpu, measured_points=1), settle_seconds=0.0)
    assert (one_shot.window_seconds, one_shot.max_windows, one_shot.adaptive) == (1.5, 5, False)
    cpu_later = harness._plan(SimpleNamespace(spec=spec, ctx=SimpleNamespace(nvml=None), measured_points=2), 5.0)
    assert cpu_later.window_seconds == 0.75 and cpu_later.max_windows == 10
    fixed = ProbeSpec("attention", preset="default", iterations=50)  # fixed-iteration windows keep their length
    assert harness._plan(SimpleNamespace(spec=fixed, ctx=gpu, measured_points=2), 5.0).max_windows == fixed.repeats

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
    assert harness._rate_cv(_windows(99.5, 100.0, 100.5)) <= harness.SWEEP_TARGET_CV < harness._rate_cv(
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
    assert not harness._windows_agree(_windows(100.0, 100.0))  # too few windows
    assert harness._windows_agree(_windows(100.0, 100.0, 100.0))
    assert not harness._windows_agree(_windows(98.0, 100.0, 102.0))  # rates 2 % apart
    assert harness._windows_agree(_windows(99.9, 100.0, 100.1, 100.0))

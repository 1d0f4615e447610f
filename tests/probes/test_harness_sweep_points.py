"""Further points of a warm sweep cost what their noise needs (gpuperfd.probes.harness)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from gpuperfd.probes import harness  # noqa: E402
from gpuperfd.probes.result import RepeatResult  # noqa: E402
from gpuperfd.probes.spec import ProbeSpec  # noqa: E402


def _windows(*rates: float) -> list[RepeatResult]:
    return [RepeatResult(index=i, measured_seconds=2.0, units_of_work=2.0 * r) for i, r in enumerate(rates)]


def test_rate_cv_of_the_windows() -> None:
    assert harness._rate_cv(_windows(100.0)) == math.inf  # one window tells nothing
    assert harness._rate_cv(_windows(100.0, 100.0, 100.0)) == 0.0
    cv = harness._rate_cv(_windows(99.0, 100.0, 101.0))
    assert cv == pytest.approx(0.01)  # stdev 1 over mean 100
    assert harness._rate_cv(_windows(99.9, 100.0, 100.1)) <= harness.SWEEP_TARGET_CV < cv


def test_first_point_measures_every_window_and_later_points_stop_once_steady() -> None:
    spec = ProbeSpec("attention", preset="tiny", device="cpu", repeats=6, measure_seconds=0.05,
                     warmup_seconds=0.0, busy_profile_seconds=0.0)
    prepared = harness.prepare(spec)
    first = harness.measure(prepared)
    assert first.extra["windows_measured"] == 6 and len(first.repeats) == 6
    later = harness.measure(prepared)
    n = later.extra["windows_measured"]
    assert harness.SWEEP_MIN_REPEATS <= n <= 6 and len(later.repeats) == n
    if n < 6:  # it stopped early only because the windows agreed
        assert harness._rate_cv(later.repeats) <= harness.SWEEP_TARGET_CV
    else:
        assert harness._rate_cv(later.repeats[:-1]) > harness.SWEEP_TARGET_CV

"""The simulated workload against real H100 points (issue 43): the shape of the figures, not only
the default presets, follows a real card. The rates are compared relative to each probe's default
preset on the same card (the simulator is anchored there), peak memory absolutely."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuperfd.probing.simulated_workload import simulated_workload

POINTS = json.loads((Path(__file__).parents[1] / "data" / "h100_shape_points.json").read_text())


def _rate_at_max(probe: str, preset: str | None, options: dict) -> float:
    profile = simulated_workload(probe, preset, options).profile
    return next(c.units_per_second_at_max for c in profile.calibrations if c.model == "H100")


@pytest.mark.parametrize("point", POINTS["points"], ids=lambda p: f"{p['preset']}-bs{p['batch_size']}")
def test_simulated_h100_follows_measured_points(point: dict) -> None:
    probe = point["probe"]
    simulated = _rate_at_max(probe, point["preset"], {"batch_size": point["batch_size"]}) / _rate_at_max(probe, None, {})
    measured = point["rate"] / POINTS["defaults"][probe]
    assert simulated == pytest.approx(measured, rel=0.10), (simulated, measured)
    peak = simulated_workload(probe, point["preset"], {"batch_size": point["batch_size"]}).profile.memory_bytes / 2**20
    assert peak == pytest.approx(point["peak_mib"], rel=0.30), (peak, point["peak_mib"])

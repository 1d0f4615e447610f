"""The simulator below 700 W against published power-cap measurements (gpuperfd/device/calibration.py).

Each published row that names a probe must be met by that simulated probe
within the row's tolerance; docs/simulator.md must carry the table generated
from the rows (regenerate: ``python -m gpuperfd.device.calibration --write-docs``);
and the two workload classes must respond as the sources describe: compute-bound
work loses throughput with the clock once the cap binds, memory-bound decode
barely slows until the clock falls far.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuperfd.device import calibration
from gpuperfd.device.calibration import PUBLISHED_LOSSES, simulated_loss, simulated_model
from gpuperfd.device.simulated import GPU_MODELS, WORKLOAD_PROFILES, compute_operating_point

DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
CHECKED = [row for row in PUBLISHED_LOSSES if row.probe is not None]


@pytest.mark.parametrize("row", CHECKED, ids=[row.key for row in CHECKED])
def test_simulated_probe_matches_the_published_loss(row: calibration.PublishedLoss) -> None:
    model = simulated_model(row)
    assert row.probe is not None
    got = simulated_loss(model, row.probe, row.cap_for(model, row.probe))
    assert got == pytest.approx(row.loss, abs=row.tolerance)


def test_rows_are_complete_and_name_real_probes() -> None:
    keys = [row.key for row in PUBLISHED_LOSSES]
    assert len(keys) == len(set(keys))
    for row in PUBLISHED_LOSSES:
        assert row.url.startswith("https://") and row.source and row.where
        assert (row.cap_watts is None) != (row.cap_share is None), row.key
        assert 0.0 <= row.loss < 1.0
        if row.probe is not None:
            assert row.probe in WORKLOAD_PROFILES and row.tolerance > 0
    # Both classes are checked against a source: compute-bound inference and memory-bound decode.
    assert {"vit/vit-b16", "attention/default", "llm/gpt2"} <= {row.probe for row in CHECKED}


def test_docs_table_is_the_generated_one() -> None:
    text = DOCS.read_text()
    assert calibration.generated_block() in text, "run: python -m gpuperfd.device.calibration --write-docs"
    # What stays assumed is said where the table is.
    assert "train/gpt2" in text and "remains assumed" in text


def test_write_docs_replaces_only_the_block(tmp_path: Path) -> None:
    path = tmp_path / "simulator.md"
    path.write_text(f"# head\n\n{calibration.BEGIN}\nstale\n{calibration.END}\n\ntail\n")
    assert calibration.main(["--write-docs", str(path)]) == 0
    text = path.read_text()
    assert text.startswith("# head\n\n") and text.endswith("\n\ntail\n")
    assert "stale" not in text and calibration.table() in text
    path.write_text("no markers here\n")
    with pytest.raises(ValueError, match="markers"):
        calibration.main(["--write-docs", str(path)])
    assert path.read_text() == "no markers here\n"


@pytest.mark.parametrize("model", ["H100", "H200"])
@pytest.mark.parametrize("probe", ["vit/vit-b16", "attention/default"])
def test_compute_bound_work_loses_throughput_roughly_with_the_clock(model: str, probe: str) -> None:
    gpu, profile = GPU_MODELS[model], WORKLOAD_PROFILES[probe]
    full = compute_operating_point(gpu, profile, 700.0)
    for cap in (600.0, 450.0, 300.0):
        point = compute_operating_point(gpu, profile, cap)
        clock_share = point.sm_hertz / full.sm_hertz
        speed_share = point.units_per_second / full.units_per_second
        assert "sw_power_cap" in point.clock_events
        # Throughput falls at least 80 % as fast as the clock (the rest is memory time).
        assert clock_share <= speed_share <= clock_share + 0.2 * (1 - clock_share) + 1e-9


@pytest.mark.parametrize("model", ["H100", "H200"])
def test_decode_barely_slows_until_the_clock_falls_far(model: str) -> None:
    gpu, profile = GPU_MODELS[model], WORKLOAD_PROFILES["llm/gpt2"]
    full = compute_operating_point(gpu, profile, 700.0)
    caps = [200.0 + 5 * step for step in range(101)]
    points = [compute_operating_point(gpu, profile, cap) for cap in caps]
    for point in points:
        clock_share = point.sm_hertz / full.sm_hertz
        loss = 1 - point.units_per_second / full.units_per_second
        if clock_share >= 0.8:
            assert loss < 0.04, (clock_share, loss)
        # Always far less than the clock's own loss.
        assert loss <= 0.5 * (1 - clock_share) + 1e-9
    lowest = points[0]
    assert lowest.sm_hertz < 0.7 * full.sm_hertz  # the cap does reach it at the bottom of the range

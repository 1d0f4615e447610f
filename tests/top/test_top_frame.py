"""``gpuperfd top``'s frame: every line within the width at 120, 80, 40 and 20 columns, nothing lost."""

from __future__ import annotations

import re

import pytest

from gpuperfd.top.frame import render, visible_width

GIB = 1024 ** 3

FRAME = {
    "backend": "simulated", "time": 1_800_000_000.0,
    "gpus": [{
        "gpu": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "up": True, "utilization_ratio": 0.87,
        "memory_used_bytes": 12 * GIB, "memory_total_bytes": 80 * GIB, "power_draw_watts": 612.4,
        "power_limit_watts": 700.0, "temperature_celsius": 61.0, "sm_clock_hertz": 1755e6,
        "sm_clock_max_hertz": 1980e6, "clock_events": ["sw_power_cap", "hw_thermal_slowdown"],
        "health": {"state": "degraded", "action": "check_hardware", "reasons": [
            {"message": "PCIe link runs at Gen4 x8 instead of Gen5 x16", "severity": "degraded"}]},
        "probes": [{"probe": "llm", "preset": "gpt2", "unit": "token", "cap_watts": 700.0, "units_per_second": 12345.0,
                    "expected_units_per_second": 12500.0, "energy_per_unit_joules": 0.05,
                    "recommendation": {"cap_watts": 500.0, "baseline_cap_watts": 700.0, "energy_saving_ratio": 0.18,
                                       "slowdown_ratio": 0.06, "watts_saved_while_busy": 150.0}}],
        "sweep": {"gpu": 0, "probe": "llm", "preset": "gpt2", "cap_watts": 400.0, "point": 3, "points": 5},
    }, {"gpu": 1, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "up": False, "health": None, "probes": [],
        "sweep": None}],
}

#: What must be on the frame, whatever the width (compared with runs of whitespace made one space).
FIGURES = ["GPU 0", "util 87%", "mem 12.0/80.0 GiB", "power 612/700 W cap", "temp 61 C", "SM 1755/1980 MHz",
           "throttle: sw_power_cap, hw_thermal_slowdown", "degraded (check hardware)",
           "! PCIe link runs at Gen4 x8 instead of Gen5 x16", "llm/gpt2 at 700 W: 12.3k tokens/s",
           "-1.2% vs expected 12.5k", "recommended 500 W: 18.0% less energy, 6.0% slower, 150 W less busy",
           "SWEEPING", "sweep in progress: llm/gpt2 at 400 W, point 3 of 5", "GPU 1", "LOST"]


@pytest.mark.parametrize("width", [120, 80, 40, 20])
def test_every_line_fits_and_every_figure_is_there(width: int) -> None:
    lines = render(FRAME, "daemon http://127.0.0.1:9400", width)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert not any("\x1b" in line for line in lines)
    text = " ".join(" ".join(lines).split())
    squeezed = "".join(text.split())  # at 20 columns a word longer than the line is split
    for figure in FIGURES:
        assert figure in text if width >= 40 else "".join(figure.split()) in squeezed, (width, figure)


def test_wide_frames_take_fewer_lines_and_wrap_per_gpu() -> None:
    wide, narrow = render(FRAME, "daemon", 120), render(FRAME, "daemon", 40)
    assert len(wide) < len(narrow)
    # each GPU's block starts on its own line after a blank one
    assert [i for i, line in enumerate(narrow) if line.startswith("GPU ")] == [
        i + 1 for i, line in enumerate(narrow) if line == ""]
    # at 80 columns the telemetry fits in two lines, the throttle reasons on the continuation
    eighty = render(FRAME, "daemon", 80)
    assert any(line.startswith("  util 87%") and "SM 1755/1980 MHz" in line for line in eighty)


def test_colour_codes_do_not_count_towards_the_width() -> None:
    coloured = render(FRAME, "daemon", 40, color=True)
    plain = render(FRAME, "daemon", 40)
    assert any("\x1b[" in line for line in coloured)
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in coloured] == plain
    assert all(visible_width(line) <= 40 for line in coloured)


def test_a_failed_refresh_marks_the_frame_stale() -> None:
    lines = render(FRAME, "daemon", 80, error="no gpuperfd daemon answers at http://x")
    assert "stale: no gpuperfd daemon answers at http://x" in " ".join(lines)


def test_many_reasons_are_counted_past_the_first_three() -> None:
    reasons = [{"message": f"reason {i}", "severity": "degraded"} for i in range(5)]
    gpu = {**FRAME["gpus"][0], "health": {"state": "degraded", "action": "none", "reasons": reasons}}
    text = "\n".join(render({**FRAME, "gpus": [gpu]}, "daemon", 80))
    assert "! reason 2" in text and "! reason 3" not in text and "! and 2 more (GET /api/v1/health)" in text


def test_a_cap_apply_mode_holds_is_named_beside_the_power() -> None:
    """An applied GPU read "power 78/300 W cap" with no word that apply mode holds that cap."""
    gpu = {**FRAME["gpus"][0], "power_draw_watts": 78.0, "power_limit_watts": 300.0,
           "apply": {"applied_watts": 300.0, "operator_watts": 700.0}}
    text = " ".join(" ".join(render({**FRAME, "gpus": [gpu]}, "test", 120)).split())
    assert "power 78/300 W cap cap 300 W set by apply mode (operator's 700 W)" in text
    assert "apply mode" not in " ".join(render(FRAME, "test", 120))

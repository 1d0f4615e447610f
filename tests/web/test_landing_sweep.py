"""The landing page marks a sweep in progress, and its charts carry their values on the axes."""

from __future__ import annotations

import re

from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.web.landing import chart_svg, landing_page
from landing_fakes import FakeSampler, row

#: Every GPU here draws 398 W of its 400 W limit.
POWER = (398.0, 400.0)


def test_a_sweep_in_progress_is_marked_in_its_row_and_above_the_table() -> None:
    sweeps = {1: SweepProgress(1, "llm", "gpt2", 400.0, 3, 5, 1_800_000_000.0)}
    page = landing_page(FakeSampler(2, power=POWER), "simulated", "/metrics", sweeps=sweeps).decode()
    assert "<th>Sweep</th>" in page
    banner = page.split('<p class="sweeping" id="sweeps">', 1)[1].split("</p>", 1)[0]
    assert "GPU 1: llm/gpt2 at 400 W, point 3 of 5 (since 08:00:00 UTC)" in banner
    assert banner.index("GPU 1") < len(banner) and "GPU 0" not in banner
    assert 'data-sweeping="1">llm/gpt2 at 400 W, point 3 of 5</td>' in row(page, 1)
    assert "data-sweeping" not in row(page, 0)
    idle = landing_page(FakeSampler(2, power=POWER), "simulated", "/metrics").decode()
    assert 'id="sweeps"' not in idle and "data-sweeping" not in idle


def labels(svg: str) -> list[tuple[str, str]]:
    """(fill colour, text) of each axis label."""
    return re.findall(r'<text [^>]*fill="([^"]+)"[^>]*class="axis">([^<]*)</text>', svg)


def test_chart_axes_carry_min_and_max_values_with_units() -> None:
    svg = chart_svg([(700, 1250.0, 0.41), (500, 1180.0, 0.33), (300, 870.0, 0.29)], 500, "token")
    found = labels(svg)
    assert ("#1f77b4", "1.25k tokens/s") in found and ("#1f77b4", "870 tokens/s") in found  # throughput, left axis
    assert ("#e8710a", "410 mJ/token") in found and ("#e8710a", "290 mJ/token") in found  # energy, right axis
    assert ("#666", "300 W") in found and ("#666", "700 W") in found  # the caps, bottom axis
    # the max at the top of its axis, the min at the bottom
    ys = {text: float(y) for y, text in re.findall(r'<text [^>]*y="([\d.]+)"[^>]*class="axis">([^<]*)</text>', svg)}
    assert ys["1.25k tokens/s"] < ys["870 tokens/s"] and ys["410 mJ/token"] < ys["290 mJ/token"]
    width = float(re.search(r'width="(\d+)"', svg).group(1))
    xs = [float(x) for x in re.findall(r'<text x="([\d.]+)"', svg)]
    assert all(0 <= x <= width for x in xs)


def test_a_flat_series_gets_one_label() -> None:
    found = labels(chart_svg([(700, 1000.0, None), (500, 1000.0, None)], None, "image"))
    assert [text for colour, text in found if colour == "#1f77b4"] == ["1k images/s"]


def test_the_page_shows_the_axis_values_of_each_probe_chart() -> None:
    def point(cap: float, rate: float, energy: float) -> SweepPoint:
        return SweepPoint(cap, ProbeResult("llm", "sim", "gpt2", measured_seconds=1.0, units_of_work=rate,
                                           energy_per_unit_joules=energy, work_unit="token", started_at=1e9))

    latest = {(0, "llm", "gpt2"): [point(700, 1000, 0.4), point(500, 950, 0.3)]}
    page = landing_page(FakeSampler(1, power=POWER), "simulated", "/metrics", latest).decode()
    assert ">1k tokens/s</text>" in page and ">950 tokens/s</text>" in page and ">400 mJ/token</text>" in page

"""The landing page at / in a real browser: a simulated daemon sweeps, headless Chromium shows the results.

Needs Debian's ``chromium`` (scripts/test.sh installs it). Without it these tests
fail with the install command; they never skip. Set GPUPERFD_DOCS_SCREENSHOT=1 to
refresh docs/images/landing.png from the running daemon.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests

from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.recommend import SweepPoint, recommend
from gpuperfd.web.landing import landing_page
from daemon_configs import simulated_daemon
from landing_fakes import FakeSampler
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
{daemon}  stop_early: false  # the page shows every cap
  first_run_delay_seconds: 0.5
  simulated_measure_seconds: 0.3
  max_slowdown: 0.10
  schedules:
    - probe: llm
      interval_seconds: 3600
      caps: [max, 600, 500, 400, 300, 200]
      settle_seconds: 0.1
    - probe: train
      interval_seconds: 3600
      caps: [max, 600, 500, 400]
      settle_seconds: 0.1
"""

REC = re.compile(r"(\d+) W(?:</b>)?\s*:\s*([\d.]+)% less energy per (\w+), ([\d.]+)% slower than (\d+) W")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "headless Chromium is required for the landing-page test: "
        "apt-get install -y --no-install-recommends chromium (scripts/test.sh installs it)"
    )


def browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}", *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"chromium failed ({out.returncode}): {out.stderr[-2000:]}"
    return out


class Rows(HTMLParser):
    """Text of every <tr> by class, and the number of <svg> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[dict]] = {}
        self.svgs = 0
        self._current: dict | None = None

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("class"):
            self._current = {"class": attrs["class"], "attrs": attrs, "text": ""}
            self.rows.setdefault(attrs["class"], []).append(self._current)
        if tag == "svg":
            self.svgs += 1

    def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
        if tag == "tr":
            self._current = None

    def handle_data(self, data):  # type: ignore[no-untyped-def]
        if self._current is not None:
            self._current["text"] += data + " "


def parse(text: str) -> Rows:
    rows = Rows()
    rows.feed(text)
    return rows


def gauges(metrics: str, name: str, gpu: str, probe: str) -> dict[int, float]:
    pattern = re.compile(rf'^{name}\{{([^}}]*)\}} (\S+)$', re.M)
    out = {}
    for labels, value in pattern.findall(metrics):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if pairs.get("gpu") == gpu and pairs.get("probe") == probe:
            out[int(pairs["power_cap"])] = float(value)
    return out


def test_landing_page_in_headless_chromium(start_daemon, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(config_text=CONFIG.format(daemon=simulated_daemon(state, gpus=2, seed=3, writable=True)))

    def done() -> bool:  # every cap of both sweeps on both GPUs published, every cap restored
        metrics = requests.get(daemon.url + "/metrics", timeout=5).text
        return metrics.count("gpuperf_probe_energy_per_unit_joules{") == 2 * (6 + 4) and not re.search(
            r"^gpuperf_sweep_in_progress\{[^}]*\} 1", metrics, re.M)

    wait_for(done, timeout=90, what="both sweeps on both GPUs")
    page = requests.get(daemon.url + "/", timeout=5).text
    assert len(REC.findall(page)) == 4, (
        "the landing page does not show the four recommendations; does the daemon's '/' route pass "
        "self.probes.latest() to landing_page()?\n" + page[-3000:])
    dom = browser(tmp_path, "--dump-dom", daemon.url + "/").stdout
    rows = parse(dom)

    gpus = rows.rows["gpu-row"]
    assert len(gpus) == 2
    for index, row in enumerate(gpus):
        assert row["attrs"]["data-gpu"] == str(index)
        assert "NVIDIA H100 80GB HBM3" in row["text"] and "GPU-" in row["text"] and " up " in row["text"]
        assert re.search(r"\d+ W", row["text"])  # power draw and cap

    probes = rows.rows["probe-row"]
    assert sorted((r["attrs"]["data-probe"], r["attrs"]["data-preset"]) for r in probes) == [
        ("llm", "gpt2"), ("llm", "gpt2"), ("train", "gpt2"), ("train", "gpt2")]
    assert rows.svgs >= 4  # one chart per probe row, rendered by the browser as SVG

    # What the page shows is the rule applied to what /metrics publishes.
    metrics = requests.get(daemon.url + "/metrics", timeout=5).text
    llm_rows = [r for r in probes if r["attrs"]["data-probe"] == "llm"]
    for gpu, row in enumerate(llm_rows):
        cap, saving, unit, slowdown, baseline = REC.search(row["text"]).groups()
        rates = gauges(metrics, "gpuperf_probe_work_units_per_second", str(gpu), "llm")
        energy = gauges(metrics, "gpuperf_probe_energy_per_unit_joules", str(gpu), "llm")
        assert sorted(rates) == [200, 300, 400, 500, 600, 700]
        points = [SweepPoint(c, ProbeResult("llm", "sim", "gpt2", measured_seconds=1.0, units_of_work=rates[c],
                                            energy_per_unit_joules=energy[c])) for c in rates]
        best = recommend(points, 0.10)
        assert int(cap) == round(best.cap_watts) and int(baseline) == 700 and unit == "token"
        assert float(saving) == pytest.approx(100 * best.energy_saving_ratio, abs=0.06)
        assert float(slowdown) == pytest.approx(100 * best.slowdown_ratio, abs=0.06)
        assert float(slowdown) <= 10.0
        assert "700 600 500 400 300 200" in row["text"]

    shot = tmp_path / "landing.png"
    browser(tmp_path, f"--screenshot={shot}", "--window-size=1360,860", daemon.url + "/")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    if os.environ.get("GPUPERFD_DOCS_SCREENSHOT") == "1":
        target = ROOT / "docs" / "images" / "landing.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


# --- the page itself (no browser): escaping and the empty state --------------------------------


def one_gpu(name: str) -> FakeSampler:
    """One GPU of model ``name`` with a UUID that needs escaping, drawing 123 W of 650 W."""
    return FakeSampler(1, name=name, uuid="GPU-<uuid>", power=(123.0, 650.0))


def point(cap: float, rate: float, energy: float, preset: str = "gpt2") -> SweepPoint:
    return SweepPoint(cap, ProbeResult("llm", "sim", preset, measured_seconds=2.0, units_of_work=2 * rate,
                                       energy_per_unit_joules=energy, work_unit="token", started_at=1e9))


def test_landing_page_escapes_everything_and_shows_the_rule():
    evil = "<script>alert(1)</script>"
    latest = {(0, "llm", evil): [point(700, 1000, 0.40, evil), point(500, 950, 0.30, evil), point(300, 700, 0.25, evil)]}
    page = landing_page(one_gpu(f'H100 "{evil}"'), "simulated", '/metrics"><x', latest, 0.10).decode()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert 'href="/metrics&quot;&gt;&lt;x"' in page
    assert "GPU-&lt;uuid&gt;" in page
    assert "123 W" in page and "650 W" in page
    # 300 W is 30% slower: out; 500 W is 5% slower and 25% cheaper: recommended.
    assert "<b>500 W</b>: 25.0% less energy per token, 5.0% slower than 700 W" in page
    assert page.count("<svg") == 1 and "<polyline" in page


def test_landing_page_states_the_watts_saved_while_busy():
    def powered(cap: float, rate: float, energy: float) -> SweepPoint:
        sweep_point = point(cap, rate, energy)
        sweep_point.result.average_power_watts = energy * rate
        return sweep_point

    latest = {(0, "llm", "gpt2"): [powered(700, 1000, 0.40), powered(500, 950, 0.30), powered(300, 700, 0.25)]}
    page = landing_page(one_gpu("H100"), "simulated", "/metrics", latest, 0.10).decode()
    # 400 W at 700 W against 285 W at the recommended 500 W.
    assert "5.0% slower than 700 W; 115 W less while busy" in page


def test_landing_page_without_results():
    page = landing_page(one_gpu("NVIDIA H100 80GB HBM3"), "simulated", "/metrics").decode()
    assert "NVIDIA H100 80GB HBM3" in page and "No probe results yet" in page and "<svg" not in page
    one_cap = {(0, "vit", "vit-b16"): [point(650, 500, 0.1, "vit-b16")]}
    page = landing_page(one_gpu("x"), "simulated", "/metrics", one_cap).decode()
    assert "one cap only" in page and 'data-probe="vit"' in page

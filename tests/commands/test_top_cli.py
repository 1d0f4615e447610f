"""``gpuperfd top`` against a real daemon on simulated GPUs, locally, and with no daemon at all."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.cli import main
from gpuperfd.commands import top as top_cli
from gpuperfd.top.frame import fmt_rate
from conftest import free_port

#: Readings frozen for the test's length: the values /metrics and top show are the same reading.
STILL = """
device: {{backend: simulated}}
simulation: {{gpus: 2, seed: 3, state_file: {state}/sim.json}}
sampler: {{interval_seconds: 120}}
probes: {{state_dir: {state}}}
"""

SWEEPING = """
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 1, state_file: {state}/sim.json}}
probes:
  read_only: false
  state_dir: {state}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.5
  simulated_measure_seconds: 1.5
  stop_early: false
  schedules:
    - probe: llm
      interval_seconds: 3600
      caps: [max, 500, 400, 300, 200]
      settle_seconds: 0.2
"""


def metric(text: str, name: str, gpu: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("gpu") == gpu and all(
                    sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def top(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["top", *args])
    out, err = capsys.readouterr()
    return code, out, err


def squeezed(text: str) -> str:
    return " ".join(text.split())


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_once_shows_the_daemons_figures_as_metrics_has_them(start_daemon, tmp_path, capsys, monkeypatch):
    daemon = start_daemon(config_text=STILL.format(state=tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "120")
    text = requests.get(daemon.url + "/metrics", timeout=5).text
    health = requests.get(daemon.url + "/api/v1/health", timeout=5).json()
    code, out, err = top(capsys, "--once", "--url", daemon.url)
    assert code == 0, err
    assert "\x1b" not in out  # not a TTY: no escape codes
    assert f"from daemon {daemon.url}" in out and "backend simulated" in out
    blocks = out.split("\n\n")[1:]
    assert len(blocks) == 2
    for gpu, block in enumerate(blocks):
        g = str(gpu)
        block = squeezed(block)
        assert block.startswith(f"GPU {gpu} NVIDIA H100 80GB HBM3 up {health['gpus'][gpu]['state']}")
        util = metric(text, "gpuperf_gpu_utilization_ratio", g)
        used, total = metric(text, "gpuperf_memory_used_bytes", g), metric(text, "gpuperf_memory_total_bytes", g)
        draw, cap = metric(text, "gpuperf_power_draw_watts", g), metric(text, "gpuperf_power_limit_watts", g)
        temp, sm = metric(text, "gpuperf_temperature_celsius", g), metric(text, "gpuperf_sm_clock_hertz", g)
        sm_max = metric(text, "gpuperf_sm_clock_max_hertz", g)
        assert None not in (util, used, total, draw, cap, temp, sm, sm_max)
        for figure in (f"util {100 * util:.0f}%", f"mem {used / 2**30:.1f}/{total / 2**30:.1f} GiB",
                       f"power {draw:.0f}/{cap:.0f} W cap", f"temp {temp:.0f} C", f"SM {sm / 1e6:.0f}/{sm_max / 1e6:.0f} MHz"):
            assert figure in block, (gpu, figure, block)
        idle = metric(text, "gpuperf_clock_event_active", g, reason="gpu_idle")
        assert ("clocks: idle" in block) == (idle == 1.0), block


def test_gpus_selects_and_names_a_missing_index(start_daemon, tmp_path, capsys, monkeypatch):
    daemon = start_daemon(config_text=STILL.format(state=tmp_path / "state"))
    code, out, _ = top(capsys, "--once", "--url", daemon.url, "--gpus", "1")
    assert code == 0 and "GPU 1 " in out and "GPU 0 " not in out
    code, out, err = top(capsys, "--once", "--url", daemon.url, "--gpus", "0,5")
    assert code == 2 and out == ""
    assert "--gpus: GPU index 5 does not exist there (GPUs: 0, 1)" in err


def test_a_sweep_in_progress_is_shown_then_its_recommendation(start_daemon, tmp_path, capsys, monkeypatch):
    daemon = start_daemon(config_text=SWEEPING.format(state=tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "80")

    def sweeping() -> str | None:
        text = requests.get(daemon.url + "/metrics", timeout=5).text
        return text if metric(text, "gpuperf_sweep_in_progress", "0") == 1.0 else None

    before = wait_for(sweeping, what="a sweep holding a cap")
    code, out, err = top(capsys, "--once", "--url", daemon.url)
    after = requests.get(daemon.url + "/metrics", timeout=5).text
    assert code == 0, err
    caps = {metric(t, "gpuperf_sweep_cap_watts", "0") for t in (before, after)} - {None}
    frame = squeezed(out)
    assert "SWEEPING" in frame
    shown = [cap for cap in caps if f"sweep in progress: llm/gpt2 at {cap:.0f} W, point" in frame]
    assert shown, (caps, frame)
    point = [700, 500, 400, 300, 200].index(round(shown[0])) + 1
    assert f"at {shown[0]:.0f} W, point {point} of 5" in frame
    page = requests.get(daemon.url + "/", timeout=5).text  # the landing page marks it too (or it just ended)
    assert 'id="sweeps"' in page or metric(requests.get(daemon.url + "/metrics", timeout=5).text,
                                           "gpuperf_sweep_in_progress", "0") == 0.0

    wait_for(lambda: metric(requests.get(daemon.url + "/metrics", timeout=5).text, "gpuperf_sweep_in_progress", "0")
             == 0.0, what="the sweep to end")
    api = requests.get(daemon.url + "/api/v1/gpus", timeout=5).json()
    probe = api["gpus"][0]["probes"][0]
    rec = probe["recommendation"]
    code, out, _ = top(capsys, "--once", "--url", daemon.url)
    frame = squeezed(out)
    assert "SWEEPING" not in frame and "sweep in progress" not in frame
    assert f"llm/gpt2 at 700 W: {fmt_rate(probe['units_per_second'])} tokens/s" in frame
    expected = probe["expected_units_per_second"]
    assert expected is not None  # a simulated H100 at 700 W has the shipped figure
    assert f"{100 * (probe['units_per_second'] / expected - 1):+.1f}% vs expected" in frame
    assert f"recommended {rec['cap_watts']:.0f} W" in frame


def test_local_reads_simulated_gpus_without_a_daemon(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    code, out, err = top(capsys, "--simulate", "2", "--once", "--gpus", "1")
    assert code == 0, err
    assert "local simulated GPUs" in squeezed(out) and "GPU 1 " in out and "GPU 0 " not in out
    assert "power " in out and "W cap" in out
    assert all(len(line) <= 40 for line in out.splitlines())


def test_local_without_a_driver_is_the_clear_error_never_a_simulation(capsys):
    code, out, err = top(capsys, "--local", "--once")  # this machine has no NVIDIA driver
    assert code == 3 and out == ""
    assert "no NVIDIA driver found" in err and "--simulate" in err and "Traceback" not in err


def test_an_unreachable_daemon_says_so_and_how_to_fall_back(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = top(capsys, "--once", "--url", url)
    assert code == 1 and out == ""
    assert f"no gpuperfd daemon answers at {url}" in err and "--local" in err


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Source:
    description = "test"

    def __init__(self, frames: list[Any]) -> None:
        self.frames = frames

    def fetch(self) -> dict[str, Any]:
        frame = self.frames.pop(0)
        if isinstance(frame, BaseException):
            raise frame
        return frame

    def close(self) -> None:
        pass


DATA = {"backend": "simulated", "time": 0.0, "gpus": [{"gpu": 0, "name": "X", "up": True}]}


def test_ctrl_c_exits_0_and_restores_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    monkeypatch.setenv("NO_COLOR", "1")
    out = FakeTty()
    source = Source([{**DATA, "gpus": [{"gpu": 0, "name": "Y", "up": True}]},
                     top_cli.TopError("no gpuperfd daemon answers"), KeyboardInterrupt()])
    assert top_cli.live(source, DATA, None, 0.1, out) == 0
    text = out.getvalue()
    assert text.startswith(top_cli.ENTER) and text.endswith(top_cli.LEAVE)
    assert text.count("\x1b[H") == 3  # three frames, each redrawn in place
    assert "GPU 0  Y" in text and "stale: no gpuperfd daemon answers" in text


def test_live_without_a_tty_writes_plain_frames(monkeypatch):
    out = io.StringIO()
    assert top_cli.live(Source([KeyboardInterrupt()]), DATA, None, 0.1, out) == 0
    assert "\x1b" not in out.getvalue() and "GPU 0  X" in out.getvalue()


COVERAGE = """
device: {{backend: simulated}}
simulation: {{gpus: 2, seed: 4, state_file: {state}/sim.json, mig: [{{gpu: 1, instances: 2}}]}}
probes:
  state_dir: {state}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.3
  simulated_measure_seconds: 0.2
  schedules:
    - {{probe: llm, interval_seconds: 3600, settle_seconds: 0}}
"""


def test_each_results_age_and_a_due_gpu_without_one_are_shown_everywhere(start_daemon, tmp_path, capsys, monkeypatch):
    """Issue 50: GPU 0's llm result has an age and is fresh; GPU 1 (MIG on, never probed) has none and it is due:
    /api/v1/gpus, /metrics, `gpuperfd top` and the landing page say so alike."""
    daemon = start_daemon(config_text=COVERAGE.format(state=tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "160")

    def covered():
        gpus = requests.get(daemon.url + "/api/v1/gpus", timeout=5).json()["gpus"]
        return gpus if gpus[0]["probes"] and gpus[1]["coverage"] else None

    gpus = wait_for(covered, what="a result on GPU 0")
    fresh, waiting = gpus[0]["probes"][0], gpus[1]["coverage"]
    assert fresh["probe"] == "llm" and fresh["due"] is False and 0 <= fresh["age_seconds"] < 60
    assert waiting == [{"probe": "llm", "preset": "gpt2", "age_seconds": None, "due": True}]
    text = requests.get(daemon.url + "/metrics", timeout=5).text
    assert metric(text, "gpuperf_probe_due", "0", probe="llm") == 0 and metric(text, "gpuperf_probe_due", "1") == 1
    assert metric(text, "gpuperf_probe_result_age_seconds", "0", probe="llm") >= 0
    assert metric(text, "gpuperf_probe_result_age_seconds", "1") is None
    code, out, err = top(capsys, "--once", "--url", daemon.url)
    assert code == 0, err
    block0, block1 = (squeezed(b) for b in out.split("\n\n")[1:3])
    assert "llm/gpt2 at" in block0 and " s old" in block0 and "old, due" not in block0
    assert "llm/gpt2: no result yet, due (waiting for a gap)" in block1
    page = requests.get(daemon.url + "/", timeout=5).text
    assert 'class="age" data-due="0"' in page and " s old" in page
    assert 'id="due-1"' in page and "due (waiting for the GPU to be free): llm/gpt2" in page


@pytest.mark.parametrize("page", ["/metrics", "/", "/api/v1/gpus", "/healthz"])
def test_a_url_with_one_of_the_daemons_pages_is_its_base_url(start_daemon, tmp_path, capsys, page):
    """Issue 61: ``--url http://HOST:PORT/metrics`` (copied from a scrape config) was told the daemon
    "does not serve /api/v1/gpus (a gpuperfd older than top?)", which was false: the path was the mistake."""
    daemon = start_daemon(config_text=STILL.format(state=tmp_path / "state"))
    code, out, err = top(capsys, "--once", "--url", daemon.url + page)
    assert code == 0 and f"from daemon {daemon.url}" in out, err


def test_a_url_whose_path_serves_nothing_says_the_url_is_the_daemons_base(start_daemon, tmp_path, capsys):
    daemon = start_daemon(config_text=STILL.format(state=tmp_path / "state"))
    code, out, err = top(capsys, "--once", "--url", daemon.url + "/gpuperfd")
    assert code == 1 and out == ""
    assert f"nothing serves {daemon.url}/gpuperfd/api/v1/gpus (HTTP 404): --url is the daemon's base URL, " \
           f"e.g. {daemon.url}" in err, err
    assert "older than" not in err

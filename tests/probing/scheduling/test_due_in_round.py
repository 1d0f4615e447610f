"""Issue 61, point 3: a schedule's due flag turns 0 when its own result is published, not when the
round of several schedules that ran it ends (on a real node a round lasts minutes)."""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.prometheus

CAPS = 6  # points in each schedule's sweep

CONFIG = """
device: {backend: simulated}
simulation: {gpus: 1, model: H100, seed: 7}
sampler: {interval_seconds: 0.5}
probes:
  read_only: false
  state_dir: state
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0
  simulated_measure_seconds: 0.5
  stop_early: false
  schedules:
    - probe: llm
      interval_seconds: 300
      caps: [max, 600, 500, 400, 300, 200]
      settle_seconds: 0.5
    - probe: vit
      interval_seconds: 300
      caps: [max, 650, 600, 550, 500, 400]
      settle_seconds: 0.5
"""


def _by_probe(text: str, name: str) -> dict[str, float]:
    """The samples of ``name`` summed by their probe label."""
    summed: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                summed[sample.labels["probe"]] = summed.get(sample.labels["probe"], 0.0) + sample.value
    return summed


def test_a_schedule_is_no_longer_due_once_its_result_is_published_while_its_round_goes_on(start_daemon):
    daemon = start_daemon([], CONFIG)
    deadline, seen = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        text = requests.get(daemon.url + "/metrics", timeout=5).text
        points = _by_probe(text, "gpuperf_probe_runs_total")
        due = _by_probe(text, "gpuperf_probe_due")
        done = [probe for probe, count in points.items() if count >= CAPS]
        if len(done) == 1:  # one schedule's sweep is out whole, the other still runs in the same round
            seen.append((done[0], points, due))
        if len(done) == 2:
            break
        time.sleep(0.2)
    assert "leads a round with" in daemon.log(), daemon.log()[-3000:]
    assert len(seen) >= 3, f"never saw one sweep done and the other still running: {seen}"
    for first, points, due in seen[1:]:  # the first scrape may race the flag by a moment
        other = ({"llm", "vit"} - {first}).pop()
        assert due[first] == 0, f"{first}'s sweep is published whole but it reads due: {due} ({points})"
        assert due[other] == 1

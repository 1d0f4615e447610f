"""Issue 50, bad input: a schedule whose interval or cron window cannot hold one of its runs, and a GPU-time
share out of range (or too small for one run), are refused at load naming the field; nothing is changed."""

from __future__ import annotations

import pytest

import gpuperfd.cli  # noqa: F401 - hands the config its vocabulary (a probe child's measured windows)
from gpuperfd.config import ConfigError, load_config

SIMULATED = "device: {backend: simulated}\nprobes:\n  simulated_measure_seconds: 4\n"


@pytest.mark.parametrize("text,field,words", [
    # simulated: one point is 4 s measured; a read-only node measures one point, a sweep one per cap
    (SIMULATED + "  read_only: false\n  schedules: [{probe: llm, interval_seconds: 10, caps: [max, 500, 400]}]\n",
     "probes.schedules.0.interval_seconds", "at least 12 s: 3 point(s) x 4 s"),
    (SIMULATED + "  schedules: [{probe: llm, cron: '0 2 * * *', window_seconds: 3}]\n",
     "probes.schedules.0.window_seconds", "at least 4 s"),
    (SIMULATED + "  schedules: [{probe: llm, interval_seconds: 60, window_seconds: 100}]\n",
     "probes.schedules.0", "only a cron schedule has a window"),
    (SIMULATED + "  max_gpu_time_ratio: 0\n", "probes.max_gpu_time_ratio", "greater than 0"),
    (SIMULATED + "  max_gpu_time_ratio: 1.5\n", "probes.max_gpu_time_ratio", "less than or equal to 1"),
    (SIMULATED + "  max_gpu_time_ratio: 0.00001\n  schedules: [{probe: llm, interval_seconds: 60}]\n",
     "probes.max_gpu_time_ratio", "it could never run"),
    # a probe child: 5 windows of 1.5 s, 1 s warmup and 0.1 s profiled per point (8.6 s), times 2 caps
    ("probes:\n  read_only: false\n  schedules: [{probe: vit, interval_seconds: 12, caps: [max, 300]}]\n",
     "probes.schedules.0.interval_seconds", "at least 17.2 s"),
])
def test_a_schedule_that_cannot_fit_its_time_is_refused_naming_the_field(tmp_path, text, field, words) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert f"  - {field}:" in message and words in message, message


def test_configs_of_today_keep_loading_and_mean_freshness(tmp_path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(SIMULATED + "  schedules:\n    - {probe: llm, interval_seconds: 10}\n"
                    "    - {probe: vit, cron: '0 2 * * *'}\n    - {probe: attention, cron: '0 3 * * *', window_seconds: 600}\n")
    config = load_config(path)
    assert config.probes.max_gpu_time_ratio == 0.01  # the default share: 1 % of a day
    assert [s.window_seconds for s in config.probes.schedules] == [None, None, 600]

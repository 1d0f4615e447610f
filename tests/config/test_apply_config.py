"""The apply: section: off by default, and bad input named by field (issue 45)."""

from __future__ import annotations

import pytest

import gpuperfd.cli  # noqa: F401 - hands the vocabulary in, as the entry point does
from gpuperfd.config import ConfigError, config_from_mapping

SCHEDULES = {"read_only": False, "schedules": [{"probe": "llm", "interval_seconds": 60, "caps": ["max", 300]}]}


def test_off_by_default() -> None:
    assert config_from_mapping({}).apply.mode == "off"


@pytest.mark.parametrize(("data", "message"), [
    ({"apply": {"mode": "on", "workload": "llm", "budget_ratio": 0.9}, "probes": SCHEDULES},
     "apply.budget_ratio: Input should be less than or equal to 0.5"),
    ({"apply": {"mode": "on", "workload": "llm", "budget_ratio": 0}, "probes": SCHEDULES},
     "apply.budget_ratio: Input should be greater than 0"),
    ({"apply": {"mode": "advise", "workload": "bert"}, "probes": SCHEDULES}, "unknown probe 'bert'"),
    ({"apply": {"mode": "advise", "workload": "vit"}, "probes": SCHEDULES}, "no probes.schedules entry runs it"),
    ({"apply": {"mode": "on"}, "probes": SCHEDULES}, "mode on needs workload"),
    ({"apply": {"mode": "on", "workload": "llm"}, "probes": {**SCHEDULES, "read_only": True}},
     "probes.read_only is true"),
    ({"apply": {"mode": "always", "workload": "llm"}, "probes": SCHEDULES}, "apply.mode"),
])
def test_bad_input_names_the_field(data, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_mapping(data)


def test_advise_on_a_read_only_node_and_canary_by_gpus() -> None:
    advise = config_from_mapping({"apply": {"mode": "advise", "workload": "llm/gpt2"},
                                  "probes": {**SCHEDULES, "read_only": True}})
    assert advise.apply.workload == "llm/gpt2"
    canary = config_from_mapping({"apply": {"mode": "canary", "workload": "llm", "canary_gpus": [0, 3]},
                                  "probes": SCHEDULES})
    assert canary.apply.canary_gpus == [0, 3]


def test_bare_yaml_on_and_off_mean_the_modes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpuperfd.config import load_config

    path = tmp_path / "gpuperfd.yaml"
    path.write_text("probes:\n  read_only: false\n  schedules:\n    - {probe: llm, interval_seconds: 60, caps: [max, 300]}\n"
                    "apply: {mode: on, workload: llm}\n")
    assert load_config(path).apply.mode == "on"
    path.write_text("apply: {mode: off}\n")
    assert load_config(path).apply.mode == "off"

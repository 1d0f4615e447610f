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


@pytest.mark.parametrize("word", ["yes", "Yes", "true", "True", "no", "false", "y", "n", "ON"])
def test_a_yaml_boolean_other_than_on_or_off_is_refused(tmp_path, word) -> None:  # type: ignore[no-untyped-def]
    """PyYAML reads yes/no/true/false (YAML 1.1) as booleans: ``mode: yes`` once meant ``on``, the mode
    that changes every cap (issue 51). Only the four modes pass; a bare on/off is the word written."""
    from gpuperfd.config import load_config

    path = tmp_path / "gpuperfd.yaml"
    path.write_text("probes:\n  read_only: false\n  schedules:\n    - {probe: llm, interval_seconds: 60, caps: [max, 300]}\n"
                    f"apply: {{mode: {word}, workload: llm}}\n")
    if word == "ON":
        assert load_config(path).apply.mode == "on"
        return
    with pytest.raises(ConfigError, match=r"apply\.mode: Input should be 'off', 'advise', 'canary' or 'on'"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"apply\.mode"):  # a boolean given by a program: refused too
        config_from_mapping({"apply": {"mode": True, "workload": "llm"}, "probes": SCHEDULES})


@pytest.mark.parametrize(("workload", "schedule", "ok"), [
    ("llm/gpt9", {}, False),                           # no schedule runs that preset (once accepted)
    ("llm/gpt2-medium", {}, False),                    # a schedule without a preset runs the default (gpt2)
    ("llm/gpt2", {}, True),
    ("llm/gpt2-medium", {"preset": "gpt2-medium"}, True),
    ("llm", {"preset": "gpt2-medium"}, True),
])
def test_a_workload_or_preset_no_schedule_runs_is_refused(workload, schedule, ok) -> None:  # type: ignore[no-untyped-def]
    probes = {"read_only": False, "schedules": [{"probe": "llm", "interval_seconds": 60, "caps": ["max", 300],
                                                 **schedule}]}
    data = {"apply": {"mode": "on", "workload": workload}, "probes": probes}
    if ok:
        assert config_from_mapping(data).apply.workload == workload
        return
    with pytest.raises(ConfigError, match=r"no probes.schedules entry runs it, so nothing recommends or checks a cap for it \(the schedules run llm/gpt2\)"):
        config_from_mapping(data)


def test_a_canary_gpu_the_simulated_node_lacks_is_refused() -> None:
    data = {"device": {"backend": "simulated"}, "simulation": {"gpus": 4},
            "apply": {"mode": "canary", "workload": "llm", "canary_gpus": [0, 7]}, "probes": SCHEDULES}
    with pytest.raises(ConfigError, match=r"apply.canary_gpus: GPU 7 does not exist \(this node has 4 GPUs"):
        config_from_mapping(data)

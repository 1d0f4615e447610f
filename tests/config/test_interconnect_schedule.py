"""``probe: interconnect`` schedules: a set of at least two GPUs, InterconnectRequest's options,
no preset and no cap sweep; every problem named."""

from __future__ import annotations

import pytest

from gpuperfd.config import ConfigError, config_from_mapping


def schedule(**fields):
    return config_from_mapping({"probes": {"schedules": [{"probe": "interconnect", "interval_seconds": 600,
                                                           **fields}]}}).probes.schedules[0]


def test_a_valid_interconnect_schedule_keeps_its_set_and_options():
    got = schedule(gpus=[0, 1, 3], options={"allreduce_bytes": [1 << 20, 1 << 30], "repeats": 5, "dtype": "bfloat16"})
    assert got.gpus == [0, 1, 3] and got.caps == ["current"] and got.options["allreduce_bytes"] == [1 << 20, 1 << 30]
    assert schedule().gpus is None  # every GPU of the node


@pytest.mark.parametrize("fields, words", [
    ({"gpus": [2]}, "needs at least two GPUs"),
    ({"gpus": [0, 0]}, "named twice"),
    ({"caps": ["max", 300]}, "operator's caps only"),
    ({"preset": "gpt2"}, "takes no preset"),
    ({"options": {"batch_size": 8}}, "'batch_size' is not an interconnect option"),
    ({"options": {"allreduce_bytes": 1024}}, "options.allreduce_bytes: give a list"),
    ({"options": {"repeats": 0}}, "options.repeats: must be a number >= 1"),
    ({"options": {"dtype": "int8"}}, "options.dtype"),
])
def test_bad_interconnect_schedules_are_refused_naming_the_field(fields, words):
    with pytest.raises(ConfigError, match=words):
        schedule(**fields)

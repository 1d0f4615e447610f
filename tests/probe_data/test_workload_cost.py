"""The work accounting the simulator scales by (probe_data/workload_cost.py): parameter counts of the
published models, bytes by dtype, K/V heads by group, and clear errors."""

from __future__ import annotations

import pytest

from gpuperfd.probe_data.spec import PRESETS
from gpuperfd.probe_data.kinds import workload_cost
from gpuperfd.probe_data.workload_cost import attention_cost, llm_cost, train_cost, vit_cost


@pytest.mark.parametrize(("model", "millions"), [("gpt2", 124.4), ("gpt2-medium", 354.8), ("gpt2-large", 774.0),
                                                 ("gpt2-xl", 1557.6)])
def test_gpt2_weights_are_the_published_parameter_counts(model: str, millions: float) -> None:
    weights = llm_cost(model, 1, 1, 1, 1, "float32").memory.weights
    assert weights / 4 / 1e6 == pytest.approx(millions, rel=0.01)
    assert llm_cost(model, 1, 1, 1, 1, "float16").memory.weights == weights / 2


def test_vit_b16_has_86_million_parameters_and_17_gigaflop_multiply_adds_an_image() -> None:
    cost = vit_cost("vit-b16", 1, 224, "float32")
    assert cost.memory.weights / 4 / 1e6 == pytest.approx(86.6, rel=0.01)
    assert cost.step.flops / 2 / 1e9 == pytest.approx(17.6, rel=0.03)


def test_the_kv_cache_follows_batch_length_and_groups() -> None:
    base = llm_cost("gpt2", 4, 128, 128, 1, "float16").memory.kv_cache
    assert base == 4 * 12 * 2 * 256 * 768 * 2
    assert llm_cost("gpt2", 8, 128, 128, 1, "float16").memory.kv_cache == 2 * base
    assert llm_cost("gpt2", 4, 384, 128, 1, "float16").memory.kv_cache == 2 * base
    assert llm_cost("gpt2", 4, 128, 128, 4, "float16").memory.kv_cache == base / 4


def test_attention_holds_q_k_v_and_o_with_fewer_kv_heads_by_group() -> None:
    one = attention_cost(16, 16, 128, 4096, 1, False, "bfloat16")
    assert one.memory.total == 4 * 16 * 16 * 4096 * 128 * 2  # the real default's 1,073,741,824 + 1,536
    assert attention_cost(16, 16, 128, 4096, 2, False, "bfloat16").memory.total == 3 * one.memory.total / 4
    assert attention_cost(16, 16, 128, 4096, 1, True, "bfloat16").step.flops == one.step.flops / 2


def test_training_holds_sixteen_bytes_a_parameter_of_weights_and_optimizer_state() -> None:
    cost = train_cost("gpt2", 16, 1024, "bfloat16")
    params = cost.memory.weights / 4
    assert cost.memory.optimizer == 12 * params
    assert cost.units_per_step == 16 * 1024


def test_every_preset_has_a_cost_and_bad_input_is_named() -> None:
    for probe, presets in PRESETS.items():
        for options in presets.values():
            cost = workload_cost(probe, options)
            assert cost.step.flops > 0 and cost.memory.total > 0
    with pytest.raises(ValueError, match="probe"):
        workload_cost("nope", {"dtype": "float16"})
    with pytest.raises(KeyError, match="batch_size"):
        workload_cost("vit", {"dtype": "float16", "model": "vit-b16", "image_size": 224})
    with pytest.raises(ValueError, match="dtype"):
        workload_cost("vit", {"dtype": "int3"})

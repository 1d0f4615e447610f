"""The llm probe's Llama presets and speculative options: resolved from seed 004's configuration,
and every bad value refused with the field it names (nothing run)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuperfd.probe_data.spec import (
    GPT2_VARIANTS,
    LLAMA_VARIANTS,
    PRESETS,
    ProbeSpec,
    check_options,
    unknown_key_message,
)
from gpuperfd.probe_data.speculative import expected_tokens, speculative_summary
from gpuperfd.probe_data.kinds import workload_cost
from gpuperfd.probe_data.workload_cost import llama_room_bytes


def test_seed_004s_configuration_is_a_preset() -> None:
    spec = ProbeSpec("llm", preset="llama-3.1-8b-spec")
    assert (spec.model, spec.draft_model, spec.speculative_tokens) == ("llama-3.1-8b", "llama-3.2-1b", 12)
    assert (spec.batch_size, spec.prompt_tokens, spec.output_tokens, spec.dtype) == (1, 128, 128, "bfloat16")
    assert spec.acceptance_rates == (0.5, 0.7, 0.9)
    # the same preset measured without the draft: the speculative fields go with the variant
    plain = ProbeSpec("llm", preset="llama-3.1-8b-spec", variant="graph")
    assert plain.draft_model is None and "draft_model" not in plain.params()


def test_gpt2_points_keep_their_params() -> None:
    """No speculative key in a GPT-2 point's params: its records and peers compare as before."""
    assert set(ProbeSpec("llm", preset="gpt2").params()) == {
        "model", "batch_size", "prompt_tokens", "output_tokens", "n_groups", "dtype", "repeats", "warmup",
        "measure_seconds", "seed"}


@pytest.mark.parametrize(("fields", "field"), [
    ({"preset": "llama-3.1-8b-spec", "acceptance_rates": [0.5, 1.2]}, "acceptance_rates"),
    ({"preset": "llama-3.1-8b-spec", "acceptance_rates": [-0.1]}, "acceptance_rates"),
    ({"preset": "llama-3.1-8b-spec", "acceptance_rates": []}, "acceptance_rates"),
    ({"preset": "llama-3.1-8b-spec", "acceptance_rates": "0.5"}, "acceptance_rates"),
    ({"preset": "llama-3.1-8b-spec", "speculative_tokens": 0}, "speculative_tokens"),
    ({"preset": "llama-3.1-8b-spec", "speculative_tokens": 65}, "speculative_tokens"),
    ({"preset": "llama-3.1-8b-spec", "draft_model": "gpt2"}, "draft_model"),
    ({"preset": "llama-3.1-8b-spec", "draft_model": "llama-tiny"}, "draft_model"),  # another vocabulary
    ({"preset": "llama-3.1-8b", "speculative_tokens": 4}, "speculative_tokens"),  # not the speculative variant
    ({"preset": "llama-3.1-8b", "n_groups": 4}, "n_groups"),
    ({"preset": "llama-3.1-8b", "prompt_tokens": 8000, "output_tokens": 500}, "output_tokens"),
    ({"preset": "llama-3.1-8b-spec", "output_tokens": 1}, "output_tokens"),
    ({"preset": "gpt2", "variant": "speculative"}, "variant"),
    ({"preset": "gpt2", "variant": "compiled"}, "variant"),
    ({"preset": "gpt2", "model": "llama-70b"}, "model"),
])
def test_bad_llama_input_names_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        ProbeSpec("llm", **fields)


def test_speculative_options_belong_to_the_llm_probe() -> None:
    with pytest.raises(ValueError, match="^speculative_tokens: not used by probe 'vit'"):
        ProbeSpec("vit", preset="tiny", speculative_tokens=3)
    check_options("llm", {"acceptance_rates": [0.8], "speculative_tokens": 5}, preset="llama-tiny-spec")
    with pytest.raises(ValueError, match="^acceptance_rates: "):
        check_options("llm", {"acceptance_rates": [2]}, preset="llama-tiny-spec")


def test_every_llama_preset_uses_a_variant_of_its_family() -> None:
    for name, values in PRESETS["llm"].items():
        spec = ProbeSpec("llm", preset=name)
        family = LLAMA_VARIANTS if name.startswith("llama") else GPT2_VARIANTS
        assert spec.variant in family, name


def test_seed_004s_speculative_key_is_translated() -> None:
    assert "'speculative_tokens'" in unknown_key_message("num_speculated_tokens", ["speculative_tokens"])
    assert "draft_model" in unknown_key_message("spec_config", ["speculative_tokens"])


def test_expected_tokens_per_round() -> None:
    assert expected_tokens(0.0, 12) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens(1.0, 12) == 13.0  # everything accepted, plus the bonus token
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match="^acceptance_rates: "):
            expected_tokens(bad, 4)


def test_speculative_summary_break_even() -> None:
    # a round of 4 draft steps (1 ms each) and a 10 ms verify against a 10 ms plain decode step:
    # speculation pays once a round yields 1.4 tokens
    summary = speculative_summary(4, (0.5,), 0.004, 0.010, 0.010)
    assert summary["round_seconds"] == pytest.approx(0.014)
    assert summary["baseline_tokens_per_second"] == pytest.approx(100.0)
    even = summary["break_even_acceptance_rate"]
    assert expected_tokens(even, 4) >= 1.4 > expected_tokens(even - 0.001, 4)
    assert summary["at_rates"][0]["speedup"] == pytest.approx(expected_tokens(0.5, 4) / 1.4)
    # a window without a round (nothing measured) has no rate and no break-even, and does not raise
    empty = speculative_summary(4, (0.5,), 0.0, 0.0, 0.010)
    assert empty["break_even_acceptance_rate"] is None and empty["at_rates"][0]["tokens_per_second"] is None


def test_llama_room_grows_with_batch_and_the_draft() -> None:
    one = llama_room_bytes(PRESETS["llm"]["llama-3.1-8b"])
    assert 16 * 2**30 < one < 24 * 2**30  # 16.06 GB of weights, caches, margin: fits an 80 GB card
    assert llama_room_bytes({**PRESETS["llm"]["llama-3.1-8b"], "batch_size": 32}) > one
    assert llama_room_bytes(PRESETS["llm"]["llama-3.1-8b-spec"]) > one + 2.4e9  # the 1B draft's weights


def test_batch_1_decode_is_memory_bound_in_the_cost_model() -> None:
    """The 8B's batch-1 decode step reads 15 GB for 16 GFLOP: far below any card's ridge point."""
    cost = workload_cost("llm", {**PRESETS["llm"]["llama-3.1-8b"]})
    assert 14.9e9 < cost.step.bytes_moved < 15.2e9
    assert cost.step.flops / cost.step.bytes_moved < 2  # FLOP per byte; an H100's ridge is ~300
    b32 = workload_cost("llm", {**PRESETS["llm"]["llama-3.1-8b"], "batch_size": 32})
    assert b32.step.flops / b32.step.bytes_moved > 25 * cost.step.flops / cost.step.bytes_moved

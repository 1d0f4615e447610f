"""ProbeSpec: presets resolve, bad values fail with the field's name, round trips."""

from __future__ import annotations

import pytest

from gpuperfd.probe_data.spec import (
    DEFAULT_PRESET,
    PRESETS,
    PROBES,
    VARIANTS,
    ProbeSpec,
    canonical_dtype,
    default_timeout,
)


@pytest.mark.parametrize("probe", PROBES)
def test_every_preset_resolves_and_validates(probe: str) -> None:
    for name in PRESETS[probe]:
        spec = ProbeSpec(probe, preset=name)
        assert spec.preset == name
        assert spec.variant in VARIANTS[probe]
        assert spec.batch_size >= 1
        assert spec.repeats >= 1
        assert default_timeout(spec) > spec.repeats * spec.measure_seconds


@pytest.mark.parametrize("probe", PROBES)
def test_default_preset_is_gpu_sized_and_tiny_is_cpu(probe: str) -> None:
    default = ProbeSpec(probe)
    assert default.preset == DEFAULT_PRESET[probe]
    assert default.device == "cuda"
    assert default.repeats == 5
    assert default.measure_seconds * default.repeats <= 10.0  # one point's measurement stays under 10 s
    tiny = ProbeSpec(probe, preset="tiny")
    assert tiny.device == "cpu"
    assert tiny.dtype == "float32"


def test_overrides_win_over_the_preset() -> None:
    spec = ProbeSpec("llm", preset="gpt2", batch_size=1, output_tokens=64, dtype="bf16", device="cuda:1")
    assert (spec.batch_size, spec.output_tokens, spec.dtype, spec.cuda_index) == (1, 64, "bfloat16", 1)
    assert spec.prompt_tokens == PRESETS["llm"]["gpt2"]["prompt_tokens"]
    assert spec.params()["batch_size"] == 1


def test_round_trip_through_dict() -> None:
    spec = ProbeSpec("attention", preset="tiny", n_groups=2, causal=True, seed=7)
    again = ProbeSpec.from_dict(spec.to_dict())
    assert again == spec


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"probe": "nope"}, "probe"),
        ({"probe": "llm", "preset": "gpt5"}, "preset"),
        ({"probe": "llm", "preset": "tiny", "batch_size": 0}, "batch_size"),
        ({"probe": "llm", "preset": "tiny", "batch_size": 2.5}, "batch_size"),
        ({"probe": "llm", "preset": "tiny", "dtype": "int8"}, "dtype"),
        ({"probe": "llm", "preset": "tiny", "output_tokens": 500}, "output_tokens"),
        ({"probe": "llm", "preset": "tiny", "variant": "compiled"}, "variant"),
        ({"probe": "llm", "preset": "tiny", "device": "gpu0"}, "device"),
        ({"probe": "llm", "preset": "tiny", "repeats": 0}, "repeats"),
        ({"probe": "llm", "preset": "tiny", "measure_seconds": 0}, "measure_seconds"),
        ({"probe": "llm", "preset": "tiny", "gpu_busy_threshold": 1.5}, "gpu_busy_threshold"),
        ({"probe": "llm", "preset": "tiny", "inject_fault": "meteor"}, "inject_fault"),
        ({"probe": "llm", "preset": "tiny", "weights_path": "/does/not/exist"}, "weights_path"),
        ({"probe": "vit", "preset": "tiny", "prompt_tokens": 8}, "prompt_tokens"),
        ({"probe": "vit", "preset": "tiny", "image_size": 30}, "image_size"),
        ({"probe": "attention", "preset": "tiny", "n_groups": 3}, "n_groups"),
        ({"probe": "attention", "preset": "tiny", "head_dim": 1024}, "head_dim"),
        ({"probe": "train", "preset": "tiny", "seq_len": 4096}, "seq_len"),
        ({"probe": "train", "preset": "tiny", "n_groups": 2}, "n_groups"),
    ],
)
def test_bad_values_name_the_field(fields: dict, field_name: str) -> None:
    with pytest.raises(ValueError) as info:
        ProbeSpec(**fields)
    assert str(info.value).startswith(f"{field_name}:"), str(info.value)


def test_from_dict_rejects_unknown_fields() -> None:
    data = ProbeSpec("llm", preset="tiny").to_dict()
    data["batch"] = 3
    with pytest.raises(ValueError, match="^batch:"):
        ProbeSpec.from_dict(data)


def test_dtype_aliases() -> None:
    assert canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype("half") == "float16"
    with pytest.raises(ValueError, match="^dtype:"):
        canonical_dtype("fp8")


def test_seed_keys_get_a_translation_not_a_bare_unknown_key() -> None:
    from gpuperfd.probe_data.spec import OPTION_KEYS, SEED_KEYS, unknown_key_message

    known = ("variant", "prompt_tokens", "output_tokens", "warmup", "repeats", "batch_size")
    text = unknown_key_message("frameworks", known, where="config: bench.json")
    assert text.startswith("config: bench.json: 'frameworks' is 'variant' here") and "valid keys: batch_size" in text
    assert "'input_tokens' is 'prompt_tokens' here" in unknown_key_message("input_tokens", known)
    assert "'num_runs' is 'repeats' here" in unknown_key_message("num_runs", known)
    assert "no equivalent here: the llm probe decodes greedily" in unknown_key_message("num_beams", known)
    assert "did you mean 'repeats'?" in unknown_key_message("repeets", known)
    assert "did you mean" not in unknown_key_message("zzz", known)
    # every translation names a key that exists somewhere (a spec field or a CLI/config key)
    elsewhere = {"caps", "output", "dataset", "model"}
    assert all(v is None or v in OPTION_KEYS or v in elsewhere for v in SEED_KEYS.values())


def test_bad_option_names_the_valid_keys_not_a_python_type_error() -> None:
    from gpuperfd.probe_data.spec import check_options

    with pytest.raises(ValueError) as info:
        check_options("llm", {"batchsize": 4})
    text = str(info.value)
    assert "'batchsize' is 'batch_size' here" in text and "valid keys:" in text and "TypeError" not in text
    with pytest.raises(ValueError, match="did you mean 'prompt_tokens'"):
        check_options("llm", {"prompt_token": 4})
    with pytest.raises(ValueError, match="batch_size"):
        check_options("llm", {"batch_size": 0})
    check_options("llm", {"batch_size": 4, "prompt_tokens": 16})


def test_schedule_options_error_translates_seed_keys() -> None:
    from gpuperfd.config import ScheduleConfig

    with pytest.raises(Exception) as info:
        ScheduleConfig(probe="llm", interval_seconds=60, options={"batchsize": 4})
    assert "'batchsize' is 'batch_size' here" in str(info.value)

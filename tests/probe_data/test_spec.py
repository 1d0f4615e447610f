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

"""The CPU path of a probe: float32 unless a dtype is given, a time bound that grows with the work, advice."""

from __future__ import annotations

import pytest

from gpuperfd.probe_data.cpu_path import MAX_CPU_TIMEOUT_SECONDS, half_on_cpu_warning, timeout_hint
from gpuperfd.probe_data.spec import ProbeSpec, default_timeout


@pytest.mark.parametrize("probe,preset", [("llm", "gpt2"), ("llm", "gpt2-medium"), ("train", "gpt2"),
                                          ("vit", "vit-b16"), ("attention", "default")])
def test_a_cpu_point_without_a_dtype_runs_float32(probe: str, preset: str) -> None:
    assert ProbeSpec(probe, preset=preset, device="cpu").dtype == "float32"
    assert ProbeSpec(probe, preset=preset).dtype in ("float16", "bfloat16")  # the GPU preset is unchanged


def test_an_explicit_dtype_on_the_cpu_is_kept_and_float16_warned_about_once() -> None:
    specs = [ProbeSpec("llm", preset="gpt2", device="cpu", dtype="fp16", batch_size=b) for b in (1, 2)]
    assert [s.dtype for s in specs] == ["float16", "float16"]
    warning = half_on_cpu_warning(specs)
    assert warning is not None and "2 point(s)" in warning and "float32" in warning
    assert half_on_cpu_warning([ProbeSpec("llm", preset="gpt2", device="cpu")]) is None
    assert half_on_cpu_warning([ProbeSpec("llm", preset="gpt2", dtype="float16")]) is None  # on a GPU: fine


def test_the_cpu_time_bound_grows_with_the_presets_work() -> None:
    def bound(preset: str, **fields) -> float:
        return default_timeout(ProbeSpec("llm", preset=preset, device="cpu", **fields))

    tiny, gpt2, medium = bound("tiny"), bound("gpt2", batch_size=1), bound("gpt2-medium", batch_size=1)
    assert tiny == pytest.approx(60.0 + 3 * (2 * 0.2 + 0.05), abs=1.0)  # the tiny preset: as before
    assert 120 < gpt2 < medium < MAX_CPU_TIMEOUT_SECONDS  # was 86 s for both: every point timed out
    assert bound("gpt2", batch_size=8) > gpt2  # more work per iteration, more time
    assert bound("gpt2", batch_size=1, dtype="float16") > gpt2  # emulated half precision is slower
    assert bound("gpt2-xl") == MAX_CPU_TIMEOUT_SECONDS
    cuda = ProbeSpec("llm", preset="gpt2")
    assert default_timeout(cuda) == pytest.approx(120 + 3 * (5 * 1.5 + 1.0 + 0.1))  # the GPU bound: windows, warm-up, busy pass


def test_the_timeout_hint_says_what_to_change() -> None:
    cpu_half = ProbeSpec("llm", preset="gpt2", device="cpu", dtype="float16")
    text = timeout_hint(cpu_half, 61.0)
    assert text == ("the point ran out of its 61 s on the CPU: change --timeout S, --dtype float32, "
                    "or a smaller --preset or --batch-size")
    assert "--dtype" not in timeout_hint(ProbeSpec("llm", preset="gpt2"), 146.0)

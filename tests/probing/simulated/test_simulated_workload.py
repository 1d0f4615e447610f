"""The simulated probe's figures follow the workload's shape (issue 43).

Each test runs points through the simulated executor (the path of ``gpuperfd probe --simulate``) on a
simulated H100 and checks a direction a real card shows: a larger model is slower and holds more
memory, a larger batch gains throughput with diminishing returns, decode at batch 1 is memory-bound,
ViT flattens at large batch, fewer K/V heads hold less, fp32 is slower. On the simulator before this
issue every point ran its probe's default profile, so all of these were flat and failed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuperfd.config import SimulationConfig
from gpuperfd.device.reference_figures import REAL_PROBE_FIGURES
from gpuperfd.device.roofline import CARDS, step_time
from gpuperfd.device.simulated import GPU_MODELS, SimulatedBackend
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PRESETS
from gpuperfd.probe_data.workload_cost import NOT_MODELLED_KEY, llm_cost
from gpuperfd.commands import probe as cli
from gpuperfd.probing.simulated.probe import simulated_executor
from gpuperfd.probing.simulated.workload import simulated_workload

#: How close a default preset's simulated figures stay to the card's row (noise off: exact by design).
DEFAULT_TOLERANCE = 0.01

_GPUS: dict[str, Any] = {}


def point(probe: str, preset: str | None = None, card: str = "H100", **options: Any) -> ProbeResult:
    """One simulated point without noise at the default 700 W cap."""
    if card not in _GPUS:
        _GPUS[card] = SimulatedBackend(SimulationConfig(gpus=1, model=card, seed=3)).devices()[0]
    executor = simulated_executor(0.01, seed=1, noise=0.0)
    result = executor.measure(_GPUS[card], ProbeRequest(probe=probe, preset=preset, options=options), threading.Event(), 0.0)
    assert result.ok, result.error_message
    return result


def rate(result: ProbeResult) -> float:
    return next(iter(result.throughput.values()))


def mean(result: ProbeResult, name: str) -> float:
    samples = result.latencies[name]
    return sum(samples) / len(samples)


def test_a_larger_gpt2_is_slower_and_holds_more_memory() -> None:
    points = [point("llm", model, batch_size=4) for model in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")]
    rates = [rate(p) for p in points]
    memory = [p.peak_memory_bytes for p in points]
    assert rates == sorted(rates, reverse=True) and rates[0] > 2.5 * rates[-1], rates
    assert memory == sorted(memory) and memory[-1] > 5 * memory[0], memory


def test_llm_batch_raises_throughput_with_diminishing_returns_and_lengthens_each_step() -> None:
    points = [point("llm", "gpt2", batch_size=b) for b in (1, 4, 32, 128)]
    rates = [rate(p) for p in points]
    assert rates == sorted(rates) and rates[-1] > 20 * rates[0], rates
    per_sequence = [r / b for r, b in zip(rates, (1, 4, 32, 128))]
    assert per_sequence == sorted(per_sequence, reverse=True), per_sequence  # diminishing returns
    tpot = [mean(p, "tpot_seconds") for p in points]
    assert tpot == sorted(tpot) and tpot[-1] > 1.3 * tpot[0], tpot
    assert [p.peak_memory_bytes for p in points] == sorted(p.peak_memory_bytes for p in points)


def test_decode_at_batch_1_is_memory_bound_and_draws_less_power() -> None:
    for model in ("gpt2", "gpt2-xl"):
        decode = llm_cost(model, 1, 128, 128, 1, "float16").step
        time = step_time("H100", "float16", decode.flops, decode.bytes_moved, decode.kernels)
        assert time.memory > 10 * time.compute, (model, time)
    small, large = point("llm", "gpt2", batch_size=1), point("llm", "gpt2", batch_size=128)
    assert small.average_power_watts < large.average_power_watts - 50


def test_prompt_and_output_lengths_show_in_latency() -> None:
    short, long = point("llm", "gpt2", batch_size=32, prompt_tokens=128), point("llm", "gpt2", batch_size=32,
                                                                                 prompt_tokens=896)
    assert mean(long, "ttft_seconds") > 3 * mean(short, "ttft_seconds")
    assert rate(long) < rate(short)  # a longer cache to read every step
    assert long.peak_memory_bytes > short.peak_memory_bytes
    more = point("llm", "gpt2", batch_size=32, output_tokens=512)
    assert mean(more, "request_seconds") > 3 * mean(short, "request_seconds")


def test_vit_images_per_second_rise_with_batch_then_flatten() -> None:
    batches = (1, 8, 32, 64, 128)
    points = [point("vit", "vit-b16", batch_size=b) for b in batches]
    rates = [rate(p) for p in points]
    assert rates == sorted(rates), rates
    assert rates[1] > 3 * rates[0]  # a small batch leaves the card idle between kernels
    assert rates[-1] < 1.15 * rates[-2]  # the tensor cores are full: it flattens
    batch_seconds = [mean(p, "batch_seconds") for p in points]
    assert batch_seconds == sorted(batch_seconds)
    assert [p.peak_memory_bytes for p in points] == sorted(p.peak_memory_bytes for p in points)
    assert points[0].average_power_watts < points[-1].average_power_watts - 100


def test_fewer_kv_heads_hold_less_memory() -> None:
    llm = [point("llm", "gpt2", n_groups=g) for g in (1, 2, 4)]
    assert [p.peak_memory_bytes for p in llm] == sorted((p.peak_memory_bytes for p in llm), reverse=True)
    assert rate(llm[-1]) > rate(llm[0])  # decode reads a smaller cache
    attention = [point("attention", "default", n_groups=g) for g in (1, 2, 4)]
    memory = [p.peak_memory_bytes for p in attention]
    assert memory[0] > memory[1] > memory[2], memory


@pytest.mark.parametrize(("probe", "preset", "half"), [("llm", "gpt2", "float16"), ("vit", "vit-b16", "bfloat16"),
                                                     ("train", "gpt2", "bfloat16"),
                                                     ("attention", "default", "float16")])
def test_fp32_is_slower_and_larger_than_half_precision(probe: str, preset: str, half: str) -> None:
    fp32, low = point(probe, preset, dtype="float32"), point(probe, preset, dtype=half)
    assert rate(fp32) < 0.8 * rate(low)
    assert fp32.peak_memory_bytes > low.peak_memory_bytes


def test_a_larger_training_model_is_slower_and_memory_grows_with_batch() -> None:
    rates = [rate(point("train", m, batch_size=2)) for m in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")]
    assert rates == sorted(rates, reverse=True), rates
    memory = [point("train", "gpt2", batch_size=b).peak_memory_bytes for b in (2, 8, 16)]
    assert memory == sorted(memory) and memory[-1] > 3 * memory[0]


@pytest.mark.parametrize("model", ["H100", "H200"])
@pytest.mark.parametrize("probe", sorted(DEFAULT_PRESET))
def test_default_presets_keep_the_cards_figures(model: str, probe: str) -> None:
    """Spelled out or left to the preset, the default preset's point is the card's row."""
    preset = DEFAULT_PRESET[probe]
    real = REAL_PROBE_FIGURES[model][f"{probe}/{preset}"]
    options = {k: v for k, v in PRESETS[probe][preset].items() if k in ("batch_size", "dtype", "model")}
    for result in (point(probe, None, model), point(probe, preset, model, **options)):
        assert result.units_of_work / result.measured_seconds == pytest.approx(
            float(real["units_per_second"]), rel=DEFAULT_TOLERANCE)
        assert result.peak_memory_bytes == pytest.approx(int(real["peak_memory_bytes"]), rel=DEFAULT_TOLERANCE)
        assert NOT_MODELLED_KEY not in result.extra


def test_every_simulated_card_has_a_roofline_row() -> None:
    assert set(GPU_MODELS) <= set(CARDS)


def test_an_option_the_simulator_ignores_is_named() -> None:
    eager = point("llm", "gpt2", variant="eager")
    assert eager.extra[NOT_MODELLED_KEY] == ["variant"]
    assert simulated_workload("vit", "vit-b16", {"dataset_path": "/data/x"}).not_modelled == ("dataset_path",)
    assert simulated_workload("vit", "vit-b16", {"variant": "compiled"}).not_modelled == ()


def test_the_cli_table_and_the_report_name_what_is_not_modelled(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from gpuperfd.report.records import load_history

    out = tmp_path / "v.jsonl"
    code = cli.main(_parse(["vit", "--simulate", "1", "--variant", "eager", "--repeats", "1",
                            "--measure-seconds", "0.01", "--no-progress", "--output", str(out)]))
    assert code == 0
    assert "simulated: variant not modelled" in capsys.readouterr().out
    record = json.loads(out.read_text().splitlines()[0])
    assert record["result"]["extra"][NOT_MODELLED_KEY] == ["variant"]
    notes = load_history([out]).notes
    assert any(n.startswith("simulated: variant not modelled (1 run)") for n in notes), notes


def _parse(argv: list[str]) -> Any:
    import argparse

    parser = argparse.ArgumentParser(prog="gpuperfd")
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["probe", *argv])


def _measure(device: Any, probe: str, preset: str | None = None, **options: Any) -> ProbeResult:
    executor = simulated_executor(0.01, seed=1, noise=0.0)
    return executor.measure(device, ProbeRequest(probe=probe, preset=preset, options=options), threading.Event(), 0.0)


@pytest.mark.parametrize("card", ["H100", "A100"])
def test_a_point_larger_than_the_card_runs_out_of_memory_as_a_real_card_does(card: str) -> None:
    """gpt2-xl at batch 4096 once came back ok with a 288 GiB peak on an 80 GB card."""
    device = SimulatedBackend(SimulationConfig(gpus=1, model=card, seed=3)).devices()[0]
    huge = _measure(device, "llm", "gpt2-xl", batch_size=4096)
    assert (huge.status, huge.failure_reason) == ("failed", "oom")
    assert "CUDA out of memory" in huge.error_message and "80.00 GiB" in huge.error_message
    assert huge.units_of_work is None and huge.energy_joules is None
    assert device.memory().used_bytes == 0  # nothing was loaded
    from gpuperfd.probe_child.child import classify_exception

    assert classify_exception(RuntimeError(huge.error_message)) == "oom"  # the words a real OOM uses
    assert _measure(device, "llm", "gpt2-xl", batch_size=32).ok  # what fits still runs


def test_a_users_job_holding_the_memory_leaves_no_room_for_the_probe() -> None:
    device = SimulatedBackend(SimulationConfig(gpus=1, seed=3)).devices()[0]
    assert _measure(device, "vit").ok
    device.add_foreign_process(4242, 79 * 2**30)
    squeezed = _measure(device, "vit")
    assert squeezed.failure_reason == "oom" and "0.00 GiB is free" in squeezed.error_message

"""The ``fused`` variant's kernels: their cases (``interpreted_llama_kernels.py``) in Triton's interpreter
on this CPU, in a process of their own (Triton reads TRITON_INTERPRET when it is imported); and where the
fused decode cannot run, the reason, and a probe that measures ``graph``'s step and says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuperfd.probe_child.workloads.llama.fused import fused_unavailable  # noqa: E402
from gpuperfd.probe_child.workloads.llama.static import StaticLlama  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_llama  # noqa: E402

CASES = Path(__file__).with_name("interpreted_llama_kernels.py")


def test_the_kernels_in_tritons_interpreter() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout and "skipped" not in out.stdout


def test_where_the_fused_decode_cannot_run_it_says_why() -> None:
    cpu = torch.device("cpu")
    assert fused_unavailable(cpu, 2) == "the fused decode runs batch 1 only (batch 2)"
    assert fused_unavailable(cpu, 1) == "the fused decode's Triton kernels need a CUDA device"
    model = build_llama("llama-tiny", cpu, torch.float32)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="batch_size: the fused decode runs batch 1 only, got 2"):
            StaticLlama(model, 2, 4, 8, fused_decode=True)
        with pytest.raises(ValueError, match="fused and compiled"):
            StaticLlama(model, 1, 4, 8, fused_decode=True, compile_steps=True)


def test_the_fused_variant_on_a_cpu_measures_graphs_step_and_says_why() -> None:
    """The GPU presets' variant (``fused``) on a CPU: measured with ``graph``'s step, answers checked,
    the reason published (never a silent stand-in)."""
    from gpuperfd.probe_child import harness
    from gpuperfd.probe_data.spec import ProbeSpec

    assert ProbeSpec("llm", preset="llama-3.1-8b").variant == ProbeSpec("llm", preset="llama-3.2-1b").variant == "fused"
    result = harness.execute(ProbeSpec("llm", preset="llama-tiny", variant="fused", batch_size=1, repeats=2,
                                       measure_seconds=0.05, busy_profile_seconds=0.0))
    assert result.status == "ok", result.error_message
    assert result.variant == "fused" and result.correctness["status"] == "ok"
    assert result.extra["fused_error"] == "the fused decode's Triton kernels need a CUDA device"
    assert result.extra["step_forms"]["fused_decode_kernels"] is False
    assert result.throughput["decode_tokens_per_second"] > 0


def test_a_fused_step_triton_cannot_launch_measures_graphs_step_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton failing for real (its kernels launched on this GPU-less machine, outside the interpreter):
    the point measures ``graph``'s step, its answers checked, Triton's error published as the reason."""
    from gpuperfd.probe_child import harness
    from gpuperfd.probe_child.workloads.llama import probe
    from gpuperfd.probe_data.spec import ProbeSpec

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(probe, "fused_unavailable", lambda device, batch: None)  # as if on a CUDA card
    result = harness.execute(ProbeSpec("llm", preset="llama-tiny", variant="fused", batch_size=1, repeats=2,
                                       measure_seconds=0.05, busy_profile_seconds=0.0))
    assert result.status == "ok", result.error_message
    assert result.correctness["status"] == "ok"
    assert result.extra["fused_error"] and "CUDA device" not in result.extra["fused_error"]
    assert result.extra["step_forms"]["fused_decode_kernels"] is False


def test_a_speculative_point_whose_fused_steps_fail_runs_graphs_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuperfd.probe_child import harness
    from gpuperfd.probe_child.workloads.llama import probe
    from gpuperfd.probe_data.spec import ProbeSpec

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(probe, "fused_unavailable", lambda device, batch: None)
    result = harness.execute(ProbeSpec("llm", preset="llama-tiny-spec", batch_size=1, repeats=2,
                                       measure_seconds=0.05, busy_profile_seconds=0.0))
    assert result.status == "ok", result.error_message
    assert result.extra["fused_error"] and result.extra["fused_decode_kernels"] is False
    assert result.extra["speculative"]["at_rates"]

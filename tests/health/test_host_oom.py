"""A probe child killed for host memory (``host_oom``) is never held against the GPU."""

from __future__ import annotations

from gpuperfd.health.checks import ACTIVE_CHECKS, by_id, defaults
from gpuperfd.health.evaluate import GpuInputs, consecutive_failures, probe_outcome


def _runs(*reasons: str) -> list[dict]:
    return [{"time": float(i), "status": "failed", "failure_reason": r, "probe": "llm", "preset": "gpt2"}
            for i, r in enumerate(reasons)]


def test_host_oom_does_not_count_as_a_gpu_failure() -> None:
    check, settings = by_id()["probe_failures"], defaults()
    limit = int(settings[check.threshold.key])  # type: ignore[union-attr]
    gpu = GpuInputs(gpu=0, uuid="GPU-a", runs=_runs(*["host_oom"] * (limit + 2)))
    assert consecutive_failures(check, gpu, [gpu], settings, 100.0) == []
    crashed = GpuInputs(gpu=0, uuid="GPU-a", runs=_runs(*["crash"] * limit))
    assert consecutive_failures(check, crashed, [crashed], settings, 100.0) != []  # the same count of crashes does


def test_the_check_probe_killed_for_host_memory_is_unknown_not_unhealthy() -> None:
    check = next(c for c in ACTIVE_CHECKS if c.id == "check_probe_failed")
    gpu = GpuInputs(gpu=0, uuid="GPU-a", runs=_runs("host_oom"))
    (reason,) = probe_outcome(check, gpu, [gpu], defaults(), 100.0)
    assert (reason.severity, reason.action) == ("unknown", "none")

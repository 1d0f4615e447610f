"""Probe workloads that measure the GPU, not Python: LLM, ViT, attention, training.

Public API (none of it imports torch; the workloads do, inside the probe child):

* :class:`~gpuperfd.probes.spec.ProbeSpec` - what to run (presets, validation);
* :func:`~gpuperfd.probes.runner.run_probe` - run it in an isolated child process;
* :class:`~gpuperfd.probes.result.ProbeResult` and :func:`~gpuperfd.probes.result.summarize`.

See docs/probes.md for the measurement method and GPU figures.
"""

from gpuperfd.probes.result import PRIMARY_METRIC, ProbeResult, RepeatResult, summarize
from gpuperfd.probes.runner import check_idle, run_probe
from gpuperfd.probes.spec import DEFAULT_PRESET, PRESETS, PROBES, ProbeSpec

__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "PRIMARY_METRIC",
    "PROBES",
    "ProbeResult",
    "ProbeSpec",
    "RepeatResult",
    "check_idle",
    "run_probe",
    "summarize",
]

"""What changes when a probe runs on the CPU: the dtype chosen when none is given, the time bound, the advice.

The presets are GPU presets: half precision (float16 for llm, bfloat16 for the others) and batches
sized for an H100. On a CPU, float16 matrix products are emulated: on the 2-core development VM
(torch 2.13, ``benchmarks``-style 1024x1024 matmul) float32 ran 67 GFLOP/s and float16 1.0 GFLOP/s, so
``probe llm --device cpu --preset gpt2`` ran out of its 60-odd seconds at every point. Hence:

* no ``dtype`` given and a CPU device: float32 (:func:`cpu_dtype`), whatever the preset says;
* an explicit half dtype on a CPU is the user's choice, warned about once (:func:`half_on_cpu_warning`);
* the CPU's time bound grows with the work of the point (:func:`cpu_timeout_seconds`): model build by
  its parameters, each iteration by its floating-point operations (the kind's row, ``kind_work.py``) at a
  deliberately low assumed rate;
* a point that ran out of time says what to change (:func:`timeout_hint`).

Plain data and arithmetic: no torch (the daemon and the CLI parent import it).
"""

from __future__ import annotations

from typing import Any

from gpuperfd.probe_data.kinds import probe_kind

__all__ = ["CPU_DTYPE", "cpu_dtype", "cpu_timeout_seconds",
           "half_on_cpu_warning", "timeout_hint", "CPU_FLOPS", "MAX_CPU_TIMEOUT_SECONDS"]

#: The dtype a CPU point runs in when none was given.
CPU_DTYPE = "float32"
#: Floating-point operations a second assumed of a CPU for a probe's iterations: low on purpose (a
#: small, shared host; decode's small matrix products), since it bounds a point rather than predicts it.
CPU_FLOPS = 10e9
#: How much slower than float32 each dtype may run on a CPU (float16 is emulated: 67x on the dev VM;
#: bfloat16 is fast where the CPU has it, emulated elsewhere).
CPU_DTYPE_SLOWDOWN = {"float32": 1.0, "bfloat16": 8.0, "float16": 64.0}
#: Parameters a second a CPU builds (random initialization) at least.
CPU_BUILD_PARAMETERS_PER_SECOND = 20e6
#: The CPU time bound never exceeds this (beyond it: a smaller preset or batch, said by the hint).
MAX_CPU_TIMEOUT_SECONDS = 4 * 3600.0
#: A CPU point's fixed cost: the child's start, torch's import, the first calls (as before this module).
CPU_SETUP_SECONDS = 60.0


def cpu_dtype(dtype: str, given: bool, is_cuda: bool) -> str:
    """The dtype a point runs in: the one given, or on a CPU float32 instead of the preset's half precision."""
    return dtype if given or is_cuda else CPU_DTYPE


def cpu_timeout_seconds(spec: Any, windows_seconds: float) -> float:
    """The hard time bound of a CPU point: setup, the model's build, and every iteration it must run
    (warmup, one a window at least, the answer check and the busy pass) at :data:`CPU_FLOPS` slowed by
    its dtype, plus three times its timed windows; at most :data:`MAX_CPU_TIMEOUT_SECONDS`."""
    kind = probe_kind(spec.probe)
    rate = CPU_FLOPS / CPU_DTYPE_SLOWDOWN.get(spec.dtype, 1.0)
    iterations = spec.warmup + spec.repeats + 2
    work = iterations * kind.flops(spec) / rate
    build = kind.parameters(spec) / CPU_BUILD_PARAMETERS_PER_SECOND
    return min(CPU_SETUP_SECONDS + build + work + 3.0 * windows_seconds, MAX_CPU_TIMEOUT_SECONDS)


def half_on_cpu_warning(specs: list[Any]) -> str | None:
    """One warning for a run whose CPU points were asked for in float16 (only ever given explicitly)."""
    half = [s for s in specs if not s.is_cuda and s.dtype == "float16"]
    if not half:
        return None
    return (f"warning: --dtype float16 on the CPU ({len(half)} point(s)): float16 matrix products are emulated "
            "there, often 10-70x slower than float32; drop --dtype (float32 is the CPU default) unless "
            "float16 itself is what you measure")


def timeout_hint(spec: Any, timeout_seconds: float) -> str:
    """What to change after a point ran out of ``timeout_seconds``: a longer bound, a faster dtype on a
    CPU, or less work."""
    changes = ["--timeout S"]
    if not spec.is_cuda and spec.dtype != CPU_DTYPE:
        changes.append(f"--dtype {CPU_DTYPE}")
    where = " on the CPU" if not spec.is_cuda else ""
    return (f"the point ran out of its {timeout_seconds:.0f} s{where}: change {', '.join(changes)}, "
            "or a smaller --preset or --batch-size")

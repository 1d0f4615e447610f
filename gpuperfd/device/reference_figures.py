"""Real GPU figures the simulated GPU is derived from: one table, with its sources.

The simulator (:mod:`gpuperfd.device.simulated`) calibrates each workload
profile from these rows, and ``tests/device/test_simulated_vs_real.py`` checks the
simulated default probes against the same rows, so a change to the physics
cannot drift away from the cards silently. Pure data: no imports, no code.

Each probe row is what ``gpuperfd probe NAME`` (default preset, landed
defaults) measured at the card's default 700 W power limit, read-only (no limit
or clock was changed): throughput in the probe's work unit per second, average
power from the hardware energy counter (watts), mean SM clock (MHz), the clock
events seen (``sw_power_cap``: the power cap held the clock below its maximum),
GPU-busy ratio (profiler kernel union) and peak device memory (bytes).

Sources:

* H100: ``/work/shared/reference/h100-probes.json`` (NVIDIA H100 80GB HBM3,
  driver 580.159.04, 2026-11-23, ``gpuperfd probe <name> --repeats 3``).
* H200: ``benchmarks/results/probes_gpu_h200_final_summary.json`` (NVIDIA H200,
  driver 580.159.04, 2026-11-22), rows ``llm_graph_default``,
  ``vit_compiled_default``, ``attention_default``, ``train_default``. That run
  reports attention as FLOP/s; one call of the default preset is
  4 x 16 x 16 x 4096^2 x 128 = 2.199e12 FLOP, so 5.880e14 FLOP/s = 267.4 calls/s.
* GPM: ``h100-probes.json`` ``gpm_during_matmul`` (bf16 8192^3 matmul loop) and
  ``gpm_during_copy`` (fp32 4 GiB device-to-device copy loop), percent / 100.
"""

from __future__ import annotations

#: Power limit every probe row was measured at (the default of both parts), watts.
MEASURED_POWER_LIMIT_WATTS = 700.0

#: GPU model key -> "probe/preset" -> measured figures at the default 700 W limit.
REAL_PROBE_FIGURES: dict[str, dict[str, dict[str, object]]] = {
    "H100": {
        "llm/gpt2": {
            "unit": "token",
            "units_per_second": 104_269.5,
            "average_power_watts": 429.5,
            "sm_clock_mhz": 1980.0,
            "clock_events": (),
            "gpu_busy_ratio": 0.9287,
            "peak_memory_bytes": 1_537_583_104,
        },
        "vit/vit-b16": {
            "unit": "image",
            "units_per_second": 11_658.5,
            "average_power_watts": 698.1,
            "sm_clock_mhz": 1707.0,
            "clock_events": ("sw_power_cap",),
            "gpu_busy_ratio": 0.9659,
            "peak_memory_bytes": 495_215_104,
        },
        "attention/default": {
            "unit": "iteration",
            "units_per_second": 270.6,
            "average_power_watts": 716.1,
            "sm_clock_mhz": 1472.0,
            "clock_events": ("sw_power_cap",),
            "gpu_busy_ratio": 0.9883,
            "peak_memory_bytes": 1_073_743_360,
        },
        "train/gpt2": {
            "unit": "token",
            "units_per_second": 130_429.5,
            "average_power_watts": 534.0,
            "sm_clock_mhz": 1980.0,
            "clock_events": (),
            "gpu_busy_ratio": 0.9716,
            "peak_memory_bytes": 25_394_386_944,
        },
    },
    "H200": {
        "llm/gpt2": {
            "unit": "token",
            "units_per_second": 109_637.9,
            "average_power_watts": 412.1,
            "sm_clock_mhz": 1980.0,
            "clock_events": (),
            "gpu_busy_ratio": 0.9212,
            "peak_memory_bytes": 1_537_583_104,
            # Prefill of the batch's prompts (128 x 128 tokens), from the probe's time to first token.
            "prompt_tokens_per_second": 2_148_844.6,
        },
        "vit/vit-b16": {
            "unit": "image",
            "units_per_second": 12_183.7,
            "average_power_watts": 699.4,
            "sm_clock_mhz": 1698.6,
            "clock_events": ("sw_power_cap",),
            "gpu_busy_ratio": 0.9697,
            "peak_memory_bytes": 495_215_104,
        },
        "attention/default": {
            "unit": "iteration",
            "units_per_second": 267.4,
            "average_power_watts": 695.3,
            "sm_clock_mhz": 1598.8,
            "clock_events": ("sw_power_cap",),
            "gpu_busy_ratio": 0.9896,
            "peak_memory_bytes": 1_073_743_360,
        },
        "train/gpt2": {
            "unit": "token",
            "units_per_second": 150_101.0,
            "average_power_watts": 567.8,
            "sm_clock_mhz": 1980.0,
            "clock_events": (),
            "gpu_busy_ratio": 0.9718,
            "peak_memory_bytes": 25_394_387_968,
        },
    },
}

#: NVML GPM activity (ratios) of an H100 under two pure loads at 700 W: a tensor-bound and a
#: DRAM-bound one. fp16/fp32/fp64 pipes: only fp16 was read (0 in both); a copy uses no FP pipe
#: and a bf16 matmul runs on the tensor cores, so fp32 and fp64 are taken as 0 too.
REAL_GPM_FIGURES: dict[str, dict[str, float]] = {
    "bf16 matmul": {
        "sm_active": 0.9599,
        "sm_occupancy": 0.1419,
        "tensor_active": 0.9317,
        "dram_active": 0.2613,
        "fp16_active": 0.0,
        "fp32_active": 0.0,
        "fp64_active": 0.0,
    },
    "device copy": {
        "sm_active": 0.9929,
        "sm_occupancy": 0.7957,
        "tensor_active": 0.0,
        "dram_active": 0.8962,
        "fp16_active": 0.0,
        "fp32_active": 0.0,
        "fp64_active": 0.0,
    },
}

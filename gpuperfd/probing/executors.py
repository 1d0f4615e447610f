"""How the daemon runs one probe point: in a child process, or on the simulator.

``child_process_executor`` is the real path: the probe runs torch in a child
(:func:`gpuperfd.probes.runner.run_probe`), so a crash, hang or OOM ends that
probe and never the daemon. ``simulated_executor`` loads a simulated GPU with
the profile of the probe and preset (calibrated from the real cards' figures at
700 W; presets without figures of their own run their probe's default preset
profile) for a measured window and derives the result from
the simulator's physics (throughput from the SM clock the cap allows, energy
from the simulated hardware counter), with realistic noise, so sweeps on the
simulator show real-looking curves with a known true optimum.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from gpuperfd.config import ScheduleConfig
from gpuperfd.device.base import Device
from gpuperfd.probes.result import ProbeResult
from gpuperfd.probes.spec import DEFAULT_PRESET

#: The simulator profile of each probe's default preset ("probe/preset").
SIMULATED_PROFILE = {probe: f"{probe}/{preset}" for probe, preset in DEFAULT_PRESET.items()}


def simulated_profile_name(probe: str, preset: str | None) -> str:
    """The simulator profile for ``probe`` at ``preset``: the preset's own where measured,
    else the default preset's (the simulator does not model model size or batch size)."""
    from gpuperfd.device.simulated import WORKLOAD_PROFILES

    name = f"{probe}/{preset or DEFAULT_PRESET[probe]}"
    return name if name in WORKLOAD_PROFILES else SIMULATED_PROFILE[probe]


def child_process_executor(  # type: ignore[no-untyped-def]
    timeout_seconds: float, torch_device: str = "cuda", state_dir: Path | str | None = None
):
    """Run the real probe in a child process on the CUDA device matching the NVML index (or the CPU).

    ``state_dir``: where each running child is recorded, so a restarted daemon can end it.
    """
    from gpuperfd.probes.runner import run_probe
    from gpuperfd.probes.spec import ProbeSpec

    # NVML numbers GPUs by PCI bus id; make CUDA agree so cuda:i is NVML's GPU i.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    # Probe children yield the CPU to the exporter (see probes/child.py).
    os.environ.setdefault("GPUPERFD_PROBE_NICE", "10")

    def execute(device: Device, schedule: ScheduleConfig, abort: threading.Event) -> ProbeResult:
        spec = ProbeSpec(
            probe=schedule.probe,
            preset=schedule.preset,
            device=f"cuda:{device.index}" if torch_device == "cuda" else "cpu",
            **schedule.options,
        )
        return run_probe(
            spec,
            timeout_seconds=timeout_seconds,
            device=device,
            own_pids=(os.getpid(),),
            should_abort=abort.is_set,
            record_dir=state_dir,
        )

    return execute


def _noisy(rng: random.Random, value: float, sigma: float) -> float:
    return max(value * (1.0 + rng.gauss(0.0, sigma)), 0.0)


def simulated_executor(  # type: ignore[no-untyped-def]
    measure_seconds: float, seed: int | None = None, noise: float = 0.004, watch_interval: float = 0.1
):
    """Run a probe on a SimulatedGpu: load it for ``measure_seconds`` and read its physics."""
    from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedGpu

    rng = random.Random(seed)
    lock = threading.Lock()

    def execute(device: Device, schedule: ScheduleConfig, abort: threading.Event) -> ProbeResult:
        if not isinstance(device, SimulatedGpu):
            raise TypeError("the simulated executor needs a simulated GPU")
        preset = schedule.preset or DEFAULT_PRESET[schedule.probe]
        profile = WORKLOAD_PROFILES[simulated_profile_name(schedule.probe, preset)]
        started_at = time.time()
        wall_start = time.monotonic()
        energy_start = device.energy_joules()
        own = os.getpid()
        device.begin_load(profile, pid=own)
        gpm = _window_gpm(device)
        why = None
        try:
            # Like the child runner: a process of someone else's appearing mid-probe aborts it
            # and gives the GPU back at once.
            deadline = time.monotonic() + measure_seconds
            while why is None and (left := deadline - time.monotonic()) > 0:
                if abort.wait(min(left, watch_interval)):
                    why = "aborted by shutdown"
                elif foreign := [p.pid for p in device.compute_processes() if p.pid != own]:
                    why = f"compute process {foreign[0]} appeared on the GPU"
            energy_end = device.energy_joules()
            try:  # what the GPU shows at the end of the loaded window
                temperature, utilization = device.temperature_celsius(), device.utilization().gpu_ratio
            except Exception:  # noqa: BLE001 - a faulty simulated part: leave the telemetry out
                temperature = utilization = None
        finally:
            device.end_load()
        measured = time.monotonic() - wall_start
        if why is not None:
            return ProbeResult.failure(
                schedule.probe, "simulated", preset, "aborted", why, status="aborted",
                device=f"sim:{device.index}", started_at=started_at, wall_seconds=measured,
            )
        point = device.operating_point(profile)
        with lock:
            rate = _noisy(rng, point.units_per_second, noise)
            samples = [_noisy(rng, 1.0, noise * 3) for _ in range(32)]
        units = rate * measured
        energy = energy_end - energy_start
        info = device.info()
        latencies, throughput, unit = _simulated_latencies(schedule, rate, samples, device, profile)
        return ProbeResult(
            probe=schedule.probe,
            variant="simulated",
            preset=preset,
            params=dict(schedule.options),
            device=f"sim:{device.index}",
            gpu_name=info.name,
            compute_capability=info.compute_capability,
            gpu_uuid=info.uuid,
            started_at=started_at,
            wall_seconds=measured,
            measured_seconds=measured,
            work_unit=unit,
            units_of_work=units,
            throughput=throughput,
            latencies=latencies,
            energy_joules=energy,
            average_power_watts=energy / measured,
            energy_per_unit_joules=energy / units if units else None,
            peak_memory_bytes=profile.memory_bytes,
            allocated_memory_bytes=profile.memory_bytes,
            sm_clock_hertz_mean=point.sm_hertz,
            clock_events_seen=sorted(point.clock_events),
            gpu_busy_ratio=profile.activity,
            temperature_celsius_max=temperature,
            gpu_utilization_mean_ratio=utilization,
            power_limit_watts=device.power_limits().enforced_watts,
            gpm_sm_active_mean_ratio=None if gpm is None else gpm.sm_active,
            gpm_tensor_active_mean_ratio=None if gpm is None else gpm.tensor_active,
            gpm_dram_active_mean_ratio=None if gpm is None else gpm.dram_active,
        )

    return execute


def _window_gpm(device: Any) -> Any:
    """The simulated GPU's GPM activity under the probe's load (constant over the window),
    as the child reads it between two GPM samples; None where the model has no GPM."""
    from gpuperfd.device.errors import DeviceError

    if not device.model.has_gpm:
        return None
    try:
        return device.gpm_activity()
    except DeviceError:
        return None


def _simulated_latencies(schedule: ScheduleConfig, rate: float, samples: list[float], device: Any, profile: Any):  # type: ignore[no-untyped-def]
    """Latency lists consistent with the simulated throughput, per probe."""
    from gpuperfd.probes.spec import PRESETS

    preset = PRESETS[schedule.probe].get(schedule.preset or DEFAULT_PRESET[schedule.probe], {})
    options = {**preset, **schedule.options}
    if schedule.probe == "llm":
        from gpuperfd.device.simulated import LLM_PREFILL_SPEEDUP

        batch = int(options.get("batch_size", 1))
        prompt = int(options.get("prompt_tokens", 128))
        output = int(options.get("output_tokens", 128))
        prefill_rate = rate * LLM_PREFILL_SPEEDUP
        tpot = batch / rate
        ttft = batch * prompt / prefill_rate
        request = ttft + output * tpot
        return (
            {
                "ttft_seconds": [ttft * s for s in samples[:8]],
                "tpot_seconds": [tpot * s for s in samples],
                "request_seconds": [request * s for s in samples[:8]],
            },
            {
                "output_tokens_per_second": rate,
                "prompt_tokens_per_second": batch * prompt / ttft,
                "requests_per_second": batch / request,
            },
            "token",
        )
    if schedule.probe == "vit":
        batch = int(options.get("batch_size", 128))
        return {"batch_seconds": [batch / rate * s for s in samples]}, {"images_per_second": rate}, "image"
    if schedule.probe == "attention":
        return {"iteration_seconds": [s / rate for s in samples]}, {"iterations_per_second": rate}, "iteration"
    tokens_per_step = int(options.get("batch_size", 16)) * int(options.get("seq_len", 1024))
    return {"step_seconds": [tokens_per_step / rate * s for s in samples]}, {"tokens_per_second": rate}, "token"

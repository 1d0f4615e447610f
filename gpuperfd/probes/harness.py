"""The measurement harness that runs inside the probe child (imports torch).

One probe point goes: build the workload (model, buffers, CUDA graphs) ->
warmup (at least ``warmup`` iterations and ``warmup_seconds``; nothing recorded)
-> ``repeats`` measured windows -> one short profiled pass for the GPU-busy
fraction -> a :class:`~gpuperfd.probes.result.ProbeResult`.

A measured window, and only it, is bracketed by: a device synchronize, the
hardware energy counter read (NVML ``energy_joules``), an NVTX range, a
background telemetry sampler (clocks, clock events, utilization, temperature,
power every ``sample_interval``), the iterations, a synchronize, the second
counter read. Energy is the counter difference over that window; average power is
that energy over the window's wall time. The host never runs more than two
iterations ahead of the GPU, so a fixed-time window ends close to its nominal
length and the GPU never starves for work either.

GPU-busy fraction (why this method): after the windows, the same loop runs for
``busy_profile_seconds`` under ``torch.profiler`` (CUPTI), and the ratio is the
union of kernel/memcpy/memset intervals over the wall time of that pass. That is
exactly "share of time the GPU was executing work", at microsecond resolution,
and it sees kernels inside CUDA graphs. It runs outside the measured windows
because CUPTI adds host overhead per launch, which would slow down (and flatter)
a CPU-bound variant's throughput. NVML's own utilization (``gpu_utilization_mean_ratio``,
sampled in the windows) is kept as a cross-check: it is coarse (the driver's
1/6-1 s sample period) and counts a period as busy if any kernel ran in it. On a
CPU device the same code measures the union of operator intervals, i.e. the share
of time spent inside torch ops rather than in Python.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gpuperfd.device.base import Device
from gpuperfd.probes.result import ProbeResult, RepeatResult
from gpuperfd.probes.spec import ProbeSpec

log = logging.getLogger(__name__)

__all__ = ["Clock", "ProbeContext", "WindowStats", "Workload", "execute", "busy_ratio_from_trace"]

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: How many iterations the host may run ahead of the GPU inside a window.
_MAX_AHEAD = 2


# --- timing -----------------------------------------------------------------------------


class Clock:
    """Timestamps on the device timeline (CUDA events) or the host clock.

    CUDA events measure what the GPU did without forcing a synchronize per mark;
    the host clock is for CPU devices and for paths that synchronize anyway
    (``sync=True`` makes each host mark wait for the GPU first).
    """

    def __init__(self, cuda: bool, host: bool = False) -> None:
        self.events = cuda and not host
        self.sync = cuda and host
        self._marks: list[Any] = []
        self._seconds: list[float] | None = None

    def mark(self) -> int:
        """Record a timestamp now (in stream order on CUDA); returns its index."""
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            if self.sync:
                torch.cuda.synchronize()
            self._marks.append(time.perf_counter())
        return len(self._marks) - 1

    def __len__(self) -> int:
        return len(self._marks)

    def finalize(self) -> None:
        """Turn marks into seconds since the first mark; call after a synchronize."""
        if not self._marks:
            self._seconds = []
        elif self.events:
            first = self._marks[0]
            self._seconds = [0.0] + [first.elapsed_time(e) / 1000.0 for e in self._marks[1:]]
        else:
            first = self._marks[0]
            self._seconds = [t - first for t in self._marks]

    def seconds(self, start: int, end: int) -> float:
        if self._seconds is None:
            self.finalize()
        assert self._seconds is not None
        return self._seconds[end] - self._seconds[start]

    def diffs(self, indices: list[int]) -> list[float]:
        """Time between consecutive marks in ``indices``."""
        return [self.seconds(a, b) for a, b in zip(indices, indices[1:])]


@dataclass
class WindowStats:
    """What a workload reports for one window (or warmup / profiled pass).

    ``counts`` maps each rate's name to (count, seconds): the rate is their ratio,
    and rates pool over windows by summing both (never by averaging ratios).
    """

    iterations: int
    units: float
    counts: dict[str, tuple[float, float]]
    latencies: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> dict[str, float]:
        return {name: count / secs for name, (count, secs) in self.counts.items() if secs > 0}


class Workload(Protocol):
    """A probe workload; built by each workload module's ``build(spec, ctx)``."""

    work_unit: str
    #: True if the workload synchronizes by itself each iteration (host timestamps are exact).
    host_clock: bool

    def begin(self, clock: Clock) -> None: ...

    def step(self, clock: Clock) -> None: ...

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats: ...

    def describe(self) -> dict[str, Any]: ...


# --- the device context -----------------------------------------------------------------


@dataclass
class Telemetry:
    samples: int = 0
    sm_clock: list[float] = field(default_factory=list)
    mem_clock: list[float] = field(default_factory=list)
    gpu_util: list[float] = field(default_factory=list)
    mem_util: list[float] = field(default_factory=list)
    temperature: list[float] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    clock_events: set[str] = field(default_factory=set)

    def merge(self, other: Telemetry) -> None:
        self.samples += other.samples
        for name in ("sm_clock", "mem_clock", "gpu_util", "mem_util", "temperature", "power"):
            getattr(self, name).extend(getattr(other, name))
        self.clock_events |= other.clock_events


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Sampler:
    """Background NVML sampling during a window (no-op without a device)."""

    def __init__(self, device: Device | None, interval: float) -> None:
        self.device = device
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.data = Telemetry()

    def start(self) -> None:
        if self.device is None:
            return
        self._stop.clear()
        self.data = Telemetry()
        self._thread = threading.Thread(target=self._run, name="gpuperfd-probe-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # First sample one interval in: the window's own first milliseconds follow a sync.
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        from gpuperfd.device.errors import DeviceError

        dev = self.device
        assert dev is not None
        data = self.data
        data.samples += 1
        with contextlib.suppress(DeviceError):
            clocks = dev.clocks()
            data.sm_clock.append(clocks.sm_hertz)
            data.mem_clock.append(clocks.memory_hertz)
        with contextlib.suppress(DeviceError):
            data.clock_events |= set(dev.clock_events().active)
        with contextlib.suppress(DeviceError):
            util = dev.utilization()
            data.gpu_util.append(util.gpu_ratio)
            data.mem_util.append(util.memory_ratio)
        with contextlib.suppress(DeviceError):
            data.temperature.append(dev.temperature_celsius())
        with contextlib.suppress(DeviceError):
            data.power.append(dev.power_watts())

    def stop(self) -> Telemetry:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5.0)
            self._thread = None
        return self.data


def _open_nvml_device(uuid: str) -> tuple[Device | None, str | None]:
    """The NVML device whose UUID matches torch's; (None, why) if NVML is unavailable."""
    try:
        from gpuperfd.device.nvml import NvmlBackend

        backend = NvmlBackend(indices=None)
        for dev in backend.devices():
            if dev.info().uuid.lower() == uuid.lower():
                return dev, None
        return None, f"no NVML device has uuid {uuid}"
    except Exception as exc:  # noqa: BLE001 - telemetry is optional; the probe still runs
        return None, f"{type(exc).__name__}: {exc}"


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


class ProbeContext:
    """Device, dtype, seeds, NVML telemetry and NVTX for one probe child."""

    def __init__(self, spec: ProbeSpec) -> None:
        self.spec = spec
        self.is_cuda = spec.is_cuda
        self.dtype = _TORCH_DTYPES[spec.dtype]
        self.nvml: Device | None = None
        self.telemetry_error: str | None = None
        self.gpu_name: str | None = None
        self.compute_capability: str | None = None
        self.gpu_uuid: str | None = None
        self.power_limit_watts: float | None = None
        torch.manual_seed(spec.seed)
        if self.is_cuda:
            if not torch.cuda.is_available():
                raise RuntimeError(f"device {spec.device!r} requested but torch.cuda is not available")
            index = spec.cuda_index or 0
            if index >= torch.cuda.device_count():
                raise RuntimeError(f"device {spec.device!r}: only {torch.cuda.device_count()} CUDA device(s)")
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
            props = torch.cuda.get_device_properties(index)
            self.gpu_name = props.name
            self.compute_capability = f"{props.major}.{props.minor}"
            self.gpu_uuid = "GPU-" + str(props.uuid)
            self.memory_total_bytes = int(props.total_memory)
            torch.cuda.manual_seed_all(spec.seed)
            # Matmuls in float32 use TF32 on the tensor cores, as a real job would.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.nvml, self.telemetry_error = _open_nvml_device(self.gpu_uuid)
            if self.nvml is not None:
                from gpuperfd.device.errors import DeviceError

                try:
                    self.power_limit_watts = self.nvml.power_limits().enforced_watts
                except DeviceError:
                    pass
        else:
            self.device = torch.device("cpu")
            self.memory_total_bytes = None
        self._nvtx = self.is_cuda and hasattr(torch.cuda, "nvtx")

    def identity(self) -> dict[str, Any]:
        return {"gpu_name": self.gpu_name, "compute_capability": self.compute_capability, "gpu_uuid": self.gpu_uuid}

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def generator(self, offset: int = 0) -> torch.Generator:
        """A seeded generator on the probe's device (reproducible inputs)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.spec.seed + offset)
        return gen

    def new_clock(self, host: bool = False) -> Clock:
        return Clock(self.is_cuda, host=host)

    @contextlib.contextmanager
    def nvtx(self, name: str) -> Iterator[None]:
        """An NVTX range (Nsight Systems shows it on the timeline); no-op on CPU."""
        if self._nvtx:
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield

    def energy(self) -> float | None:
        if self.nvml is None:
            return None
        from gpuperfd.device.errors import DeviceError

        try:
            return self.nvml.energy_joules()
        except DeviceError as exc:
            self.telemetry_error = f"energy_joules: {exc}"
            return None

    def apply_memory_limit(self, limit: int | None) -> None:
        """Cap what this process may allocate so an oversized point fails with a real OOM."""
        if limit is None:
            return
        if self.is_cuda:
            total = self.memory_total_bytes or 1
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), self.device)
        else:
            current = _vm_bytes() or 0
            _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            new = current + limit
            if hard != resource.RLIM_INFINITY:
                new = min(new, hard)
            resource.setrlimit(resource.RLIMIT_AS, (new, hard))

    def reset_peak_memory(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def memory(self) -> tuple[int | None, int | None]:
        """(peak, current): CUDA allocator bytes, or the process's resident set on CPU."""
        if self.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.memory_allocated(self.device))
        current = _rss_bytes()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        # The kernel updates the high-water mark lazily; it can trail the current size.
        return max(int(peak), current or 0), current


# --- faults (tests only) ----------------------------------------------------------------


def _inject_fault(kind: str, ctx: ProbeContext) -> None:
    """Fail on purpose, for the runner's isolation tests (see ProbeSpec.inject_fault)."""
    if kind == "exception":
        raise RuntimeError("injected fault: exception")
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)
        raise RuntimeError("injected crash did not kill the process")
    if kind == "oom":
        limit = ctx.spec.memory_limit_bytes or (512 << 20)
        if ctx.spec.memory_limit_bytes is None:
            ctx.apply_memory_limit(limit)
        chunk = 64 << 20
        held: list[torch.Tensor] = []
        try:
            # A real allocation failure: RLIMIT_AS on CPU, the allocator's cap on CUDA.
            # torch.empty does not touch the pages, so the CPU path costs no physical memory.
            while True:
                held.append(torch.empty(chunk, dtype=torch.uint8, device=ctx.device))
                if len(held) * chunk > 4 * limit + (1 << 30):
                    raise torch.OutOfMemoryError(
                        f"injected oom: allocated {len(held) * chunk} bytes without hitting the {limit}-byte limit"
                    )
        finally:
            held.clear()
    if kind == "cuda_error":
        if ctx.is_cuda:
            # Out-of-bounds gather: a device-side assert, the sticky kind of CUDA error.
            values = torch.zeros(4, device=ctx.device)
            index = torch.tensor([1 << 20], device=ctx.device)
            values[index].sum().item()
            torch.cuda.synchronize()
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected fault; no GPU here)")
    raise ValueError(f"inject_fault: unknown fault {kind!r}")


# --- GPU-busy fraction ------------------------------------------------------------------

_BUSY_WINDOW = "gpuperfd_busy_window"
_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def busy_ratio_from_trace(events: list[dict[str, Any]], device_kind: str) -> tuple[float | None, dict[str, Any]]:
    """Union of device-activity intervals inside the busy window, over the window's length.

    ``device_kind`` "cuda" counts kernels, memcpys and memsets; "cpu" counts torch
    operator intervals (nested ones are covered by the union).
    """
    window = None
    for ev in events:
        if ev.get("ph") == "X" and ev.get("name") == _BUSY_WINDOW and ev.get("cat") == "user_annotation":
            window = (float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)))
            break
    if window is None or window[1] <= window[0]:
        return None, {"busy_error": "busy window not found in the profiler trace"}
    categories = _DEVICE_CATEGORIES if device_kind == "cuda" else {"cpu_op"}
    intervals = []
    count = 0
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in categories:
            continue
        start = float(ev["ts"])
        end = start + float(ev.get("dur", 0.0))
        start, end = max(start, window[0]), min(end, window[1])
        if end > start:
            intervals.append((start, end))
            count += 1
    intervals.sort()
    busy = 0.0
    cur_start = cur_end = None
    for start, end in intervals:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        busy += cur_end - cur_start
    length = window[1] - window[0]
    return min(busy / length, 1.0), {"busy_window_seconds": length / 1e6, "busy_activities": count}


def _run_loop(ctx: ProbeContext, workload: Workload, clock: Clock, seconds: float, iterations: int | None,
              min_iterations: int = 1, on_step: Callable[[int], None] | None = None) -> tuple[int, float]:
    """Run steps until ``iterations`` (if given) or ``seconds`` have passed; returns (n, wall)."""
    ahead: deque[Any] = deque()
    n = 0
    t0 = time.perf_counter()
    workload.begin(clock)
    while True:
        workload.step(clock)
        n += 1
        if on_step is not None:
            on_step(n)
        if ctx.is_cuda and not workload.host_clock:
            event = torch.cuda.Event()
            event.record()
            ahead.append(event)
            while len(ahead) > _MAX_AHEAD:
                ahead.popleft().synchronize()
        if iterations is not None:
            if n >= iterations:
                break
        elif n >= min_iterations and time.perf_counter() - t0 >= seconds:
            break
    ctx.synchronize()
    return n, time.perf_counter() - t0


def _measure_busy(ctx: ProbeContext, workload: Workload, seconds: float) -> tuple[float | None, dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if ctx.is_cuda:
        activities.append(ProfilerActivity.CUDA)
    clock = ctx.new_clock(host=workload.host_clock)
    with ctx.nvtx("gpuperfd:busy_profile"):
        with profile(activities=activities) as prof:
            with record_function(_BUSY_WINDOW):
                ctx.synchronize()
                n, wall = _run_loop(ctx, workload, clock, seconds, None)
    workload.end(clock, n, wall)
    fd, path = tempfile.mkstemp(prefix="gpuperfd-busy-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    ratio, info = busy_ratio_from_trace(events, "cuda" if ctx.is_cuda else "cpu")
    info["busy_iterations"] = n
    return ratio, info


# --- the probe --------------------------------------------------------------------------


def _load_workload(spec: ProbeSpec, ctx: ProbeContext) -> Workload:
    if spec.probe == "llm":
        from gpuperfd.probes import llm as module
    elif spec.probe == "vit":
        from gpuperfd.probes import vit as module  # type: ignore[no-redef]
    elif spec.probe == "attention":
        from gpuperfd.probes import attention as module  # type: ignore[no-redef]
    elif spec.probe == "train":
        from gpuperfd.probes import train as module  # type: ignore[no-redef]
    else:  # pragma: no cover - spec validation stops this
        raise ValueError(f"probe: unknown probe {spec.probe!r}")
    return module.build(spec, ctx)


def execute(
    spec: ProbeSpec,
    progress: Callable[..., None] | None = None,
    identity: dict[str, Any] | None = None,
) -> ProbeResult:
    """Run one probe point in this process (the child) and return its result."""
    t_start = time.perf_counter()
    started_at = time.time()
    report = progress or (lambda **_: None)
    ctx = ProbeContext(spec)
    if identity is not None:
        identity.update(ctx.identity())
    ctx.apply_memory_limit(spec.memory_limit_bytes)
    report(phase="setup")
    with ctx.nvtx("gpuperfd:setup"):
        workload = _load_workload(spec, ctx)
    ctx.synchronize()
    setup_seconds = time.perf_counter() - t_start

    report(phase="warmup")
    ctx.reset_peak_memory()
    warm_clock = ctx.new_clock(host=workload.host_clock)
    with ctx.nvtx("gpuperfd:warmup"):
        if spec.warmup > 0 or spec.warmup_seconds > 0:
            n_warm, warm_seconds = _run_loop(ctx, workload, warm_clock, spec.warmup_seconds, None,
                                             min_iterations=max(spec.warmup, 1))
            workload.end(warm_clock, n_warm, warm_seconds)
        else:
            n_warm, warm_seconds = 0, 0.0

    sampler = Sampler(ctx.nvml, spec.sample_interval)
    repeats: list[RepeatResult] = []
    latencies: dict[str, list[float]] = {}
    all_telemetry = Telemetry()
    extras: list[dict[str, Any]] = []
    for index in range(spec.repeats):
        clock = ctx.new_clock(host=workload.host_clock)
        ctx.synchronize()
        with ctx.nvtx(f"gpuperfd:measure[{index}]"):
            e0 = ctx.energy()
            sampler.start()
            if index == 0 and spec.inject_fault is not None:
                _inject_fault(spec.inject_fault, ctx)
            n, seconds = _run_loop(ctx, workload, clock, spec.measure_seconds, spec.iterations)
            e1 = ctx.energy()
        telemetry = sampler.stop()
        all_telemetry.merge(telemetry)
        stats = workload.end(clock, n, seconds)
        energy = e1 - e0 if e0 is not None and e1 is not None else None
        repeats.append(RepeatResult(
            index=index,
            measured_seconds=seconds,
            units_of_work=stats.units,
            throughput=stats.throughput,
            energy_joules=energy,
            average_power_watts=energy / seconds if energy is not None and seconds > 0 else None,
            energy_per_unit_joules=energy / stats.units if energy is not None and stats.units else None,
            sm_clock_hertz_mean=_mean(telemetry.sm_clock),
            memory_clock_hertz_mean=_mean(telemetry.mem_clock),
            clock_events_seen=sorted(telemetry.clock_events),
            temperature_celsius_max=max(telemetry.temperature) if telemetry.temperature else None,
            gpu_utilization_mean_ratio=_mean(telemetry.gpu_util),
            memory_utilization_mean_ratio=_mean(telemetry.mem_util),
            telemetry_samples=telemetry.samples,
            iterations=n,
            extra={**stats.extra, "counts": {k: [float(c), float(t)] for k, (c, t) in stats.counts.items()}},
        ))
        extras.append(stats.extra)
        for name, samples in stats.latencies.items():
            latencies.setdefault(name, []).extend(samples)
        report(phase="measure", repeat=index + 1, repeats=spec.repeats)

    peak, allocated = ctx.memory()

    busy: float | None = None
    busy_info: dict[str, Any] = {}
    busy_method = None
    if spec.busy_profile_seconds > 0:
        report(phase="busy_profile")
        try:
            busy, busy_info = _measure_busy(ctx, workload, spec.busy_profile_seconds)
            busy_method = "profiler_kernel_union" if ctx.is_cuda else "profiler_cpu_op_union"
        except Exception as exc:  # noqa: BLE001 - fall back to NVML's view rather than lose the point
            busy_info = {"busy_error": f"{type(exc).__name__}: {exc}"}
    if busy is None and all_telemetry.gpu_util:
        busy = _mean(all_telemetry.gpu_util)
        busy_method = "nvml_utilization"

    measured = sum(r.measured_seconds for r in repeats)
    units = sum(r.units_of_work for r in repeats)
    energies = [r.energy_joules for r in repeats]
    energy_total = sum(energies) if energies and all(e is not None for e in energies) else None  # type: ignore[misc]
    pooled = _pool_throughput(repeats)

    extra: dict[str, Any] = dict(workload.describe())
    extra.update({
        "setup_seconds": setup_seconds,
        "warmup_iterations": n_warm,
        "warmup_seconds": warm_seconds,
        "gpu_busy_method": busy_method,
        **busy_info,
        "torch_version": torch.__version__,
        "iterations": sum(r.iterations for r in repeats),
        "power_samples_mean_watts": _mean(all_telemetry.power),
        "telemetry_samples": all_telemetry.samples,
    })
    if extras and "loss" in extras[-1]:
        extra["loss"] = extras[-1]["loss"]
        extra["loss_first"] = extras[0].get("loss_first")
    if ctx.telemetry_error:
        extra["telemetry_error"] = ctx.telemetry_error
    if not ctx.is_cuda:
        extra["cpu_model"] = _cpu_model()
        extra["cpu_threads"] = torch.get_num_threads()
    try:
        import transformers

        extra["transformers_version"] = transformers.__version__
    except ImportError:  # attention needs no transformers
        pass

    return ProbeResult(
        probe=spec.probe,
        variant=spec.variant,
        preset=spec.preset,
        params=spec.params(),
        status="ok",
        device=str(ctx.device),
        gpu_name=ctx.gpu_name,
        compute_capability=ctx.compute_capability,
        gpu_uuid=ctx.gpu_uuid,
        started_at=started_at,
        wall_seconds=time.perf_counter() - t_start,
        measured_seconds=measured,
        work_unit=workload.work_unit,
        units_of_work=units,
        throughput=pooled,
        latencies=latencies,
        energy_joules=energy_total,
        average_power_watts=energy_total / measured if energy_total is not None and measured > 0 else None,
        energy_per_unit_joules=energy_total / units if energy_total is not None and units else None,
        peak_memory_bytes=peak,
        allocated_memory_bytes=allocated,
        sm_clock_hertz_mean=_mean(all_telemetry.sm_clock),
        memory_clock_hertz_mean=_mean(all_telemetry.mem_clock),
        clock_events_seen=sorted(all_telemetry.clock_events),
        temperature_celsius_max=max(all_telemetry.temperature) if all_telemetry.temperature else None,
        gpu_utilization_mean_ratio=_mean(all_telemetry.gpu_util),
        memory_utilization_mean_ratio=_mean(all_telemetry.mem_util),
        gpu_busy_ratio=busy,
        low_gpu_busy=busy is not None and busy < spec.gpu_busy_threshold,
        power_limit_watts=ctx.power_limit_watts,
        repeats=repeats,
        extra=extra,
    )


def _pool_throughput(repeats: list[RepeatResult]) -> dict[str, float]:
    """Rates over all windows together: total count over total seconds for each rate."""
    totals: dict[str, list[float]] = {}
    for rep in repeats:
        for name, (count, secs) in rep.extra.get("counts", {}).items():
            acc = totals.setdefault(name, [0.0, 0.0])
            acc[0] += count
            acc[1] += secs
    return {name: count / secs for name, (count, secs) in totals.items() if secs > 0}

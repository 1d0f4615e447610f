"""What a workload sees inside the probe child: the device context, clocks, window statistics,
and the background telemetry sampler of a measured window (imports torch).

The workloads import this module; the harness that runs them imports it too, never the other way
round, so the workload modules and the harness do not import each other.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gpuperfd.device.base import Device
from gpuperfd.probe_data.spec import ProbeSpec

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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

    def check_plan(self) -> Any:
        """What the answer checks run (a ``correctness.CheckPlan``): the output on the window's inputs
        through the window's path, and a slice to recompute in float64 (probe_child/correctness.py)."""
        ...


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
    #: GPM over whole windows: (seconds between the window's two GPM samples, values by GPM_FIELDS key).
    gpm: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def merge(self, other: Telemetry) -> None:
        self.samples += other.samples
        for name in ("sm_clock", "mem_clock", "gpu_util", "mem_util", "temperature", "power", "gpm"):
            getattr(self, name).extend(getattr(other, name))
        self.clock_events |= other.clock_events

    def gpm_mean(self, key: str) -> float | None:
        """Time-weighted mean of one GPM field over the windows that have it; None if none does."""
        parts = [(seconds, values[key]) for seconds, values in self.gpm if key in values and seconds > 0]
        total = sum(seconds for seconds, _ in parts)
        return sum(seconds * value for seconds, value in parts) / total if total > 0 else None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class WindowSampler:
    """Background NVML sampling during a window (no-op without a device)."""

    def __init__(self, device: Device | None, interval: float) -> None:
        self.device = device
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.data = Telemetry()
        #: A GPM sample was taken at the running window's start (the cut's sample gives its mean).
        self._gpm_started = False

    def prime_gpm(self) -> None:
        """Take the device's first GPM sample pair now, outside any window (the first read waits
        ~0.1 s for its second sample); later window bounds cost one sample each."""
        from gpuperfd.device.errors import DeviceError

        if self.device is not None:
            with contextlib.suppress(DeviceError):
                self.device.gpm_metrics()

    def start(self) -> None:
        if self.device is None:
            return
        from gpuperfd.device.errors import DeviceError

        self._stop.clear()
        self.data = Telemetry()
        # GPM: a sample at the window's start; the one at stop gives the mean over the window.
        self._gpm_started = False
        with contextlib.suppress(DeviceError):
            self.device.gpm_metrics()
            self._gpm_started = True
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

    def cut(self) -> Telemetry:
        """End a window without stopping the sampling thread: its telemetry so far, with the GPM
        sample of this bound, and a fresh record for the next window. Back-to-back windows need no
        thread start and join between them, so the GPU idles for as short a time as the host's
        bookkeeping takes (issue 36: every idle gap is a transient of the power controller)."""
        from gpuperfd.device.errors import DeviceError

        window, self.data = self.data, Telemetry()
        if self.device is not None and self._gpm_started:
            with contextlib.suppress(DeviceError):
                gpm = self.device.gpm_metrics()
                window.gpm.append((gpm.interval_seconds, dict(gpm.values)))
        return window

    def close(self) -> None:
        """Stop the sampling thread (after the last :meth:`cut`); what it sampled since is dropped."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5.0)
            self._thread = None

    def stop(self) -> Telemetry:
        """End the one window since :meth:`start`: stop the thread, then :meth:`cut` it."""
        self.close()
        return self.cut()


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


def _statm_bytes(field: int) -> int | None:
    """Field ``field`` of /proc/self/statm (pages) in bytes; None where it cannot be read."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def rss_bytes() -> int | None:
    return _statm_bytes(1)


def vm_bytes() -> int | None:
    return _statm_bytes(0)


def cpu_model() -> str | None:
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
        self.dtype = TORCH_DTYPES[spec.dtype]
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
            self.read_power_limit()
        else:
            self.device = torch.device("cpu")
            self.memory_total_bytes = None
        self._nvtx = self.is_cuda and hasattr(torch.cuda, "nvtx")

    def read_power_limit(self) -> float | None:
        """Read the enforced cap again (a warm child measures at several caps); None without NVML."""
        if self.nvml is not None:
            from gpuperfd.device.errors import DeviceError

            try:
                self.power_limit_watts = self.nvml.power_limits().enforced_watts
            except DeviceError:
                self.power_limit_watts = None
        return self.power_limit_watts

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
            current = vm_bytes() or 0
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
        current = rss_bytes()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        # The kernel updates the high-water mark lazily; it can trail the current size.
        return max(int(peak), current or 0), current



"""The measurement harness that runs inside the probe child (imports torch).

One probe point goes: build the workload (model, buffers, CUDA graphs) ->
warmup (at least ``warmup`` iterations and ``warmup_seconds``; nothing recorded)
-> ``repeats`` measured windows -> one short profiled pass for the GPU-busy
fraction -> a :class:`~gpuperfd.probe_data.result.ProbeResult`.

A measured window, and only it, is bracketed by: a device synchronize, the
hardware energy counter read (NVML ``energy_joules``), an NVTX range, a
background telemetry sampler (clocks, clock events, utilization, temperature,
power every ``sample_interval``), the iterations, a synchronize, the second
counter read. Energy is the counter difference over that window; average power is
that energy over the window's wall time. The host never runs more than two
iterations ahead of the GPU, so a fixed-time window ends close to its nominal
length and the GPU never starves for work either.

GPU-busy fraction (why this method): after the windows, the same loop runs under
``torch.profiler`` (CUPTI) for the iterations that fill ``busy_profile_seconds``
on the GPU (:func:`busy_iterations`), and the ratio is the
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

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuperfd.probe_child import workloads
from gpuperfd.probe_child.busy import measure_busy
from gpuperfd.probe_child.context import (
    ProbeContext,
    Telemetry,
    WindowSampler,
    Workload,
    cpu_model,
    mean,
)
from gpuperfd.probe_child.correctness import run_checks
from gpuperfd.probe_child.faults import inject_fault
from gpuperfd.probe_child.loop import run_loop
from gpuperfd.probe_data.recommend import rate_cv
from gpuperfd.probe_data.result import ProbeResult, RepeatResult, WindowStats
from gpuperfd.probe_data import settle as settle_rule
from gpuperfd.probe_data.spec import WRONG_RESULT_FAULTS, ProbeSpec


@dataclass
class Prepared:
    """A built workload in this process, ready to be measured any number of times (a warm sweep)."""

    spec: ProbeSpec
    ctx: ProbeContext
    workload: Workload
    setup_seconds: float
    measured_points: int = 0
    #: Where the first point's time went before its windows: "context" (device, NVML, CUDA context).
    phase_seconds: dict[str, float] = field(default_factory=dict)


def execute(
    spec: ProbeSpec,
    progress: Callable[..., None] | None = None,
    identity: dict[str, Any] | None = None,
) -> ProbeResult:
    """Run one probe point in this process (the child) and return its result."""
    t_start = time.perf_counter()
    prepared = prepare(spec, progress, identity)
    result = measure(prepared, progress)
    result.wall_seconds = time.perf_counter() - t_start
    return result


def prepare(
    spec: ProbeSpec,
    progress: Callable[..., None] | None = None,
    identity: dict[str, Any] | None = None,
) -> Prepared:
    """Build the workload once: model, buffers, ``torch.compile``, CUDA graphs."""
    t_start = time.perf_counter()
    report = progress or (lambda **_: None)
    ctx = ProbeContext(spec)
    if identity is not None:
        identity.update(ctx.identity())
    ctx.apply_memory_limit(spec.memory_limit_bytes)
    context_seconds = time.perf_counter() - t_start
    report(phase="setup")
    with ctx.nvtx("gpuperfd:setup"):
        workload = workloads.build(spec, ctx)
    ctx.synchronize()
    prepared = Prepared(spec, ctx, workload, time.perf_counter() - t_start)
    prepared.phase_seconds["context"] = context_seconds
    return prepared


def _max_clock(ctx: ProbeContext) -> float | None:
    """The board's maximum SM clock (Hz), where NVML tells it: windows at it are steady whatever their power."""
    from gpuperfd.device.errors import DeviceError

    try:
        return ctx.nvml.clocks().sm_max_hertz if ctx.nvml is not None else None
    except DeviceError:
        return None


@dataclass
class _Settle:
    """The settle judged from the windows' own power and SM-clock trace (issue 60).

    A separate settle loop ran the load for 0.9-2.3 s before the first window even when the GPU was
    steady from the warm-up on (H200, a ready child), and that was most of a daemon probe's time beyond
    its windows. Here the windows start at once: a window is kept once it and the window before it agree
    (:func:`~gpuperfd.probe_data.settle.steady`: mean power within 2 %, mean SM clock within 1 %; a window
    is one power-controller cycle, so two steady ones agree whatever the cycle's phase) or both sit at the
    board's maximum clock; until then each window is set aside as settle. After ``bound`` seconds set
    aside the windows are kept unsettled (``settle_steady: false``), as the settle loop's bound did.
    """

    bound: float
    max_clock: float | None
    seconds: float = 0.0
    #: None while judging; True once two windows agreed; False once the bound passed.
    steady: bool | None = None

    def judge(self, held: _Window | None, window: _Window) -> list[_Window]:
        """The windows to keep now that ``window`` was measured (``held``: the last one set aside)."""
        if self.steady is not None:
            return [window]
        if window.reading == (None, None):  # no power and no clock: nothing to wait for
            self.steady = None if held is None else False
            return [window]
        if held is not None and (settle_rule.steady(held.reading, window.reading)
                                 or settle_rule.at_max_clock(held.reading, window.reading, self.max_clock)):
            self.seconds -= held.seconds  # the held window counts after all
            self.steady = True
            return [held, window]
        self.seconds += window.seconds
        if self.seconds > self.bound:
            self.seconds -= window.seconds
            self.steady = False
            return [window]
        return []


#: A point of a GPU sweep measures at least this many windows and stops once the windows'
#: work rates agree within SWEEP_TARGET_CV, the sweep's noise target (every point's CV <= 0.5 %):
#: a point costs what its noise needs (docs/probes.md, "Warm sweeps"). LLM and training points
#: agree within 0.05 % at once; power-capped ViT and attention scattered by 0.4-1 % while their
#: windows cut the power controller's clock cycle at different phases and followed an idle gap
#: (the sampler's start/join and GPM's first sample); with whole-cycle windows back to back they
#: agree within the target (docs/benchmarks.md, issue 36). Energy is not a stopping test: it is
#: pooled over the windows, and a short window's own energy mostly shows the counter's update
#: step (3-5 % spread at 0.5 s on an H200). Two windows are enough to stop on: whole-cycle windows
#: back to back agreed within 0.32 % at three (H100, issue 36), and the third window was 20 of a
#: default sweep's 113 GPU-s on an H200 (issue 41); windows that disagree still run on to the most.
SWEEP_MIN_REPEATS = 2
SWEEP_TARGET_CV = 0.005
#: Further points (the workload hot, the cap settled under load) measure windows this many times
#: shorter than the first point's, and at most this many times as many (the same longest time).
#: Halving kept every rate CV under 0.5 % on an H200; a third made ViT's and attention's windows
#: disagree, so they ran to the longest time.
SWEEP_LATER_WINDOW_DIVISOR = 2
#: Under a power cap the board's controller moves the SM clock in a cycle of about a second
#: (H100, driver 580: 0.98 s under attention, 1.00 s under ViT, benchmarks/clock_trace.py). A
#: window that cuts that cycle at different phases scatters with it: on one 20 s trace of attention,
#: 0.5 s windows scattered by 0.83 %, 0.75 s by 0.49 %, 1.0 s by 0.11 %, 1.5 s by 0.18 %. So the
#: windows of a GPU sweep's points (settled under load) last whole cycles: 1.0 s, the same for the
#: first point (was 1.5 s) and the later ones (were 0.75 s); at most the same longest time.
POWER_CONTROLLER_PERIOD_SECONDS = 1.0


class _PhaseTimer:
    """Wall seconds of each phase of a point (``with timer("settle"): ...``), for the sweep-cost
    benchmark's breakdown: what a point's GPU time is made of, measured where it is spent."""

    def __init__(self, initial: dict[str, float]) -> None:
        self.seconds: dict[str, float] = dict(initial)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _rate_cv(repeats: list[RepeatResult]) -> float:
    """Coefficient of variation of the windows' work rates (inf when it cannot be told)."""
    cv = rate_cv(repeats)
    return math.inf if cv is None else cv


def _windows_agree(repeats: list[RepeatResult]) -> bool:
    """Enough windows, and their work rates agree."""
    return len(repeats) >= SWEEP_MIN_REPEATS and _rate_cv(repeats) <= SWEEP_TARGET_CV


@dataclass
class _Plan:
    """How one point is measured: window length and count, and whether it may stop early."""

    later: bool  # a further point of a warm sweep
    settles_under_load: bool
    adaptive: bool  # stops once its windows agree
    window_seconds: float
    max_windows: int


@dataclass
class _Window:
    """One measured window before it is kept or set aside as settle."""

    seconds: float
    telemetry: Telemetry
    stats: Any  # the workload's window statistics (units, counts, latencies, extra)
    energy: float | None
    iterations: int

    @property
    def reading(self) -> tuple[float | None, float | None]:
        """Mean power (W) and mean SM clock (Hz) over the window, as the settle compares them."""
        return mean(self.telemetry.power), mean(self.telemetry.sm_clock)


@dataclass
class _Windows:
    """The measured windows of one point and what they pooled."""

    repeats: list[RepeatResult]
    latencies: dict[str, list[float]]
    telemetry: Telemetry
    extras: list[dict[str, Any]]

    def keep(self, window: _Window) -> None:
        """Pool ``window`` into the point's figures."""
        self.telemetry.merge(window.telemetry)
        stats = window.stats
        figures = _window_stats(window.telemetry, window.energy, window.seconds, stats.units, stats.throughput)
        self.repeats.append(RepeatResult(
            index=len(self.repeats), measured_seconds=window.seconds, units_of_work=stats.units,
            telemetry_samples=window.telemetry.samples, iterations=window.iterations,
            extra={**stats.extra, "counts": {k: [float(c), float(t)] for k, (c, t) in stats.counts.items()}},
            **figures.window_fields(),
        ))
        self.extras.append(stats.extra)
        for name, samples in stats.latencies.items():
            self.latencies.setdefault(name, []).extend(samples)


def _plan(prepared: Prepared, settle_seconds: float) -> _Plan:
    """A further point of a warm sweep: the workload was built, compiled and loaded moments ago, so
    the windows it sets aside until power and SM clock are steady (:class:`_Settle`) are its warmup,
    the profiled busy pass of the first point stands for the sweep, and its windows are shorter. Every
    sweep point (settled under load, or a further one) stops once its windows agree."""
    spec, ctx = prepared.spec, prepared.ctx
    later = prepared.measured_points > 1
    settles_under_load = settle_seconds > 0 and ctx.nvml is not None
    window_seconds, max_windows = spec.measure_seconds, spec.repeats
    if spec.iterations is None and settles_under_load:  # a GPU sweep's point: whole controller periods
        window_seconds = POWER_CONTROLLER_PERIOD_SECONDS
        max_windows = math.ceil(spec.repeats * spec.measure_seconds / window_seconds)
    elif later and spec.iterations is None:  # fixed-iteration windows keep their length
        window_seconds = spec.measure_seconds / SWEEP_LATER_WINDOW_DIVISOR
        max_windows = spec.repeats * SWEEP_LATER_WINDOW_DIVISOR
    return _Plan(later, settles_under_load, later or settles_under_load, window_seconds, max_windows)


def _warm_up(prepared: Prepared, plan: _Plan) -> tuple[int, float]:
    """The warm-up loop: (iterations, seconds)."""
    spec, ctx, workload = prepared.spec, prepared.ctx, prepared.workload
    ctx.reset_peak_memory()
    warm_clock = ctx.new_clock(host=workload.host_clock)
    with ctx.nvtx("gpuperfd:warmup"):
        if spec.warmup <= 0 and spec.warmup_seconds <= 0:
            return 0, 0.0
        # settled on its windows (set aside until power and clock are steady): the warmup's
        # iterations only, not its seconds (a training step's first window after a pause ran 6% slow
        # on an H200 without the iterations)
        seconds = 0.0 if plan.settles_under_load else spec.warmup_seconds
        n_warm, warm_seconds = run_loop(ctx, workload, warm_clock, seconds, None, min_iterations=max(spec.warmup, 1))
        workload.end(warm_clock, n_warm, warm_seconds)
    return n_warm, warm_seconds


def _window_stats(telemetry: Telemetry, energy: float | None, seconds: float, units: float,
                  throughput: dict[str, float]) -> WindowStats:
    """One window's (or the pooled windows') statistics from its telemetry and energy difference."""
    return WindowStats(
        throughput=throughput,
        **WindowStats.energy_rates(energy, seconds, units),
        sm_clock_hertz_mean=mean(telemetry.sm_clock),
        memory_clock_hertz_mean=mean(telemetry.mem_clock),
        clock_events_seen=sorted(telemetry.clock_events),
        temperature_celsius_max=max(telemetry.temperature) if telemetry.temperature else None,
        gpu_utilization_mean_ratio=mean(telemetry.gpu_util),
        memory_utilization_mean_ratio=mean(telemetry.mem_util),
        gpm_sm_active_mean_ratio=telemetry.gpm_mean("sm_active"),
        gpm_tensor_active_mean_ratio=telemetry.gpm_mean("tensor_any"),
        gpm_dram_active_mean_ratio=telemetry.gpm_mean("dram_active"),
    )


def _measure_windows(prepared: Prepared, plan: _Plan, report: Callable[..., None],
                     settle: _Settle | None) -> _Windows:
    """The measured windows: energy counter and telemetry around each; stop early once they agree.

    With ``settle`` (a GPU point settled under load) the first windows double as the settle: each is
    kept or set aside by :meth:`_Settle.judge`, and only kept windows count toward the plan's number.
    """
    spec, ctx = prepared.spec, prepared.ctx
    # One sampling thread for all the windows, cut at each bound (no start/join between windows);
    # GPM was primed before the warm-up, so no 0.1 s first-sample wait sits right before window 0.
    sampler = WindowSampler(ctx.nvml, spec.sample_interval)
    out = _Windows([], {}, Telemetry(), [])
    held: _Window | None = None
    index = 0
    try:
        while len(out.repeats) < plan.max_windows:
            window = _measure_window(prepared, plan, sampler, index)
            index += 1
            kept = [window] if settle is None else settle.judge(held, window)
            held = None if kept else window
            kept = kept[-(plan.max_windows - len(out.repeats)):]
            for each in kept:
                out.keep(each)
            report(phase="measure" if kept else "settle", repeat=len(out.repeats), repeats=plan.max_windows)
            if plan.adaptive and _windows_agree(out.repeats):
                break
    finally:
        sampler.close()
    return out


def _measure_window(prepared: Prepared, plan: _Plan, sampler: WindowSampler, index: int) -> _Window:
    """One measured window (the sampler runs on; this window is cut off it)."""
    spec, ctx, workload = prepared.spec, prepared.ctx, prepared.workload
    clock = ctx.new_clock(host=workload.host_clock)
    ctx.synchronize()
    with ctx.nvtx(f"gpuperfd:measure[{index}]"):
        e0 = ctx.energy()
        if index == 0:
            sampler.start()
        if (index == 0 and spec.inject_fault is not None and spec.inject_fault not in WRONG_RESULT_FAULTS
                and prepared.measured_points == 1):
            inject_fault(spec.inject_fault, ctx)
        n, seconds = run_loop(ctx, workload, clock, plan.window_seconds, spec.iterations)
        e1 = ctx.energy()
    telemetry = sampler.cut()
    stats = workload.end(clock, n, seconds)
    energy = e1 - e0 if e0 is not None and e1 is not None else None
    return _Window(seconds, telemetry, stats, energy, n)


def busy_iterations(repeats: list[RepeatResult], seconds: float) -> int | None:
    """How many iterations the busy pass runs: as many as the windows say fill ``seconds`` on the GPU
    (at least one), or None (no window told: the pass runs for ``seconds`` of host time).

    A pass timed on the host ran two LLM requests for its 0.1 s (the host enqueues the next request
    before the GPU ends the first): 43,610 kernel records and 1.0-1.4 s of a daemon probe's turn on a
    lent H200 (issue 60), where one request has the whole pattern of prefill and decode."""
    done = [(r.iterations, r.measured_seconds) for r in repeats if r.iterations > 0 and r.measured_seconds > 0]
    if not done:
        return None
    per_iteration = sum(t for _, t in done) / sum(n for n, _ in done)
    return max(1, math.ceil(seconds / per_iteration))


def _busy_pass(prepared: Prepared, plan: _Plan, windows: _Windows,
               report: Callable[..., None]) -> tuple[float | None, str | None, dict[str, Any]]:
    """The GPU-busy fraction (profiler pass, else NVML's utilization): (ratio, method, details).

    On a CPU device there is no GPU to be busy: the ratio is None (never flagged low_gpu_busy; empty
    in the table, the CSV and the JSON alike) and the profiler's operator union is kept as
    ``cpu_op_busy_ratio`` in the details; no NVML fallback (a GPU beside the CPU run is not its device)."""
    spec, ctx = prepared.spec, prepared.ctx
    busy: float | None = None
    busy_info: dict[str, Any] = {}
    busy_method = None
    if spec.busy_profile_seconds > 0 and not (plan.later and ctx.nvml is not None):  # later points: NVML's view
        report(phase="busy_profile")
        try:
            busy, busy_info = measure_busy(ctx, prepared.workload, spec.busy_profile_seconds,
                                           busy_iterations(windows.repeats, spec.busy_profile_seconds))
            busy_method = "profiler_kernel_union" if ctx.is_cuda else "profiler_cpu_op_union"
        except Exception as exc:  # noqa: BLE001 - fall back to NVML's view rather than lose the point
            busy_info = {"busy_error": f"{type(exc).__name__}: {exc}"}
    if not ctx.is_cuda:
        if busy is not None:
            busy_info["cpu_op_busy_ratio"] = busy
        return None, busy_method, busy_info
    if busy is None and windows.telemetry.gpu_util:
        busy = mean(windows.telemetry.gpu_util)
        busy_method = "nvml_utilization"
    return busy, busy_method, busy_info


def _environment(ctx: ProbeContext) -> dict[str, Any]:
    """Versions and identity the record carries (driver, CPU, torch, transformers)."""
    extra: dict[str, Any] = {"torch_version": torch.__version__}
    if ctx.nvml is not None:
        try:
            extra["driver_version"] = ctx.nvml.info().driver_version
        except Exception:  # noqa: BLE001 - identity only; the record says "-" without it
            pass
    if ctx.telemetry_error:
        extra["telemetry_error"] = ctx.telemetry_error
    if not ctx.is_cuda:
        extra["cpu_model"] = cpu_model()
        extra["cpu_threads"] = torch.get_num_threads()
    try:
        import transformers

        extra["transformers_version"] = transformers.__version__
    except ImportError:  # attention needs no transformers
        pass
    return extra


def measure(
    prepared: Prepared,
    progress: Callable[..., None] | None = None,
    settle_seconds: float = 0.0,
) -> ProbeResult:
    """Measure one point with the workload ``prepare`` built: warm-up, settle, measured windows,
    busy pass, then the aggregate (:func:`_aggregate`).

    ``settle_seconds`` bounds the wait for steady power and SM clock after a cap change.
    """
    ctx = prepared.ctx
    setup_seconds = prepared.setup_seconds if prepared.measured_points == 0 else 0.0
    prepared.measured_points += 1
    t_start = time.perf_counter()
    started_at = time.time()
    report = progress or (lambda **_: None)
    ctx.read_power_limit()
    plan = _plan(prepared, settle_seconds)
    phases = _PhaseTimer(prepared.phase_seconds if setup_seconds else {})
    WindowSampler(ctx.nvml, prepared.spec.sample_interval).prime_gpm()  # its ~0.1 s wait before the load, not after
    report(phase="warmup")
    with phases("warmup"):
        n_warm, warm_seconds = _warm_up(prepared, plan)
    settle = _Settle(settle_seconds, _max_clock(ctx)) if plan.settles_under_load else None
    with phases("measure"):
        windows = _measure_windows(prepared, plan, report, settle)
    settle_wait, settled = (settle.seconds, settle.steady) if settle is not None else (0.0, None)
    phases.seconds["measure"] -= settle_wait
    phases.seconds["settle"] = settle_wait
    peak, allocated = ctx.memory()
    report(phase="check")
    with phases("check"):
        checked = _check(prepared)
    with phases("busy"):
        busy, busy_method, busy_info = _busy_pass(prepared, plan, windows, report)
    extra: dict[str, Any] = {
        "setup_seconds": setup_seconds,
        "point_index": prepared.measured_points - 1,
        "settle_seconds": settle_wait,
        "settle_steady": settled,
        "warmup_iterations": n_warm,
        "warmup_seconds": warm_seconds,
        "gpu_busy_method": busy_method,
        "window_seconds": plan.window_seconds,
        "phase_seconds": phases.seconds,
        **busy_info,
    }
    result = _aggregate(prepared, windows, extra, peak, allocated, busy)
    result.correctness = checked
    if checked["status"] == "mismatch":
        result.status, result.failure_reason = "failed", "wrong_result"
        result.error_message = (f"wrong result: {', '.join(checked['failed_checks'])} check failed "
                                f"(slice max abs error {checked['max_abs_error']}, max rel error "
                                f"{checked['max_rel_error']}, {checked['precision']}, {checked['path']})")
    result.started_at, result.wall_seconds = started_at, time.perf_counter() - t_start
    return result


def _check(prepared: Prepared) -> dict[str, Any]:
    """The answer checks (probe_child/correctness.py), after the windows on the window's inputs, so the
    throughput figures never include them; their cost is in ``correctness.seconds``."""
    spec, ctx = prepared.spec, prepared.ctx
    fault = spec.inject_fault if spec.inject_fault in WRONG_RESULT_FAULTS else None
    with ctx.nvtx("gpuperfd:check"):
        return run_checks(prepared.workload.check_plan(), ctx.synchronize, fault)


def _aggregate(prepared: Prepared, windows: _Windows, point_extra: dict[str, Any], peak: int | None,
               allocated: int | None, busy: float | None) -> ProbeResult:
    """Pool the windows into the point's result: units over total time, energy summed, latencies joined."""
    spec, ctx, workload = prepared.spec, prepared.ctx, prepared.workload
    repeats, telemetry = windows.repeats, windows.telemetry
    measured = sum(r.measured_seconds for r in repeats)
    units = sum(r.units_of_work for r in repeats)
    energies = [r.energy_joules for r in repeats]
    energy_total = sum(energies) if energies and all(e is not None for e in energies) else None  # type: ignore[misc]
    extra: dict[str, Any] = dict(workload.describe())
    extra.update(point_extra)
    extra.update({
        "windows_measured": len(repeats),
        "iterations": sum(r.iterations for r in repeats),
        "power_samples_mean_watts": mean(telemetry.power),
        "temperature_celsius_mean": mean(telemetry.temperature),
        "telemetry_samples": telemetry.samples,
    })
    if windows.extras and "loss" in windows.extras[-1]:
        extra["loss"] = windows.extras[-1]["loss"]
        extra["loss_first"] = windows.extras[0].get("loss_first")
    extra.update(_environment(ctx))
    pooled = _window_stats(telemetry, energy_total, measured, units, _pool_throughput(repeats))
    result = ProbeResult(
        probe=spec.probe, variant=spec.variant, preset=spec.preset, params=spec.params(), status="ok",
        device=str(ctx.device), gpu_name=ctx.gpu_name, compute_capability=ctx.compute_capability,
        gpu_uuid=ctx.gpu_uuid, measured_seconds=measured, work_unit=workload.work_unit, units_of_work=units,
        latencies=windows.latencies, peak_memory_bytes=peak, allocated_memory_bytes=allocated,
        gpu_busy_ratio=busy, low_gpu_busy=busy is not None and busy < spec.gpu_busy_threshold,
        power_limit_watts=ctx.power_limit_watts, repeats=repeats, extra=extra, **pooled.window_fields(),
    )
    annotate = getattr(workload, "annotate", None)  # figures from the pooled rates (the Llama roofline share)
    if annotate is not None:
        annotate(result)
    return result


def _pool_throughput(repeats: list[RepeatResult]) -> dict[str, float]:
    """Rates over all windows together: total count over total seconds for each rate."""
    totals: dict[str, list[float]] = {}
    for rep in repeats:
        for name, (count, secs) in rep.extra.get("counts", {}).items():
            acc = totals.setdefault(name, [0.0, 0.0])
            acc[0] += count
            acc[1] += secs
    return {name: count / secs for name, (count, secs) in totals.items() if secs > 0}

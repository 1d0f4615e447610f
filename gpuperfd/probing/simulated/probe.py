"""The simulated probe: a probe point on a ``SimulatedGpu``, from the simulator's physics.

It loads the simulated GPU with the profile of the probe and preset (calibrated from the real cards'
figures at 700 W on the default presets, and scaled to every other point by the work it does:
``simulated/workload.py``) for a measured window and derives the result from the physics: throughput
from the SM clock the cap allows, energy from the simulated hardware counter, with realistic noise,
so sweeps on the simulator show real-looking curves with a known true optimum. What differs per probe (its latencies, rates,
unit of work and extra fields) is one row of :data:`SHAPES`, found through the main latency its registry row
names (``probe_data/kinds.py``); nothing here names a probe.

It lives on the probing side, not in ``device/``, because it builds a ``ProbeResult`` (probe_data/),
which the device layer does not import (tests/test_architecture.py).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data import wire
from gpuperfd.probe_data.kinds import is_llama_point, probe_kind
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import NO_ROOM, ProbeResult
from gpuperfd.probe_data.settle import wait_steady
from gpuperfd.probe_data.spec import DEFAULT_PRESET, GPT2_MODELS, PRESETS
from gpuperfd.probe_data.workload_cost import (NOT_MODELLED_KEY, SIMULATED_NOTE_KEY, SPECULATIVE_NOT_SIMULATED,
                                               llama_no_room, llama_room_bytes)
from gpuperfd.probing.child.standby import take_standby
from gpuperfd.probing.simulated.child import SimulatedChild, pass_time
from gpuperfd.probing.simulated.costs import ChildCosts, costs_for
from gpuperfd.probing.simulated.workload import SimulatedWorkload, merged_options, simulated_workload

if TYPE_CHECKING:  # the simulator's module is imported when a simulated point runs, not with the daemon
    from gpuperfd.device.simulated import SimulatedGpu, WorkloadProfile
    from gpuperfd.probing.child.runner import ProbeChild, ProgressCallback
    from gpuperfd.probing.child.standby import StandbyChildren

#: The simulator profile of each probe's default preset ("probe/preset").
SIMULATED_PROFILE = {probe: f"{probe}/{preset}" for probe, preset in DEFAULT_PRESET.items()}

log = logging.getLogger(__name__)


def simulated_profile_name(probe: str, preset: str | None) -> str:
    """The calibrated simulator profile for ``probe`` at ``preset``: the preset's own where measured,
    else the default preset's (which ``simulated_workload`` scales to the preset's work)."""
    from gpuperfd.device.simulated import WORKLOAD_PROFILES

    name = f"{probe}/{preset or DEFAULT_PRESET[probe]}"
    return name if name in WORKLOAD_PROFILES else SIMULATED_PROFILE[probe]


# --- what differs per probe ------------------------------------------------------------------------

#: (latencies, throughput, unit of work) of one point, as the probe's workload reports them.
Shape = tuple[dict[str, list[float]], dict[str, float], str]


def _llm_shape(rate: float, samples: list[float], options: Mapping[str, Any], work: SimulatedWorkload) -> Shape:
    batch = int(options.get("batch_size", 1))
    prompt = int(options.get("prompt_tokens", 128))
    output = int(options.get("output_tokens", 128))
    tpot = batch / rate
    assert work.ttft_per_tpot is not None
    ttft = tpot * work.ttft_per_tpot
    request = ttft + output * tpot
    return ({"ttft_seconds": [ttft * s for s in samples[:8]], "tpot_seconds": [tpot * s for s in samples],
             "request_seconds": [request * s for s in samples[:8]]},
            {"output_tokens_per_second": rate, "prompt_tokens_per_second": batch * prompt / ttft,
             "requests_per_second": batch / request}, "token")


def _vit_shape(rate: float, samples: list[float], options: Mapping[str, Any],
               work: SimulatedWorkload) -> Shape:
    batch = int(options.get("batch_size", 128))
    return {"batch_seconds": [batch / rate * s for s in samples]}, {"images_per_second": rate}, "image"


def _attention_shape(rate: float, samples: list[float], options: Mapping[str, Any],
                     work: SimulatedWorkload) -> Shape:
    return {"iteration_seconds": [s / rate for s in samples]}, {"iterations_per_second": rate}, "iteration"


def _train_shape(rate: float, samples: list[float], options: Mapping[str, Any],
                 work: SimulatedWorkload) -> Shape:
    tokens_per_step = int(options.get("batch_size", 16)) * int(options.get("seq_len", 1024))
    return {"step_seconds": [tokens_per_step / rate * s for s in samples]}, {"tokens_per_second": rate}, "token"


def _train_loss(request: ProbeRequest, preset: str, units: float, draw: Callable[[], float]) -> dict[str, float]:
    """A train point's loss, as the train probe reports it (``loss`` over the window, ``loss_first``):
    the simulator trains nothing, so it is the cross-entropy of an untrained model of the preset's
    vocabulary (ln V) with a small noisy decrease over the window's tokens."""
    model = request.options.get("model") or PRESETS[request.probe].get(preset, {}).get("model", preset)
    first = math.log(int(GPT2_MODELS.get(str(model), {}).get("vocab_size", 50257)))
    drop = 0.02 * (1.0 - math.exp(-units / 1e5)) + abs(draw())
    return {"loss_first": first, "loss": first * (1.0 - drop)}


@dataclass(frozen=True)
class ProbeShape:
    """One probe's row: its latencies and rates from the simulated rate, and its extra fields."""

    shape: Callable[[float, list[float], Mapping[str, Any], SimulatedWorkload], Shape]
    #: Extra result fields from (request, preset, units of work, a noise draw); None: none.
    extra: Callable[[ProbeRequest, str, float, Callable[[], float]], dict[str, float]] | None = None


#: The simulated result of each kind, by the main latency its registry row names (one kind each).
SHAPES: dict[str, ProbeShape] = {
    "tpot_seconds": ProbeShape(_llm_shape),
    "batch_seconds": ProbeShape(_vit_shape),
    "iteration_seconds": ProbeShape(_attention_shape),
    "step_seconds": ProbeShape(_train_shape, extra=_train_loss),
}


def probe_shape(probe: str) -> ProbeShape:
    """The simulated result shape of ``probe``: its row's main latency names it."""
    return SHAPES[str(probe_kind(probe).main_latency)]


def _correctness(device: SimulatedGpu, probe: str, preset: str) -> dict[str, Any]:
    """What the answer checks say on a simulated GPU: ok with one fingerprint per (model, probe, preset),
    shared by healthy peers; a mismatch and a fingerprint of its own where ``wrong_results`` is set."""
    wrong = bool(getattr(device, "wrong_results", False))
    key = f"{device.model.key}/{probe}/{preset}" + (f"/wrong/{device.index}" if wrong else "")
    return {
        "status": "mismatch" if wrong else "ok", "checks": 2,
        "failed_checks": ["repeat", "slice"] if wrong else [],
        "max_abs_error": 0.5 if wrong else 1e-3, "max_rel_error": 0.4 if wrong else 2e-3,
        "elements_checked": 4096, "fingerprint": hashlib.blake2b(key.encode(), digest_size=8).hexdigest(),
        "peer_comparable": probe_kind(probe).peer_comparable, "precision": "bfloat16", "path": "simulated",
        "seconds": 0.0,
    }


# --- the loaded window -----------------------------------------------------------------------------


class _WindowTelemetry:
    """What the simulated GPU shows over a loaded window, sampled at each watch tick (means and
    maximum, as the child's telemetry sampler gives them); a faulty simulated part leaves it out."""

    def __init__(self, device: SimulatedGpu) -> None:
        self.device = device
        self.values: dict[str, list[float]] = {"temperature": [], "gpu": [], "memory": []}

    def sample(self) -> None:
        try:
            temperature, utilization = self.device.temperature_celsius(), self.device.utilization()
        except Exception:  # noqa: BLE001 - a faulty simulated part: leave the telemetry out
            return
        self.values["temperature"].append(float(temperature))
        self.values["gpu"].append(float(utilization.gpu_ratio))
        self.values["memory"].append(float(utilization.memory_ratio))

    def mean(self, name: str) -> float | None:
        values = self.values[name]
        return sum(values) / len(values) if values else None

    def max(self, name: str) -> float | None:
        return max(self.values[name], default=None)


def _window_gpm(device: SimulatedGpu) -> Any:
    """The simulated GPU's GPM activity under the probe's load (constant over the window),
    as the child reads it between two GPM samples; None where the model has no GPM."""
    if not device.model.has_gpm:
        return None
    try:
        return device.gpm_activity()
    except DeviceError:
        return None


def out_of_memory(device: SimulatedGpu, peak_bytes: int) -> str | None:
    """Why a point whose peak is ``peak_bytes`` cannot run on ``device`` now, in the words torch's
    allocator uses (``torch.OutOfMemoryError``); None when it fits. The point needs its peak and a CUDA
    context beside what the GPU already holds (a user's job, another process)."""
    from gpuperfd.device.simulated import BASE_MEMORY_BYTES

    memory = device.memory()
    free = memory.total_bytes - memory.used_bytes - BASE_MEMORY_BYTES
    if peak_bytes <= free:
        return None
    gib = 2**30
    return (f"OutOfMemoryError: CUDA out of memory. The point needs {peak_bytes / gib:.2f} GiB at its peak; "
            f"GPU {device.index} has a total capacity of {memory.total_bytes / gib:.2f} GiB of which "
            f"{max(free, 0) / gib:.2f} GiB is free (simulated; a smaller batch_size, model or sequence fits)")


def no_room(device: SimulatedGpu, probe: str, preset: str, options: Mapping[str, Any]) -> str | None:
    """Why a Llama point does not fit ``device``'s free memory, in the real child's words (its check
    before the build, :func:`gpuperfd.probe_child.workloads.llama.probe.check_room`: the model's bytes
    with the margin against the card's free memory, a CUDA context already held); None: it fits or is
    no Llama point. docs/probes.md promises ``skipped``/``no_room`` for it, on a real card and here."""
    from gpuperfd.device.simulated import BASE_MEMORY_BYTES

    merged = merged_options(probe, preset, options)
    if not is_llama_point(probe, merged.get("model")):
        return None
    needed = llama_room_bytes(merged)
    memory = device.memory()
    free = max(memory.total_bytes - memory.used_bytes - BASE_MEMORY_BYTES, 0)
    if needed <= free:
        return None
    gib = 2**30
    return llama_no_room(merged, preset, f"{needed / gib:.1f} GiB of GPU memory",
                         f"{device.info().name} has {free / gib:.1f} GiB free of {memory.total_bytes / gib:.1f} GiB")


@dataclass
class _Window:
    """One loaded window: how long, the energy counter's difference, what the GPU showed, and why it
    ended early (None: it ran its length)."""

    measured: float = 0.0
    energy: float = 0.0
    settled: tuple[float, bool | None] = (0.0, None)
    gpm: Any = None
    watch: _WindowTelemetry | None = None
    why: str | None = None
    started_at: float = field(default_factory=time.time)


class SimulatedExecutor:
    """Run a probe on a SimulatedGpu: load it for ``measure_seconds`` and read its physics.

    ``cost_scale``: the real child's costs it charges (:mod:`~gpuperfd.probing.simulated.costs`; 1: as
    measured on an H200, 0: none): the imports before the first point (nothing on the GPU; a ready
    standby child, :meth:`new_child`, saves them), the build and each point's overheads on the GPU."""

    def __init__(self, measure_seconds: float, seed: int | None = None, noise: float = 0.004,
                 watch_interval: float = 0.1, cost_scale: float = 0.0) -> None:
        self.measure_seconds = measure_seconds
        self.noise = noise
        self.watch_interval = watch_interval
        self.cost_scale = cost_scale
        #: Children started before their GPU qualifies (the daemon's; None: none are).
        self.standby: StandbyChildren | None = None
        #: How long a standby child may take to be ready.
        self.timeout_seconds = 600.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._said: set[tuple[str, str]] = set()  # (preset, note) pairs logged

    def costs(self, probe: str) -> ChildCosts:
        return costs_for(probe, self.cost_scale)

    def new_child(self, device: Device, request: ProbeRequest, also: Sequence[ProbeRequest] = ()) -> SimulatedChild:
        """A standby child for ``request``: its imports' time, paid before the GPU qualifies. They stand for
        ``also``'s too: a round's later probe pays none in the carried child, as in a real child that
        imported their code with its own."""
        return SimulatedChild(device, request, self.costs(request.probe).imports)

    def open(self, device: Device, request: ProbeRequest, abort: threading.Event,
             carried: ProbeChild | SimulatedChild | None = None,
             on_progress: ProgressCallback | None = None) -> SimulatedSession:
        """A sweep's session. A ready simulated child (the GPU's standby child, or the round's previous
        session's) has paid the imports; any other carried child is closed (the simulator measures here)."""
        gave_way = None
        if carried is None and device is not None and self.standby is not None:
            carried, gave_way = take_standby(self.standby, device)
        imports = self.costs(request.probe).imports
        if isinstance(carried, SimulatedChild) and carried.alive:  # what is left of its imports
            imports = min(imports, carried.remaining_seconds())
        elif carried is not None:
            carried.close()
        return SimulatedSession(self, device, request, abort, on_progress, imports_seconds=imports, gave_way=gave_way)

    def measure(self, device: Device, request: ProbeRequest, abort: threading.Event,
                settle_seconds: float, hold_seconds: float = 0.0) -> ProbeResult:
        """One point at the cap set now: load (``hold_seconds`` of build and overheads), settle (at most
        ``settle_seconds``), measured window."""
        from gpuperfd.device.simulated import SimulatedGpu

        if not isinstance(device, SimulatedGpu):
            raise TypeError("the simulated executor needs a simulated GPU")
        preset = request.preset or DEFAULT_PRESET[request.probe]
        work = simulated_workload(request.probe, preset, request.options)
        if (message := no_room(device, request.probe, preset, request.options)) is not None:  # the child's check
            return self._not_run(device, request, preset, NO_ROOM, message, "skipped")
        if (message := out_of_memory(device, work.profile.memory_bytes)) is not None:  # as a real card: no window
            return self._not_run(device, request, preset, "oom", message, "failed")
        window = self._load(device, work.profile, abort, settle_seconds, hold_seconds)
        if window.why is not None:  # a user's job is a preemption (skipped), a shutdown an abort
            status, reason = ("aborted", "aborted") if abort.is_set() else ("skipped", "preempted")
            return ProbeResult.failure(request.probe, "simulated", preset, reason, window.why, status=status,
                                       device=f"sim:{device.index}", started_at=window.started_at,
                                       wall_seconds=window.measured)
        return self._result(device, request, preset, work, window)

    def _say_once(self, preset: str, note: str) -> None:
        """Log ``note`` once per preset: a daemon's schedule of it is told in its log, not every point."""
        with self._lock:
            if (preset, note) in self._said:
                return
            self._said.add((preset, note))
        log.warning("preset %s: %s", preset, note)

    @staticmethod
    def _not_run(device: SimulatedGpu, request: ProbeRequest, preset: str, reason: str, message: str,
                 status: str) -> ProbeResult:
        """A point refused before its window (no room, out of memory), with the GPU's identity."""
        info = device.info()
        return ProbeResult.failure(request.probe, "simulated", preset, reason, message, status=status,
                                   device=f"sim:{device.index}", started_at=time.time(), wall_seconds=0.0,
                                   gpu_name=info.name, compute_capability=info.compute_capability,
                                   gpu_uuid=info.uuid, params=dict(request.options))

    def _load(self, device: SimulatedGpu, profile: WorkloadProfile, abort: threading.Event,
              settle_seconds: float, hold_seconds: float = 0.0) -> _Window:
        """Load the GPU, hold it (build, overheads), settle, then watch a measured window; like the child
        runner, a process of someone else's appearing mid-probe ends it and gives the GPU back at once."""
        own = os.getpid()
        window = _Window()
        device.begin_load(profile, pid=own)
        window.gpm = _window_gpm(device)
        wall_start = time.monotonic()
        try:
            if hold_seconds > 0:
                window.why = pass_time(hold_seconds, lambda: _gave_way(device, abort, own))
                if window.why is not None:
                    return window
            if settle_seconds > 0:
                def sample(seconds: float) -> tuple[float | None, float | None]:
                    abort.wait(seconds)
                    return device.power_watts(), device.clocks().sm_hertz

                window.settled = wait_steady(sample, settle_seconds, slice_seconds=min(0.25, settle_seconds / 4))
            wall_start = time.monotonic()
            energy_start = device.energy_joules()
            deadline = time.monotonic() + self.measure_seconds
            window.watch = watch = _WindowTelemetry(device)
            while window.why is None and (left := deadline - time.monotonic()) > 0:
                if abort.wait(min(left, self.watch_interval)):
                    window.why = "aborted by shutdown"
                elif (why := _gave_way(device, abort, own)) is not None:
                    window.why = why
                else:
                    watch.sample()
            window.energy = device.energy_joules() - energy_start
            watch.sample()  # what the GPU shows at the end of the loaded window
        finally:
            device.end_load()
            window.measured = time.monotonic() - wall_start
        return window

    def _noisy(self, value: float, sigma: float) -> float:
        return max(value * (1.0 + self._rng.gauss(0.0, sigma)), 0.0)

    def _result(self, device: SimulatedGpu, request: ProbeRequest, preset: str, work: SimulatedWorkload,
                window: _Window) -> ProbeResult:
        """A finished window's result: the rate the cap allows, with noise, shaped as the probe reports it."""
        row, profile = probe_shape(request.probe), work.profile
        point = device.operating_point(profile)
        with self._lock:
            rate = self._noisy(point.units_per_second, self.noise)
            samples = [self._noisy(1.0, self.noise * 3) for _ in range(32)]
        measured, energy, watch, gpm = window.measured, window.energy, window.watch, window.gpm
        assert watch is not None
        units = rate * measured
        info = device.info()
        options = {**PRESETS[request.probe].get(preset, {}), **request.options}
        latencies, throughput, unit = row.shape(rate, samples, options, work)
        extra: dict[str, Any] = {"settle_seconds": window.settled[0], "settle_steady": window.settled[1],
                                 "temperature_celsius_mean": watch.mean("temperature")}
        if work.not_modelled:  # the simulated figure does not follow these: say so, never draw a flat line
            extra[NOT_MODELLED_KEY] = list(work.not_modelled)
        if options.get("variant") == "speculative":
            extra[SIMULATED_NOTE_KEY] = SPECULATIVE_NOT_SIMULATED
            self._say_once(preset, SPECULATIVE_NOT_SIMULATED)
        if row.extra is not None:
            with self._lock:
                extra.update(row.extra(request, preset, units, lambda: self._rng.gauss(0.0, self.noise)))
        correctness = _correctness(device, request.probe, preset)
        wrong = correctness["status"] == "mismatch"
        return ProbeResult(
            status="failed" if wrong else "ok", failure_reason="wrong_result" if wrong else None,
            error_message="wrong result: repeat, slice check failed (simulated silent data corruption)" if wrong
            else None,
            correctness=correctness, probe=request.probe, variant="simulated", preset=preset,
            params=dict(request.options), device=f"sim:{device.index}", gpu_name=info.name,
            compute_capability=info.compute_capability, gpu_uuid=info.uuid, started_at=window.started_at,
            wall_seconds=measured, measured_seconds=measured, work_unit=unit, units_of_work=units,
            throughput=throughput, latencies=latencies, energy_joules=energy,
            average_power_watts=energy / measured, energy_per_unit_joules=energy / units if units else None,
            peak_memory_bytes=profile.memory_bytes, allocated_memory_bytes=profile.memory_bytes,
            sm_clock_hertz_mean=point.sm_hertz, clock_events_seen=sorted(point.clock_events),
            gpu_busy_ratio=profile.activity, temperature_celsius_max=watch.max("temperature"),
            gpu_utilization_mean_ratio=watch.mean("gpu"), memory_utilization_mean_ratio=watch.mean("memory"),
            power_limit_watts=device.power_limits().enforced_watts,
            gpm_sm_active_mean_ratio=None if gpm is None else gpm.sm_active,
            gpm_tensor_active_mean_ratio=None if gpm is None else gpm.tensor_active,
            gpm_dram_active_mean_ratio=None if gpm is None else gpm.dram_active,
            extra=extra,
        )


class SimulatedSession:
    """A warm sweep on the simulator: the same protocol as the child's (results cross as JSON),
    settle by measurement under load, one point per ``measure``. A request with a ``repeats`` option
    measures that many windows, pooled as the child pools its repeats (``gpuperfd probe --simulate``).

    It charges what the real child costs (the executor's ``cost_scale``): the imports in :meth:`prepare`
    (or before the first point) unless a ready child was carried in, watching the GPU meanwhile (a user's
    job makes every point give way at once: nothing of ours was on the GPU); the build at the first
    point and the overheads at every point, on the GPU."""

    def __init__(self, executor: SimulatedExecutor, device: Device, request: ProbeRequest,
                 abort: threading.Event, on_progress: ProgressCallback | None = None,
                 imports_seconds: float | None = None, gave_way: str | None = None) -> None:
        self.executor, self.device, self.request, self.abort = executor, device, request, abort
        self.on_progress = on_progress
        self.costs = executor.costs(request.probe)
        #: What is left of the child's imports (all of them, or a carried child's rest; 0: paid).
        self.imports_seconds = self.costs.imports if imports_seconds is None else imports_seconds
        self.imported = self.imports_seconds <= 0
        #: Why every point gives way (a user's job came before the GPU was ours); None: it did not.
        self.gave_way = gave_way
        #: Points measured (the simulator builds nothing: this stands for the child's reuse).
        self.points = 0

    def prepare(self) -> None:
        """The imports' time, on the CPU, before the sweep takes the GPU; a job arriving meanwhile ends it."""
        if self.imported or self.gave_way is not None:
            return
        own = os.getpid()
        self.gave_way = pass_time(self.imports_seconds, lambda: _gave_way(self.device, self.abort, own))
        self.imported = self.gave_way is None

    def measure(self, cap_watts: float | None) -> ProbeResult:
        self.prepare()
        if self.gave_way is not None:
            result = _not_run(self.device, self.request, self.gave_way, self.abort)
        elif "repeats" in self.request.options:
            result = self._repeated(int(self.request.options["repeats"]))
        else:
            result = self.executor.measure(self.device, self.request, self.abort, self.request.settle_seconds,
                                           self._hold())
        result.extra.update({"warm": True, "point_index": self.points})
        self.points += 1
        return ProbeResult.from_dict(wire.decode(wire.encode("result", result.to_dict()))[1])

    def _hold(self) -> float:
        """This point's time on the GPU besides settle and windows: the build at the first, overheads always."""
        return self.costs.overhead + (self.costs.build if self.points == 0 else 0.0)

    def _repeated(self, repeats: int) -> ProbeResult:
        """``repeats`` windows (settled before the first) as one point; the first failed window is the point's."""
        windows: list[ProbeResult] = []
        for number in range(1, repeats + 1):
            settle = self.request.settle_seconds if number == 1 else 0.0
            hold = self._hold() if number == 1 else 0.0
            window = self.executor.measure(self.device, self.request, self.abort, settle, hold)
            if not window.ok:
                return window
            windows.append(window)
            if self.on_progress is not None:
                self.on_progress({"phase": "measure", "repeat": number, "repeats": repeats})
        return _pool(windows)

    def hand_over(self) -> SimulatedChild | None:
        """The round's next session builds in the same (simulated) child: its imports are paid."""
        if not self.imported or self.gave_way is not None:
            return None
        child = SimulatedChild(self.device, self.request, 0.0)
        child.start(0.0)
        return child

    def close(self) -> None:
        pass


def _pool(windows: list[ProbeResult]) -> ProbeResult:
    """Windows as one point with a repeat each: rates and telemetry means, energy summed, latencies pooled."""
    import dataclasses

    from gpuperfd.probe_data.result import RepeatResult

    def mean(values: list[Any]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    first = windows[0]
    seconds = sum(w.measured_seconds or 0.0 for w in windows)
    units = sum(w.units_of_work or 0.0 for w in windows)
    energy = sum(w.energy_joules or 0.0 for w in windows)
    latencies: dict[str, list[float]] = {}
    for w in windows:
        for name, samples in w.latencies.items():
            latencies.setdefault(name, []).extend(samples)
    extra = dict(first.extra)
    for key in ("temperature_celsius_mean", "loss", "loss_first", "settle_seconds"):
        if any(key in w.extra for w in windows):
            extra[key] = mean([w.extra.get(key) for w in windows])
    extra["simulated"] = True
    repeats = [RepeatResult(index=i, measured_seconds=w.measured_seconds, units_of_work=w.units_of_work,
                            **w.window_fields()) for i, w in enumerate(windows)]
    return dataclasses.replace(
        first, repeats=repeats,
        wall_seconds=sum(w.wall_seconds or 0 for w in windows), measured_seconds=seconds, units_of_work=units,
        energy_joules=energy, average_power_watts=energy / seconds if seconds else None,
        energy_per_unit_joules=energy / units if units else None,
        throughput={k: mean([w.throughput.get(k) for w in windows]) for k in first.throughput},
        latencies=latencies, temperature_celsius_max=max((w.temperature_celsius_max for w in windows
                                                          if w.temperature_celsius_max is not None), default=None),
        gpu_utilization_mean_ratio=mean([w.gpu_utilization_mean_ratio for w in windows]),
        memory_utilization_mean_ratio=mean([w.memory_utilization_mean_ratio for w in windows]),
        sm_clock_hertz_mean=mean([w.sm_clock_hertz_mean for w in windows]), extra=extra,
    )


def _gave_way(device: Device, abort: threading.Event, own: int) -> str | None:
    """Why a probe on ``device`` stops now (a shutdown, a user's process on the GPU), or None."""
    if abort.is_set():
        return "aborted by shutdown"
    foreign = [p.pid for p in device.compute_processes() if p.pid != own]
    return f"compute process {foreign[0]} appeared on the GPU; probe gave way" if foreign else None


def _not_run(device: Device, request: ProbeRequest, why: str, abort: threading.Event) -> ProbeResult:
    """A point that gave way (or was aborted) before anything of it reached the GPU."""
    status, reason = ("aborted", "aborted") if abort.is_set() else ("skipped", "preempted")
    return ProbeResult.failure(request.probe, "simulated", request.preset or DEFAULT_PRESET[request.probe], reason,
                               why, status=status, device=f"sim:{device.index}", started_at=time.time(),
                               wall_seconds=0.0)


def simulated_executor(measure_seconds: float, seed: int | None = None, noise: float = 0.004,
                       watch_interval: float = 0.1, cost_scale: float = 0.0) -> SimulatedExecutor:
    """The simulator's executor (see :class:`SimulatedExecutor`)."""
    return SimulatedExecutor(measure_seconds, seed, noise, watch_interval, cost_scale)

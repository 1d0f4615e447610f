"""How the daemon runs probe points: in a child process, or on the simulator.

An executor called as ``executor(device, schedule, abort)`` runs one point from
scratch; ``executor.open(device, schedule, abort)`` gives a sweep a *session* that
builds the probe once and measures one point per cap (:func:`open_session`).

``child_process_executor`` is the real path: the probe runs torch in a child
(:mod:`gpuperfd.probing.runner`), so a crash, hang or OOM ends that probe and never
the daemon; a sweep keeps one warm child for all its caps. ``simulated_executor`` loads a simulated GPU with
the profile of the probe and preset (calibrated from the real cards' figures at
700 W; presets without figures of their own run their probe's default preset
profile) for a measured window and derives the result from
the simulator's physics (throughput from the SM clock the cap allows, energy
from the simulated hardware counter), with realistic noise, so sweeps on the
simulator show real-looking curves with a known true optimum.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuperfd.config import Config, ScheduleConfig
from gpuperfd.device.base import Device
from gpuperfd.probe_data import wire
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.settle import wait_steady
from gpuperfd.probe_data.spec import DEFAULT_PRESET, ProbeSpec
from gpuperfd.probing.idle import DEFAULT_IDLE_THRESHOLD, busy_reason, gave_way

if TYPE_CHECKING:
    from gpuperfd.probing.runner import ProbeChild

#: Runs a probe once on a device at the cap it holds now: (device, schedule, abort) -> result.
Executor = Callable[[Device, ScheduleConfig, threading.Event], ProbeResult]
#: Told (probe, peak host RSS in bytes) when a probe child exits (:class:`gpuperfd.probing.admission.PeakBook`).
PeakCallback = Callable[[str, int], None]

log = logging.getLogger(__name__)

#: The simulator profile of each probe's default preset ("probe/preset").
SIMULATED_PROFILE = {probe: f"{probe}/{preset}" for probe, preset in DEFAULT_PRESET.items()}


def simulated_profile_name(probe: str, preset: str | None) -> str:
    """The simulator profile for ``probe`` at ``preset``: the preset's own where measured,
    else the default preset's (the simulator does not model model size or batch size)."""
    from gpuperfd.device.simulated import WORKLOAD_PROFILES

    name = f"{probe}/{preset or DEFAULT_PRESET[probe]}"
    return name if name in WORKLOAD_PROFILES else SIMULATED_PROFILE[probe]


class Session(Protocol):
    """One sweep's probe, built once: ``measure`` runs it at the cap set now (a warm sweep)."""

    def prepare(self) -> None:
        """Whatever needs no GPU, done before the sweep changes a cap (a child's imports)."""

    def measure(self, cap_watts: float) -> ProbeResult: ...

    def close(self) -> None: ...


class ColdSession:
    """The per-point path: every ``measure`` is one whole run of ``execute`` (spawn, build, measure)."""

    def __init__(self, execute: Executor, device: Device, schedule: ScheduleConfig, abort: threading.Event) -> None:
        self._run = lambda: execute(device, schedule, abort)

    def prepare(self) -> None:
        pass  # every point starts its own child

    def measure(self, cap_watts: float) -> ProbeResult:
        return self._run()

    def close(self) -> None:
        pass


def open_session(executor: Executor, device: Device, schedule: ScheduleConfig, abort: threading.Event,
                 after: Session | None = None) -> Session:
    """The executor's warm session where it has one (``executor.open``), else a cold one.

    ``after``: the session of the previous schedule of the same round on this GPU, not closed yet:
    a warm session takes its child over (one child serves every probe of the round; the old
    workload is dropped and the new one built in it) and closes the rest.
    """
    opener = getattr(executor, "open", None)
    if opener is not None:
        carried = after.hand_over() if isinstance(after, WarmChildSession) else None
        if after is not None:
            after.close()
        session = opener(device, schedule, abort)
        if isinstance(session, WarmChildSession):
            session.carried = carried
        elif carried is not None:
            carried.close()
        return session  # type: ignore[no-any-return]
    if after is not None:
        after.close()
    return ColdSession(executor, device, schedule, abort)


class WarmChildSession:
    """One probe child for a whole sweep: built once, then one ``measure`` request per cap.

    A point whose child fails (crash, timeout, CUDA error) fails with its reason and
    the child is gone; the next point starts a new child. A child that could not be
    built is not built again for the next caps: they fail with the same reason.
    """

    def __init__(self, spec: ProbeSpec, device: Device, abort: threading.Event, timeout_seconds: float,
                 settle_seconds: float, state_dir: Path | str | None, check_idle: bool = True,
                 idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD,
                 env: dict[str, str] | None = None, on_peak: PeakCallback | None = None) -> None:
        self.spec = spec
        #: Told each child's peak host RSS when it exits (the admission's estimate).
        self.on_peak = on_peak
        #: Extra environment of its children (compile caches, see :func:`compile_cache_env`).
        self.env = dict(env or {})
        self.device = device
        self.abort = abort
        self.timeout_seconds = timeout_seconds
        self.settle_seconds = settle_seconds
        self.state_dir = state_dir
        self.check_idle = check_idle
        self.idle_utilization_threshold = idle_utilization_threshold
        self.child: ProbeChild | None = None
        #: A live child of the round's previous probe, rebuilt for this one instead of a new child.
        self.carried: ProbeChild | None = None
        #: Children started (1 for a sweep without failures; 0 when a carried child served it).
        self.children = 0
        #: Seconds :meth:`prepare` took (the child's imports, before the GPU was taken); reported once.
        self.prepare_seconds = 0.0
        self._build_failure: ProbeResult | None = None

    def prepare(self) -> None:
        """Before the sweep takes the GPU (no cap changed, nothing on the GPU): a child that has
        imported torch and this probe's model code (a new one, or the round's carried child, whose
        old workload it drops) and waits for its build. The first point then starts at the build:
        the imports (3-5 s on an H100 node) are not time the GPU is out of service. A child that
        fails here is closed and the first point starts one as before, reporting the failure."""
        from gpuperfd.probing.runner import ProbeChild

        t0 = time.monotonic()
        deadline = t0 + self.timeout_seconds
        child, self.carried = self.carried, None
        if child is not None and child.alive:
            child.should_abort = self.abort.is_set
            failed = child.preload(self.spec, deadline)
        else:
            if child is not None:
                child.close()
            child = ProbeChild(self.spec, device=self.device, own_pids=(os.getpid(),), should_abort=self.abort.is_set,
                               record_dir=self.state_dir, env=self.env, on_peak=self.on_peak)
            self.children += 1
            failed = child.start(deadline, defer_build=True)
        if failed is not None:
            if not self.abort.is_set():  # stopping: the sweep ends before its first point, nothing to say
                # A user's job that arrived meanwhile is news, not a warning: the first point gives way too.
                (log.info if failed.preempted else log.warning)(
                    "probe %s: the child could not be prepared (%s); the first point starts one",
                    self.spec.probe, failed.error_message)
            child.close()
            return
        self.child = child
        self.prepare_seconds = time.monotonic() - t0

    def measure(self, cap_watts: float) -> ProbeResult:
        t0 = time.monotonic()
        deadline = t0 + self.timeout_seconds  # the hard limit of one point, a (re)build included
        if self._build_failure is not None:
            return _copy_failure(self._build_failure, f"not run: the probe could not be built: "
                                 f"{self._build_failure.error_message}")
        for _attempt in range(2):
            fresh = self.child is None or not self.child.alive or not self.child.built
            if fresh:
                failed = self._start(deadline)
                if failed is not None:
                    return failed
            assert self.child is not None
            result = self.child.measure(deadline, settle_seconds=self.settle_seconds, cap_watts=cap_watts)
            # A warm child found dead before it began this point died between points: this point
            # did not run on it, so it gets a fresh child once instead of failing.
            if fresh or result.failure_reason != "crash" or self.child.progressed:
                break
            log.warning("probe child %s died between points (%s); starting a new one",
                        self.child.pid, result.error_message)
        ready = self.child.ready or {}
        result.extra.update({
            "warm": True,
            "child_pid": self.child.pid,
            "child_start_seconds": self.child.start_seconds if fresh else 0.0,
            "child_setup_seconds": ready.get("setup_seconds") if fresh else 0.0,
            "child_prepare_seconds": self.prepare_seconds if fresh else 0.0,
        })
        if fresh:
            self.prepare_seconds = 0.0
        result.wall_seconds = time.monotonic() - t0
        return result

    def _start(self, deadline: float) -> ProbeResult | None:
        """A new child (the old one closed), built and ready; a failure result if not."""
        from gpuperfd.probing.runner import ProbeChild

        prepared = self.child if self.child is not None and self.child.alive and not self.child.built else None
        if prepared is None and self.child is not None:
            self.child.close()
        carried, self.carried = self.carried, None
        if prepared is None and carried is not None and carried.alive:
            prepared = carried
        elif carried is not None:
            carried.close()
        if prepared is not None:  # a prepared child, or the previous probe's: built in it
            return self._rebuild(prepared, deadline)
        own = (os.getpid(),)
        if (busy := self._busy(own)) is not None:
            return busy
        self.child = ProbeChild(self.spec, device=self.device, own_pids=own, should_abort=self.abort.is_set,
                                record_dir=self.state_dir, env=self.env, on_peak=self.on_peak)
        self.children += 1
        return self._built(self.child.start(deadline))

    def _rebuild(self, child: ProbeChild, deadline: float) -> ProbeResult | None:
        """This probe built in a live child: the previous probe's (the GPU stayed ours, the child
        on it) or one :meth:`prepare` started."""
        if (busy := self._busy((os.getpid(), child.pid or 0))) is not None:
            child.close()
            return busy
        child.should_abort = self.abort.is_set
        self.child = child
        return self._built(child.rebuild(self.spec, deadline))

    def _busy(self, own: tuple[int, ...]) -> ProbeResult | None:
        """When the idle check is on and the GPU is not free before a build: a user's job arrived
        since the gate, so the point gives way (skipped, preempted; :func:`.idle.gave_way`)."""
        if not self.check_idle:
            return None
        busy = busy_reason(self.device, self.idle_utilization_threshold, own, wait_seconds=5.0)
        if busy is None:
            return None
        status, reason = gave_way(busy)
        return ProbeResult.failure(self.spec.probe, self.spec.variant or "", self.spec.preset or "",
                                   reason, str(busy), status=status, device=self.spec.device,
                                   started_at=time.time(), extra={"busy_kind": busy.kind.value})

    def _built(self, failed: ProbeResult | None) -> ProbeResult | None:
        """A build's outcome, kept when the probe cannot be built (not a timeout): no later point retries it."""
        if failed is not None and failed.status == "failed" and failed.failure_reason != "timeout":
            self._build_failure = failed
        return failed

    def hand_over(self) -> ProbeChild | None:
        """The live child, taken out of this session for the next probe of the round (None if dead)."""
        child, self.child = self.child, None
        if child is not None and not child.alive:
            child.close()
            return None
        return child

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None
        if self.carried is not None:
            self.carried.close()
            self.carried = None


def _copy_failure(failure: ProbeResult, message: str) -> ProbeResult:
    return ProbeResult.failure(failure.probe, failure.variant, failure.preset, failure.failure_reason or "exception",
                               message, status=failure.status, params=dict(failure.params), device=failure.device,
                               started_at=time.time())


class ChildProcessExecutor:
    """Run the real probe in a child process on the CUDA device matching the NVML index (or the CPU).

    Called, it runs one point in a child of its own (the per-point path, ``gpuperfd probe``);
    :meth:`open` gives a sweep one warm child for all its caps.
    """

    def __init__(self, timeout_seconds: float, torch_device: str = "cuda", state_dir: Path | str | None = None,
                 idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD, compile_cache: bool = True,
                 on_peak: PeakCallback | None = None) -> None:
        self.timeout_seconds = timeout_seconds
        #: Told each child's peak host RSS when it exits (the admission's estimate of the next ones).
        self.on_peak = on_peak
        #: Keep torch.compile's and Triton's caches in the state directory across runs (and restarts).
        self.compile_cache = compile_cache
        #: ``probes.idle_utilization_threshold``: the one threshold of the busy check before a child starts.
        self.idle_utilization_threshold = idle_utilization_threshold
        self.torch_device = torch_device
        #: Where each running child is recorded, so a restarted daemon can end it.
        self.state_dir = state_dir
        # NVML numbers GPUs by PCI bus id; make CUDA agree so cuda:i is NVML's GPU i.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        # Probe children yield the CPU to the exporter (see probe_child/child.py).
        os.environ.setdefault("GPUPERFD_PROBE_NICE", "10")

    def spec(self, device: Device, schedule: ScheduleConfig) -> ProbeSpec:
        return ProbeSpec(
            probe=schedule.probe,
            preset=schedule.preset,
            device=f"cuda:{device.index}" if self.torch_device == "cuda" else "cpu",
            **schedule.options,
        )

    def __call__(self, device: Device, schedule: ScheduleConfig, abort: threading.Event) -> ProbeResult:
        from gpuperfd.probing.runner import run_probe

        return run_probe(
            self.spec(device, schedule),
            timeout_seconds=self.timeout_seconds,
            device=device,
            own_pids=(os.getpid(),),
            should_abort=abort.is_set,
            record_dir=self.state_dir,
            idle_utilization_threshold=self.idle_utilization_threshold,
            env=self.child_env(),
            on_peak=self.on_peak,
        )

    def child_env(self) -> dict[str, str]:
        """What its children get on top of the daemon's environment."""
        return compile_cache_env(self.state_dir) if self.compile_cache else {}

    def open(self, device: Device, schedule: ScheduleConfig, abort: threading.Event) -> WarmChildSession:
        return WarmChildSession(self.spec(device, schedule), device, abort, self.timeout_seconds,
                                schedule.settle_seconds, self.state_dir,
                                idle_utilization_threshold=self.idle_utilization_threshold, env=self.child_env(),
                                on_peak=self.on_peak)


#: Below the state directory: torch.compile's (Inductor's FX graph and autotuning) and Triton's kernel caches.
COMPILE_CACHE_DIR = "compile-cache"


def compile_cache_env(state_dir: Path | str | None) -> dict[str, str]:
    """Environment that keeps a probe child's compile caches in ``state_dir`` (none without one).

    A probe's first point pays for ``torch.compile`` and Triton's kernel builds; by default
    their caches live under /tmp (``torchinductor_<user>``), which systemd's PrivateTmp and a
    container's tmpfs empty at every restart. In the state directory they survive, so every
    run after the first loads compiled kernels instead of building them. The folders are the
    daemon's own (mode 0700): a cache is code that the child will run.
    """
    if state_dir is None:
        return {}
    root = Path(state_dir) / COMPILE_CACHE_DIR
    try:
        for sub in ("", "inductor", "triton"):
            (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no compile cache in %s (%s): every run compiles from scratch", root, exc)
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


def child_process_executor(
    timeout_seconds: float, torch_device: str = "cuda", state_dir: Path | str | None = None,
    idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD, on_peak: PeakCallback | None = None,
) -> ChildProcessExecutor:
    """The real executor (see :class:`ChildProcessExecutor`)."""
    return ChildProcessExecutor(timeout_seconds, torch_device, state_dir, idle_utilization_threshold, on_peak=on_peak)


def starts_children(config: Config, backend_name: str) -> bool:
    """Whether :func:`choose_executor` picks the child executor: only then do probes need host
    memory admitted (:mod:`gpuperfd.probing.admission`); the simulator runs in this process."""
    kind = config.probes.executor
    return not (kind == "simulated" or (kind == "auto" and backend_name == "simulated"))


def choose_executor(config: Config, backend_name: str, on_peak: PeakCallback | None = None) -> Executor:
    """The one executor choice, for the daemon and ``gpuperfd sweep`` alike.

    ``probes.executor``: ``simulated`` (the simulator's physics, in this process), ``child`` (torch in
    a child process), or ``auto``: simulated on the simulated backend, a child otherwise. ``on_peak``:
    told each child's peak host RSS (the admission's :class:`~gpuperfd.probing.admission.PeakBook`).
    """
    if not starts_children(config, backend_name):
        return simulated_executor(config.probes.simulated_measure_seconds, seed=config.simulation.seed)
    return child_process_executor(config.probes.timeout_seconds, config.probes.torch_device,
                                  state_dir=config.probes.state_dir,
                                  idle_utilization_threshold=config.probes.idle_utilization_threshold,
                                  on_peak=on_peak)


def _noisy(rng: random.Random, value: float, sigma: float) -> float:
    return max(value * (1.0 + rng.gauss(0.0, sigma)), 0.0)


class SimulatedSession:
    """A warm sweep on the simulator: the same protocol as the child's (results cross as JSON),
    settle by measurement under load, one point per ``measure``."""

    def __init__(self, executor: SimulatedExecutor, device: Device, schedule: ScheduleConfig,
                 abort: threading.Event) -> None:
        self.executor, self.device, self.schedule, self.abort = executor, device, schedule, abort
        #: Points measured (the simulator builds nothing: this stands for the child's reuse).
        self.points = 0

    def prepare(self) -> None:
        pass  # nothing to import: the simulator runs in this process

    def measure(self, cap_watts: float) -> ProbeResult:
        result = self.executor.measure(self.device, self.schedule, self.abort, self.schedule.settle_seconds)
        result.extra.update({"warm": True, "point_index": self.points})
        self.points += 1
        return ProbeResult.from_dict(wire.decode(wire.encode("result", result.to_dict()))[1])

    def close(self) -> None:
        pass


class SimulatedExecutor:
    """Run a probe on a SimulatedGpu: load it for ``measure_seconds`` and read its physics."""

    def __init__(self, measure_seconds: float, seed: int | None = None, noise: float = 0.004,
                 watch_interval: float = 0.1) -> None:
        self.measure_seconds = measure_seconds
        self.noise = noise
        self.watch_interval = watch_interval
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, device: Device, schedule: ScheduleConfig, abort: threading.Event) -> ProbeResult:
        return self.measure(device, schedule, abort, 0.0)

    def open(self, device: Device, schedule: ScheduleConfig, abort: threading.Event) -> SimulatedSession:
        return SimulatedSession(self, device, schedule, abort)

    def measure(self, device: Device, schedule: ScheduleConfig, abort: threading.Event,
                settle_seconds: float) -> ProbeResult:
        """One point at the cap set now: load, settle (at most ``settle_seconds``), measured window."""
        from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedGpu

        if not isinstance(device, SimulatedGpu):
            raise TypeError("the simulated executor needs a simulated GPU")
        rng, lock, noise = self._rng, self._lock, self.noise
        preset = schedule.preset or DEFAULT_PRESET[schedule.probe]
        profile = WORKLOAD_PROFILES[simulated_profile_name(schedule.probe, preset)]
        started_at = time.time()
        own = os.getpid()
        device.begin_load(profile, pid=own)
        gpm = _window_gpm(device)
        why = None
        settled: tuple[float, bool | None] = (0.0, None)
        try:
            if settle_seconds > 0:
                def sample(seconds: float) -> tuple[float | None, float | None]:
                    abort.wait(seconds)
                    return device.power_watts(), device.clocks().sm_hertz

                settled = wait_steady(sample, settle_seconds, slice_seconds=min(0.25, settle_seconds / 4))
            wall_start = time.monotonic()
            energy_start = device.energy_joules()
            # Like the child runner: a process of someone else's appearing mid-probe aborts it
            # and gives the GPU back at once.
            deadline = time.monotonic() + self.measure_seconds
            watch = _WindowTelemetry(device)
            while why is None and (left := deadline - time.monotonic()) > 0:
                if abort.wait(min(left, self.watch_interval)):
                    why = "aborted by shutdown"
                elif foreign := [p.pid for p in device.compute_processes() if p.pid != own]:
                    why = f"compute process {foreign[0]} appeared on the GPU; probe gave way"
                else:
                    watch.sample()
            energy_end = device.energy_joules()
            watch.sample()  # what the GPU shows at the end of the loaded window
        finally:
            device.end_load()
        measured = time.monotonic() - wall_start
        if why is not None:  # a user's job is a preemption (skipped), a shutdown an abort
            status, reason = ("aborted", "aborted") if abort.is_set() else ("skipped", "preempted")
            return ProbeResult.failure(
                schedule.probe, "simulated", preset, reason, why, status=status,
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
        correctness = _simulated_correctness(device, schedule.probe, preset)
        wrong = correctness["status"] == "mismatch"
        return ProbeResult(
            status="failed" if wrong else "ok",
            failure_reason="wrong_result" if wrong else None,
            error_message="wrong result: repeat, slice check failed (simulated silent data corruption)" if wrong
            else None,
            correctness=correctness,
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
            temperature_celsius_max=watch.max("temperature"),
            gpu_utilization_mean_ratio=watch.mean("gpu"),
            memory_utilization_mean_ratio=watch.mean("memory"),
            power_limit_watts=device.power_limits().enforced_watts,
            gpm_sm_active_mean_ratio=None if gpm is None else gpm.sm_active,
            gpm_tensor_active_mean_ratio=None if gpm is None else gpm.tensor_active,
            gpm_dram_active_mean_ratio=None if gpm is None else gpm.dram_active,
            extra={"settle_seconds": settled[0], "settle_steady": settled[1],
                   "temperature_celsius_mean": watch.mean("temperature"),
                   **_simulated_loss(schedule, units, rng, lock, noise)},
        )


def _simulated_correctness(device: Any, probe: str, preset: str) -> dict[str, Any]:
    """What the answer checks say on a simulated GPU: ok with one fingerprint per (model, probe, preset),
    shared by healthy peers; a mismatch and a fingerprint of its own where ``wrong_results`` is set."""
    import hashlib

    wrong = bool(getattr(device, "wrong_results", False))
    key = f"{device.model.key}/{probe}/{preset}" + (f"/wrong/{device.index}" if wrong else "")
    return {
        "status": "mismatch" if wrong else "ok", "checks": 2,
        "failed_checks": ["repeat", "slice"] if wrong else [],
        "max_abs_error": 0.5 if wrong else 1e-3, "max_rel_error": 0.4 if wrong else 2e-3,
        "elements_checked": 4096, "fingerprint": hashlib.blake2b(key.encode(), digest_size=8).hexdigest(),
        "peer_comparable": probe != "train", "precision": "bfloat16", "path": "simulated", "seconds": 0.0,
    }


def simulated_executor(measure_seconds: float, seed: int | None = None, noise: float = 0.004,
                       watch_interval: float = 0.1) -> SimulatedExecutor:
    """The simulator's executor (see :class:`SimulatedExecutor`)."""
    return SimulatedExecutor(measure_seconds, seed, noise, watch_interval)


class _WindowTelemetry:
    """What the simulated GPU shows over a loaded window, sampled at each watch tick (means and
    maximum, as the child's telemetry sampler gives them); a faulty simulated part leaves it out."""

    def __init__(self, device: Any) -> None:
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


def _simulated_loss(schedule: ScheduleConfig, steps_tokens: float, rng: random.Random, lock: threading.Lock,
                    noise: float) -> dict[str, float]:
    """A train point's loss, as the train probe reports it (``loss`` over the window, ``loss_first``):
    the simulator trains nothing, so it is the cross-entropy of an untrained model of the preset's
    vocabulary (ln V) with a small noisy decrease over the window's tokens; other probes have none."""
    if schedule.probe != "train":
        return {}
    import math

    from gpuperfd.probe_data.spec import GPT2_MODELS, PRESETS

    preset = schedule.preset or DEFAULT_PRESET["train"]
    model = schedule.options.get("model") or PRESETS["train"].get(preset, {}).get("model", preset)
    vocab = int(GPT2_MODELS.get(str(model), {}).get("vocab_size", 50257))
    first = math.log(vocab)
    with lock:
        drop = 0.02 * (1.0 - math.exp(-steps_tokens / 1e5)) + abs(rng.gauss(0.0, noise))
    return {"loss_first": first, "loss": first * (1.0 - drop)}


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
    from gpuperfd.probe_data.spec import PRESETS

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

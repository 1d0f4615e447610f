"""The real executor: a probe runs torch in a child process, one warm child per sweep.

A crash, hang or OOM ends that probe's child and never the daemon (:mod:`gpuperfd.probing.child.runner`).
A sweep's :class:`WarmChildSession` builds the probe once and measures one point per cap; the next
probe of the same round on the GPU is built in the same child, handed over explicitly
(:meth:`WarmChildSession.hand_over` -> ``ChildProcessExecutor.open(..., carried=...)``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuperfd.device.base import Device
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.child.compile_cache import compile_cache_env
from gpuperfd.probing.child.standby import take_standby
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD, busy_reason, gave_way

if TYPE_CHECKING:
    from gpuperfd.probing.child.runner import ProbeChild, ProgressCallback
    from gpuperfd.probing.child.standby import StandbyChildren

#: Told (probe, peak host RSS in bytes) when a probe child exits (:class:`gpuperfd.probing.gates.admission.PeakBook`).
PeakCallback = Callable[[str, int], None]
#: Seconds the busy check before a child starts waits for a GPU that is only briefly busy.
IDLE_WAIT_SECONDS = 5.0

log = logging.getLogger(__name__)


class WarmChildSession:
    """One probe child for a whole sweep: built once, then one ``measure`` request per cap.

    A point whose child fails (crash, timeout, CUDA error) fails with its reason and
    the child is gone; the next point starts a new child. A child that could not be
    built is not built again for the next caps: they fail with the same reason.
    """

    def __init__(self, spec: ProbeSpec, device: Device | None, abort: threading.Event, timeout_seconds: float,
                 settle_seconds: float, state_dir: Path | str | None, check_idle: bool = True,
                 idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD,
                 env: dict[str, str] | None = None, on_peak: PeakCallback | None = None,
                 carried: ProbeChild | None = None, on_progress: ProgressCallback | None = None,
                 idle_wait_seconds: float = IDLE_WAIT_SECONDS, gave_way: str | None = None) -> None:
        self.spec = spec
        #: Told the child's progress messages (``gpuperfd probe``'s bar); None: nobody listens.
        self.on_progress = on_progress
        #: Told each child's peak host RSS when it exits (the admission's estimate).
        self.on_peak = on_peak
        #: Extra environment of its children (compile caches, see :func:`compile_cache_env`).
        self.env = dict(env or {})
        #: The GPU watched (busy check, foreign processes); None: nothing to watch (a CPU probe).
        self.device = device
        self.abort = abort
        self.timeout_seconds = timeout_seconds
        self.settle_seconds = settle_seconds
        self.state_dir = state_dir
        self.check_idle = check_idle
        self.idle_utilization_threshold = idle_utilization_threshold
        self.idle_wait_seconds = idle_wait_seconds
        self.child: ProbeChild | None = None
        #: A live child of the round's previous probe (its session's :meth:`hand_over`), rebuilt for
        #: this one instead of a new child.
        self.carried: ProbeChild | None = carried
        #: Children started (1 for a sweep without failures; 0 when a carried child served it).
        self.children = 0
        #: Seconds :meth:`prepare` took (the child's imports, before the GPU was taken); reported once.
        self.prepare_seconds = 0.0
        self._build_failure: ProbeResult | None = None
        #: Set when a user's job took the GPU before this session's child reached it (``gave_way``: while
        #: the round waited for its standby child; or while :meth:`prepare`'s child imported): every
        #: point gives way at once (skipped, preempted) and no other child is started.
        self._gave_way: ProbeResult | None = None if gave_way is None else self._preempted(gave_way)

    def prepare(self) -> None:
        """Before the sweep takes the GPU (no cap changed, nothing on the GPU): a child that has
        imported torch and this probe's model code (a new one, or the round's carried child, whose
        old workload it drops) and waits for its build. The first point then starts at the build:
        the imports (3-5 s on an H100 node) are not time the GPU is out of service. A child that
        fails here is closed and the first point starts one as before, reporting the failure."""
        if self._gave_way is not None:
            return
        t0 = time.monotonic()
        deadline = t0 + self.timeout_seconds
        child, self.carried = self.carried, None
        if child is not None and child.alive:
            child.should_abort, child.on_progress = self.abort.is_set, self.on_progress
            # a standby child started for this very probe has imported its code already
            failed = None if _preloaded_for(child, self.spec) else child.preload(self.spec, deadline)
        else:
            if child is not None:
                child.close()
            child = self._child((os.getpid(),))
            failed = child.start(deadline, defer_build=True)
        if failed is not None:
            child.close()
            if failed.preempted:  # a user's job came while the child imported: give way, start no other
                log.info("probe %s: %s", self.spec.probe, failed.error_message)
                self._gave_way = failed
            elif not self.abort.is_set():  # stopping: the sweep ends before its first point, nothing to say
                log.warning("probe %s: the child could not be prepared (%s); the first point starts one",
                            self.spec.probe, failed.error_message)
            return
        self.child = child
        self.prepare_seconds = time.monotonic() - t0

    def measure(self, cap_watts: float | None) -> ProbeResult:
        t0 = time.monotonic()
        deadline = t0 + self.timeout_seconds  # the hard limit of one point, a (re)build included
        if self._gave_way is not None:
            return _copy_failure(self._gave_way, self._gave_way.error_message or "probe gave way")
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
        self.child = self._child(own)
        return self._built(self.child.start(deadline))

    def _child(self, own: tuple[int, ...]) -> ProbeChild:
        """A new (not yet started) child of this session, counted."""
        from gpuperfd.probing.child.runner import ProbeChild

        self.children += 1
        return ProbeChild(self.spec, device=self.device, own_pids=own, should_abort=self.abort.is_set,
                          record_dir=self.state_dir, env=self.env, on_peak=self.on_peak, on_progress=self.on_progress)

    def _rebuild(self, child: ProbeChild, deadline: float) -> ProbeResult | None:
        """This probe built in a live child: the previous probe's (the GPU stayed ours, the child
        on it) or one :meth:`prepare` started."""
        # The GPU passed the gate (a standby child) or was ours all along (the round's previous probe's
        # child): only a job's process can have come since. Its utilization is our own load's tail, which
        # NVML averages over up to a second: waiting for it cost each later probe of a round ~1-2 s on an H200.
        if (busy := self._busy((os.getpid(), child.pid or 0), processes_only=True)) is not None:
            child.close()
            return busy
        child.should_abort, child.on_progress = self.abort.is_set, self.on_progress
        self.child = child
        return self._built(child.rebuild(self.spec, deadline))

    def _preempted(self, message: str) -> ProbeResult:
        return ProbeResult.failure(self.spec.probe, self.spec.variant or "", self.spec.preset or "", "preempted",
                                   message, status="skipped", device=self.spec.device, started_at=time.time())

    def _busy(self, own: tuple[int, ...], processes_only: bool = False) -> ProbeResult | None:
        """When the idle check is on and the GPU is not free before a build: a user's job arrived
        since the gate, so the point gives way (skipped, preempted; :func:`~gpuperfd.probing.gates.idle.gave_way`).
        ``processes_only``: a foreign process, read once (no utilization: ours)."""
        if not self.check_idle or self.device is None:
            return None
        if processes_only:  # a utilization ratio never exceeds 2: only processes (or an unreadable GPU) count
            busy = busy_reason(self.device, 2.0, own)
        else:
            busy = busy_reason(self.device, self.idle_utilization_threshold, own, wait_seconds=self.idle_wait_seconds)
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


def _preloaded_for(child: ProbeChild, spec: ProbeSpec) -> bool:
    """Whether ``child`` imported ``spec``'s code and built nothing since (a standby child started for it)."""
    return not child.built and child.spec.to_dict() == spec.to_dict()


def _copy_failure(failure: ProbeResult, message: str) -> ProbeResult:
    return ProbeResult.failure(failure.probe, failure.variant, failure.preset, failure.failure_reason or "exception",
                               message, status=failure.status, params=dict(failure.params), device=failure.device,
                               started_at=time.time())


class ChildProcessExecutor:
    """Run the real probe in a child process on the CUDA device matching the NVML index (or the CPU).

    :meth:`open` gives a sweep one warm child for all its caps; a one-shot point (``gpuperfd probe``,
    ``gpuperfd check``) is a session of one point (:func:`gpuperfd.probing.executors.measure_once`).
    """

    def __init__(self, timeout_seconds: float, torch_device: str = "cuda", state_dir: Path | str | None = None,
                 idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD, compile_cache: bool = True,
                 on_peak: PeakCallback | None = None, idle_wait_seconds: float = IDLE_WAIT_SECONDS) -> None:
        self.timeout_seconds = timeout_seconds
        #: How long the busy check before a child starts waits for a briefly busy GPU to calm down.
        self.idle_wait_seconds = idle_wait_seconds
        #: Told each child's peak host RSS when it exits (the admission's estimate of the next ones).
        self.on_peak = on_peak
        #: Keep torch.compile's and Triton's caches in the state directory across runs (and restarts).
        self.compile_cache = compile_cache
        #: ``probes.idle_utilization_threshold``: the one threshold of the busy check before a child starts.
        self.idle_utilization_threshold = idle_utilization_threshold
        self.torch_device = torch_device
        #: Where each running child is recorded, so a restarted daemon can end it.
        self.state_dir = state_dir
        #: Children started before their GPU qualifies (:mod:`gpuperfd.probing.child.standby`; the daemon's):
        #: a sweep with no carried child builds in its GPU's. None: every sweep starts its own.
        self.standby: StandbyChildren | None = None
        # NVML numbers GPUs by PCI bus id; make CUDA agree so cuda:i is NVML's GPU i.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        # Probe children yield the CPU to the exporter (see probe_child/child.py).
        os.environ.setdefault("GPUPERFD_PROBE_NICE", "10")

    def spec(self, device: Device | None, request: ProbeRequest) -> ProbeSpec:
        """The child's spec: the torch device of ``device`` (NVML's index) unless the request names one
        (``gpuperfd probe --device``, numbered as CUDA_VISIBLE_DEVICES numbers them)."""
        fields = dict(request.options)
        if "device" not in fields:
            if self.torch_device == "cuda" and device is None:
                raise ValueError("device: a cuda probe needs the GPU it runs on (or a device option)")
            fields["device"] = f"cuda:{device.index}" if self.torch_device == "cuda" and device is not None else "cpu"
        return ProbeSpec(probe=request.probe, preset=request.preset, **fields)

    def child_env(self) -> dict[str, str]:
        """What its children get on top of the daemon's environment."""
        return compile_cache_env(self.state_dir) if self.compile_cache else {}

    def new_child(self, device: Device, request: ProbeRequest, also: Sequence[ProbeRequest] = ()) -> ProbeChild:
        """A child for ``request`` on ``device``'s GPU, not started, watching no GPU yet (a standby child:
        :class:`~gpuperfd.probing.child.standby.StandbyChildren` gives it the GPU to watch when a round takes it);
        with a deferred build it imports ``also``'s code too (each probe and variant once; a request whose
        spec is not valid here is left to its own round, which says why)."""
        from gpuperfd.probing.child.runner import ProbeChild

        spec = self.spec(device, request)
        pairs: list[tuple[str, str | None]] = []
        for other in also:
            try:
                pair = (other.probe, self.spec(device, other).variant)
            except ValueError:
                continue
            if pair != (spec.probe, spec.variant) and pair not in pairs:
                pairs.append(pair)
        child = ProbeChild(spec, device=None, own_pids=(os.getpid(),), record_dir=self.state_dir,
                           env=self.child_env(), on_peak=self.on_peak)
        child.also_preload = tuple(pairs)
        return child

    def open(self, device: Device | None, request: ProbeRequest, abort: threading.Event,
             carried: ProbeChild | None = None, on_progress: ProgressCallback | None = None) -> WarmChildSession:
        """A warm session for a sweep; ``carried``: the live child of the round's previous session
        (its :meth:`WarmChildSession.hand_over`), in which this probe is built instead of a new child;
        the first session of a round takes the GPU's standby child, if one was started.
        ``device`` None: no GPU to watch (a CPU probe, ``gpuperfd probe --no-idle-check``)."""
        gave_way = None
        if carried is None and device is not None and self.standby is not None:
            carried, gave_way = take_standby(self.standby, device)
        return WarmChildSession(self.spec(device, request), device, abort,
                                request.timeout_seconds or self.timeout_seconds, request.settle_seconds,
                                self.state_dir, idle_utilization_threshold=self.idle_utilization_threshold,
                                env=self.child_env(), on_peak=self.on_peak, carried=carried, on_progress=on_progress,
                                idle_wait_seconds=self.idle_wait_seconds, gave_way=gave_way)


def child_process_executor(
    timeout_seconds: float, torch_device: str = "cuda", state_dir: Path | str | None = None,
    idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD, on_peak: PeakCallback | None = None,
) -> ChildProcessExecutor:
    """The real executor (see :class:`ChildProcessExecutor`)."""
    return ChildProcessExecutor(timeout_seconds, torch_device, state_dir, idle_utilization_threshold, on_peak=on_peak)

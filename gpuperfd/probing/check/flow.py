"""``gpuperfd check``'s one-shot flow: passive read, short probes on idle GPUs, one verdict.

Parent side (no torch here). Everything runs under one deadline (``--timeout``):

1. open the backend (no driver: :class:`CannotCheck`, the could-not-check exit code);
2. one synchronous read of every collector of every selected GPU, one thread per GPU
   (a GPU whose read does not finish by the deadline is ``unknown``);
3. unless ``quick``, the short check probe on every GPU that is free: not lost, not in
   MIG mode (its instances are other tenants'; checked at the parent GPU's level), its
   per-GPU lock (:mod:`~gpuperfd.caps.ownership`) free, which is held for the probe so the daemon
   does not sweep under it, and not busy (:func:`~gpuperfd.probing.gates.idle.busy_reason`). All GPUs probe in
   parallel, through the one executor choice (:func:`~gpuperfd.probing.executors.choose_executor`: a probe
   child on real GPUs, the simulator's physics with ``--simulate``), one session of one point
   each (:func:`~gpuperfd.probing.executors.measure_once`, as the daemon's sessions run), as many children at once
   as the host memory holds (each takes its GPU's turn with its child's memory, :mod:`~gpuperfd.probing.gates.turns`,
   the daemon's one rule; :mod:`~gpuperfd.probing.gates.admission`, the book): the others queue, and one
   that gets no room before the deadline is not probed, with the reason. A gpuperfd probe child on
   a GPU (a daemon's with another state directory, whose lock the check cannot see) is waited for
   within the deadline, before the probe or when it preempts the probe mid-run, never given way to as
   to a user's job (:func:`measure_beside_gpuperfd`). It is read-only: nothing here changes a power cap;
4. with two or more GPUs probed, a short interconnect probe across them, their locks still held
   (:mod:`~gpuperfd.probing.check.interconnect`: a share of the timeout is kept for it; a wrong copy or sum is a
   wrong result on each GPU of the set);
5. the pure judge (:func:`gpuperfd.health.judge.judge`): the daemon's table plus the
   one-shot rows. A probe that did not finish by the deadline is ``unknown``, never healthy.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.caps.ownership import GpuBusy, GpuLock, is_owned, safe_name
from gpuperfd.config import Config
from gpuperfd.device.base import Backend, Device
from gpuperfd.device.errors import DeviceError, NotSupported
from gpuperfd.health.evaluate import GpuInputs
from gpuperfd.health.interconnect import interconnect_inputs, read_topology
from gpuperfd.health.judge import expected_figure, judge, run_row
from gpuperfd.health.monitor import snapshot_inputs
from gpuperfd.health.verdict import Verdict
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probe_data.kinds import INTERCONNECT, check_kind
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probing.check.interconnect import INTERCONNECT_SHARE, apply_to_inputs, run_interconnect
from gpuperfd.probing.executors import Executor, choose_executor, measure_once, starts_children
from gpuperfd.probing.gates.admission import Admission, memory_limit
from gpuperfd.probing.gates.idle import BusyKind, busy_reason, mig_reason
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Turn
from gpuperfd.probing.interconnect.executor import InterconnectExecutor
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.sampler import Sampler

log = logging.getLogger(__name__)

#: The check probe: llm at the gpt2 preset (the model, batch and variant of the shipped H100/H200
#: figures, no compiler) with short windows: the figures apply unchanged, and the build dominates.
DEFAULT_PROBE, DEFAULT_PRESET = check_kind().name, str(check_kind().default_preset)
CHECK_TIMING: dict[str, Any] = {"repeats": 2, "measure_seconds": 1.0, "warmup_seconds": 1.0}
#: The simulated executor's measured window in a check (the simulator builds nothing).
SIMULATED_MEASURE_SECONDS = 1.0
#: Share of ``--timeout`` the passive read (and, after it, the busy checks) may take at most.
PASSIVE_SHARE = 0.2
MIG_TEXT = "MIG enabled: checked at the parent GPU's level, not probed"


class CheckUsageError(Exception):
    """Bad input the caller can fix (a GPU index that does not exist): the usage exit code."""


class CannotCheck(Exception):
    """The node cannot be checked at all (no driver, NVML does not start): could-not-check."""


def passive_budget(timeout_seconds: float) -> float:
    """The passive read's own share of the check's timeout: one hung GPU must not starve the others' probes."""
    return max(2.0, PASSIVE_SHARE * timeout_seconds)


@dataclass(frozen=True)
class CheckRequest:
    gpus: Sequence[int] | None = None
    quick: bool = False
    timeout_seconds: float = 60.0
    require_probe: bool = False
    probe: str = DEFAULT_PROBE
    preset: str = DEFAULT_PRESET


@dataclass
class CheckOutcome:
    node: str
    verdicts: list[Verdict]
    #: Seconds per phase (open, passive, probe, judge) and in all.
    phases: dict[str, float] = field(default_factory=dict)
    probed: list[int] = field(default_factory=list)
    not_probed: dict[int, str] = field(default_factory=dict)
    #: The interconnect step's result (an InterconnectResult's dict, or ``not_run``); None: fewer
    #: than two GPUs probed.
    interconnect: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The extra ``check`` key of the JSON answer (beside the daemon's shape)."""
        return {"phases_seconds": {k: round(v, 3) for k, v in self.phases.items()},
                "probed": self.probed, "not_probed": {str(k): v for k, v in self.not_probed.items()},
                **({INTERCONNECT: self.interconnect} if self.interconnect is not None else {})}


def _bounded(fn: Callable[[], Any], deadline: float, name: str) -> tuple[bool, Any, BaseException | None]:
    """Run ``fn`` in a daemon thread until ``deadline``: (finished, value, exception)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        return False, None, None
    return True, box.get("value"), box.get("error")


def open_devices(config: Config, request: CheckRequest, deadline: float,
                 opener: Callable[[Config], Backend]) -> tuple[Backend, list[Device]]:
    """The backend and the GPUs asked for; CannotCheck or CheckUsageError with words for the operator."""
    from gpuperfd.device.errors import DriverNotFound

    def start() -> tuple[Backend, list[Device]]:
        backend = opener(config)
        return backend, backend.devices()

    done, value, error = _bounded(start, deadline, "check-open")
    if not done:
        raise CannotCheck("the GPU driver did not answer within the timeout (NVML init hangs)")
    if isinstance(error, DriverNotFound):
        raise CannotCheck(f"{error} (no NVIDIA driver or NVML cannot start; --simulate N runs a demo)")
    if isinstance(error, DeviceError):
        raise CannotCheck(f"cannot open the GPUs: {error}")
    if error is not None:
        raise error
    backend, devices = value
    if not devices:
        raise CannotCheck("the driver reports no GPU on this node")
    if request.gpus is not None:
        known = {d.index: d for d in devices}
        missing = [i for i in request.gpus if i not in known]
        if missing:
            raise CheckUsageError(f"--gpus: GPU index {', '.join(map(str, missing))} does not exist on this node "
                                  f"(GPUs: {', '.join(map(str, sorted(known)))})")
        devices = [known[i] for i in sorted(set(request.gpus))]
    return backend, devices


def passive_read(backend: Backend, devices: Sequence[Device], deadline: float) -> tuple[Sampler, set[int]]:
    """One read of every collector per GPU, in parallel; the indices whose read finished in time."""
    collectors = [cls() for name, cls in COLLECTORS.items() if name not in ("xid", "allocation")]
    sampler = Sampler(backend, list(devices), collectors, xid_enabled=False)
    threads = {}
    for device in devices:
        thread = threading.Thread(target=lambda d=device: [sampler.read_one(d, c) for c in sampler.collectors],
                                  name=f"check-read-gpu{device.index}", daemon=True)
        thread.start()
        threads[device.index] = thread
    try:
        for event in backend.wait_xid_events(0.0):  # events the driver has queued for us now
            sampler.xid_counts.add(event)
    except NotSupported:
        pass
    except DeviceError as exc:
        log.warning("cannot read XID events: %s", exc)
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    return sampler, {i for i, t in threads.items() if not t.is_alive()}


def why_not_probed(device: Device, config: Config, lost: bool) -> str | None:
    """Why this GPU must not be probed now (lost, MIG, busy), or None; the lock is taken apart."""
    if lost:
        return "not probed: the GPU does not answer"
    mig = mig_reason(device, allow_mig=False)
    if mig is not None:
        return MIG_TEXT if mig.kind is BusyKind.MIG else f"not probed: {mig}"
    busy = busy_reason(device, config.probes.idle_utilization_threshold, (os.getpid(),))
    if busy is not None and busy.kind is BusyKind.GPUPERFD_PROBE:  # a daemon's probe: not a user's job
        owner = _cap_owner(device, config)
        if not owner:  # a daemon of another state directory, or a CLI probe: the probe step waits for it
            return None
        return f"not probed: busy: {busy}{owner}"  # a sweep under our own lock holds the GPU for minutes
    return None if busy is None else f"not probed: busy, {busy} ({busy.kind.value})"


#: Seconds between looks at a GPU a gpuperfd probe child holds, while the check waits for it to go.
GPUPERFD_WAIT_POLL_SECONDS = 0.25
#: Most seconds the utilization a departed gpuperfd probe child leaves (NVML's last sample period) is waited out.
GPUPERFD_TAIL_SECONDS = 3.0


def wait_out_gpuperfd_probe(device: Device, config: Config, until: float, abort: threading.Event) -> str | None:
    """Wait while only gpuperfd probe children (a daemon's with another state directory, a CLI's) use
    the GPU, then while the utilization they leave lasts; why the GPU is still theirs at ``until``
    (the check's deadline), or None when it is free of them (a user's job is not waited for: the probe
    gives way to it as ever)."""
    threshold = config.probes.idle_utilization_threshold
    waited = False
    while True:
        busy = busy_reason(device, threshold, (os.getpid(),))
        if busy is None or busy.kind is not BusyKind.GPUPERFD_PROBE:
            if waited and busy is not None and busy.kind is BusyKind.UTILIZATION:
                busy_reason(device, threshold, (os.getpid(),),
                            wait_seconds=min(GPUPERFD_TAIL_SECONDS, max(0.0, until - time.monotonic())))
            return None
        left = until - time.monotonic()
        if left <= 0 or abort.is_set():
            return f"not probed: busy: {busy} until the check's deadline{_cap_owner(device, config)}"
        waited = True
        abort.wait(min(GPUPERFD_WAIT_POLL_SECONDS, left))


def measure_beside_gpuperfd(executor: Executor, device: Device, probe: ProbeRequest, abort: threading.Event,
                            config: Config, until: float) -> dict[str, Any]:
    """The check probe on ``device`` as a result dict, waiting (until ``until``) for a gpuperfd probe child
    instead of giving way to it as to a user's job: a daemon beside the check with another state
    directory takes no lock the check can see, and its child appearing mid-probe once made the check
    answer ``unknown``. A probe preempted by such a child is run again once the child has gone; one
    that never gets the GPU in time is ``not_probed``, with the reason."""
    threshold = config.probes.idle_utilization_threshold
    while True:
        held = wait_out_gpuperfd_probe(device, config, until, abort)
        if held is not None:
            return {"not_probed": held}
        result = measure_once(executor, device, probe, abort)
        if result.status != "skipped" or result.failure_reason != "preempted" or abort.is_set():
            return result.to_dict()
        busy = busy_reason(device, threshold, (os.getpid(),))
        if busy is None or busy.kind is not BusyKind.GPUPERFD_PROBE:
            return result.to_dict()  # a user's job: the probe gave way, as it must
        log.info("gpu %d: the check probe met %s; waiting for it", device.index, busy)


def _cap_owner(device: Device, config: Config) -> str:
    """Who holds the GPU's cap lock beside its probe child (the daemon or a CLI sweep), in words; "" if nobody."""
    try:
        owner = is_owned(config.probes.state_dir, safe_name(device.info().uuid))
    except (DeviceError, OSError):
        return ""
    return "" if owner is None else f", its power cap owned by pid {owner}"


def shares_gpus(config: Config) -> bool:
    """Whether the check's GPUs may be shared with a daemon or a sweep, so each probe takes the GPU's lock.

    Real GPUs are: the lock keeps a daemon beside the check from sweeping under its probe. Simulated
    GPUs live inside this process alone; nobody can sweep them, so a simulated check (which says
    read-only) writes nothing under the state directory."""
    return config.device.backend != "simulated"


def take_lock(config: Config, uuid: str) -> tuple[GpuLock | None, str | None]:
    """The GPU's lock, held for the probe so the daemon does not sweep under it; or why not probed.

    Where the state directory cannot hold a lock (a user without rights to it), the probe still
    runs if no live process holds the lock (read like a read-only sweep does, never fought for)."""
    state_dir = config.probes.state_dir
    if not state_dir.is_dir():
        return None, None  # no daemon or sweep ever ran here: nobody to own the GPU, nothing to create
    lock = GpuLock(state_dir, safe_name(uuid))
    try:
        lock.acquire(0.0)
        _give_to_directory_owner(lock)
        return lock, None
    except GpuBusy as exc:
        owner: int | None = exc.owner_pid
    except OSError as exc:
        owner = is_owned(config.probes.state_dir, safe_name(uuid))
        if owner is None:
            log.info("no lock for %s (%s): probing without one, as a read-only sweep does", uuid, exc)
            return None, None
    return None, f"not probed: owned by pid {owner} (a sweep or probe of the daemon or the CLI)"


def _give_to_directory_owner(lock: GpuLock) -> None:
    """A lock file root's check created must stay usable by the daemon's user (it opens it to lock):
    hand it to the state directory's owner, as if the daemon had made it."""
    if os.geteuid() != 0:
        return
    try:
        owner = os.stat(lock.path.parent)
        os.chown(lock.path, owner.st_uid, owner.st_gid, follow_symlinks=False)
    except OSError as exc:
        log.warning("cannot give %s to the state directory's owner: %s", lock.path, exc)


def _probe_config(config: Config, seconds: float) -> Config:
    """The check's probes: bounded by its budget, a short simulated window, and (unless the config sets
    ``simulation.cost_scale``) no simulated child costs: the check's short window is not time compressed
    for a scheduling test, and its verdict reads the physics, not the probe's wall time."""
    probes = config.probes.model_copy(update={
        "timeout_seconds": max(1.0, min(seconds, 7200.0)),
        "simulated_measure_seconds": SIMULATED_MEASURE_SECONDS})
    simulation = config.simulation
    if simulation.cost_scale is None:
        simulation = simulation.model_copy(update={"cost_scale": 0.0})
    return config.model_copy(update={"probes": probes, "simulation": simulation})


def probe_all(config: Config, backend: Backend, devices: Sequence[Device], request: CheckRequest,
              deadline: float) -> dict[int, dict[str, Any]]:
    """The check probe on each device in parallel: index -> the result's dict; a GPU whose probe did
    not come back by the deadline maps to a failed ``timeout`` result."""
    grace = min(3.0, max(0.5, 0.1 * request.timeout_seconds))
    # a check never creates the state directory: where it does not exist, the child keeps nothing there
    executor = choose_executor(_probe_config(config, deadline - time.monotonic() - grace), backend.name,
                               keep_records=config.probes.state_dir.is_dir())
    # the child's timing; the simulator measures one window of SIMULATED_MEASURE_SECONDS
    children = starts_children(config, backend.name)
    options = dict(CHECK_TIMING) if children and request.preset != "tiny" else {}
    # read-only and unsettled: one point at the cap the GPU holds, as the shipped figures were measured
    probe = ProbeRequest(probe=request.probe, preset=request.preset, options=options, settle_seconds=0.0)
    abort = threading.Event()
    admission = check_admission(config, backend.name)
    # each GPU's probe takes the GPU's turn with its child's host memory: the daemon's one rule
    turns = GpuTurns([device.index for device in devices], admission)
    need = admission.peaks.expected([request.probe]) if admission is not None else 0
    results: dict[int, dict[str, Any]] = {}
    threads = {}
    for device in devices:
        def run(d: Device = device) -> None:
            taken = False
            try:
                wait = max(0.0, deadline - grace - time.monotonic())
                turn = turns.take(d.index, Holder(HolderKind.CHECK, "gpuperfd check"), wait, stop=abort.is_set,
                                  memory=need, memory_timeout=wait)
                taken = turn is Turn.GRANTED
                if not taken:
                    reason = "memory_budget" if turn is Turn.REFUSED else "deadline"
                    results[d.index] = {"not_probed": not_admitted_text(reason, need)}
                    return
                results[d.index] = measure_beside_gpuperfd(executor, d, probe, abort, config, deadline - grace)
            except Exception as exc:  # noqa: BLE001 - a bug is this GPU's "could not check", never a crash
                log.exception("gpu %d: check probe failed", d.index)
                results[d.index] = {"probe": request.probe, "preset": request.preset, "status": "failed",
                                    "failure_reason": "exception", "error_message": str(exc)}
            finally:
                if taken:
                    turns.release(d.index)  # and its child's memory
        thread = threading.Thread(target=run, name=f"check-probe-gpu{device.index}", daemon=True)
        thread.start()
        threads[device.index] = thread
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        abort.set()

    timer = threading.Timer(max(0.0, deadline - grace - time.monotonic()), expire)
    timer.daemon = True
    timer.start()
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    timer.cancel()
    abort.set()
    out = {}
    for index in threads:
        result = results.get(index)
        if result is None or (expired.is_set() and result.get("failure_reason") == "aborted"):
            result = {"probe": request.probe, "preset": request.preset, "status": "failed",
                      "failure_reason": "timeout",
                      "error_message": f"the probe did not finish within the {request.timeout_seconds:g} s timeout"}
        out[index] = result
    return out


def check_admission(config: Config, backend_name: str) -> Admission | None:
    """The host-memory book of the check's probe children, which its GPU turns book them in (None on the simulator)."""
    if not starts_children(config, backend_name):
        return None
    return Admission(*memory_limit(config.probes.memory_budget))


def not_admitted_text(reason: str, need: int) -> str:
    """Why a GPU got no probe child: the memory it needed was not free in time, or never fits."""
    mib = need / 2**20
    if reason == "memory_budget":
        return (f"not probed: host memory too small for one probe child (~{mib:.0f} MiB; raise the memory limit, "
                "docs/operations.md, sizing)")
    return (f"not probed: no host memory for its probe child (~{mib:.0f} MiB) before the deadline, other GPUs' "
            "children held it (raise --timeout or the memory limit)")


def _power_limit(device: Device) -> float | None:
    try:
        return device.power_limits().enforced_watts
    except DeviceError:
        return None


def gate(config: Config, request: CheckRequest, devices: Sequence[Device], inputs: dict[int | None, GpuInputs],
         outcome: CheckOutcome, deadline: float) -> tuple[list[Device], list[GpuLock]]:
    """Which GPUs to probe (their locks held), in parallel under ``deadline``; the others get their
    ``not_probed`` words, and a GPU whose busy check does not answer in time is unknown."""
    decided: dict[int, tuple[str | None, GpuLock | None]] = {}

    def decide(device: Device) -> None:
        gpu = inputs[device.index]
        why = "not probed: --quick (passive checks only)" if request.quick else why_not_probed(device, config, gpu.lost)
        lock = None
        if why is None and shares_gpus(config):
            lock, why = take_lock(config, gpu.uuid)
        decided[device.index] = (why, lock)

    threads = [threading.Thread(target=decide, args=(d,), name=f"check-gate-gpu{d.index}", daemon=True)
               for d in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    to_probe, locks = [], []
    for device in devices:
        gpu = inputs[device.index]
        if device.index not in decided:
            gpu.runs = [{"status": "failed", "failure_reason": "timeout", "probe": "busy check", "preset": "read",
                         "error": "the GPU did not answer the busy check in time"}]
            continue
        why, lock = decided[device.index]
        if lock is not None:
            locks.append(lock)
        if why is None:
            to_probe.append(device)
        else:
            gpu.not_probed = outcome.not_probed[device.index] = why
    return to_probe, locks


def _interconnect_judged(backend: Backend, devices: Sequence[Device],
                         ran: dict[str, Any] | None) -> dict[str, Any] | None:
    """The interconnect checks' inputs: the node's NVLink pairs (links up against the board's), and the
    interconnect step's copies where it ran well on the GPUs themselves (NCCL, or the simulated node's
    links; a gloo run on the CPU copies host memory and says nothing of a link); None where the
    backend cannot tell its topology."""
    try:
        topology, links = read_topology(backend, devices)
    except DeviceError:
        return None
    result = None
    if ran is not None and "status" in ran and ran.get("backend") in ("nccl", "simulated"):
        try:
            result = InterconnectResult.from_dict(ran)
        except (TypeError, ValueError):
            result = None
    return interconnect_inputs(result, topology, links)


def _interconnect_step(config: Config, backend: Backend, to_probe: Sequence[Device], outcome: CheckOutcome,
                       inputs: dict[int | None, GpuInputs], deadline: float,
                       executor: tuple[InterconnectExecutor, str] | None, now: float) -> None:
    """The interconnect probe across the GPUs probed (a per-GPU probe that gave way to a user's job
    leaves its GPU out), when two or more are."""
    free = [d for d in to_probe if d.index in outcome.probed
            and not any(r.get("status") == "skipped" for r in inputs[d.index].runs)]
    if len(free) < 2:
        return
    outcome.interconnect = run_interconnect(config, backend, free, deadline, executor)
    apply_to_inputs(outcome.interconnect, inputs, now)


def run_check(config: Config, request: CheckRequest,
              opener: Callable[[Config], Backend] | None = None,
              interconnect: tuple[InterconnectExecutor, str] | None = None) -> CheckOutcome:
    """The whole check under one deadline; raises CannotCheck or CheckUsageError before any verdict."""
    from gpuperfd.device.factory import open_backend

    t0 = time.monotonic()
    deadline = t0 + request.timeout_seconds
    phases: dict[str, float] = {}
    budget = passive_budget(request.timeout_seconds)
    backend, devices = open_devices(config, request, deadline, opener or open_backend)
    phases["open"] = time.monotonic() - t0
    mark = time.monotonic()
    passive_seconds = min(deadline - mark, budget)
    sampler, read = passive_read(backend, devices, mark + passive_seconds)
    now = time.time()
    inputs = {g.gpu: g for g in snapshot_inputs(sampler, sorted(read), now)}
    phases["passive"] = time.monotonic() - mark
    for device in devices:
        if device.index not in inputs:  # the read did not finish (or the GPU has no identity)
            inputs[device.index] = GpuInputs(gpu=device.index, uuid="", runs=[{
                "status": "failed", "failure_reason": "timeout", "probe": "telemetry", "preset": "read",
                "error": f"the GPU's telemetry read did not finish within {passive_seconds:.1f} s, "
                         "or the GPU gave no identity"}])
    outcome = CheckOutcome(node=socket.gethostname(), verdicts=[])
    mark = time.monotonic()
    to_probe, locks = gate(config, request, [d for d in devices if not inputs[d.index].runs], inputs, outcome,
                           min(deadline, mark + budget))
    phases["gate"] = time.monotonic() - mark
    mark = time.monotonic()
    # two or more GPUs: the interconnect step after the per-GPU probes keeps its share of the time
    probe_deadline = deadline - (INTERCONNECT_SHARE * request.timeout_seconds if len(to_probe) >= 2 else 0.0)
    try:
        if to_probe:
            limits = {d.index: _power_limit(d) for d in to_probe}
            for index, result in probe_all(config, backend, to_probe, request, probe_deadline).items():
                gpu = inputs[index]
                if "not_probed" in result:  # no memory for its child in time
                    gpu.not_probed = outcome.not_probed[index] = result["not_probed"]
                    continue
                gpu.runs = [run_row(result, limits[index], now)]
                key = f"{result.get('probe')}/{result.get('preset')}"
                figure, note = expected_figure(gpu.name, request.probe, str(result.get("preset") or request.preset),
                                               limits[index])
                gpu.expected = {key: figure if figure is not None else {"note": note}}
                outcome.probed.append(index)
        _interconnect_step(config, backend, to_probe, outcome, inputs, deadline, interconnect, now)
    finally:
        for lock in locks:
            lock.release()
    phases["probe"] = time.monotonic() - mark
    mark = time.monotonic()
    thresholds = {**config.health.thresholds, **({"require_probe": 1.0} if request.require_probe else {})}
    outcome.verdicts = judge([inputs[d.index] for d in devices], thresholds, now,
                             _interconnect_judged(backend, devices, outcome.interconnect))
    phases["judge"] = time.monotonic() - mark
    phases["total"] = time.monotonic() - t0
    outcome.phases = phases
    return outcome

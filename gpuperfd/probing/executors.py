"""How the daemon and the CLIs run probe points: the executor protocol and the one choice of executor.

An :class:`Executor` opens a :class:`Session` for one probe on one GPU
(``open(device, request, abort, carried)``); the sweep prepares it before any cap changes, measures
one point per cap and closes it. Between the schedules of one round on a GPU the live probe child is
handed over explicitly (:func:`open_session`: the previous session's ``hand_over()`` becomes the next
``open``'s ``carried``), so one child serves every probe of the round.

The two executors live beside what they drive: the child process (:mod:`~gpuperfd.probing.child.session`, torch in a
child) and the simulator's physics (:mod:`~gpuperfd.probing.simulated.probe`); this module only chooses between them,
for every caller (the daemon, ``sweep``, ``check``, ``probe``, the interconnect probe's): nowhere else decides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuperfd.config import Config
from gpuperfd.device.base import Backend, Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.health.checks import defaults as health_defaults
from gpuperfd.health.interconnect import interconnect_inputs, read_topology, slow_pairs
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.interconnect.executor import InterconnectExecutor, RetestingExecutor, SlowPairs
from gpuperfd.probing.child.session import ChildProcessExecutor, PeakCallback, child_process_executor
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD
from gpuperfd.probing.simulated.costs import cost_scale_for
from gpuperfd.probing.simulated.probe import (
    SIMULATED_PROFILE,
    SimulatedExecutor,
    simulated_executor,
    simulated_profile_name,
)

if TYPE_CHECKING:
    from gpuperfd.probing.child.runner import ProbeChild, ProgressCallback

__all__ = ["Executor", "choose_interconnect_executor", "interconnect_executor", "Session", "PeakCallback",
           "PerPointExecutor", "open_session", "measure_once", "choose_executor", "command_executor", "starts_children",
           "ChildProcessExecutor", "child_process_executor",
           "SimulatedExecutor", "simulated_executor", "SIMULATED_PROFILE", "simulated_profile_name"]


class Session(Protocol):
    """One sweep's probe, built once: ``measure`` runs it at the cap set now (a warm sweep)."""

    def prepare(self) -> None:
        """Whatever needs no GPU, done before the sweep changes a cap (a child's imports)."""

    def measure(self, cap_watts: float | None) -> ProbeResult:
        """One point at the cap the GPU holds now (``cap_watts``, for the record; None: not read)."""

    def hand_over(self) -> ProbeChild | None:
        """The live probe child, taken out for the round's next session (None: none, or dead)."""

    def close(self) -> None:
        """End whatever the session still holds (its child)."""


class Executor(Protocol):
    """Runs probes on a device: a session per sweep (a one-shot point is a session of one, :func:`measure_once`)."""

    def open(self, device: Device, request: ProbeRequest, abort: threading.Event,
             carried: ProbeChild | None = None, on_progress: ProgressCallback | None = None) -> Session:
        """A session for ``request``; ``carried``: the previous session's child, to build this probe in;
        ``on_progress``: told the probe's progress messages (phase, repeat of repeats: a CLI's bar)."""


class _PerPointSession:
    """Every ``measure`` is one whole run of the function (spawn, build, measure)."""

    def __init__(self, run: Callable[[], ProbeResult]) -> None:
        self._run = run

    def prepare(self) -> None:
        pass  # every point starts from scratch

    def measure(self, cap_watts: float | None) -> ProbeResult:
        return self._run()

    def hand_over(self) -> ProbeChild | None:
        return None

    def close(self) -> None:
        pass


class PerPointExecutor:
    """An executor from a plain function ``(device, request, abort) -> result`` that runs one point from
    scratch: a wrapper that counts or fails points (tests, benchmarks) says so by wrapping it here."""

    def __init__(self, run_point: Callable[[Device, ProbeRequest, threading.Event], ProbeResult]) -> None:
        self.run_point = run_point

    def open(self, device: Device, request: ProbeRequest, abort: threading.Event,
             carried: ProbeChild | None = None, on_progress: ProgressCallback | None = None) -> Session:
        if carried is not None:
            carried.close()
        return _PerPointSession(lambda: self.run_point(device, request, abort))


def open_session(executor: Executor, device: Device, request: ProbeRequest, abort: threading.Event,
                 after: Session | None = None) -> Session:
    """``executor``'s session for ``request``.

    ``after``: the session of the previous schedule of the same round on this GPU, not closed yet: its
    live child is handed to the new session (one child serves every probe of the round; the old
    workload is dropped and the new one built in it) and the rest of it is closed.
    """
    carried = None
    if after is not None:
        carried = after.hand_over()
        after.close()
    return executor.open(device, request, abort, carried=carried)


def measure_once(executor: Executor, device: Device | None, request: ProbeRequest, abort: threading.Event,
                 on_progress: ProgressCallback | None = None) -> ProbeResult:
    """One point at the cap the GPU holds now, through a session of its own: ``gpuperfd probe`` and
    ``gpuperfd check``, read-only (no cap is set, so there is nothing to own or restore).

    ``device`` None: no GPU to watch (a CPU probe, or ``--no-idle-check``; the child executor only).
    No ``prepare``: it exists to do the imports before a sweep changes a cap, and here none changes,
    so the point starts at its busy check (a busy GPU starts no child) and one deadline covers the
    start, the build and the measurement. The result's start and wall time are the whole run's.
    """
    started_at, t0 = time.time(), time.monotonic()
    session = executor.open(device, request, abort, on_progress=on_progress)  # type: ignore[arg-type]  # None: above
    try:
        result = session.measure(None)
    finally:
        session.close()
    result.started_at = started_at
    result.wall_seconds = time.monotonic() - t0
    return result


def starts_children(config: Config, backend_name: str) -> bool:
    """Whether :func:`choose_executor` picks the child executor: only then do probes need host
    memory admitted (:mod:`gpuperfd.probing.gates.admission`); the simulator runs in this process."""
    return _children(config.probes.executor, backend_name)


def _children(executor: str, backend_name: str) -> bool:
    """The one decision, for every executor below: a probe child (or worker), unless ``executor`` (the
    ``probes.executor`` setting) says ``simulated``, or ``auto`` on the simulated backend."""
    return not (executor == "simulated" or (executor == "auto" and backend_name == "simulated"))


def choose_executor(config: Config, backend_name: str, on_peak: PeakCallback | None = None,
                    keep_records: bool = True) -> Executor:
    """The one executor choice, for the daemon, ``gpuperfd sweep`` and ``gpuperfd check`` alike.

    ``probes.executor``: ``simulated`` (the simulator's physics, in this process), ``child`` (torch in
    a child process), or ``auto``: simulated on the simulated backend, a child otherwise. ``on_peak``:
    told each child's peak host RSS (the admission's :class:`~gpuperfd.probing.gates.admission.PeakBook`).
    ``keep_records``: the child keeps its record and compile cache in the state directory (``gpuperfd
    check`` never creates it: where it does not exist, none).
    """
    if not starts_children(config, backend_name):
        scale = cost_scale_for(config.simulation.cost_scale, config.probes.simulated_measure_seconds)
        return simulated_executor(config.probes.simulated_measure_seconds, seed=config.simulation.seed,
                                  cost_scale=scale)
    return child_process_executor(config.probes.timeout_seconds, config.probes.torch_device,
                                  state_dir=config.probes.state_dir if keep_records else None,
                                  idle_utilization_threshold=config.probes.idle_utilization_threshold,
                                  on_peak=on_peak)


def command_executor(backend_name: str, timeout_seconds: float, idle_utilization_threshold: float,
                     simulated_measure_seconds: float, seed: int | None = None) -> Executor:
    """``gpuperfd probe``'s executor, chosen as ``probes.executor: auto`` chooses (the simulator's on
    the simulated backend of ``--simulate``, else a child on the spec's torch device) from its flags
    rather than the daemon's config: its timeout is the spec's (no config bound), it records nothing
    (no state directory), and the simulator charges no child costs (its windows are the spec's)."""
    if not _children("auto", backend_name):
        return simulated_executor(simulated_measure_seconds, seed=seed)
    return child_process_executor(timeout_seconds, idle_utilization_threshold=idle_utilization_threshold)


def choose_interconnect_executor(config: Config, backend: Backend,
                                 keep_records: bool = True) -> tuple[InterconnectExecutor, str]:
    """The interconnect executor of the daemon and ``gpuperfd check``, and its kind (simulated, cuda,
    cpu): :func:`interconnect_executor` on ``probes.torch_device``, wrapped in the retest of a slow pair.
    ``keep_records``: record the workers in the state directory (``gpuperfd check`` never creates it)."""
    limit = {**health_defaults(), **config.health.thresholds}["interconnect_expected_ratio"]
    inner, kind = interconnect_executor(
        backend, config.probes.torch_device, executor=config.probes.executor, seed=config.simulation.seed,
        idle_utilization_threshold=config.probes.idle_utilization_threshold,
        record_dir=config.probes.state_dir if keep_records else None)
    return RetestingExecutor(inner, slow_pairs_on(backend, limit)), kind


def interconnect_executor(backend: Backend | None, torch_device: str, executor: str = "auto",
                          seed: int | None = None, idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD,
                          record_dir: Path | None = None,
                          ranks: int | None = None) -> tuple[InterconnectExecutor, str]:
    """The one interconnect executor choice and its kind, picked as :func:`choose_executor` picks the
    per-GPU one: the simulated node's figures (``device/simulated_topology.py``) on the simulator, else
    one worker per GPU on ``torch_device`` (``backend`` None: ``ranks`` gloo ranks on this host's CPU).
    ``executor``: the ``probes.executor`` setting (``gpuperfd probe interconnect``: ``auto``)."""
    if backend is not None and not _children(executor, backend.name):
        from gpuperfd.device.simulated import SimulatedBackend
        from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor

        if not isinstance(backend, SimulatedBackend):  # the simulated fabric is the simulated node's own
            raise ValueError(f"probes.executor: {executor}: the simulated node probe measures the "
                             f"simulated node's interconnect (device.backend: simulated); this node's backend is "
                             f"{backend.name}")
        return SimulatedInterconnectExecutor(backend.interconnect, seed=seed), "simulated"
    from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor

    return ProcessInterconnectExecutor(torch_device, ranks=ranks, record_dir=record_dir,
                                       idle_utilization_threshold=idle_utilization_threshold), torch_device


def slow_pairs_on(backend: Backend, limit: float) -> SlowPairs:
    """The retest's judge on ``backend``'s node: the ordered NVLink pairs whose copies are below
    ``limit`` of the figure the verdict holds them to (health/interconnect.py). A gloo run on a CPU
    copies host memory and says nothing of a link: nothing to retest."""
    def slow(result: InterconnectResult, devices: Sequence[Device]) -> set[tuple[int, int]]:
        if result.backend not in ("nccl", "simulated"):
            return set()
        try:
            topology, links = read_topology(backend, devices)
        except DeviceError:
            return set()
        return slow_pairs(interconnect_inputs(result, topology, links)["copies"], limit)

    return slow

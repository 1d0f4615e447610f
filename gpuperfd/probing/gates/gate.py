"""The gate of a node's GPUs: may this GPU be probed now?

One object answers for the whole daemon, so a round, the gap dispatcher, an interconnect run and apply
mode's cap write all ask the same question of the same state: the kubelet's allocations (and whether
the kubelet must answer at all), the idle tracker fed by the sampler, and when our own last load on
each GPU ended (its utilization tail is ours, not a user's). The checks themselves are the pure ones
of :mod:`gpuperfd.probing.gates.idle`; this holds what they read.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

from gpuperfd.attribution.allocations import AllocationState
from gpuperfd.config import ProbesConfig
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probing.gates.idle import (BusyKind, IdleTracker, allocated_reason, busy_after_own_run, mig_reason,
                                         not_idle_text, pod_reason)
from gpuperfd.probing.gates.turns import Release

#: Seconds after our own run on a GPU during which its utilization is read as our run's tail.
OWN_LOAD_GRACE_SECONDS = 2.0


class GpuGate:
    """Whether each GPU of the node may be probed now, and whether a user's job holds it; thread-safe
    as far as its parts are (the tracker locks, the own-load times are single writes per GPU)."""

    def __init__(self, config: ProbesConfig, tracker: IdleTracker, abort: threading.Event,
                 allocations: Callable[[], AllocationState] | None = None,
                 kubelet_socket: str | None = None) -> None:
        #: The probes config it reads (ours, allow_mig, idle_seconds, the utilization threshold); a reload
        #: hands it the new one (:meth:`~gpuperfd.probing.scheduling.service.ProbeService.apply_config`).
        self.config = config
        #: Since when each GPU has been idle (the sampler's readings), and where our own load runs now.
        self.tracker = tracker
        #: The daemon's stop: the wait for our own run's tail gives up at once when it is set.
        self.abort = abort
        #: The kubelet's latest pod allocations (None: not on Kubernetes, processes only).
        self.allocations = allocations
        #: Where the kubelet must answer before any probe runs (inside a pod); None on bare metal.
        self.kubelet_socket = kubelet_socket
        #: Monotonic time our last load on each GPU ended (a round, an interconnect hold).
        self._own_load_ended: dict[int, float] = {}

    def refusal(self, device: Device, wait: bool = True) -> tuple[str, str] | None:
        """(reason, detail) why ``device`` must not be probed now (lost, allocated, MIG, not idle long
        enough, busy), or None: the one gate of a round and of the interconnect probe's every GPU.
        ``wait`` False: never sleep for our own run's utilization tail (reason ``own_tail`` at once):
        the gap dispatcher asks for every GPU on one thread, and a wait for one GPU held all the others
        (seen in the busy-fleet test: every GPU's gap went unseen for the grace)."""
        gpu = device.index
        try:
            device.info()  # a lost GPU is skipped with its reason, not raised into the scheduler
        except DeviceError as exc:
            return exc.reason, str(exc)
        held = self.claimed_now(device)
        if held is not None:  # someone's GPU, even at zero utilization
            return "allocated", held
        if (why := mig_reason(device, self.config.allow_mig)) is not None:
            return "mig", str(why)
        idle_for = self.tracker.idle_for(gpu)
        if idle_for < self.config.idle_seconds and self.tracker.handed_since(gpu) is None:
            return "not_idle", not_idle_text(idle_for, self.config.idle_seconds)
        ended = self._own_load_ended.get(gpu, -math.inf)  # the one busy check, with our own tail's grace
        reason = busy_after_own_run(device, self.config.idle_utilization_threshold, (os.getpid(),),
                                    time.monotonic() - ended, OWN_LOAD_GRACE_SECONDS, self.abort, wait=wait)
        if reason is not None:
            return ("own_tail" if reason.kind is BusyKind.OWN_TAIL and not wait else "busy"), str(reason)
        return None

    def claimed_now(self, device: Device) -> str | None:
        """Why a user's job holds this GPU now, read live (a pod's allocation, a compute process not
        ours), or None: apply mode's check at the moment it writes a cap (issue 51)."""
        held = allocated_reason(device, self._state(), self.config.ours, (os.getpid(),), self.kubelet_socket)
        return None if held is None else str(held)

    def wanted(self, device: Device) -> str | None:
        """Why a pod now holds this GPU (asked between a round's points: the round gives way), or None."""
        reason = pod_reason(device, self._state(), self.config.ours)
        return None if reason is None else str(reason)

    def released(self, done: Release) -> None:
        """A turns listener: a GPU given back after a load of ours (a round, an interconnect run) starts
        our load's tail now; an apply change ran no load (``load`` None)."""
        if done.load is not None:
            self.load_ended(done.gpu, done.load[1])

    def load_ended(self, gpu: int, when: float) -> None:
        """Our load on ``gpu`` ended at monotonic ``when``: its utilization for a grace after is our tail."""
        self._own_load_ended[gpu] = when

    def last_load_end(self, gpu: int) -> float | None:
        """When (monotonic) our last load on ``gpu`` ended, or None if none did since the start."""
        return self._own_load_ended.get(gpu)

    def _state(self) -> AllocationState | None:
        return self.allocations() if self.allocations is not None else None

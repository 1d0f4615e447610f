"""Which pod holds which GPU: a background poller of the kubelet's PodResources API.

One thread per daemon calls ``List`` every ``interval_seconds`` (default 10 s)
and keeps the latest answer as device id -> allocations. The ``allocation``
collector and the probe gate read that snapshot; neither ever waits on the
kubelet. A failed call keeps the last good answer for the probe gate (a GPU we
last saw allocated stays off-limits while the kubelet restarts) and marks the
state failed with its reason for the collector.

Device ids are what the device plugin hands the kubelet: GPU UUIDs
(``GPU-...``), MIG device UUIDs (``MIG-...``) and, with time-slicing,
``<uuid>::<replica>``; the replica suffix is dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuperfd.attribution.podresources import (
    PodResources,
    PodResourcesError,
    list_pod_resources,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Allocation:
    """One device of one container, as the kubelet lists it."""

    namespace: str
    pod: str
    container: str
    resource: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
    device_id: str  # the GPU or MIG UUID, replica suffix removed


@dataclass(frozen=True)
class AllocationState:
    """The poller's view: last good map, and how the latest call went."""

    by_device: dict[str, tuple[Allocation, ...]] = field(default_factory=dict)
    #: The socket has existed at least once (False on bare metal: nothing to report).
    seen: bool = False
    #: At least one call succeeded: ``by_device`` is a real answer, not "unknown".
    answered: bool = False
    ok: bool = False
    reason: str | None = None  # why the latest call failed
    updated: float = float("-inf")  # monotonic time of the latest call's end

    def for_devices(self, device_ids: Iterable[str]) -> list[Allocation]:
        found: list[Allocation] = []
        for device_id in device_ids:
            found.extend(self.by_device.get(device_id, ()))
        return found


def allocation_map(pods: Iterable[PodResources], resource_prefixes: tuple[str, ...]) -> dict[str, tuple[Allocation, ...]]:
    """device id -> allocations, for resources whose name starts with one of the prefixes."""
    mapping: dict[str, list[Allocation]] = {}
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(resource_prefixes):
                    continue
                for device_id in devices.device_ids:
                    base = device_id.split("::", 1)[0]
                    allocation = Allocation(pod.namespace, pod.name, container.name, devices.resource_name, base)
                    if allocation not in mapping.setdefault(base, []):
                        mapping[base].append(allocation)
    return {key: tuple(value) for key, value in mapping.items()}


def kubelet_required(setting: bool | str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether probes need the kubelet's answer (attribution.kubernetes.required; "auto": inside a pod)."""
    if setting == "auto":
        return bool(environ.get("KUBERNETES_SERVICE_HOST"))  # set in every container Kubernetes starts
    return bool(setting)


class PodResourcesWatcher:
    """Polls the kubelet on its own thread; ``state()`` is cheap and never blocks on the kubelet."""

    def __init__(
        self,
        socket_path: str,
        *,
        interval_seconds: float = 10.0,
        timeout_seconds: float = 2.0,
        resource_prefixes: tuple[str, ...] = ("nvidia.com/",),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self.resource_prefixes = resource_prefixes
        self.clock = clock
        self._lock = threading.Lock()
        self._state = AllocationState()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_reason: str | None = None

    def state(self) -> AllocationState:
        with self._lock:
            return self._state

    def stale_after(self) -> float:
        """Age past which the state is treated as failed (a hung poller)."""
        return 3 * self.interval_seconds + self.timeout_seconds

    def poll_once(self) -> AllocationState:
        """One List call; updates and returns the state."""
        seen = self.state().seen or os.path.exists(self.socket_path)
        try:
            pods = list_pod_resources(self.socket_path, self.timeout_seconds)
        except PodResourcesError as exc:
            seen = seen or exc.reason == "no_permission"  # exists() is False when we may not look
            self._log_failure(exc, seen)
            with self._lock:
                self._state = AllocationState(self._state.by_device, seen, self._state.answered, False, exc.reason, self.clock())
                return self._state
        except Exception:  # a bug here must not end the poller
            log.exception("kubelet PodResources: List failed")
            with self._lock:
                self._state = AllocationState(self._state.by_device, seen, self._state.answered, False, "unknown", self.clock())
                return self._state
        if self._last_reason is not None:
            log.info("kubelet PodResources: %s answers again", self.socket_path)
            self._last_reason = None
        return self.apply(pods)

    def apply(self, pods: Iterable[PodResources]) -> AllocationState:
        """Take ``pods`` as the kubelet's latest answer (what a successful List does)."""
        with self._lock:
            self._state = AllocationState(allocation_map(pods, self.resource_prefixes), True, True, True, None, self.clock())
            return self._state

    def _log_failure(self, exc: PodResourcesError, seen: bool) -> None:
        if exc.reason != self._last_reason and seen:  # once per change of reason, not every poll
            log.warning("kubelet PodResources (%s): %s: %s", self.socket_path, exc.reason, exc)
        self._last_reason = exc.reason

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet-podresources", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval_seconds)

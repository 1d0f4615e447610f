"""Which pod and container hold this GPU (or its MIG devices): one info series per allocation.

The kubelet's answer comes from :class:`~gpuperfd.attribution.allocations.PodResourcesWatcher`,
which polls on its own thread; this collector only matches the latest answer to
the GPU's UUID and MIG UUIDs. The series carries ``gpu``/``uuid`` like every
other, so PromQL joins it onto any GPU series (docs/metrics.md) instead of every
series carrying pod labels that churn with each pod.

No socket ever seen (bare metal): nothing to report, not a failure. A socket
that answered once and now fails, or a poller that stopped: the collector
fails with the call's reason (``unavailable``, ``no_permission``, ``timeout``, ``malformed``,
``rpc_error``, ``stale``) and the series are absent until it answers again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuperfd.attribution.allocations import PodResourcesWatcher
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError, NotSupported
from gpuperfd.telemetry.collectors.base import (
    Collector,
    MetricSpec,
    Point,
    optional,
    register,
)

if TYPE_CHECKING:
    from gpuperfd.config import Config


class AttributionError(DeviceError):
    """The kubelet could not be asked; ``reason`` is the call's failure reason."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


@register
class AllocationCollector(Collector):
    name = "allocation"
    help = "Kubernetes pod, namespace and container holding the GPU or its MIG devices (kubelet PodResources)"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec(
            "gpuperf_gpu_allocation_info",
            "1 per container holding this GPU or one of its MIG devices (kubelet PodResources API); "
            "device is the allocated GPU or MIG UUID.",
            labels=("namespace", "pod", "container", "resource", "device"),
        ),
    )

    def __init__(self, watcher: PodResourcesWatcher | None = None) -> None:
        self.watcher = watcher
        self._uuids: dict[int, str] = {}  # a GPU's UUID never changes: read once

    @classmethod
    def from_config(cls, config: Config) -> AllocationCollector:
        """With its own kubelet poller, from ``attribution.kubernetes``: the daemon starts and stops
        it, and the probe gate reads its answers too (:attr:`CollectorSet.pod_resources`)."""
        kubernetes = config.attribution.kubernetes
        return cls(PodResourcesWatcher(
            kubernetes.socket,
            interval_seconds=kubernetes.interval_seconds,
            timeout_seconds=kubernetes.timeout_seconds,
            resource_prefixes=tuple(kubernetes.resource_prefixes),
        ))

    def _uuid(self, device: Device) -> str:
        uuid = self._uuids.get(device.index)
        if uuid is None:
            uuid = self._uuids[device.index] = device.info().uuid
        return uuid

    def read(self, device: Device) -> list[Point]:
        if self.watcher is None:
            raise NotSupported("no kubelet PodResources socket configured")
        state = self.watcher.state()
        if not state.seen:
            raise NotSupported(f"{self.watcher.socket_path} has never existed (not a Kubernetes node)")
        if not state.ok:
            raise AttributionError(state.reason or "unknown", f"kubelet PodResources: {state.reason}")
        if self.watcher.clock() - state.updated > self.watcher.stale_after():
            raise AttributionError("stale", "kubelet PodResources poller has not finished a call in time")
        ids = [self._uuid(device), *(optional(device.mig_uuids) or [])]
        return [
            Point("gpuperf_gpu_allocation_info", 1.0, (a.namespace, a.pod, a.container, a.resource, a.device_id))
            for a in sorted(state.for_devices(ids), key=lambda a: (a.device_id, a.namespace, a.pod, a.container))
        ]

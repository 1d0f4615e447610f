"""``gpuperfd top --local``: the GPUs read here, one read per frame, when no daemon runs.

Opens the backend the way every command does (:func:`gpuperfd.device.factory.open_backend`: NVML,
or simulated GPUs only when asked with ``--simulate N``; no driver is the device layer's own
:class:`~gpuperfd.device.errors.DriverNotFound`, never a quiet switch to simulation), reads the
glance collectors through a :class:`~gpuperfd.telemetry.sampler.Sampler` in this thread and builds
``GET /api/v1/gpus``'s shape with :func:`gpuperfd.web.status.gpu_status`. Verdicts, probe results
and sweeps live in the daemon, so a local frame has none (the header says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuperfd.config import Config
from gpuperfd.device.base import Backend
from gpuperfd.device.factory import open_backend, selected_devices
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.sampler import Sampler
from gpuperfd.top.client import TopError
from gpuperfd.web.status import gpu_status

#: The collectors a frame shows (web/status.py's FIELDS and the clock-event reasons).
GLANCE_COLLECTORS = ("info", "utilization", "memory", "power", "temperature", "clocks", "clock_events")


class LocalSource:
    """Frames read from this node's GPUs (or simulated ones) by this process."""

    def __init__(self, config: Config, gpus: Sequence[int] | None = None, backend: Backend | None = None) -> None:
        self.backend = backend if backend is not None else open_backend(config)  # DriverNotFound propagates
        devices = selected_devices(self.backend, config)
        if gpus is not None:
            known = {d.index: d for d in devices}
            missing = [i for i in gpus if i not in known]
            if missing:
                self.backend.close()
                raise TopError(f"--gpus: GPU index {', '.join(map(str, missing))} does not exist here "
                               f"(GPUs: {', '.join(map(str, sorted(known))) or 'none'})")
            devices = [known[i] for i in sorted(set(gpus))]
        kind = "simulated GPUs" if config.device.backend == "simulated" else "NVML"
        self.description = f"local {kind} (no daemon: no verdicts, probe results or sweeps)"
        self.sampler = Sampler(self.backend, devices, [COLLECTORS[name]() for name in GLANCE_COLLECTORS],
                               xid_enabled=False, call_timeout_seconds=config.device.call_timeout_seconds)

    def fetch(self) -> dict[str, Any]:
        self.sampler.sample_once()
        return gpu_status(self.sampler.store.snapshot(), self.sampler.interval_seconds, self.backend.name,
                          source="local")

    def close(self) -> None:
        self.backend.close()

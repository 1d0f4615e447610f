"""Choose the device backend from the configuration, explicitly.

The simulator is used only when asked for (``--simulate N`` or
``device.backend: simulated``); a node without a driver gets DriverNotFound,
never a silent switch to simulated GPUs.
"""

from __future__ import annotations

from gpuperfd.config import Config
from gpuperfd.device.base import Backend, Device


def open_backend(config: Config) -> Backend:
    if config.device.backend == "simulated":
        from gpuperfd.device.simulated import SimulatedBackend

        return SimulatedBackend(config.simulation, call_timeout_seconds=config.device.call_timeout_seconds)
    from gpuperfd.device.nvml import NvmlBackend

    return NvmlBackend(indices=config.device.gpus, call_timeout_seconds=config.device.call_timeout_seconds)


def selected_devices(backend: Backend, config: Config) -> list[Device]:
    """The backend's devices, limited to ``device.gpus`` when set (simulated backend too)."""
    devices = backend.devices()
    if config.device.gpus is None:
        return devices
    wanted = set(config.device.gpus)
    return [d for d in devices if d.index in wanted]

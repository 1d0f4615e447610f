"""Choose the device backend from the configuration, explicitly.

The simulator is used only when asked for (``--simulate N`` or
``device.backend: simulated``); a node without a driver gets DriverNotFound,
never a silent switch to simulated GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpuperfd.config import Config
from gpuperfd.device.base import Backend, Device

T = TypeVar("T")


def open_backend(config: Config) -> Backend:
    if config.device.backend == "simulated":
        from gpuperfd.device.simulated import SimulatedBackend

        return SimulatedBackend(config.simulation, call_timeout_seconds=config.device.call_timeout_seconds)
    from gpuperfd.device.nvml import NvmlBackend

    return NvmlBackend(indices=config.device.gpus, call_timeout_seconds=config.device.call_timeout_seconds)


def with_devices(config: Config, act: Callable[[list[Device]], T]) -> T:
    """Open the backend, hand its devices to ``act``, close it whatever happens: for one-shot commands
    (``restore-caps``, ``apply --revert``). A DeviceError (no driver) propagates: their exit 3."""
    backend = open_backend(config)
    try:
        return act(backend.devices())
    finally:
        backend.close()


def selected_devices(backend: Backend, config: Config) -> list[Device]:
    """The backend's devices, limited to ``device.gpus`` when set (simulated backend too)."""
    devices = backend.devices()
    if config.device.gpus is None:
        return devices
    wanted = set(config.device.gpus)
    return [d for d in devices if d.index in wanted]

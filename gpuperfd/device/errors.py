"""The project's own device errors.

Every device implementation maps its library's errors onto these, in one place,
so collectors, the sampler and the sweep code never see pynvml exceptions.
"""

from __future__ import annotations


class DeviceError(Exception):
    """Base class for anything that went wrong talking to a GPU."""

    #: Short, stable reason used as a metric label value (bounded set).
    reason = "unknown"


class DriverNotFound(DeviceError):
    """No NVIDIA driver (libnvidia-ml) on this node."""

    reason = "driver_not_found"


class NotSupported(DeviceError):
    """The GPU or driver does not support this field; the sample is left out."""

    reason = "not_supported"


class NoPermission(DeviceError):
    """The call needs privileges the daemon does not have (e.g. setting a power limit)."""

    reason = "no_permission"


class GpuLost(DeviceError):
    """The GPU fell off the bus or stopped answering; its series go down."""

    reason = "gpu_lost"


class DeviceTimeout(DeviceError):
    """The call did not return in time."""

    reason = "timeout"


class InvalidArgument(DeviceError):
    """A value passed to the device was rejected (e.g. a power limit out of range)."""

    reason = "invalid_argument"


class UnknownDeviceError(DeviceError):
    """Any other library error; the message keeps the original text."""

    reason = "unknown"


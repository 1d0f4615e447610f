"""What the NVML tests share: real pynvml handles and errors, and the backend and GPU fixtures over each
test module's own ``nvml`` fixture (its autospecced pynvml functions and their defaults)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from gpuperfd.device import nvml as nvml_module
from gpuperfd.device.nvml import NvmlBackend, NvmlDevice

pynvml = nvml_module.pynvml


def nvml_error(code: int) -> pynvml.NVMLError:
    """A real pynvml error (NVMLError(code) returns the matching subclass)."""
    return pynvml.NVMLError(code)


def handle_at(address: int) -> pynvml.c_nvmlDevice_t:
    """A device handle as NVML returns it: an opaque pointer."""
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)


@pytest.fixture
def backend(nvml: SimpleNamespace) -> Iterator[NvmlBackend]:
    """An NvmlBackend over the requesting module's ``nvml`` fakes, closed after the test."""
    b = NvmlBackend()
    yield b
    b.close()


@pytest.fixture
def gpu(backend: NvmlBackend) -> NvmlDevice:
    """The backend's first GPU."""
    device = backend.devices()[0]
    assert isinstance(device, NvmlDevice)
    return device

"""A driver that appears after the daemon starts: the daemon waits (when asked) instead of failing."""

from __future__ import annotations

import pytest

import gpuperfd.daemon as daemon_module
from gpuperfd.config import config_from_mapping
from gpuperfd.device.errors import DriverNotFound
from gpuperfd.device.simulated import SimulatedBackend


def flaky_open(fail_times: int):
    calls = {"n": 0}

    def open_backend(config):
        calls["n"] += 1
        if calls["n"] <= fail_times:
            raise DriverNotFound("no NVIDIA driver found (test)")
        return SimulatedBackend(config.simulation)

    return open_backend, calls


def test_driver_appearing_later_is_picked_up(monkeypatch):
    opener, calls = flaky_open(3)
    monkeypatch.setattr(daemon_module, "open_backend", opener)
    slept = []
    config = config_from_mapping({"device": {"driver_wait_seconds": 60}, "simulation": {"gpus": 2}})
    backend = daemon_module.open_backend_waiting(config, sleep=slept.append)
    assert calls["n"] == 4 and len(backend.devices()) == 2
    assert slept == [1.0, 2.0, 4.0]  # backs off


def test_no_wait_fails_at_once(monkeypatch):
    opener, calls = flaky_open(1)
    monkeypatch.setattr(daemon_module, "open_backend", opener)
    with pytest.raises(DriverNotFound):
        daemon_module.open_backend_waiting(config_from_mapping({}), sleep=lambda s: None)
    assert calls["n"] == 1

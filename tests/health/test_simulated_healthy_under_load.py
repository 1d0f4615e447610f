"""A healthy simulated GPU earns no reason under any load the simulator can make.

A user's job (``add_foreign_process``) once left the simulated PCIe link at generation 1, so the GPU's
verdict turned ``degraded (pcie_generation_below_max)`` while it worked; a real card under load trains its
link to its maximum (../shared/reference/h100-health-fields.json). Every model, at its lowest and highest
cap, under every workload profile, a user's job, both at once, and idle, over enough samples for every
``busy_share`` check to be allowed to fire."""

from __future__ import annotations

import pytest

from gpuperfd.device.simulated import GPU_MODELS, WORKLOAD_PROFILES
from simnode import Node

#: (label, workload profile name or None, a user's job beside it)
LOADS = [("idle", None, False), ("user job", None, True),
         *[(name, name, False) for name in WORKLOAD_PROFILES],
         *[(f"{name} + user job", name, True) for name in WORKLOAD_PROFILES]]


@pytest.mark.parametrize("cap", ["min", "max"])
@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_no_simulated_healthy_gpu_gets_a_reason_under_any_load(tmp_path, model: str, cap: str) -> None:
    node = Node(tmp_path, gpus=len(LOADS), model=model)
    for device, (_label, profile, user) in zip(node.gpus, LOADS):
        limits = device.power_limits()
        device.set_power_limit(limits.min_watts if cap == "min" else limits.max_watts)
        if profile is not None:
            device.begin_load(WORKLOAD_PROFILES[profile])
        if user:
            device.add_foreign_process(40_000 + device.index, 4 << 30)
    for _ in range(int(node.thresholds["busy_min_samples"]) + 5):
        verdicts = node.step(1.0)
    for device, (label, _profile, _user) in zip(node.gpus, LOADS):
        verdict = verdicts[device.index]
        assert verdict.state == "healthy" and verdict.reasons == [], (model, cap, label, verdict.to_dict())

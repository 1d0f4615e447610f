"""The simulated node's interconnect: boards by GPU count and model, faults, and what NVML would say."""

from __future__ import annotations

import pytest

from gpuperfd.config import InterconnectFaultConfig, SimulationConfig, ValidationError
from gpuperfd.device.errors import NotSupported
from gpuperfd.device.simulated import SimulatedBackend


def backend(**kwargs: object) -> SimulatedBackend:
    return SimulatedBackend(SimulationConfig(seed=1, **kwargs))


@pytest.mark.parametrize(("gpus", "model", "links", "board"), [
    (1, "H100", None, "none"), (2, "H200", None, "nvlink-pair"), (4, "H100", None, "hgx"),
    (8, "H200", None, "hgx"), (2, "H100", 0, "pcie"),
])
def test_default_board_follows_gpu_count_and_links(gpus: int, model: str, links: int | None, board: str) -> None:
    assert backend(gpus=gpus, model=model, nvlink_links=links).interconnect.board == board


def test_nvlink_pair_is_nv18_direct_without_a_fabric() -> None:
    node = backend(gpus=2, model="H200")
    [pair] = node.topology()
    assert (pair.gpu_a, pair.gpu_b, pair.path, pair.nvlink_links, pair.via_nvswitch, pair.p2p) == \
        (0, 1, "nvlink", 18, False, True)
    with pytest.raises(NotSupported):
        node.devices()[0].fabric_state()


def test_hgx_pairs_meet_in_nvswitch_and_fabric_completes() -> None:
    node = backend(gpus=8, model="H100")
    pairs = node.topology()
    assert len(pairs) == 28 and all(p.via_nvswitch and p.nvlink_links == 18 for p in pairs)
    state = node.devices()[5].fabric_state()
    assert (state.state, state.status) == ("completed", None)


def test_pcie_board_has_no_nvlink_and_no_fabric() -> None:
    node = backend(gpus=4, topology="pcie")
    assert {p.path for p in node.topology()} == {"pxb", "sys"}
    assert all(p.nvlink_links == 0 for p in node.topology())
    with pytest.raises(NotSupported):
        node.devices()[0].nvlink()
    with pytest.raises(NotSupported):
        node.devices()[0].fabric_state()


def test_link_down_on_a_direct_pair_takes_both_ends_down() -> None:
    node = backend(gpus=2, interconnect_faults=[InterconnectFaultConfig(kind="link_down", gpu=0, links=2)])
    assert node.topology()[0].nvlink_links == 16
    for gpu in node.devices():
        assert sum(1 for _, up in gpu.nvlink().links if not up) == 2
    node.devices()[0].reset()
    node.devices()[1].reset()
    assert node.topology()[0].nvlink_links == 18


def test_link_down_on_hgx_touches_every_pair_of_that_gpu_only() -> None:
    node = backend(gpus=4, interconnect_faults=[InterconnectFaultConfig(kind="link_down", gpu=2, links=3)])
    links = {(p.gpu_a, p.gpu_b): p.nvlink_links for p in node.topology()}
    assert links == {(0, 1): 18, (0, 2): 15, (0, 3): 18, (1, 2): 15, (1, 3): 18, (2, 3): 15}


def test_half_bandwidth_raises_no_event() -> None:
    fault = InterconnectFaultConfig(kind="half_bandwidth", gpu=1, peer=3)
    node = backend(gpus=4, interconnect_faults=[fault])
    assert node.interconnect.bandwidth_factor(3, 1) == 0.5
    assert node.interconnect.bandwidth_factor(0, 1) == 1.0
    assert all(up for gpu in node.devices() for _, up in gpu.nvlink().links)
    assert all(p.nvlink_links == 18 for p in node.topology())


@pytest.mark.parametrize(("state", "status"), [("not_started", None), ("in_progress", None),
                                               ("completed", "NVML_ERROR_UNKNOWN")])
def test_fabric_fault_sets_the_state(state: str, status: str | None) -> None:
    fault = InterconnectFaultConfig(kind="fabric", gpu="*", fabric_state=state, fabric_status=status)
    node = backend(gpus=4, interconnect_faults=[fault])
    got = node.devices()[3].fabric_state()
    assert (got.state, got.status) == (state, status)


def test_bad_input_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="GPU 5"):
        backend(gpus=2, interconnect_faults=[InterconnectFaultConfig(kind="link_down", gpu=5)])
    with pytest.raises(ValueError, match="nvlink-pair needs 2 GPUs"):
        backend(gpus=4, topology="nvlink-pair")
    with pytest.raises(ValidationError, match="half_bandwidth"):
        InterconnectFaultConfig(kind="half_bandwidth", gpu=1)
    with pytest.raises(ValidationError):
        SimulationConfig(topology="torus")


def test_a_call_fault_on_fabric_state_applies() -> None:
    from gpuperfd.config import FaultConfig
    from gpuperfd.device.errors import GpuLost

    node = backend(gpus=4, faults=[FaultConfig(gpu=1, call="fabric_state", kind="gpu_lost")])
    with pytest.raises(GpuLost):
        node.devices()[1].fabric_state()
    assert node.devices()[0].fabric_state().state == "completed"

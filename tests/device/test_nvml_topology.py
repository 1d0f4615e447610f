"""The node's topology and fabric state through NVML, against the counting fake libnvidia-ml."""

from __future__ import annotations

import threading

import pynvml as real
import pytest

from fake_pynvml import installed
from gpuperfd.device.errors import NotSupported
from gpuperfd.device.nvml import NvmlBackend


def test_direct_pair_counts_links_whose_far_end_is_the_peer() -> None:
    with installed(gpus=2):
        [pair] = NvmlBackend().topology()
    assert (pair.gpu_a, pair.gpu_b, pair.path, pair.nvlink_links, pair.via_nvswitch, pair.p2p) == \
        (0, 1, "nvlink", 4, False, True)


def test_links_into_a_switch_mean_nvswitch() -> None:
    with installed(gpus=4) as fake:
        fake.nvlink_remote = {gpu: dict.fromkeys(range(4), "switch") for gpu in range(4)}
        fake.nvlink_remote[2] = {0: "switch", 1: "switch"}  # two of GPU 2's links are down
        pairs = {(p.gpu_a, p.gpu_b): p for p in NvmlBackend().topology()}
    assert len(pairs) == 6 and all(p.via_nvswitch and p.path == "nvlink" for p in pairs.values())
    assert pairs[(0, 1)].nvlink_links == 4 and pairs[(1, 2)].nvlink_links == 2


def test_no_nvlink_gives_the_pcie_path() -> None:
    with installed(gpus=2) as fake:
        fake.nvlink_remote = {0: {}, 1: {}}
        fake.topology_level = real.NVML_TOPOLOGY_SYSTEM
        [pair] = NvmlBackend().topology()
    assert (pair.path, pair.nvlink_links, pair.via_nvswitch) == ("sys", 0, False)


def test_fabric_not_supported_on_a_board_without_nvswitch() -> None:
    with installed(gpus=2):
        gpu = NvmlBackend().devices()[0]
        with pytest.raises(NotSupported):
            gpu.fabric_state()


@pytest.mark.parametrize(("state", "status", "want"), [
    (real.NVML_GPU_FABRIC_STATE_NOT_STARTED, 0, ("not_started", None)),
    (real.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0, ("in_progress", None)),
    (real.NVML_GPU_FABRIC_STATE_COMPLETED, real.NVML_SUCCESS, ("completed", None)),
    (real.NVML_GPU_FABRIC_STATE_COMPLETED, real.NVML_ERROR_UNKNOWN, ("completed", f"fake NVML error {real.NVML_ERROR_UNKNOWN}")),
])
def test_fabric_states(state: int, status: int, want: tuple[str, str | None]) -> None:
    with installed(gpus=2) as fake:
        fake.fabric[1] = (state, status)
        got = NvmlBackend().devices()[1].fabric_state()
    assert (got.state, got.status) == want


def test_fabric_is_read_with_the_versioned_call() -> None:
    """Driver 580 on a 2x H200 NVSwitch slice: the unversioned call said NOT_SUPPORTED while the
    fabric had completed (nvidia-smi, nvmlDeviceGetGpuFabricInfoV); gpuperfd saw no fabric there."""
    with installed(gpus=2) as fake:
        fake.fabric[0] = (real.NVML_GPU_FABRIC_STATE_COMPLETED, real.NVML_SUCCESS)
        got = NvmlBackend().devices()[0].fabric_state()
    assert (got.state, got.status, got.clique_id) == ("completed", None, 7)


def test_a_driver_that_knows_only_v2_is_read_with_v2() -> None:
    with installed(gpus=2) as fake:
        fake.fabric_versions = {real.nvmlGpuFabricInfo_v2}  # v3 answers ARGUMENT_VERSION_MISMATCH
        fake.fabric[1] = (real.NVML_GPU_FABRIC_STATE_IN_PROGRESS, real.NVML_SUCCESS)
        assert NvmlBackend().devices()[1].fabric_state().state == "in_progress"


def test_a_driver_without_the_versioned_call_is_read_with_the_old_one() -> None:
    with installed(gpus=2) as fake:
        fake.fabric_versions = None  # nvmlDeviceGetGpuFabricInfoV: FUNCTION_NOT_FOUND
        fake.fabric[1] = (real.NVML_GPU_FABRIC_STATE_NOT_STARTED, real.NVML_SUCCESS)
        gpu = NvmlBackend().devices()[1]
        assert gpu.fabric_state().state == "not_started"
        fake.fabric[1] = (real.NVML_GPU_FABRIC_STATE_COMPLETED, real.NVML_SUCCESS)
        before = fake.calls
        assert gpu.fabric_state().state == "completed"  # the call that works is asked again,
        assert fake.calls - before == 1  # and alone: not the versioned calls this driver lacks first


def test_topology_and_fabric_keep_one_caller_at_a_time() -> None:
    with installed(gpus=4) as fake:
        fake.nvlink_remote = {gpu: dict.fromkeys(range(4), "switch") for gpu in range(4)}
        fake.fabric = {gpu: (real.NVML_GPU_FABRIC_STATE_COMPLETED, 0) for gpu in range(4)}
        backend = NvmlBackend()
        devices = backend.devices()
        threads = [threading.Thread(target=backend.topology)] + [
            threading.Thread(target=d.fabric_state) for d in devices] + [threading.Thread(target=d.nvlink) for d in devices]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert fake.calls > 40 and fake.max_inside == 1

"""What a healthy interconnect delivers: expected peer-copy and all-reduce figures by link (issue 44).

One table, read by the simulated interconnect executor (its figures) and by the interconnect
verdicts (what a pair is held against). Calibrated to the reference node
``/work/shared/reference/h200x2-node.json`` (2x H200, NV18, measured 2026-11-26): peer copies
375.3 and 380.0 GB/s each way (1 GiB, median of 10), NCCL all-reduce bf16 bus bandwidth 271.2 GB/s at
256 MiB (p50 0.99 ms) and 315.6 GB/s at 1 GiB (p50 3.402 ms).

Measured: an NV18 direct pair (H200 NVL). Estimates (not measured here; docs/health.md says so): NV18
through NVSwitch (HGX H100/H200: the same links, the same per-link rate), A100's 12 links, PCIe
copies (gen 5 x16 ~ 50 GB/s, gen 4 ~ 25 GB/s, less across the host bridge or sockets), the all-reduce
latency floor of a small message (15 us), and a ring over more GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuperfd.device.base import PeerLink

#: NVLink 4 data rate per link and direction, as ``nvidia-smi nvlink -s`` reports it (bytes/s).
NVLINK_BYTES_PER_SECOND_PER_LINK = 26.562e9
#: The reference's median peer copy over NV18 (mean of both directions) / the links' rate (18 x 26.562).
COPY_EFFICIENCY = ((375.3e9 + 380.0e9) / 2) / (18 * NVLINK_BYTES_PER_SECOND_PER_LINK)
#: PCIe peer copies by generation, x16 (estimates: ~ 80 % of the link's raw rate).
PCIE_COPY_BYTES_PER_SECOND: dict[int, float] = {3: 12.5e9, 4: 25e9, 5: 50e9, 6: 100e9}
#: Share of the PCIe figure left by the path (a switch beside both GPUs is best; estimates).
PCIE_PATH_FACTOR: dict[str, float] = {"pix": 1.0, "pxb": 1.0, "phb": 0.9, "node": 0.85, "sys": 0.7}

#: All-reduce time model, t(b) = floor + b / peak + ramp * min(1, b / RAMP_BYTES): fitted to the
#: reference's two sizes (256 MiB, 1 GiB) with a 15 us floor (an estimate of a small message).
REFERENCE_ALLREDUCE = ((256 << 20, 0.99e-3), (1 << 30, 3.402e-3))
ALLREDUCE_FLOOR_SECONDS = 15e-6
RAMP_BYTES = 256 << 20
#: The reference pair's all-reduce asymptote (algorithm bandwidth, = bus bandwidth on 2 ranks).
REFERENCE_PEAK_BYTES_PER_SECOND = (REFERENCE_ALLREDUCE[1][0] - REFERENCE_ALLREDUCE[0][0]) / (
    REFERENCE_ALLREDUCE[1][1] - REFERENCE_ALLREDUCE[0][1])
_RAMP_SECONDS = (REFERENCE_ALLREDUCE[0][1] - ALLREDUCE_FLOOR_SECONDS
                 - REFERENCE_ALLREDUCE[0][0] / REFERENCE_PEAK_BYTES_PER_SECOND)
#: The reference pair's copy figure, which the all-reduce's bus bandwidth scales with.
REFERENCE_COPY_BYTES_PER_SECOND = 18 * NVLINK_BYTES_PER_SECOND_PER_LINK * COPY_EFFICIENCY


def expected_copy_bandwidth(link: PeerLink, pcie_generation: int = 5) -> float:
    """Bytes/s one peer copy over ``link`` should reach (each direction); 0 with no peer path."""
    if link.path == "nvlink" and link.nvlink_links > 0:
        return link.nvlink_links * NVLINK_BYTES_PER_SECOND_PER_LINK * COPY_EFFICIENCY
    if link.path == "none" or link.p2p is False:
        return 0.0
    base = PCIE_COPY_BYTES_PER_SECOND.get(pcie_generation, PCIE_COPY_BYTES_PER_SECOND[5])
    return base * PCIE_PATH_FACTOR.get(link.path, 0.7)


def allreduce_seconds(size_bytes: int, ranks: int, slowest_copy_bytes_per_second: float) -> float:
    """Time of one ring all-reduce of ``size_bytes`` per rank over ``ranks`` GPUs whose slowest pair
    copies at the given rate: the reference's model, its bus bandwidth scaled by that pair."""
    if ranks < 2 or slowest_copy_bytes_per_second <= 0:
        raise ValueError(f"allreduce_seconds: needs 2+ ranks and a copy rate > 0 (got {ranks}, "
                         f"{slowest_copy_bytes_per_second})")
    bus_peak = REFERENCE_PEAK_BYTES_PER_SECOND * slowest_copy_bytes_per_second / REFERENCE_COPY_BYTES_PER_SECOND
    algo_peak = bus_peak * ranks / (2 * (ranks - 1))
    return ALLREDUCE_FLOOR_SECONDS + size_bytes / algo_peak + _RAMP_SECONDS * min(1.0, size_bytes / RAMP_BYTES)


def expected_pair_links(topology: Sequence[PeerLink], links_per_gpu: Mapping[int, int]) -> dict[tuple[int, int], int]:
    """NVLinks each NVLink pair should have: through NVSwitch every link of the GPU with fewer; a
    direct pair, every link of two GPUs that have only each other (an NVL pair). A GPU joined
    directly to several peers (NVL4 bridges) has no figure: its split of links is not known.
    ``links_per_gpu``: each GPU's NVLinks, up or down (``len(Device.nvlink().links)``)."""
    direct_peers: dict[int, int] = {}
    for link in topology:
        if link.path == "nvlink" and not link.via_nvswitch:
            direct_peers[link.gpu_a] = direct_peers.get(link.gpu_a, 0) + 1
            direct_peers[link.gpu_b] = direct_peers.get(link.gpu_b, 0) + 1
    out = {}
    for link in topology:
        a, b = links_per_gpu.get(link.gpu_a), links_per_gpu.get(link.gpu_b)
        if link.path != "nvlink" or not a or not b:
            continue
        if link.via_nvswitch or (direct_peers[link.gpu_a] == 1 and direct_peers[link.gpu_b] == 1):
            out[(link.gpu_a, link.gpu_b)] = min(a, b)
    return out

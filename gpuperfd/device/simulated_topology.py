"""The simulated node's interconnect: board kind, links per pair, fabric state and faults (issue 44).

A simulated backend holds one :class:`SimulatedTopology`. It answers what NVML would
(``Backend.topology()``, ``Device.fabric_state()``) and what the simulated interconnect executor
needs to compute bandwidths (a pair's links up and its bandwidth factor). Boards:

- ``nvlink-pair``: two GPUs joined directly by all their NVLinks (NV18, H200 NVL / H100 NVL); no
  NVSwitch, so no fabric manager: ``fabric_state`` is NotSupported, as NVML says on such boards.
- ``hgx``: every GPU's links go into NVSwitches; the fabric manager brings the fabric up
  (state completed, status success unless a fault says otherwise).
- ``pcie``: no NVLink; pairs meet through a PCIe switch (pxb) on one socket, across sockets (sys).
- ``none``: one GPU, no pairs.

Faults (``simulation.interconnect_faults`` or :meth:`inject`): a link down (the GPU's NVLink state
shows it, and the pair loses bandwidth in proportion), a pair at half bandwidth (no event at all,
as a link that lost lanes), the fabric not ready (not started, in progress, completed with an error).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from gpuperfd.device.base import FabricState, PeerLink
from gpuperfd.device.errors import NotSupported

if TYPE_CHECKING:
    from gpuperfd.config import InterconnectFaultConfig


class BoardGpu(Protocol):
    """What the topology needs of a simulated GPU (``device/simulated.py:SimulatedGpu``), declared here so
    the two modules do not import each other."""

    def nvlink_states(self) -> Sequence[tuple[int, bool]]: ...

    def inject_nvlink(self, down: Sequence[int] = ...) -> None: ...

    def pcie_max_generation(self) -> int: ...

BOARDS: tuple[str, ...] = ("none", "nvlink-pair", "hgx", "pcie")


def board_for(topology: str, gpus: int, nvlink_links: int) -> str:
    """The board kind ``topology`` names, "auto" resolved from the GPU count and NVLink count.

    Raises ValueError for a board the GPU count cannot have (an nvlink-pair of 3 GPUs)."""
    if topology == "auto":
        if gpus == 1:
            return "none"
        if nvlink_links == 0:
            return "pcie"
        return "nvlink-pair" if gpus == 2 else "hgx"
    if topology == "nvlink-pair" and gpus != 2:
        raise ValueError(f"simulation.topology nvlink-pair needs 2 GPUs, not {gpus}")
    if topology in ("nvlink-pair", "hgx") and nvlink_links == 0:
        raise ValueError(f"simulation.topology {topology} needs NVLink (simulation.nvlink_links is 0)")
    if topology == "none" and gpus != 1:
        raise ValueError(f"simulation.topology none is for one GPU, not {gpus}")
    return topology


class SimulatedTopology:
    """How the simulated GPUs are linked now; thread-safe (faults may be injected while probes read)."""

    def __init__(self, board: str, gpus: Sequence[BoardGpu],
                 faults: Sequence[InterconnectFaultConfig] = ()) -> None:
        if board not in BOARDS:
            raise ValueError(f"unknown simulated board {board!r} (one of {', '.join(BOARDS)})")
        self.board = board
        self._gpus = list(gpus)
        self._lock = threading.Lock()
        #: unordered pair -> bandwidth factor (half_bandwidth and slow_pair faults)
        self._pair_factor: dict[tuple[int, int], float] = {}
        #: gpu -> fabric state (fabric faults); others report the board's normal state
        self._fabric: dict[int, FabricState] = {}
        for fault in faults:
            self.inject(fault)

    @property
    def has_nvlink(self) -> bool:
        return self.board in ("nvlink-pair", "hgx")

    @property
    def has_nvswitch(self) -> bool:
        return self.board == "hgx"

    def _gpu(self, index: int) -> BoardGpu:
        if not 0 <= index < len(self._gpus):
            raise ValueError(f"interconnect fault names GPU {index}; this node has GPUs 0-{len(self._gpus) - 1}")
        return self._gpus[index]

    def inject(self, fault: InterconnectFaultConfig) -> None:
        """Apply one interconnect fault (a bad GPU index is a ValueError that changes nothing)."""
        targets = range(len(self._gpus)) if fault.gpu == "*" else [fault.gpu]
        for index in targets:
            self._gpu(index)
        if fault.peer is not None:
            self._gpu(fault.peer)
        if fault.kind in ("half_bandwidth", "slow_pair"):
            factor = 0.5 if fault.kind == "half_bandwidth" else fault.factor
            with self._lock:
                self._pair_factor[_pair(int(fault.gpu), int(fault.peer))] = factor  # type: ignore[arg-type]
        elif fault.kind == "link_down":
            self.link_down(int(fault.gpu), fault.links)
        else:
            state = FabricState(fault.fabric_state, fault.fabric_status)
            with self._lock:
                self._fabric.update(dict.fromkeys(targets, state))

    def link_down(self, gpu: int, links: int = 1) -> None:
        """Take ``links`` more NVLinks of ``gpu`` down; on a direct pair the peer's ends go down too."""
        ends = [self._gpu(gpu)] + ([self._gpus[1 - gpu]] if self.board == "nvlink-pair" else [])
        for end in ends:
            up = [link for link, state in end.nvlink_states() if state]
            end.inject_nvlink(down=up[:links])

    def fabric_state(self, gpu: int) -> FabricState:
        """The fabric's state for ``gpu``: NotSupported without NVSwitch (no fabric manager)."""
        if not self.has_nvswitch:
            raise NotSupported(f"GPU {gpu}: no GPU fabric on a {self.board} board")
        with self._lock:
            return self._fabric.get(gpu, FabricState("completed", None))

    def links_up(self, gpu: int) -> int:
        return sum(1 for _, up in self._gpus[gpu].nvlink_states() if up)

    def pair(self, a: int, b: int) -> PeerLink:
        """How GPUs ``a`` and ``b`` are linked now (links up only)."""
        lo, hi = _pair(a, b)
        if self.has_nvlink:
            links = min(self.links_up(lo), self.links_up(hi))
            return PeerLink(lo, hi, "nvlink", links, self.has_nvswitch, True)
        half = max(len(self._gpus) // 2, 1)
        same_socket = len(self._gpus) < 4 or lo // half == hi // half  # 4+ GPUs: half on each socket
        return PeerLink(lo, hi, "pxb" if same_socket else "sys", 0, False, True)

    def pcie_generation(self, gpu: int) -> int:
        """The GPU's PCIe generation at its best (5 on Hopper, 4 on A100): the PCIe copy figure's."""
        return self._gpus[gpu].pcie_max_generation()

    def expected_links(self, gpu: int) -> int:
        """NVLinks a healthy board has for this GPU (its link count, up or down); 0 without NVLink."""
        return len(self._gpus[gpu].nvlink_states()) if self.has_nvlink else 0

    def bandwidth_factor(self, a: int, b: int) -> float:
        """The pair's bandwidth multiplier from faults that raise no event (1.0: none)."""
        with self._lock:
            return self._pair_factor.get(_pair(a, b), 1.0)

    def pairs(self) -> list[PeerLink]:
        """Every unordered pair once, (0, 1), (0, 2), ..."""
        count = len(self._gpus)
        return [self.pair(a, b) for a in range(count) for b in range(a + 1, count)]

    def clear(self) -> None:
        """Remove the bandwidth and fabric faults (links come back with a GPU reset, as on hardware)."""
        with self._lock:
            self._pair_factor.clear()
            self._fabric.clear()


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)

"""The interconnect checks' inputs and their blame: which GPU a slow pair or a missing link is on.

Pure. :func:`interconnect_inputs` turns one interconnect run and the node's topology into the plain
dict every GPU's :class:`~gpuperfd.health.evaluate.GpuInputs` carries (``interconnect``); the
``interconnect_*`` evaluators read it through :func:`findings`.

Blame: a pair below its figure is the GPU's unless the GPU's other pairs are fine and the peer's
are all short (then the peer alone is the cause: a GPU whose links into the NVSwitches went down
slows every pair it is in, and its healthy peers are not blamed). A pair alone at half speed,
both ends otherwise fine, is blamed on both. Pairs without NVLink are never judged here: a PCIe
board has no link count and its copy figures are estimates (docs/health.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuperfd.device.base import Backend, Device, PeerLink
from gpuperfd.device.errors import NotSupported
from gpuperfd.device.interconnect_figures import expected_copy_bandwidth, expected_pair_links
from gpuperfd.probe_data.interconnect import InterconnectResult


def interconnect_inputs(result: InterconnectResult | None, topology: Sequence[PeerLink],
                        links_per_gpu: Mapping[int, int]) -> dict[str, Any]:
    """The node-wide inputs of the interconnect checks: NVLink pairs' links (up, expected) and, from an
    ok run, each ordered NVLink pair's copy bandwidth against the figure of a healthy link."""
    wanted = expected_pair_links(topology, links_per_gpu)
    links = {pair: (link.nvlink_links, wanted[pair]) for link in topology
             if (pair := (link.gpu_a, link.gpu_b)) in wanted}
    by_pair = {(link.gpu_a, link.gpu_b): link for link in topology}
    copies = {}
    if result is not None and result.ok:
        for copy in result.copies:
            pair = (min(copy.src, copy.dst), max(copy.src, copy.dst))
            link = by_pair.get(pair)
            if link is None or pair not in wanted:
                continue
            healthy = PeerLink(link.gpu_a, link.gpu_b, "nvlink", wanted[pair], link.via_nvswitch, link.p2p)
            copies[(copy.src, copy.dst)] = (copy.bandwidth_bytes_per_second, expected_copy_bandwidth(healthy))
    return {"links": links, "copies": copies}


def read_topology(backend: Backend, devices: Sequence[Device]) -> tuple[list[PeerLink], dict[int, int]]:
    """The node's pairs and each GPU's NVLink count (up or down; 0 without NVLink): what
    :func:`interconnect_inputs` needs. NotSupported (a DeviceError) where the backend cannot tell."""
    links: dict[int, int] = {}
    for device in devices:
        try:
            links[device.index] = len(device.nvlink().links)
        except NotSupported:
            links[device.index] = 0
    return backend.topology(), links


def findings(gpu: int, measured: Mapping[tuple[int, int], tuple[float, float]], limit: float) -> list[dict[str, Any]]:
    """This GPU's pairs whose value/expected is below ``limit``, after blame (module docstring)."""
    ratios: dict[int, list[float]] = {}
    for (a, b), (value, want) in measured.items():
        if want > 0:
            ratios.setdefault(a, []).append(value / want)
            ratios.setdefault(b, []).append(value / want)

    def all_short(index: int) -> bool:
        return bool(ratios.get(index)) and max(ratios[index]) < limit

    out = []
    for (a, b), (value, want) in sorted(measured.items()):
        if gpu not in (a, b) or want <= 0 or value / want >= limit:
            continue
        peer = b if gpu == a else a
        if all_short(peer) and not all_short(gpu):
            continue
        out.append({"src": a, "dst": b, "peer": peer, "value": value, "expected": want, "ratio": value / want})
    return out

"""The interconnect checks' inputs and their blame: which GPU a slow pair or a missing link is on.

Pure. :func:`interconnect_inputs` turns one interconnect run and the node's topology into the plain
dict every GPU's :class:`~gpuperfd.health.evaluate.GpuInputs` carries (``interconnect``); the
``interconnect_*`` evaluators read it through :func:`findings`.

The figure a pair is held against: the expected figure of its link (the reference), lowered to
what the node's own pairs of the same kind deliver where it has :data:`NODE_PAIRS_MIN` or more of
them, but never below :data:`NODE_FLOOR_RATIO` of the reference (a node whose every link is slow is
still judged). So the threshold follows the node as well as the reference: copies of a size that
reaches 91 % of the reference on every healthy pair are not held against 100 % (issue 55).

Blame: a pair below its figure is the GPU's unless the GPU's other pairs are fine and the peer's
are all short (then the peer alone is the cause: a GPU whose links into the NVSwitches went down
slows every pair it is in, and its healthy peers are not blamed). A pair alone at half speed,
both ends otherwise fine, is blamed on both. Pairs without NVLink are never judged here: a PCIe
board has no link count and its copy figures are estimates (docs/health.md).

A wrong copy or sum (:func:`wrong_sum_rows`) is charged to the GPUs of the set whose own probe gave
wrong answers (they name the culprit): a sum across GPUs is wrong on every rank when one rank's
input is, so the peers' own passing probes clear them. Where no GPU's own probe names one, the run
says only that something in the set is wrong: every GPU of the set is at most ``unknown`` (measure
again), never condemned to a replacement on another GPU's fault.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuperfd.device.base import Backend, Device, PeerLink
from gpuperfd.device.errors import NotSupported
from gpuperfd.device.interconnect_figures import expected_copy_bandwidth, expected_pair_links
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probe_data.kinds import INTERCONNECT


#: The failure reason of a wrong copy or sum no GPU's own probe explains (row ``interconnect_wrong_unattributed``).
UNATTRIBUTED = "wrong_result_unattributed"

#: The node's own pairs set the figure only where it has this many unordered pairs of one kind of link
#: (a 2-GPU node has one: its pair is held against the reference alone).
NODE_PAIRS_MIN = 3
#: ... and never below this share of the reference figure.
NODE_FLOOR_RATIO = 0.9


def interconnect_inputs(result: InterconnectResult | None, topology: Sequence[PeerLink],
                        links_per_gpu: Mapping[int, int]) -> dict[str, Any]:
    """The node-wide inputs of the interconnect checks: NVLink pairs' links (up, expected) and, from an
    ok run, each ordered NVLink pair's copy bandwidth against the figure it is held to (module
    docstring: the reference, or the node's own pairs of that kind)."""
    wanted = expected_pair_links(topology, links_per_gpu)
    links = {pair: (link.nvlink_links, wanted[pair]) for link in topology
             if (pair := (link.gpu_a, link.gpu_b)) in wanted}
    by_pair = {(link.gpu_a, link.gpu_b): link for link in topology}
    measured: dict[tuple[int, int], tuple[float, float, tuple[Any, ...]]] = {}
    if result is not None and result.ok:
        for copy in result.copies:
            pair = (min(copy.src, copy.dst), max(copy.src, copy.dst))
            link = by_pair.get(pair)
            if link is None or pair not in wanted:
                continue
            healthy = PeerLink(link.gpu_a, link.gpu_b, "nvlink", wanted[pair], link.via_nvswitch, link.p2p)
            kind = (healthy.path, healthy.nvlink_links, healthy.via_nvswitch)
            measured[(copy.src, copy.dst)] = (copy.bandwidth_bytes_per_second, expected_copy_bandwidth(healthy), kind)
    return {"links": links, "copies": held_to_node(measured)}


def held_to_node(measured: Mapping[tuple[int, int], tuple[float, float, tuple[Any, ...]]]
                 ) -> dict[tuple[int, int], tuple[float, float]]:
    """Each ordered pair's (value, figure held to): the reference, or the median of the node's pairs of
    the same kind of link where there are :data:`NODE_PAIRS_MIN` unordered ones, between
    :data:`NODE_FLOOR_RATIO` of the reference and the reference."""
    by_kind: dict[tuple[Any, ...], list[tuple[tuple[int, int], float]]] = {}
    for pair, (value, _, kind) in measured.items():
        by_kind.setdefault(kind, []).append((pair, value))
    typical: dict[tuple[Any, ...], float] = {}
    for kind, rows in by_kind.items():
        if len({(min(p), max(p)) for p, _ in rows}) >= NODE_PAIRS_MIN:
            typical[kind] = statistics.median(value for _, value in rows)
    out = {}
    for pair, (value, reference, kind) in measured.items():
        figure = reference
        if kind in typical and reference > 0:
            figure = min(reference, max(typical[kind], NODE_FLOOR_RATIO * reference))
        out[pair] = (value, figure)
    return out


def slow_pairs(copies: Mapping[tuple[int, int], tuple[float, float]], limit: float) -> set[tuple[int, int]]:
    """The ordered pairs whose value is below ``limit`` of their figure (before blame): the ones a
    verdict could come from, so the ones measured again before any verdict."""
    return {pair for pair, (value, want) in copies.items() if want > 0 and value / want < limit}


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


def own_wrong_answers(runs: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a GPU's own probe (not an interconnect run) gave wrong answers: a wrong_result run, or
    its correctness check said ``mismatch``."""
    for run in runs:
        if run.get("probe") == INTERCONNECT:
            continue
        correctness = run.get("correctness")
        if run.get("failure_reason") == "wrong_result" or (
                isinstance(correctness, Mapping) and correctness.get("status") == "mismatch"):
            return True
    return False


def wrong_sum_rows(result: InterconnectResult, runs_by_gpu: Mapping[int, Sequence[Mapping[str, Any]]],
                   now: float) -> dict[int, dict[str, Any]]:
    """The run row a wrong copy or sum adds to each GPU it is charged to (module docstring): to the
    culprits named by their own probes as ``wrong_result``; with none named, to every GPU of the set
    as :data:`UNATTRIBUTED` (at most unknown). Empty when the run was not wrong."""
    if result.failure_reason != "wrong_result":
        return {}
    failed = [f"copy {c.src}->{c.dst}" for c in result.copies if not c.ok]
    failed += [f"all-reduce sum at {a.bytes} B" for a in result.allreduce if not a.sum_ok]
    members = [gpu for gpu in result.gpus if gpu in runs_by_gpu]
    culprits = [gpu for gpu in members if own_wrong_answers(runs_by_gpu[gpu])]
    reason = "wrong_result" if culprits else UNATTRIBUTED
    row = {"time": now, "status": "failed", "failure_reason": reason, "probe": INTERCONNECT, "preset": "check",
           "power_cap_watts": None, "error": result.error_message,
           "failed_checks": ", ".join(failed) or "interconnect checks", "wall_seconds": result.wall_seconds,
           "set": ",".join(map(str, result.gpus))}
    return {gpu: dict(row) for gpu in (culprits or members)}

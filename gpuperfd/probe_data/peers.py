"""Peer comparison of answer fingerprints: which GPU computes different numbers from its peers?

A probe's fingerprint (``result.correctness.fingerprint``, probe_child/correctness.py) is bitwise
the same on every GPU of one model running the same driver, torch and CUDA libraries on the same
inputs: the same kernels are picked and run in the same order. A GPU whose own repeats agree (its
self-check passes) but whose fingerprint differs from the majority of its peers computes wrong
numbers consistently, which only this comparison can see. Used by the verdict and ``gpuperfd check``.

Pure standard library (the daemon imports it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["PeerFinding", "peer_key", "peer_disagreement", "peer_findings"]


def peer_disagreement(fingerprints_by_gpu: dict[str, str]) -> list[str]:
    """GPUs whose fingerprint differs from the strict majority's, sorted; [] without a strict majority.

    With two GPUs that differ, or any tie, nobody can tell which one is wrong: [] (the caller may
    say "peers disagree, no majority"). One GPU alone has no peers: [].
    """
    if len(fingerprints_by_gpu) < 3:
        return []
    (top, count), *rest = Counter(fingerprints_by_gpu.values()).most_common()
    if count * 2 <= len(fingerprints_by_gpu):
        return []
    return sorted(gpu for gpu, fp in fingerprints_by_gpu.items() if fp != top)


def peer_key(record: dict[str, Any]) -> tuple[str, ...] | None:
    """What must be equal for two runs' fingerprints to be comparable: GPU model, driver, torch,
    probe, variant, preset and parameters; None for a run that cannot be compared (no ok check, or
    a fingerprint that depends on how long it ran, like the training step's)."""
    result = record.get("result") or {}
    check = result.get("correctness") or {}
    if check.get("status") != "ok" or not check.get("fingerprint") or check.get("peer_comparable") is False:
        return None
    gpu = record.get("gpu") or {}
    return (str(gpu.get("name")), str(gpu.get("driver_version")), str(record.get("torch_version")),
            str(result.get("probe")), str(result.get("variant")), str(result.get("preset")),
            json.dumps(result.get("params") or {}, sort_keys=True, default=str))


@dataclass(frozen=True)
class PeerFinding:
    """One GPU whose self-consistent answers differ from the majority of its peers."""

    gpu: str
    key: tuple[str, ...]
    fingerprint: str
    majority_fingerprint: str
    peers: int

    def describe(self) -> str:
        return (f"GPU {self.gpu}: its own repeats agree but its {self.key[3]}/{self.key[4]} answers differ from "
                f"the majority of {self.peers} peers of the same model, driver and software")


def peer_findings(records: list[dict[str, Any]]) -> list[PeerFinding]:
    """Peer disagreements in run records: per comparable key, the latest ok fingerprint of each GPU
    (by uuid, else index) is compared with the others' (:func:`peer_disagreement`)."""
    latest: dict[tuple[str, ...], dict[str, tuple[float, str]]] = {}
    for record in records:
        key = peer_key(record)
        if key is None:
            continue
        gpu = record.get("gpu") or {}
        name = str(gpu.get("uuid") or gpu.get("index"))
        fp = str(record["result"]["correctness"]["fingerprint"])
        when = float(record.get("time") or 0.0)
        if name not in latest.setdefault(key, {}) or latest[key][name][0] <= when:
            latest[key][name] = (when, fp)
    findings = []
    for key, by_gpu in sorted(latest.items()):
        fps = {gpu: fp for gpu, (_, fp) in by_gpu.items()}
        odd = peer_disagreement(fps)
        if odd:
            majority = Counter(fps.values()).most_common(1)[0][0]
            findings.extend(PeerFinding(gpu, key, fps[gpu], majority, len(fps) - 1) for gpu in odd)
    return findings

"""Peer comparison of answer fingerprints: the GPU that disagrees with the majority of its peers."""

from __future__ import annotations

from gpuperfd.probe_data.peers import peer_disagreement, peer_findings, peer_key


def test_majority_names_the_odd_gpu_out() -> None:
    assert peer_disagreement({"0": "a", "1": "a", "2": "b", "3": "a"}) == ["2"]
    assert peer_disagreement({"0": "a", "1": "a", "2": "a"}) == []
    assert peer_disagreement({"0": "a", "1": "b"}) == []  # two that differ: nobody can tell which
    assert peer_disagreement({"0": "a", "1": "a", "2": "b", "3": "b"}) == []  # a tie has no majority
    assert peer_disagreement({"0": "a"}) == []
    assert peer_disagreement({"0": "a", "1": "b", "2": "c", "3": "a", "4": "a"}) == ["1", "2"]


def _record(uuid: str, fp: str, time: float = 1.0, *, probe: str = "llm", driver: str = "580.1",
            status: str = "ok", comparable: bool = True) -> dict:
    return {"time": time, "torch_version": "2.13",
            "gpu": {"uuid": uuid, "index": 0, "name": "NVIDIA H100 80GB HBM3", "driver_version": driver},
            "result": {"probe": probe, "variant": "graph", "preset": "gpt2", "params": {"batch_size": 8},
                       "correctness": {"status": status, "fingerprint": fp, "peer_comparable": comparable}}}


def test_findings_compare_like_with_like_and_latest_runs() -> None:
    records = [_record("A", "x"), _record("B", "x"), _record("C", "y"),
               _record("D", "z", driver="590.2"),  # another driver: no peers of its own kind
               _record("E", "w", probe="train", comparable=False),
               _record("F", "q", status="mismatch")]  # its self-check already failed: not a peer finding
    findings = peer_findings(records)
    assert [(f.gpu, f.fingerprint, f.majority_fingerprint, f.peers) for f in findings] == [("C", "y", "x", 2)]
    assert "differ from the majority of 2 peers" in findings[0].describe()
    # C's newer run agrees again: no finding
    assert peer_findings([*records, _record("C", "x", time=2.0)]) == []
    assert peer_key(records[4]) is None and peer_key(records[5]) is None and peer_key(records[0]) is not None

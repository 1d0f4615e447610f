"""The node-feature-discovery local feature file: content, atomic rewrite, only on change."""

from __future__ import annotations

import os
from pathlib import Path

from simnode import Node

from gpuperfd.health.nfd import NfdFeatureFile, feature_lines


def test_feature_file_follows_the_verdict_after_a_simulated_fault(tmp_path: Path) -> None:
    node = Node(tmp_path, gpus=3, ecc_errors=[{"gpu": 1, "uncorrected": 2, "after_seconds": 0}])
    path = tmp_path / "features.d" / "gpuperfd"
    node.monitor.listeners.append(NfdFeatureFile(path))
    node.step()
    assert path.read_text().splitlines() == [
        "gpuperfd.io/health-state=unhealthy", "gpuperfd.io/health-action=reset_gpu",
        "gpuperfd.io/gpus-healthy=2", "gpuperfd.io/gpus-unknown=0", "gpuperfd.io/gpus-degraded=0",
        "gpuperfd.io/gpus-unhealthy=1", "gpuperfd.io/gpus-missing=0",
    ]
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # NFD ignores dot files: no temporary file is left where it could be read half-written.
    assert os.listdir(path.parent) == ["gpuperfd"]


def test_feature_file_is_rewritten_only_when_a_line_changes(tmp_path: Path) -> None:
    node = Node(tmp_path, gpus=2)
    path = tmp_path / "gpuperfd"
    node.monitor.listeners.append(NfdFeatureFile(path))
    node.step()
    assert path.read_text().startswith("gpuperfd.io/health-state=healthy\n")
    inode = path.stat().st_ino
    node.step()
    assert path.stat().st_ino == inode  # same verdict: not rewritten


def test_a_failing_listener_does_not_stop_the_verdicts(tmp_path: Path) -> None:
    node = Node(tmp_path, gpus=1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    node.monitor.listeners.append(NfdFeatureFile(blocker / "sub" / "gpuperfd"))  # parent is a file
    verdicts = node.step()
    assert verdicts[0].state == "healthy"


def test_feature_lines_of_no_gpus() -> None:
    assert feature_lines([])[:2] == ["gpuperfd.io/health-state=healthy", "gpuperfd.io/health-action=none"]

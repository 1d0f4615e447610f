"""The verdict as node-feature-discovery labels: a local feature file the daemon keeps current.

NFD's ``local`` feature source reads every file in its ``features.d`` directory
(``/etc/kubernetes/node-feature-discovery/features.d/`` by default) and turns each
``name=value`` line into a node label, so the node's health state reaches Kubernetes
without giving gpuperfd any cluster credentials (docs/operations.md cites NFD's
documentation). Off by default; ``health.nfd_features_file`` turns it on. The file is
rewritten atomically (a temporary file in the same directory, then ``rename``), only when a
line changes, so NFD never reads half a file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from gpuperfd.health.verdict import STATES, Verdict, worst
from gpuperfd.system.files import replace_file

log = logging.getLogger(__name__)

#: Label prefix (a domain of ours: NFD lets a local feature name carry its own prefix).
PREFIX = "gpuperfd.io"


def feature_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """``name=value`` lines: the node's state and action, and how many GPUs are in each state."""
    state, action = worst(verdicts)
    lines = [f"{PREFIX}/health-state={state}", f"{PREFIX}/health-action={action}"]
    present = [v for v in verdicts if v.gpu is not None]
    for name in STATES:
        lines.append(f"{PREFIX}/gpus-{name}={sum(1 for v in present if v.state == name)}")
    missing = sum(1 for v in verdicts if v.gpu is None)
    lines.append(f"{PREFIX}/gpus-missing={missing}")
    return lines


class NfdFeatureFile:
    """A health-monitor listener that writes :func:`feature_lines` to ``path`` when they change."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._last: list[str] | None = None

    def __call__(self, verdicts: Sequence[Verdict]) -> None:
        lines = feature_lines(verdicts)
        if lines == self._last:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self.path, "".join(line + "\n" for line in lines).encode(), 0o644)  # NFD reads it as another user
        self._last = lines
        log.info("node features %s: %s", self.path, lines[0])



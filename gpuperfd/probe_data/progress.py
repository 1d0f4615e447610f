"""A sweep in progress, as plain data: which GPU, which probe, which cap, point k of n.

The daemon's sweep observer (:class:`gpuperfd.probing.scheduling.service.ServiceObserver`) keeps one per GPU
while a sweep holds a cap it set; the landing page and ``GET /api/v1/gpus`` (what ``gpuperfd top``
reads) show it. Here, not in ``probing/``, because ``web/`` may not import the probing side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SweepProgress:
    """The cap a sweep holds now on one GPU: ``point`` of ``points`` (1-based, in the sweep's cap order)."""

    gpu: int
    probe: str
    preset: str
    cap_watts: float
    point: int
    points: int
    #: Unix time the sweep set this cap.
    since: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def words(self) -> str:
        """``llm/gpt2 at 400 W, point 3 of 5``: the landing page's and ``gpuperfd top``'s text."""
        return f"{self.probe}/{self.preset} at {self.cap_watts:.0f} W, point {self.point} of {self.points}"

"""What a sweep tells the rest of the parent while it runs: one small named interface.

A result's way from the child to ``/metrics`` reads in one place: the child answers
:class:`~gpuperfd.probing.child.runner.ProbeChild` in JSON, the session hands the decoded
:class:`~gpuperfd.probe_data.result.ProbeResult` to the sweep loop
(:func:`~gpuperfd.probing.sweep.sweeper.run_sweep`), the loop tells its
:class:`SweepObserver` each cap it sets (``on_cap``), when our load runs (``on_measuring``) and each point it measured
(``on_point``), and the daemon's observer (:class:`gpuperfd.probing.scheduling.service.ServiceObserver`)
publishes it to the probe series, the history file and the landing page's latest points;
the CLI's observer draws the progress bar and writes run records. :class:`Observers` fans one
sweep out to several observers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuperfd.probe_data.recommend import SweepPoint

__all__ = ["SweepObserver", "Observers"]


class SweepObserver(Protocol):
    """Told what a sweep does, as it does it (called on the sweeping thread; keep it cheap)."""

    def on_cap(self, watts: float | None) -> None:
        """The cap held now (None once the original is restored)."""

    def on_measuring(self, running: bool) -> None:
        """Our probe's load starts (True) or ends (False) on the GPU: not someone else's load."""

    def on_point(self, point: SweepPoint) -> None:
        """One cap's result, ok or not, as soon as it is measured (or skipped)."""


class Observers:
    """Several observers as one, told in the order given."""

    def __init__(self, observers: Iterable[SweepObserver]) -> None:
        self.observers = list(observers)

    def on_cap(self, watts: float | None) -> None:
        for observer in self.observers:
            observer.on_cap(watts)

    def on_measuring(self, running: bool) -> None:
        for observer in self.observers:
            observer.on_measuring(running)

    def on_point(self, point: SweepPoint) -> None:
        for observer in self.observers:
            observer.on_point(point)

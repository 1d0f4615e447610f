"""How the daemon and the CLIs run the interconnect probe: one protocol, two executors.

The interconnect probe is a node probe: one run holds every GPU of its set at once. An
:class:`InterconnectExecutor` runs it on the devices it is given and returns one
:class:`~gpuperfd.probe_data.interconnect.InterconnectResult`: the real one starts one worker
process per GPU (NCCL; gloo on a CPU), the simulated one computes the figures from the simulated
node's topology and faults. Neither sets a cap or holds a GPU after it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from gpuperfd.device.base import Device
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult

__all__ = ["InterconnectExecutor"]


class InterconnectExecutor(Protocol):
    """Runs the interconnect probe across ``devices`` (at least two) and returns its one result."""

    def run(self, devices: Sequence[Device], request: InterconnectRequest,
            abort: threading.Event) -> InterconnectResult:
        """Blocks until the run ends (ok, failed, or aborted: every worker ended either way)."""

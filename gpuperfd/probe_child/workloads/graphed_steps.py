"""What the static forwards (GPT-2's, Llama's) share: a step replays its captured CUDA graph where one
was captured, else runs eagerly, and the last step's logits are read from where that step left them
(the graph's output buffer, or the eager call's result)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GraphedSteps"]


class GraphedSteps:
    """Mixin: ``graphs`` and ``_graph_logits`` by step name (empty until captured), the eager result,
    the last step's name, and ``_reproducible`` (the answer check's attention kernels, read by the step)."""

    graphs: dict[str, torch.cuda.CUDAGraph]
    _graph_logits: dict[str, torch.Tensor]
    _eager_logits: torch.Tensor | None
    _last: str
    _reproducible: bool

    def _step(self, name: str, eager: Callable[[], torch.Tensor], reproducible: bool = False) -> None:
        """Run step ``name``: its graph, or ``eager`` (with the reproducible kernels if asked)."""
        self._last = name
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        self._reproducible = reproducible
        try:
            self._eager_logits = eager()
        finally:
            self._reproducible = False

    def last_logits(self) -> torch.Tensor:
        """Logits of the last step run (the graph's output buffer when graphed)."""
        if self.graphs:
            return self._graph_logits[self._last]
        assert self._eager_logits is not None
        return self._eager_logits

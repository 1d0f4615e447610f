"""What the static forwards (GPT-2's, Llama's) share: a step replays its captured CUDA graph where one
was captured, else runs eagerly, and the last step's logits are read from where that step left them
(the graph's output buffer, or the eager call's result)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["GraphedSteps", "REPRODUCIBLE_SDPA", "failure_text", "graph_failure", "sdpa_choice"]

#: Attention kernels whose forward pass gives the same bits for the same inputs. cuDNN's, which
#: torch prefers on Hopper for the decode step (one query token against a masked cache), does not:
#: on an H100 two identical decode steps differed in 650k-980k of 6.4M logits
#: (benchmarks/repeat_diag.py, docs/probes.md), and the answer checks compare bits. Measuring with
#: them instead cost 23 % of decode throughput there, so the measured decode keeps torch's choice
#: and only the answer check's decode step (its own graph) uses these.
REPRODUCIBLE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def failure_text(exc: BaseException) -> str:
    """A fallback's reason as a result publishes it (``extra.cuda_graph_error``, ``compile_error``,
    ``fused_error``): the exception's type and message, at most 500 characters."""
    return f"{type(exc).__name__}: {exc}"[:500]


def graph_failure(exc: BaseException, *statics: GraphedSteps) -> str:
    """After a failed CUDA graph capture: the work it queued waited out and every graph of ``statics``
    dropped, so their steps run eagerly (the point measures the same forward launched eagerly); the
    failure's text, which the result records (``extra.cuda_graph_error``), never hidden."""
    torch.cuda.synchronize()
    for static in statics:
        static.graphs = {}
    return failure_text(exc)


def sdpa_choice(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, reproducible: bool = False) -> str | None:
    """The fused SDPA kernel a decode step's shapes select (a zero ``query`` of the step's shape against
    a layer's cache and a full-length mask; private torch API, None if unknown); ``reproducible``: the
    answer check's step (REPRODUCIBLE_SDPA only)."""
    try:
        mask = torch.zeros(1, 1, 1, keys.shape[-2], dtype=query.dtype, device=query.device)
        with sdpa_kernel(REPRODUCIBLE_SDPA) if reproducible else contextlib.nullcontext():
            choice = torch._fused_sdp_choice(query, keys, values, mask, 0.0, False)
        return SDPBackend(choice).name
    except Exception:  # noqa: BLE001 - informational only
        return None


class GraphedSteps:
    """Mixin: ``graphs`` and ``_graph_logits`` by step name (empty until captured), the eager result,
    the last step's name, and ``_reproducible`` (the answer check's attention kernels, read by the step)."""

    device: torch.device
    seq: torch.Tensor
    prompt_tokens: int
    graphs: dict[str, torch.cuda.CUDAGraph]
    _graph_logits: dict[str, torch.Tensor]
    _eager_logits: torch.Tensor | None
    _last: str
    _reproducible: bool

    def run_prefill(self) -> None:
        raise NotImplementedError

    def run_check_decode(self) -> None:
        raise NotImplementedError

    def _warm_up_for_capture(self, steps: list[Callable[[], object]], warmup: int) -> None:
        """Run ``steps`` ``warmup`` times on a side stream, as capture requires (cuBLAS handles and
        workspaces, and torch.compile's compilation, are made there, not inside a graph)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                for step in steps:
                    step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def check_output(self, prompts: torch.Tensor, output_tokens: int) -> list[torch.Tensor]:
        """The answer check's output for ``prompts``: prefill and (with more than one output token) one
        decode step with the reproducible attention kernels; their logits and tokens."""
        T = self.prompt_tokens
        with torch.inference_mode():
            self.seq[:, :T].copy_(prompts)
            self.run_prefill()
            if output_tokens > 1:
                self.run_check_decode()
            return [self.last_logits().clone(), self.seq[:, T:T + min(output_tokens, 2)].clone()]

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

"""ViT image-classification probe (ViT-B/16 at 224 by default; other sizes by preset).

One iteration is one forward pass over ``batch_size`` images (random normal
pixels by default, or a local dataset). Reports images/s, the model FLOP rate
(2 x multiply-adds, counted analytically), and latency per batch (the time
between consecutive batch boundaries on the GPU timeline; p50/p95/p99 in the
summary).

Variants:

* ``compiled`` (GPU presets): :class:`~gpuperfd.probe_child.workloads.vit_fused.FusedViT` (same
  weights and function as the Hugging Face module; one QKV matmul, the patch
  embedding as a matmul), its encoder layer under ``torch.compile`` (one graph every
  layer calls; inductor fuses each residual add with the next layer norm) and, on CUDA,
  the whole forward captured in a CUDA graph, so small
  batches are not limited by Python launch overhead either. Compiling the Hugging
  Face module itself is not used: on torch 2.11 / transformers 5.17 inductor
  decomposes its SDPA call into fp32 batched matmuls and a softmax, which is twice
  as slow as eager (see docs/probes.md).
* ``fused``: the same fused forward without the compiler (CUDA graph on CUDA).
* ``eager``: the Hugging Face module as is (the seeds' method).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpuperfd.probe_child.workloads.graphed_steps import failure_text
from gpuperfd.probe_child import correctness
from gpuperfd.probe_child.context import Clock, ProbeContext, WindowStats
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probe_child.workloads import data
from gpuperfd.probe_child.workloads.models import attention_entry, build_vit, count_parameters
from gpuperfd.probe_child.workloads.vit_fused import FusedViT

__all__ = ["build", "ViTWorkload", "vit_flops_per_image"]


def vit_flops_per_image(config: Any) -> float:
    """Forward FLOPs of one image (2 x multiply-adds of every matmul, attention included)."""
    grid = config.image_size // config.patch_size
    n = grid * grid + 1  # patches + [CLS]
    d = config.hidden_size
    inner = config.intermediate_size
    per_layer = n * d * 3 * d + n * d * d + 2 * n * d * inner + 2 * n * n * d
    patch_embed = grid * grid * (config.num_channels * config.patch_size**2) * d
    head = d * config.num_labels
    return 2.0 * (config.num_hidden_layers * per_layer + patch_embed + head)


class ViTWorkload:
    work_unit = "image"
    host_clock = False

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.model = build_vit(spec, ctx.device, ctx.dtype)
        config = self.model.config
        self.flops_per_image = vit_flops_per_image(config)
        self.n_params = count_parameters(self.model)
        size = config.image_size
        if spec.dataset_path:
            self.images = data.load_images(spec.dataset_path, data.POOL, spec.batch_size, size, ctx.dtype,
                                           ctx.device, spec.seed)
        else:
            self.images = data.random_images(data.POOL, spec.batch_size, size, ctx.dtype, ctx.device, spec.seed)
        self.input = self.images[0].clone()
        self.k = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.compiled = spec.variant == "compiled"
        self.fused = spec.variant in ("compiled", "fused")
        self.fn: Any = None
        if self.fused:
            with torch.inference_mode():
                fused = FusedViT(self.model)
            if self.compiled:
                fused.compile_layers()  # one layer's graph for every layer (vit_fused's docstring)
            self.fn = fused
        self.marks: list[int] = []
        self.graph_error: str | None = None
        #: Seconds of torch.compile and CUDA-graph capture inside the build (a sweep's cost part).
        self.compile_seconds = 0.0
        t_compile = time.perf_counter()
        if self.fused:
            with torch.inference_mode():
                if ctx.is_cuda:
                    try:
                        self._capture()
                    except RuntimeError as exc:
                        # Recorded in extra (cuda_graph False + the error); the forward
                        # then runs without a graph.
                        torch.cuda.synchronize()
                        self.graph = None
                        self.graph_error = failure_text(exc)
                elif self.compiled:
                    self._forward()  # compile now, not in the warmup
            self.compile_seconds = time.perf_counter() - t_compile

    def _forward(self) -> torch.Tensor:
        if self.fn is not None:
            return self.fn(self.input)
        return self.model(pixel_values=self.input).logits

    def _capture(self) -> None:
        stream = torch.cuda.Stream(self.ctx.device)
        stream.wait_stream(torch.cuda.current_stream(self.ctx.device))
        with torch.cuda.stream(stream):
            for _ in range(3):  # compiles (first call), autotunes, creates cuBLAS handles
                self._forward()
        torch.cuda.current_stream(self.ctx.device).wait_stream(stream)
        torch.cuda.synchronize(self.ctx.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.graph_output = self._forward()
        torch.cuda.synchronize(self.ctx.device)
        self.graph = graph

    def begin(self, clock: Clock) -> None:
        self.marks = [clock.mark()]

    def step(self, clock: Clock) -> None:
        with torch.inference_mode():
            self.input.copy_(self.images[self.k % data.POOL])
            self.k += 1
            if self.graph is not None:
                self.graph.replay()
            else:
                self._forward()
        self.marks.append(clock.mark())

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats:
        clock.finalize()
        images = self.spec.batch_size * iterations
        counts = {
            "images_per_second": (images, seconds),
            "model_flops_per_second": (images * self.flops_per_image, seconds),
        }
        return WindowStats(iterations=iterations, units=images, counts=counts,
                           latencies={"batch_seconds": clock.diffs(self.marks)})

    def check_plan(self) -> correctness.CheckPlan:
        """The window's first image batch through the window's path (eager, fused, compiled, graph):
        its logits; the slice is a product with the model's largest weight."""

        def output() -> list[torch.Tensor]:
            with torch.inference_mode():
                self.input.copy_(self.images[0])
                if self.graph is not None:
                    self.graph.replay()
                    return [self.graph_output.clone()]
                return [self._forward().clone()]

        path = "cuda_graph" if self.graph is not None else ("compiled" if self.compiled else "eager")
        return correctness.CheckPlan(
            output, correctness.weight_slice(self.model, self.ctx.dtype),
            path=path)

    def describe(self) -> dict[str, Any]:
        return {
            "model_parameters": self.n_params,
            "flops_per_image": self.flops_per_image,
            "compiled": self.compiled,
            "implementation": "gpuperfd.vit_fused" if self.fused else "transformers",
            "cuda_graph": self.graph is not None,
            "compile_seconds": self.compile_seconds,
            **attention_entry(self.model),
            **({"cuda_graph_error": self.graph_error} if self.graph_error else {}),
        }


def build(spec: ProbeSpec, ctx: ProbeContext) -> ViTWorkload:
    return ViTWorkload(spec, ctx)

"""Training-step probe: GPT-2 forward, backward and AdamW step on ``batch_size x seq_len`` tokens.

Mixed precision the usual way: float32 master weights, ``torch.autocast`` to the
spec's dtype (bf16 by default; fp16 adds a GradScaler), fused AdamW on CUDA.
Random token ids by default (the loss then stays near ln(vocab)); a local token
file gives a real loss curve. Losses are kept on the device and read after the
window, so no per-step synchronize stalls the GPU.

Reports tokens/s, an approximate model FLOP rate (6 x parameters per token plus
the attention term 12 x layers x width x seq), step latency, and the loss (mean
over the window, and the first one seen) in ``extra``. Work unit: token.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpuperfd.probe_child import correctness
from gpuperfd.probe_child.context import Clock, ProbeContext, WindowStats
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probe_child.workloads import data
from gpuperfd.probe_child.workloads.models import attention_entry, build_gpt2, count_parameters

__all__ = ["build", "TrainWorkload"]


class TrainWorkload:
    work_unit = "token"
    host_clock = False

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.model = build_gpt2(spec, ctx.device, torch.float32)
        self.model.train()
        config = self.model.config
        self.n_params = count_parameters(self.model)
        self.tokens_per_step = spec.batch_size * spec.seq_len
        self.flops_per_token = 6.0 * self.n_params + 12.0 * config.n_layer * config.n_embd * spec.seq_len
        if spec.dataset_path:
            self.batches = data.token_windows(spec.dataset_path, data.POOL, spec.batch_size, spec.seq_len,
                                              config.vocab_size, ctx.device, spec.seed)
        else:
            self.batches = data.random_tokens((data.POOL, spec.batch_size, spec.seq_len), config.vocab_size,
                                              ctx.device, spec.seed)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=ctx.is_cuda
        )
        self.autocast_dtype = None if ctx.dtype == torch.float32 else ctx.dtype
        self.scaler = torch.amp.GradScaler(ctx.device.type) if ctx.dtype == torch.float16 else None
        self.k = 0
        self.marks: list[int] = []
        self.losses: list[torch.Tensor] = []
        self.first_loss: float | None = None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=self.autocast_dtype)

    def begin(self, clock: Clock) -> None:
        self.marks = [clock.mark()]
        self.losses = []

    def step(self, clock: Clock) -> None:
        ids = self.batches[self.k % data.POOL]
        self.k += 1
        with self._autocast():
            loss = self.model(input_ids=ids, labels=ids).loss
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.detach())
        self.marks.append(clock.mark())

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats:
        clock.finalize()
        tokens = self.tokens_per_step * iterations
        losses = torch.stack(self.losses).float().cpu() if self.losses else torch.zeros(0)
        if self.first_loss is None and losses.numel():
            self.first_loss = float(losses[0])
        counts = {
            "tokens_per_second": (tokens, seconds),
            "steps_per_second": (iterations, seconds),
            "model_flops_per_second": (tokens * self.flops_per_token, seconds),
        }
        extra = {
            "loss": float(losses.mean()) if losses.numel() else None,
            "loss_first": self.first_loss,
            "loss_last": float(losses[-1]) if losses.numel() else None,
        }
        return WindowStats(iterations=iterations, units=tokens, counts=counts,
                           latencies={"step_seconds": clock.diffs(self.marks)}, extra=extra)

    def check_plan(self) -> correctness.CheckPlan:
        """The forward logits on the first sequence of the window's first batch (eval mode, no dropout,
        under the step's autocast; one sequence keeps it to a small share of one step) with the weights
        as they are: deterministic between two calls, but they depend on how many steps ran, so not
        peer-comparable. The slice is the autocast product with the largest weight (the embedding,
        tied to the LM head)."""
        ids = self.batches[0][:1]

        def output() -> list[torch.Tensor]:
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.inference_mode(), self._autocast():
                    return [self.model(input_ids=ids).logits[:, -8:].float().contiguous()]
            finally:
                self.model.train(was_training)

        dtype = self.autocast_dtype or torch.float32
        return correctness.CheckPlan(
            output, correctness.weight_slice(self.model, dtype),
            path="eager", peer_comparable=False)

    def describe(self) -> dict[str, Any]:
        return {
            "model_parameters": self.n_params,
            "flops_per_token": self.flops_per_token,
            "optimizer": "AdamW(fused)" if self.ctx.is_cuda else "AdamW",
            "autocast_dtype": str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else None,
            **attention_entry(self.model),
        }


def build(spec: ProbeSpec, ctx: ProbeContext) -> TrainWorkload:
    return TrainWorkload(spec, ctx)

"""LLM inference probe: GPT-2 family, prefill and decode measured apart.

One iteration is one batch of ``batch_size`` requests: copy prompts in, prefill
(the first output token comes out of it), then ``output_tokens - 1`` decode
steps. Every sequence in the batch is a request with the same latency.

Variants:

* ``graph`` (default): :class:`~gpuperfd.probe_child.workloads.gpt2_static.StaticGPT2`, static
  KV cache, SDPA, prefill and the decode step each one CUDA graph replay. Timing
  marks are CUDA events, so no synchronize sits inside a window. On a CPU the
  same code runs without graphs.
  ``n_groups`` > 1 shares each key/value head among that many query heads (GQA).
* ``eager``: Hugging Face ``generate()`` (greedy, dynamic cache), the seeds'
  method, kept as the comparison; a streamer marks the first token. It
  synchronizes every step by itself, so its marks are host clock reads.

Reported per window: output, total (prompt + output), prompt (prefill) and
decode tokens/s, requests/s; latencies ttft (prompt in -> first token),
tpot ((request - ttft) / (output_tokens - 1)) and request, one sample per batch;
and in each window's extra ``token_position_seconds``: the mean time to each output
token ([TTFT, token 2, ...]) over every TRACE_EVERY-th request, the per-token curve.
Work unit: output token (so J/token is energy per generated token).
"""

from __future__ import annotations

from typing import Any

import torch

from gpuperfd.probe_child import correctness
from gpuperfd.probe_child.context import Clock, ProbeContext, WindowStats
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probe_child.workloads import data
from gpuperfd.probe_child.workloads.gpt2_static import StaticGPT2
from gpuperfd.probe_child.workloads.graphed_steps import graph_failure, sdpa_choice
from gpuperfd.probe_child.workloads.models import attention_entry, build_gpt2, count_parameters

__all__ = ["build", "GraphLLM", "EagerLLM"]

#: One request in this many marks the clock after every output token (the per-position curve);
#: the others mark only start, first token and end, so tracing costs little of the measured window.
TRACE_EVERY = 4


def _prompts(spec: ProbeSpec, ctx: ProbeContext, vocab_size: int) -> torch.Tensor:
    shape = (data.POOL, spec.batch_size, spec.prompt_tokens)
    if spec.dataset_path:
        return data.token_windows(spec.dataset_path, data.POOL, spec.batch_size, spec.prompt_tokens, vocab_size,
                                  ctx.device, spec.seed)
    return data.random_tokens(shape, vocab_size, ctx.device, spec.seed)


class _LLMBase:
    work_unit = "token"
    host_clock = False

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext, model: Any) -> None:
        self.spec = spec
        self.ctx = ctx
        self.model = model
        self.prompts = _prompts(spec, ctx, model.config.vocab_size)
        self.batch = spec.batch_size
        self.T = spec.prompt_tokens
        self.O = spec.output_tokens
        self.k = 0
        self.marks: list[tuple[int, int, int]] = []
        #: Per traced request: clock marks at its start and after each output token.
        self.traces: list[list[int]] = []
        self.n_params = count_parameters(model)

    def begin(self, clock: Clock) -> None:
        self.marks = []
        self.traces = []

    def _traced(self) -> bool:
        """A window's first request and every TRACE_EVERY-th one mark each token (bounded overhead;
        a window of few long requests still gets its curve)."""
        return not self.marks or self.k % TRACE_EVERY == 0

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats:
        clock.finalize()
        ttft = [clock.seconds(a, b) for a, b, _ in self.marks]
        request = [clock.seconds(a, c) for a, _, c in self.marks]
        decode = [r - t for r, t in zip(request, ttft)]
        B, T, O, n = self.batch, self.T, self.O, iterations
        counts: dict[str, tuple[float, float]] = {
            "output_tokens_per_second": (B * O * n, seconds),
            "total_tokens_per_second": (B * (T + O) * n, seconds),
            "requests_per_second": (B * n, seconds),
            "prompt_tokens_per_second": (B * T * n, sum(ttft)),
        }
        latencies = {"ttft_seconds": ttft, "request_seconds": request}
        if O > 1:
            counts["decode_tokens_per_second"] = (B * (O - 1) * n, sum(decode))
            latencies["tpot_seconds"] = [d / (O - 1) for d in decode]
        extra: dict[str, Any] = {}
        curves = [clock.diffs(trace) for trace in self.traces if len(trace) == O + 1]
        if curves:
            # Mean time to each output token over the traced requests: [TTFT, token 2, token 3, ...].
            extra["token_position_seconds"] = [sum(c[i] for c in curves) / len(curves) for i in range(O)]
            extra["token_position_requests"] = len(curves)
        return WindowStats(iterations=n, units=B * O * n, counts=counts, latencies=latencies, extra=extra)


class GraphLLM(_LLMBase):
    """Static KV cache + CUDA graphs (CUDA) / the same forward without graphs (CPU)."""

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext, model: Any) -> None:
        super().__init__(spec, ctx, model)
        self.graph_error: str | None = None
        with torch.inference_mode():
            self.static = StaticGPT2(model, spec.batch_size, spec.prompt_tokens, spec.output_tokens,
                                     n_groups=spec.n_groups or 1)
            if ctx.is_cuda:
                try:
                    self.static.capture()
                except RuntimeError as exc:  # recorded (extra.cuda_graph = False); the steps run eagerly
                    self.graph_error = graph_failure(exc, self.static)
        self.decode_sdpa_backend = _sdpa_choice(self.static)
        self.check_sdpa_backend = _sdpa_choice(self.static, reproducible=True)

    def step(self, clock: Clock) -> None:
        s = self.static
        traced = self._traced()
        with torch.inference_mode():
            start = clock.mark()
            s.seq[:, : self.T].copy_(self.prompts[self.k % data.POOL])
            self.k += 1
            s.run_prefill()
            first = clock.mark()
            steps = [start, first]
            for _ in range(self.O - 1):
                s.run_decode()
                if traced:
                    steps.append(clock.mark())
            done = steps[-1] if traced and self.O > 1 else clock.mark()
        self.marks.append((start, first, done))
        if traced:
            self.traces.append(steps)

    def check_plan(self) -> correctness.CheckPlan:
        """The window's first request batch through the window's path (graphs or not): prefill and
        one decode step (both kernels sets, a fraction of one request's cost), their logits and
        tokens; the slice is a product with the model's largest weight."""
        s = self.static

        def output() -> list[torch.Tensor]:
            return s.check_output(self.prompts[0], self.O)

        return correctness.CheckPlan(
            output, correctness.weight_slice(self.model, self.ctx.dtype),
            path="cuda_graph" if s.graphs else "eager")

    def describe(self) -> dict[str, Any]:
        out = {
            "model_parameters": self.n_params,
            "kv_cache": "static",
            "kv_cache_bytes": self.static.kv_cache_bytes,
            "kv_heads": self.static.n_kv,
            "cuda_graph": bool(self.static.graphs),
            **attention_entry(),
            "decode_sdpa_backend": self.decode_sdpa_backend,
            "check_decode_sdpa_backend": self.check_sdpa_backend,
        }
        if self.graph_error:
            out["cuda_graph_error"] = self.graph_error
        return out


def _sdpa_choice(static: StaticGPT2, reproducible: bool = False) -> str | None:
    """The fused SDPA kernel a decode step's shapes select (private torch API; None if unknown);
    ``reproducible``: the answer check's step (REPRODUCIBLE_SDPA only)."""
    query = torch.zeros(static.batch_size, static.n_head, 1, static.head_dim, dtype=static.dtype, device=static.device)
    return sdpa_choice(query, static.k_cache[0], static.v_cache[0], reproducible)


class _FirstTokenStreamer:
    """A generate() streamer that marks the clock when the first new token arrives."""

    def __init__(self, clock: Clock, every_token: bool = False) -> None:
        self.clock = clock
        self.calls = 0
        self.first: int | None = None
        self.every_token = every_token
        self.tokens: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt itself
            self.first = self.clock.mark()
            self.tokens.append(self.first)
        elif self.calls > 2 and self.every_token:
            self.tokens.append(self.clock.mark())

    def end(self) -> None:
        pass


class EagerLLM(_LLMBase):
    """Hugging Face generate(), eager, dynamic cache: the comparison baseline."""

    host_clock = True

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext, model: Any) -> None:
        super().__init__(spec, ctx, model)
        self.mask = torch.ones(spec.batch_size, spec.prompt_tokens, dtype=torch.long, device=ctx.device)
        self.generated_short = 0

    def step(self, clock: Clock) -> None:
        ids = self.prompts[self.k % data.POOL]
        traced = self._traced()
        self.k += 1
        streamer = _FirstTokenStreamer(clock, every_token=traced)
        with torch.inference_mode():
            start = clock.mark()
            out = self.model.generate(
                ids, attention_mask=self.mask, max_new_tokens=self.O, min_new_tokens=self.O, do_sample=False,
                streamer=streamer, pad_token_id=0,
            )
            done = clock.mark()
        if out.shape[1] != self.T + self.O:
            self.generated_short += 1
        first = streamer.first if streamer.first is not None else done
        self.marks.append((start, first, done))
        if traced:
            self.traces.append([start, *streamer.tokens])

    def check_plan(self) -> correctness.CheckPlan:
        """The window's first request batch through generate(), two tokens (prefill and one decode
        step, a fraction of a request's cost): the logits of both steps and the tokens."""
        ids = self.prompts[0]
        n = min(self.O, 2)

        def output() -> list[torch.Tensor]:
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=self.mask, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=False, pad_token_id=0, output_logits=True,
                                          return_dict_in_generate=True)
            return [torch.stack(list(out.logits)), out.sequences]

        return correctness.CheckPlan(
            output, correctness.weight_slice(self.model, self.ctx.dtype),
            path="eager")

    def describe(self) -> dict[str, Any]:
        return {
            "model_parameters": self.n_params,
            "kv_cache": "dynamic",
            "cuda_graph": False,
            **attention_entry(self.model),
            "generate_short_outputs": self.generated_short,
        }


def build(spec: ProbeSpec, ctx: ProbeContext) -> Any:
    model = build_gpt2(spec, ctx.device, ctx.dtype)
    if spec.prompt_tokens + spec.output_tokens > model.config.n_positions:
        raise ValueError(
            f"output_tokens: prompt + output = {spec.prompt_tokens + spec.output_tokens} exceeds the model's "
            f"{model.config.n_positions} positions"
        )
    if spec.variant == "graph":
        return GraphLLM(spec, ctx, model)
    return EagerLLM(spec, ctx, model)

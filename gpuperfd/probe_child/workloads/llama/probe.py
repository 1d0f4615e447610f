"""The llm probe on a Llama-family model (seed 004): prefill and decode apart, the HBM roofline
beside the figure, and speculative decoding measured where random weights cannot lie.

Variants (``spec.LLAMA_VARIANTS``):

* ``graph``: :class:`~gpuperfd.probe_child.workloads.llama.static.StaticLlama`, static KV cache,
  prefill and each decode step one CUDA graph replay (on a CPU the same code, eagerly);
* ``compiled``: the same step functions through ``torch.compile`` (norms, RoPE, SwiGLU and residuals
  fused), then captured; a compile failure falls back to ``graph``'s functions, recorded in
  ``extra.compile_error``;
* ``fused``: ``graph`` with the batch-1 decode step as six Triton kernels a layer
  (:class:`~gpuperfd.probe_child.workloads.llama.fused.FusedDecode`: norm, RoPE, SwiGLU and the residual
  adds inside the products, captured); where it cannot run (a CPU, no Triton, batch > 1, a Triton that
  fails on the first step: :func:`fused_step_error`) ``graph``'s step, the reason in ``extra.fused_error``;
* ``eager``: Hugging Face ``generate()`` (dynamic cache): how a plain transformers user runs it;
* ``speculative``: a draft (``draft_model``) proposes ``speculative_tokens`` (k) tokens, one graph of
  k decode steps; the target verifies k + 1 tokens in one step (one graph). With random weights the
  acceptance rate means nothing, so it is not measured: what is measured is the draft's round and
  the target's verify step, and the tokens/s they give at the acceptance rates the user names
  (``acceptance_rates``) and on a curve over 0..1 are computed from them (:func:`expected_tokens`).

One iteration of graph/compiled/eager is one batch of requests (``llm.py``'s accounting: TTFT,
time per output token, tokens/s, J/token). The figures beside it (``extra.roofline``): the card's
datasheet HBM bandwidth, the bytes a decode step must read (every weight once, plus the live KV
cache), the tokens/s that allows, and the share the measured decode reached.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpuperfd.probe_child import correctness
from gpuperfd.probe_child.context import Clock, ProbeContext, WindowStats
from gpuperfd.probe_child.workloads import data
from gpuperfd.probe_child.workloads.graphed_steps import failure_text, graph_failure, sdpa_choice
from gpuperfd.probe_child.workloads.llama.fused import fused_unavailable
from gpuperfd.probe_child.workloads.llama.static import StaticLlama
from gpuperfd.probe_child.workloads.llm import EagerLLM, GraphLLM, _LLMBase
from gpuperfd.probe_child.workloads.models import build_llama, count_parameters
from gpuperfd.probe_data.result import NO_ROOM
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probe_data.speculative import RANDOM_WEIGHTS_NOTE, speculative_summary
from gpuperfd.probe_data.workload_cost import llama_no_room, llama_room_bytes

__all__ = ["build", "GraphLlama", "NoRoom", "SpeculativeLlama", "check_room", "roofline_figures"]


class NoRoom(ValueError):
    """The point does not fit: the run is ``skipped`` with reason ``no_room`` (not the GPU's failure:
    no health verdict or failing alert counts it), its message naming ``preset`` and the sizes."""

    failure_reason = NO_ROOM


def check_room(spec: ProbeSpec, ctx: ProbeContext) -> None:
    """:class:`NoRoom` when the card's free memory (on a CPU: the host's available memory, the cgroup's
    limit and the child's memory limit, if one is set) cannot hold the point (weights, caches,
    activations and a margin), before anything is built: a point without room says so instead of
    failing with an out-of-memory error (or the kernel's OOM kill) half-way through."""
    options = {"model": spec.model, "batch_size": spec.batch_size, "prompt_tokens": spec.prompt_tokens,
               "output_tokens": spec.output_tokens, "dtype": spec.dtype, "variant": spec.variant,
               "draft_model": spec.draft_model, "speculative_tokens": spec.speculative_tokens}
    if not ctx.is_cuda:
        needed = llama_room_bytes(options, margin=False)
        have = min(_host_room(spec), default=None)
        if have is not None and needed > have[0]:
            raise NoRoom(llama_no_room(options, spec.preset, f"{needed / 2**30:.1f} GiB of host memory "
                                                             f"({spec.dtype} on a CPU)", have[1]))
        return
    needed = llama_room_bytes(options)
    free, total = torch.cuda.mem_get_info(ctx.device)
    if needed > free:
        raise NoRoom(llama_no_room(options, spec.preset, f"{needed / 2**30:.1f} GiB of GPU memory",
                                   f"{ctx.gpu_name or ctx.device} has {free / 2**30:.1f} GiB free of "
                                   f"{total / 2**30:.1f} GiB"))


def _host_room(spec: ProbeSpec) -> list[tuple[int, str]]:
    """What a CPU child may still allocate, each with its source's words (:func:`memory_available`)."""
    from gpuperfd.system.cgroup_memory import memory_available

    found = memory_available()
    if spec.memory_limit_bytes is not None:
        limit = spec.memory_limit_bytes
        found.append((limit, f"the child's memory limit is {limit / 2**20:.0f} MiB"))
    return found


def roofline_figures(gpu_name: str | None, weight_bytes: int, kv_bytes_per_token: float, batch: int,
                     context_tokens: float, decode_tokens_per_second: float | None,
                     parameter_bytes: int | None = None) -> dict[str, Any]:
    """The HBM roofline of a decode step and the share reached: a step reads every weight it multiplies
    by once and each sequence's live KV cache (``context_tokens`` positions on average), so tokens/s <=
    batch x bandwidth / those bytes. Bandwidth is the card's datasheet figure (None on an unknown card or
    a CPU). ``parameter_bytes``: every parameter (the embedding too), the bound as issue 53 and seed
    004's reference count it (16.06 GB, 208.6 tokens/s for the 8B on an H100): ``all_parameters_*``."""
    from gpuperfd.device.roofline import hbm_bandwidth

    step_bytes = weight_bytes + batch * kv_bytes_per_token * context_tokens
    bandwidth = hbm_bandwidth(gpu_name)
    out: dict[str, Any] = {"bytes_per_step": step_bytes, "weight_bytes": weight_bytes,
                           "hbm_bytes_per_second": bandwidth, "source": "datasheet HBM bandwidth"}
    if parameter_bytes is not None:
        out["parameter_bytes"] = parameter_bytes
    if bandwidth is None:
        out["tokens_per_second"] = out["share"] = None
        return out
    bound = batch * bandwidth / step_bytes
    out["tokens_per_second"] = bound
    out["share"] = decode_tokens_per_second / bound if decode_tokens_per_second else None
    if parameter_bytes:
        every = batch * bandwidth / (parameter_bytes + batch * kv_bytes_per_token * context_tokens)
        out["all_parameters_tokens_per_second"] = every
        out["all_parameters_share"] = decode_tokens_per_second / every if decode_tokens_per_second else None
    return out


def fused_step_error(static: StaticLlama, ctx: ProbeContext) -> str | None:
    """A prefill and one fused decode step before capture; the error where Triton cannot build or launch
    the kernels here (a compiler or driver it does not support), else None. The caller then measures
    ``graph``'s step with that reason published (as a failed compile falls back), never a failed probe."""
    try:
        static.prefill()
        static.decode()
        if ctx.is_cuda:
            torch.cuda.synchronize(ctx.device)
    except Exception as exc:  # noqa: BLE001 - recorded by the caller, then graph's step is measured
        return failure_text(exc)
    return None


class _RooflineMixin:
    """Publishes the roofline beside the measured decode (``annotate``, after the windows are pooled)."""

    spec: ProbeSpec
    ctx: ProbeContext

    def _roofline_inputs(self) -> tuple[int, float]:
        raise NotImplementedError

    def annotate(self, result: Any) -> None:
        weight_bytes, kv_per_token = self._roofline_inputs()
        mean_context = self.spec.prompt_tokens + self.spec.output_tokens / 2
        decode = (result.throughput or {}).get("decode_tokens_per_second")
        model: Any = getattr(self, "model")
        parameters = count_parameters(model) * self.ctx.dtype.itemsize
        result.extra["roofline"] = roofline_figures(self.ctx.gpu_name, weight_bytes, kv_per_token,
                                                    self.spec.batch_size, mean_context, decode, parameters)


def _decode_sdpa_choice(static: StaticLlama, reproducible: bool = False) -> str | None:
    """The fused SDPA kernel a decode step's shapes select (query heads folded per KV head; private
    torch API, None if unknown); ``reproducible``: the answer check's step."""
    query = torch.zeros(static.batch_size, static.n_kv, static.n_head // static.n_kv, static.head_dim, dtype=static.dtype,
                        device=static.device)
    return sdpa_choice(query, static.k_cache[0], static.v_cache[0], reproducible)


def _kv_bytes_per_token(static: StaticLlama) -> float:
    return 2.0 * static.n_layer * static.n_kv * static.head_dim * static.k_cache[0].element_size()


class GraphLlama(_RooflineMixin, GraphLLM):
    """Static KV cache + CUDA graphs (``graph``), or torch.compile'd steps in the graphs (``compiled``)."""

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext, model: Any) -> None:
        _LLMBase.__init__(self, spec, ctx, model)
        self.graph_error: str | None = None
        self.compile_error: str | None = None
        self.compile_seconds = 0.0
        compiled = spec.variant == "compiled"
        #: Why the ``fused`` variant's decode ran as ``graph``'s (no CUDA card, no Triton, batch > 1), or None.
        self.fused_error = fused_unavailable(ctx.device, spec.batch_size) if spec.variant == "fused" else None
        fused = spec.variant == "fused" and self.fused_error is None
        with torch.inference_mode():
            self.static = StaticLlama(model, spec.batch_size, spec.prompt_tokens,
                                      spec.prompt_tokens + spec.output_tokens, compile_steps=compiled,
                                      fused_decode=fused)
            t0 = time.perf_counter()
            if fused:
                self._try_fused()
            if ctx.is_cuda:
                self._capture(compiled)
            elif compiled:
                self._compile_on_cpu()
            self.compile_seconds = time.perf_counter() - t0
        self.decode_sdpa_backend = _decode_sdpa_choice(self.static)
        self.check_sdpa_backend = _decode_sdpa_choice(self.static, reproducible=True)

    def _try_fused(self) -> None:
        error = fused_step_error(self.static, self.ctx)
        if error:
            self.fused_error = error
            self.static.fused = None

    def _uncompile(self, exc: BaseException) -> None:
        s = self.static
        self.compile_error = failure_text(exc)
        s.compiled, s._decode_fn, s._verify_fn = False, s.decode, s.verify
        s.inplace_residual = s.rope_by_product = True  # the graph variant's forms (its cache tensors stay apart)

    def _capture(self, compiled: bool) -> None:
        try:
            self.static.capture()
            return
        except Exception as exc:  # noqa: BLE001 - recorded, then the plain functions are tried
            error = graph_failure(exc, self.static)
            if not compiled:
                self.graph_error = error
                return
            self._uncompile(exc)
        try:
            self.static.capture()
        except RuntimeError as exc:
            self.graph_error = graph_failure(exc, self.static)

    def _compile_on_cpu(self) -> None:
        s = self.static
        try:
            s.prefill()
            s._decode_fn()
        except Exception as exc:  # noqa: BLE001 - no C++ compiler on this host: measured uncompiled
            self._uncompile(exc)

    def check_plan(self) -> correctness.CheckPlan:
        """Prefill and one decode step of the window's first request batch (graph replays on CUDA),
        their logits and tokens; the slice is a product with the model's largest weight (the embedding)."""
        s = self.static

        def output() -> list[torch.Tensor]:
            return s.check_output(self.prompts[0], self.O)

        return correctness.CheckPlan(output, correctness.weight_slice(self.model, self.ctx.dtype),
                                     path="cuda_graph" if s.graphs else "eager")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        s = self.static
        out.update({"model_family": "llama", "kv_heads": s.n_kv, "torch_compile": s.compiled,
                    "compile_seconds": self.compile_seconds, "weight_bytes": s.weight_bytes(),
                    # how the step is written (llama.static.StaticLlama): what a decode step's kernels are
                    "step_forms": {"residual_in_product": s.inplace_residual,
                                   "rope_by_product": s.rope_by_product and s.batch_size == 1,
                                   "joint_kv_cache": s.kv_cache is not None,
                                   "fused_decode_kernels": s.fused is not None}})
        if self.compile_error:
            out["compile_error"] = self.compile_error
        if self.fused_error:
            out["fused_error"] = self.fused_error
        return out

    def _roofline_inputs(self) -> tuple[int, float]:
        return self.static.weight_bytes(), _kv_bytes_per_token(self.static)


class EagerLlama(_RooflineMixin, EagerLLM):
    """Hugging Face generate() on the Llama model: the plain transformers user's figure."""

    def _roofline_inputs(self) -> tuple[int, float]:
        cfg = self.model.config
        size = self.ctx.dtype.itemsize
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        weights = sum(p.numel() for p in self.model.parameters()) * size
        if not getattr(cfg, "tie_word_embeddings", False):
            weights -= self.model.model.embed_tokens.weight.numel() * size  # a gather, not read whole
        return weights, 2.0 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * size

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_family": "llama"}


class SpeculativeLlama:
    """One iteration is one speculative round at a fixed position: the draft's k decode steps (one
    graph), the proposals copied to the target, the target's verify step over k + 1 tokens (one
    graph); both positions are then put back, so every round costs the same."""

    work_unit = "token"
    host_clock = False

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext, target: Any, draft: Any) -> None:
        self.spec, self.ctx, self.model, self.draft_model = spec, ctx, target, draft
        self.k = int(spec.speculative_tokens or 1)
        self.rates = tuple(spec.acceptance_rates or ())
        self.batch, self.T = spec.batch_size, spec.prompt_tokens
        context = spec.prompt_tokens + spec.output_tokens + self.k + 1
        self.prompts = data.random_tokens((data.POOL, spec.batch_size, spec.prompt_tokens),
                                          target.config.vocab_size, ctx.device, spec.seed)
        self.graph_error: str | None = None
        self.marks: list[tuple[int, int, int]] = []
        #: Both models' batch-1 decode steps as the ``fused`` variant's Triton kernels where they can run.
        self.fused = fused_unavailable(ctx.device, spec.batch_size) is None
        with torch.inference_mode():
            self.target = StaticLlama(target, spec.batch_size, spec.prompt_tokens, context, verify_tokens=self.k + 1,
                                      fused_decode=self.fused)
            self.draft = StaticLlama(draft, spec.batch_size, spec.prompt_tokens, context, fused_decode=self.fused)
            #: Why the decode steps are graph's although they could be fused here (Triton failed), or None.
            self.fused_error = None
            if self.fused:
                self.fused_error = fused_step_error(self.target, ctx) or fused_step_error(self.draft, ctx)
                if self.fused_error:
                    self.fused = False
                    self.target.fused = self.draft.fused = None
            if ctx.is_cuda:
                try:
                    self.target.capture()
                    self.draft.capture(decode_steps=self.k)
                except RuntimeError as exc:
                    self.graph_error = graph_failure(exc, self.target, self.draft)
            self._start_round(self.prompts[0])
            self.target_decode_seconds = self._time_target_decode()

    def _start_round(self, prompts: torch.Tensor) -> None:
        """Both models prefilled on ``prompts``; the draft continues from the target's first token."""
        t, d, T = self.target, self.draft, self.T
        t.seq[:, :T].copy_(prompts)
        t.run_prefill()
        d.seq[:, :T + 1].copy_(t.seq[:, :T + 1])
        d.run_prefill()
        d.seq[:, T].copy_(t.seq[:, T])

    def _time_target_decode(self, steps: int = 8) -> float:
        """Seconds of one plain target decode step (outside any window: the baseline a round beats)."""
        t, T = self.target, self.T
        clock = self.ctx.new_clock()
        start = clock.mark()
        for _ in range(steps):
            t.run_decode()
        end = clock.mark()
        if self.ctx.is_cuda:  # elapsed_time needs both events completed (the H200 run failed here)
            torch.cuda.synchronize()
        clock.finalize()
        t.pos.fill_(T)  # back to the round's position
        return clock.seconds(start, end) / steps

    def _draft_round(self) -> None:
        d = self.draft
        if d.graphs:
            d.run_decode()  # k steps in one graph
        else:
            for _ in range(self.k):
                d.run_decode()
        d.pos.sub_(self.k)

    def begin(self, clock: Clock) -> None:
        self.marks = []

    def step(self, clock: Clock) -> None:
        t, d, T, k = self.target, self.draft, self.T, self.k
        with torch.inference_mode():
            start = clock.mark()
            self._draft_round()
            drafted = clock.mark()
            t.seq[:, T + 1:T + 1 + k].copy_(d.seq[:, T + 1:T + 1 + k])
            t.run_verify()
            done = clock.mark()
        self.marks.append((start, drafted, done))

    def end(self, clock: Clock, iterations: int, seconds: float) -> WindowStats:
        clock.finalize()
        draft = [clock.seconds(a, b) for a, b, _ in self.marks]
        verify = [clock.seconds(b, c) for _, b, c in self.marks]
        rounds = [clock.seconds(a, c) for a, _, c in self.marks]
        B, k, n = self.batch, self.k, iterations
        summary = speculative_summary(k, self.rates, sum(draft) / max(n, 1), sum(verify) / max(n, 1),
                                      self.target_decode_seconds, B, seconds / max(n, 1))
        first = summary["at_rates"][0]["expected_tokens_per_round"]
        counts: dict[str, tuple[float, float]] = {
            # the headline: tokens/s at the first named acceptance rate (expected tokens per round x rounds),
            # over the window's time: the table's figure at that rate divides by the same round
            "output_tokens_per_second": (B * first * n, seconds),
            "draft_tokens_per_second": (B * k * n, sum(draft)),
            "verify_tokens_per_second": (B * (k + 1) * n, sum(verify)),
            "rounds_per_second": (float(n), seconds),
        }
        return WindowStats(iterations=n, units=B * first * n, counts=counts,
                           latencies={"request_seconds": rounds}, extra={"speculative": summary})

    def annotate(self, result: Any) -> None:
        """The pooled windows' speculative figures (draft round and verify step from the pooled rates)."""
        rates = result.throughput or {}
        B, k = self.batch, self.k
        if rates.get("draft_tokens_per_second") and rates.get("verify_tokens_per_second"):
            pooled_round = 1.0 / rates["rounds_per_second"] if rates.get("rounds_per_second") else None
            result.extra["speculative"] = {**speculative_summary(
                k, self.rates, B * k / rates["draft_tokens_per_second"],
                B * (k + 1) / rates["verify_tokens_per_second"], self.target_decode_seconds, B, pooled_round),
                "model": self.spec.model, "draft_model": self.spec.draft_model}

    def check_plan(self) -> correctness.CheckPlan:
        """The target's verify step on the first prompt batch and fixed proposals (the draft's greedy
        tokens): its logits and greedy choices; the slice is a product with the target's largest weight."""

        def output() -> list[torch.Tensor]:
            # Eager steps with attention kernels that repeat their bits (REPRODUCIBLE_SDPA): torch's
            # choice for a masked step on Hopper (cuDNN) does not, and the proposals feed the verify.
            t, d, T, k = self.target, self.draft, self.T, self.k
            with torch.inference_mode():
                t._reproducible = d._reproducible = True
                try:
                    t.seq[:, :T].copy_(self.prompts[0])
                    t.prefill()
                    d.seq[:, :T + 1].copy_(t.seq[:, :T + 1])
                    d.prefill()
                    d.seq[:, T].copy_(t.seq[:, T])
                    for _ in range(k):
                        d.decode()
                    t.seq[:, T + 1:T + 1 + k].copy_(d.seq[:, T + 1:T + 1 + k])
                    logits = t.verify()
                finally:
                    t._reproducible = d._reproducible = False
                d.pos.fill_(T)
                return [logits.clone(), t.verified.clone()]

        return correctness.CheckPlan(output, correctness.weight_slice(self.model, self.ctx.dtype), path="eager")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_family": "llama", "model_parameters": sum(p.numel() for p in self.model.parameters()),
            "draft_parameters": sum(p.numel() for p in self.draft_model.parameters()),
            "kv_cache": "static", "cuda_graph": bool(self.target.graphs), "speculative_tokens": self.k,
            "acceptance_rates": list(self.rates), "acceptance_note": RANDOM_WEIGHTS_NOTE,
            "target_decode_step_seconds": self.target_decode_seconds, "fused_decode_kernels": self.fused,
        }
        if self.graph_error:
            out["cuda_graph_error"] = self.graph_error
        if self.fused_error:
            out["fused_error"] = self.fused_error
        return out


def build(spec: ProbeSpec, ctx: ProbeContext) -> Any:
    """The Llama workload of ``spec`` (room checked first; weights made on the device)."""
    check_room(spec, ctx)
    model = build_llama(spec.model, ctx.device, ctx.dtype, spec.weights_path)
    if spec.variant == "speculative":
        draft = build_llama(str(spec.draft_model), ctx.device, ctx.dtype)
        return SpeculativeLlama(spec, ctx, model, draft)
    if spec.variant == "eager":
        return EagerLlama(spec, ctx, model)
    return GraphLlama(spec, ctx, model)

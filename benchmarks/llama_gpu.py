#!/usr/bin/env python3
"""Seed 004's LLM on a real GPU: the llm probe's Llama variants side by side, their spread, cost, roofline.

    PYTHONUNBUFFERED=1 python3 benchmarks/llama_gpu.py "$OUT" --budget 480      # the points in order, in budget
    PYTHONUNBUFFERED=1 python3 benchmarks/llama_gpu.py "$OUT" --only 8b_graph_b1 8b_compiled_b1 --runs 3
    PYTHONUNBUFFERED=1 python3 benchmarks/llama_gpu.py "$OUT" --compile-cache /tmp/llama-cc   # warm compiles on a rerun
    PYTHONUNBUFFERED=1 python3 benchmarks/llama_gpu.py "$OUT" --cpu-smoke       # the same script, tiny presets, CPU

Read-only towards the card: it never changes power limits, clocks, persistence or compute mode.

Each point runs in its own probe child as ``gpuperfd probe`` runs it (the child-process executor, its
busy check and hard timeout), so one failure never loses the rest. The child is built once per point
and measured ``--runs`` times (a warm session, as a sweep measures its caps: the runs' range is the
spread of a built model; ``--fresh-children`` gives each run a child of its own, as before, at the
cost of a build each). The points come in the order that matters (``GPU_POINTS``): the 8B at batch 1
in each variant first (issue 53's target), then the 1B, the 8B at batch 32 and the speculative point;
a point that would overrun ``--budget`` is skipped (its cost estimated from the variant, then from its
own first run), and a point never runs past the budget.

Per point it prints and keeps: decode tokens/s, ms per token, TTFT, the share of the HBM roofline
(issue 53's, every parameter read once, and the bytes a step really reads), the run-to-run range,
J/token, the child's setup seconds (imports excluded: build, capture or compile) and the GPU seconds
of each run, the child's peak host RSS, and for the speculative point the draft round, the verify step
and tokens/s at the named acceptance rates. Every result is appended to ``results.jsonl``;
``summary.json`` and ``table.txt`` (the side-by-side table) are rewritten after each run.

Before the points: the static forward against ``LlamaForCausalLM.generate()`` on the GPU (tiny shape,
fp32, batch 1 and 2, CUDA graphs: greedy tokens must match). Right after the 8B batch-1 points, if the
budget leaves room (``--diagnose``): the 8B decode step's kernels per step and their time (the
profiler), to say where a step's time goes.

Targets (issue 53): 8B batch-1 decode >= 80 % of the HBM roofline on an H100 (>= 167 tokens/s), runs
within 2 % of each other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuperfd.console import format_table  # noqa: E402
from gpuperfd.probe_data.request import ProbeRequest  # noqa: E402
from gpuperfd.probe_data.result import ProbeResult  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec, default_timeout  # noqa: E402
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once  # noqa: E402

#: (name, spec fields, "runs" = --runs measurements, "once" = one), most important first: issue 53's
#: target is the 8B at batch 1, so each variant of it comes before anything else.
GPU_POINTS: list[tuple[str, dict[str, Any], str]] = [
    ("8b_fused_b1", {"preset": "llama-3.1-8b", "variant": "fused"}, "runs"),
    ("8b_graph_b1", {"preset": "llama-3.1-8b", "variant": "graph"}, "runs"),
    ("8b_compiled_b1", {"preset": "llama-3.1-8b", "variant": "compiled"}, "runs"),
    ("1b_fused_b1", {"preset": "llama-3.2-1b", "variant": "fused"}, "runs"),
    ("1b_graph_b1", {"preset": "llama-3.2-1b", "variant": "graph"}, "runs"),
    ("1b_compiled_b1", {"preset": "llama-3.2-1b", "variant": "compiled"}, "runs"),
    ("8b_graph_b32", {"preset": "llama-3.1-8b", "variant": "graph", "batch_size": 32}, "runs"),
    ("8b_spec_k12", {"preset": "llama-3.1-8b-spec", "acceptance_rates": (0.5, 0.6, 0.7, 0.8, 0.9)}, "once"),
    ("1b_graph_b32", {"preset": "llama-3.2-1b", "variant": "graph", "batch_size": 32}, "once"),
    ("8b_compiled_b32", {"preset": "llama-3.1-8b", "variant": "compiled", "batch_size": 32}, "once"),
    ("8b_eager_b1", {"preset": "llama-3.1-8b", "variant": "eager", "repeats": 2}, "once"),
]
#: Rough seconds a point's first run costs (child start, build, capture or compile, windows), for the
#: budget; a further run of a point costs what its last run did (its child is built already).
COST_SECONDS = {"graph": 25.0, "fused": 30.0, "compiled": 120.0, "eager": 45.0, "speculative": 40.0}
#: Seconds the 8B decode step's kernel profile (``--diagnose``) costs.
DIAGNOSE_SECONDS = 40.0


def cpu_points() -> list[tuple[str, dict[str, Any], str]]:
    """The same sequence with the tiny Llama presets on the CPU (a smoke test of this script)."""
    out = []
    for name, fields, runs in GPU_POINTS:
        fields = dict(fields, preset="llama-tiny-spec" if "spec" in name else "llama-tiny", device="cpu")
        fields.pop("measure_seconds", None)
        fields.pop("repeats", None)
        if fields.get("batch_size"):
            fields["batch_size"] = 4
        if fields.get("variant") == "compiled":
            continue  # a C++ toolchain compile on a small CPU takes longer than the smoke test
        out.append((name, fields, runs))
    return out


class PointRunner:
    """The runs of one point: one warm child built once and measured ``runs`` times (a sweep's session),
    or with ``fresh`` a child per run (``measure_once``, as ``gpuperfd probe`` runs it)."""

    def __init__(self, spec: ProbeSpec, device: Any, fresh: bool, cache_dir: str | None = None) -> None:
        os.environ.setdefault("GPUPERFD_PROBE_NICE", "0")
        self.spec, self.device, self.fresh = spec, device, fresh
        #: torch.compile's and Triton's caches kept here across children (None: every child compiles cold,
        #: as a daemon's first run does)
        self.cache_dir = cache_dir
        self.peaks: list[int] = []
        self.session: Any = None

    def run(self, timeout: float) -> tuple[ProbeResult, int | None, float]:
        """One run: (result, the child's peak host RSS so far, request-to-result seconds)."""
        executor = ChildProcessExecutor(timeout, compile_cache=self.cache_dir is not None, state_dir=self.cache_dir,
                                        idle_wait_seconds=10.0, on_peak=lambda _probe, peak: self.peaks.append(peak))
        request = ProbeRequest.from_spec(self.spec, timeout)
        t0 = time.perf_counter()
        if self.fresh:
            result = measure_once(executor, self.device, request, threading.Event())
        else:
            if self.session is None:
                self.session = executor.open(self.device, request, threading.Event())
            self.session.timeout_seconds = timeout  # this run's share of the budget
            started = time.time()
            result = self.session.measure(None)
            result.started_at = started
        seconds = time.perf_counter() - t0
        result.wall_seconds = seconds
        return result, self._rss(), seconds

    def _rss(self) -> int | None:
        if not self.peaks and self.session is not None and self.session.child is not None:
            try:  # the warm child is alive: its peak so far, from /proc
                with open(f"/proc/{self.session.child.pid}/status") as fh:
                    for line in fh:
                        if line.startswith("VmHWM:"):
                            return int(line.split()[1]) * 1024
            except (OSError, ValueError, AttributeError):
                return None
        return max(self.peaks) if self.peaks else None

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def figures(result: ProbeResult, rss: int | None, first_result: float) -> dict[str, Any]:
    """What the summary keeps of one run."""
    lat = result.latencies or {}
    thr = result.throughput or {}
    extra = result.extra or {}
    roof = extra.get("roofline") or {}
    spec = extra.get("speculative") or {}

    def mean(name: str) -> float | None:
        values = lat.get(name) or []
        return statistics.fmean(values) if values else None

    windows = [r.throughput.get("decode_tokens_per_second") for r in result.repeats or []]
    windows = [w for w in windows if w]
    out = {
        "status": result.status if result.ok else f"{result.status}:{result.failure_reason}",
        "error": result.error_message,
        "ttft_ms": (mean("ttft_seconds") or 0) * 1e3 or None,
        "tpot_ms": (mean("tpot_seconds") or 0) * 1e3 or None,
        "decode_tok_s": thr.get("decode_tokens_per_second"),
        "output_tok_s": thr.get("output_tokens_per_second"),
        "roofline_tok_s": roof.get("tokens_per_second"),
        "roofline_share": roof.get("share"),
        "issue_roofline_tok_s": roof.get("all_parameters_tokens_per_second"),
        "issue_roofline_share": roof.get("all_parameters_share"),
        "roofline_bytes_per_step": roof.get("bytes_per_step"),
        "j_per_token": result.energy_per_unit_joules,
        "avg_power_w": result.average_power_watts,
        "gpu_busy": result.gpu_busy_ratio,
        "window_cv": (statistics.pstdev(windows) / statistics.fmean(windows)) if len(windows) > 1 else None,
        "variant": result.variant,
        "child_peak_rss_mib": rss / 2**20 if rss else None,
        "gpu_seconds": result.wall_seconds,
        "first_result_seconds": first_result,
        # a warm session's first run carries the build (child_setup_seconds), its later runs none
        "setup_seconds": extra["child_setup_seconds"] if "child_setup_seconds" in extra else extra.get("setup_seconds"),
        "child_start_seconds": extra.get("child_start_seconds"),
        "compile_seconds": extra.get("compile_seconds"),
        "phase_seconds": extra.get("phase_seconds"),
        "peak_gpu_mib": result.peak_memory_bytes / 2**20 if result.peak_memory_bytes else None,
        "cuda_graph": extra.get("cuda_graph"), "torch_compile": extra.get("torch_compile"),
        "compile_error": extra.get("compile_error"), "cuda_graph_error": extra.get("cuda_graph_error"),
        "decode_sdpa_backend": extra.get("decode_sdpa_backend"), "step_forms": extra.get("step_forms"),
        "gpu_busy_method": extra.get("gpu_busy_method"), "busy_error": extra.get("busy_error"),
        "correctness": (result.correctness or {}).get("status"),
    }
    if spec:
        out["speculative"] = {key: spec.get(key) for key in (
            "speculative_tokens", "draft_round_seconds", "draft_step_seconds", "verify_seconds",
            "target_decode_step_seconds", "baseline_tokens_per_second", "at_rates", "curve",
            "break_even_acceptance_rate", "note")}
    return out


def spread(runs: list[dict[str, Any]], key: str = "decode_tok_s") -> dict[str, Any]:
    values = [r[key] for r in runs if r.get(key)]
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    return {"n": len(values), "mean": mean, "min": min(values), "max": max(values),
            "range_pct": (max(values) - min(values)) / mean * 100,
            "cv_pct": statistics.pstdev(values) / mean * 100 if len(values) > 1 else 0.0}


def environment(cpu: bool) -> dict[str, Any]:
    env: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from importlib import metadata

    for module in ("torch", "transformers", "triton"):  # from the installed metadata: no 5 s import each
        try:
            env[module] = metadata.version(module)
        except Exception as exc:  # noqa: BLE001
            env[module] = repr(exc)
    if not cpu:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = out.stdout.strip()
        except Exception as exc:  # noqa: BLE001
            env["nvidia_smi"] = repr(exc)
    try:
        env["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return env


MATCH_SCRIPT = r"""
import json, sys, torch
from gpuperfd.probe_child.workloads.models import build_llama
from gpuperfd.probe_child.workloads.llama.static import StaticLlama
device = torch.device(sys.argv[1])
torch.manual_seed(0)
model = build_llama("llama-tiny", device, torch.float32)
out = {}
# batch 1: the decode step's RoPE product and joint K/V cache; 2: the general form; "fused": the fused
# variant's Triton decode step (a CUDA card only)
for batch in (1, 2, "fused"):
    fused = batch == "fused"
    if fused and device.type != "cuda":
        continue
    prompts = torch.randint(0, 512, (1 if fused else batch, 32), device=device)
    with torch.inference_mode():
        ref = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=16,
                             min_new_tokens=16, do_sample=False, pad_token_id=0)[:, 32:]
        static = StaticLlama(model, prompts.shape[0], 32, 48, fused_decode=fused)
        if device.type == "cuda":
            static.capture()
        static.seq[:, :32].copy_(prompts)
        static.run_prefill()
        for _ in range(15):
            static.run_decode()
        ours = static.seq[:, 32:48]
    out[f"batch_{batch}"] = {"tokens_match": bool(torch.equal(ours.cpu(), ref.cpu())), "graphs": bool(static.graphs)}
out["tokens_match"] = all(v["tokens_match"] for v in out.values())
print(json.dumps(out))
"""


SIM_POINTS = {"8b_fused_b1": ("llama-3.1-8b", 1), "1b_fused_b1": ("llama-3.2-1b", 1),
              "8b_graph_b32": ("llama-3.1-8b", 32), "1b_graph_b32": ("llama-3.2-1b", 32)}


def simulator_comparison(summary: dict[str, Any]) -> dict[str, Any]:
    """The simulator's decode tokens/s for the same points on the same card model at its default cap,
    and its ratios (8B vs 1B, batch 32 vs 1) beside the measured ones (issue 53: within 15 %)."""
    try:
        from gpuperfd.device.simulated import GPU_MODELS, compute_operating_point
        from gpuperfd.probing.simulated.workload import simulated_workload

        name = str(summary["environment"].get("nvidia_smi", ""))
        card = "H200" if "H200" in name else "H100"
        gpu = GPU_MODELS[card]
        sim, real = {}, {}
        for point, (preset, batch) in SIM_POINTS.items():
            profile = simulated_workload("llm", preset, {"batch_size": batch}).profile
            sim[point] = compute_operating_point(gpu, profile, gpu.default_power_watts).units_per_second
            runs = (summary["points"].get(point) or {}).get("runs") or []
            # the simulated rate is the decode's (its time per output token is batch / rate)
            values = [r["decode_tok_s"] for r in runs if r.get("decode_tok_s")]
            if values:
                real[point] = statistics.fmean(values)
        out: dict[str, Any] = {"card": card, "simulated_decode_tok_s": sim, "measured_decode_tok_s": real,
                               "ratios": {}}
        # batch 1 in the presets' variant (fused), batch 32 in graph (what fused runs at batch > 1)
        for key, a, b in (("8b_vs_1b_b1", "8b_fused_b1", "1b_fused_b1"), ("8b_vs_1b_b32", "8b_graph_b32", "1b_graph_b32"),
                          ("8b_b32_vs_b1", "8b_graph_b32", "8b_fused_b1"), ("1b_b32_vs_b1", "1b_graph_b32", "1b_fused_b1")):
            entry: dict[str, Any] = {"simulated": sim[a] / sim[b]}
            if a in real and b in real:
                entry["measured"] = real[a] / real[b]
                entry["simulated_over_measured"] = entry["simulated"] / entry["measured"]
                entry["within_15pct"] = abs(entry["simulated_over_measured"] - 1) <= 0.15
            out["ratios"][key] = entry
        return out
    except Exception as exc:  # noqa: BLE001 - the measurements stand without it
        return {"error": repr(exc)}


DIAG_SCRIPT = r"""
import json, sys, torch
from gpuperfd.probe_child.workloads.models import build_llama
from gpuperfd.probe_child.workloads.llama.static import StaticLlama
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

def kernels(prof, steps):
    rows = []
    for k in prof.key_averages():
        if getattr(k, "device_type", None) != DeviceType.CUDA:
            continue
        us = getattr(k, "self_device_time_total", None) or getattr(k, "self_cuda_time_total", 0)
        rows.append((k.key[:90], k.count / steps, us / steps))
    rows.sort(key=lambda r: -r[2])
    # the weight reads (cuBLAS GEMV/GEMM, CUTLASS, split-K reductions) against everything else
    product = [r for r in rows if any(w in r[0].lower() for w in ("gemv", "gemm", "cutlass", "sm90", "splitk"))]
    return {"kernels_per_step": sum(r[1] for r in rows), "kernel_us_per_step": sum(r[2] for r in rows),
            "product_kernels_per_step": sum(r[1] for r in product),
            "product_us_per_step": sum(r[2] for r in product),
            "top": [{"name": n, "per_step": c, "us_per_step": u} for n, c, u in rows[:20]]}

def replay_ms(s, steps=100):
    for _ in range(10):
        s.run_decode()
    s.pos.fill_(128)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        s.run_decode()
    end.record(); end.synchronize()
    s.pos.fill_(128)
    return start.elapsed_time(end) / steps

def products(s):
    # Each weight matrix kind alone, batch 1, all 32 layers' matrices in turn (distinct memory: one
    # layer's o_proj, 33 MB, would sit in the 50 MB L2 if read twice), one graph: the bandwidth cuBLAS's
    # batch-1 product reaches on each shape, the ceiling of the step's weight reads.
    out = {}
    kinds = {"qkv": [l.qkv for l in s.layers], "o": [l.o for l in s.layers],
             "gate_up": [l.gate_up for l in s.layers], "down": [l.down for l in s.layers], "lm_head": [s.lm_head]}
    for kind, weights in kinds.items():
        try:
            xs = [torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights]
            ys = [torch.nn.functional.linear(x, w) for x, w in zip(xs, weights)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for x, w, y in zip(xs, weights, ys):
                    torch.matmul(x, w.t(), out=y)
            for _ in range(3):
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 20
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record(); end.synchronize()
            ms = start.elapsed_time(end) / reps
            nbytes = sum(w.numel() * w.element_size() for w in weights)
            out[kind] = {"shape": list(weights[0].shape), "count": len(weights), "ms_per_step": ms,
                         "tb_per_s": nbytes / (ms / 1e3) / 1e12}
        except Exception as exc:
            out[kind] = {"error": repr(exc)[-300:]}
    return out

out = {}
for name in sys.argv[1:]:
    entry = {}
    try:
        torch.manual_seed(0)
        model = build_llama(name, torch.device("cuda"), torch.bfloat16)
        with torch.inference_mode():
            s = StaticLlama(model, 1, 128, 256)
            entry["weight_bytes"] = s.weight_bytes()
            s.seq[:, :128].random_(0, model.config.vocab_size)
            s.prefill(); s.decode(); torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                s.decode(); torch.cuda.synchronize()
            entry["eager_step"] = kernels(p, 1)
            s.capture()
            s.run_prefill()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(10):
                s.run_decode()
            s.pos.fill_(128)
            start.record()
            for _ in range(100):
                s.run_decode()
            end.record(); end.synchronize()
            entry["graph_decode_ms"] = start.elapsed_time(end) / 100
            s.pos.fill_(128)
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(20):
                    s.run_decode()
                torch.cuda.synchronize()
            entry["graph_step"] = kernels(p, 20)
            entry["products"] = products(s)
            try:  # the same step with cuBLASLt's heuristics for its products (torch's other BLAS backend)
                torch.backends.cuda.preferred_blas_library("cublaslt")
                s.capture()
                s.run_prefill()
                entry["graph_decode_ms_cublaslt"] = replay_ms(s)
                entry["products_cublaslt"] = products(s)
            except Exception as exc:
                entry["cublaslt_error"] = repr(exc)[-500:]
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")
        del s, model
        torch.cuda.empty_cache()
    except Exception as exc:
        entry["error"] = repr(exc)[-1500:]
    out[name] = entry
print(json.dumps(out))
"""


def point_row(name: str, entry: dict[str, Any]) -> list[Any]:
    """One line of the side-by-side table: the point's mean over its ok runs."""
    runs = [r for r in entry.get("runs") or [] if r.get("decode_tok_s") or r.get("output_tok_s")]
    first = (entry.get("runs") or [{}])[0]
    s = entry.get("spread") or {}

    def mean(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    share = mean("issue_roofline_share")
    bytes_share = mean("roofline_share")
    gpu = [r.get("gpu_seconds") for r in entry.get("runs") or [] if r.get("gpu_seconds")]
    spec = first.get("speculative") or {}
    tok_s = s.get("mean") or mean("output_tok_s")
    status = entry.get("skipped") and "skipped" or first.get("status")
    return [name, entry.get("variant"), status, len(runs), tok_s, mean("tpot_ms"), mean("ttft_ms"),
            share * 100 if share else None, bytes_share * 100 if bytes_share else None, s.get("range_pct"),
            mean("j_per_token"), first.get("setup_seconds"), first.get("compile_seconds"),
            "/".join(f"{g:.0f}" for g in gpu) or None,
            spec.get("break_even_acceptance_rate") if spec else first.get("compile_error") and "compile failed"]


TABLE_HEADER = ["point", "variant", "status", "runs", "decode tok/s", "ms/token", "TTFT ms", "% issue roofline",
                "% bytes read", "range %", "J/token", "setup s", "capture/compile s", "GPU s per run", "note"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory for results.jsonl, summary.json, table.txt")
    parser.add_argument("--runs", type=int, default=3, help="measurements per main point (the run-to-run range)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; points that would overrun are skipped")
    parser.add_argument("--only", nargs="+", help="point names to run, in the order given (default: all)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny presets on the CPU (checks the script)")
    parser.add_argument("--measure-seconds", type=float, default=0.5,
                        help="window length of the GPU points (a window holds at least one request batch)")
    parser.add_argument("--fresh-children", action="store_true",
                        help="a new child (and build) for every run instead of one built child per point")
    parser.add_argument("--diagnose", action="store_true",
                        help="after the 8B batch-1 points, if the budget allows: the 8B decode step's kernels "
                             "(profiler, about 40 s)")
    parser.add_argument("--no-match", action="store_true", help="skip the static-vs-generate() check first")
    parser.add_argument("--compile-cache", metavar="DIR",
                        help="keep torch.compile's and Triton's caches in DIR across children and calls (default: "
                             "none, every compiled point compiles cold, as a daemon's first run does)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    cpu = args.cpu_smoke
    points = cpu_points() if cpu else GPU_POINTS
    if args.only:
        by_name = {p[0]: p for p in points}
        unknown = [n for n in args.only if n not in by_name]
        if unknown:
            parser.error(f"--only: unknown point(s) {', '.join(unknown)}; use {', '.join(by_name)}")
        points = [by_name[n] for n in args.only]
    summary: dict[str, Any] = {"environment": environment(cpu), "points": {}, "targets": {},
                               "runs_in": "fresh children" if args.fresh_children else "one built child per point",
                               "budget_seconds": args.budget}
    jsonl = os.path.join(args.out, "results.jsonl")

    def left() -> float:
        return args.budget - (time.monotonic() - start)

    def save() -> None:
        with open(os.path.join(args.out, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1, default=str)
        rows = [point_row(name, entry) for name, entry in summary["points"].items()]
        with open(os.path.join(args.out, "table.txt"), "w") as fh:
            fh.write(format_table(TABLE_HEADER, rows) + "\n\n" + json.dumps(summary["targets"], indent=1, default=str)
                     + "\n")

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not args.no_match:
        try:
            out = subprocess.run([sys.executable, "-c", MATCH_SCRIPT, "cpu" if cpu else "cuda"], capture_output=True,
                                 text=True, timeout=max(30.0, min(300.0, left())),
                                 env={**os.environ, "PYTHONPATH": root})
            summary["static_matches_hf"] = (out.stdout.strip().splitlines()[-1] if out.stdout.strip()
                                            else out.stderr[-2000:])
        except Exception as exc:  # noqa: BLE001
            summary["static_matches_hf"] = repr(exc)
        print(f"static forward vs generate(): {summary['static_matches_hf']} ({time.monotonic() - start:.0f} s)",
              flush=True)
        save()

    device = None
    if not cpu:
        try:
            from gpuperfd.device.nvml import NvmlBackend

            device = NvmlBackend().devices()[0]
        except Exception as exc:  # noqa: BLE001 - the points still run, without the idle check
            summary["nvml_error"] = repr(exc)
    def diagnose() -> None:
        """Where the 8B's batch-1 decode step's time goes: kernels per step and their time (profiler)."""
        if DIAGNOSE_SECONDS > left():
            summary["decode_step_diagnosis"] = f"budget: {left():.0f} s left"
        else:
            try:
                out = subprocess.run([sys.executable, "-c", DIAG_SCRIPT, "llama-3.1-8b"], capture_output=True,
                                     text=True, timeout=max(20.0, left()), env={**os.environ, "PYTHONPATH": root})
                lines = out.stdout.strip().splitlines()
                summary["decode_step_diagnosis"] = json.loads(lines[-1]) if lines else out.stderr[-3000:]
            except Exception as exc:  # noqa: BLE001
                summary["decode_step_diagnosis"] = repr(exc)
        print("decode step:", json.dumps(summary["decode_step_diagnosis"], default=str)[:3000], flush=True)
        save()

    pending_diagnosis = args.diagnose and not cpu
    for name, fields, runs in points:
        if pending_diagnosis and not (name.startswith("8b_") and name.endswith("_b1")):
            pending_diagnosis = False  # right after the 8B batch-1 points: the step issue 53's target is about
            diagnose()
        try:
            spec = ProbeSpec("llm", **({"measure_seconds": args.measure_seconds} if not cpu else {}), **fields)
        except ValueError as exc:
            summary["points"][name] = {"error": str(exc)}
            save()
            continue
        n = args.runs if runs == "runs" else 1
        cost = COST_SECONDS.get(spec.variant, 40.0) * (0.2 if cpu else 1.0)
        entry: dict[str, Any] = {"spec": spec.params(), "variant": spec.variant, "runs": []}
        summary["points"][name] = entry
        runner = PointRunner(spec, device, args.fresh_children, args.compile_cache)
        try:
            for index in range(n):
                if cost > left():
                    entry.setdefault("skipped", f"budget: {args.budget:.0f} s would be exceeded (about {cost:.0f} s "
                                                f"needed, {left():.0f} s left)")
                    break
                try:
                    timeout = max(30.0, min(default_timeout(spec) + 60, left()))  # never past the budget
                    result, rss, first = runner.run(timeout)
                    with open(jsonl, "a") as fh:
                        fh.write(json.dumps({"point": name, "run": index, "rss": rss, "result": result.to_dict()},
                                            default=str) + "\n")
                    row = figures(result, rss, first)
                    cost = first if args.fresh_children or index else max(first - (row.get("setup_seconds") or 0)
                                                                          - (row.get("child_start_seconds") or 0), 1.0)
                except Exception as exc:  # noqa: BLE001 - one failure never loses the rest
                    row = {"status": "harness_error", "error": "".join(traceback.format_exception(exc))[-3000:]}
                entry["runs"].append(row)
                entry["spread"] = spread(entry["runs"])
                share = row.get("issue_roofline_share")
                tok_s = row.get("decode_tok_s") or row.get("output_tok_s")
                print(f"{name} run {index + 1}/{n}: {row.get('status')} decode {_num(tok_s)} tok/s"
                      f" ({_num(row.get('tpot_ms'), 3)} ms/token, {_num(share and share * 100)} % of the roofline),"
                      f" setup {_num(row.get('setup_seconds'))} s, GPU {_num(row.get('gpu_seconds'))} s,"
                      f" {left():.0f} s of budget left {row.get('compile_error') or row.get('error') or ''}",
                      flush=True)
                save()
                if not str(row.get("status", "")).startswith("ok"):
                    break  # a failed point does not fail again n times
        finally:
            runner.close()
    if pending_diagnosis:
        diagnose()
    # the issue's targets, where measured
    pts = summary["points"]
    for name in ("8b_fused_b1", "8b_graph_b1", "8b_compiled_b1"):
        s = (pts.get(name) or {}).get("spread") or {}
        first = ((pts.get(name) or {}).get("runs") or [{}])[0]
        if s.get("n"):
            issue_bound = first.get("issue_roofline_tok_s")
            summary["targets"][name] = {
                "decode_tok_s": s["mean"], "share_of_bytes_read": first.get("roofline_share"),
                # issue 53's criterion: every parameter read once a token (16.06 GB; 208.6 tok/s on an H100)
                "share_of_issue_roofline": s["mean"] / issue_bound if issue_bound else None,
                "ge_80pct_of_issue_roofline": bool(issue_bound and s["mean"] >= 0.8 * issue_bound),
                "range_pct": s["range_pct"], "within_2pct": s["range_pct"] <= 2.0}
    ratio = {}
    for a, b, key in (("8b_graph_b1", "1b_graph_b1", "8b_vs_1b_b1"), ("8b_graph_b32", "1b_graph_b32", "8b_vs_1b_b32"),
                      ("8b_graph_b32", "8b_graph_b1", "8b_b32_vs_b1"), ("1b_graph_b32", "1b_graph_b1", "1b_b32_vs_b1"),
                      ("8b_compiled_b1", "8b_graph_b1", "8b_compiled_vs_graph_b1"),
                      ("8b_fused_b1", "8b_graph_b1", "8b_fused_vs_graph_b1"),
                      ("1b_fused_b1", "1b_graph_b1", "1b_fused_vs_graph_b1"),
                      ("1b_compiled_b1", "1b_graph_b1", "1b_compiled_vs_graph_b1")):
        sa = ((pts.get(a) or {}).get("spread") or {}).get("mean")
        sb = ((pts.get(b) or {}).get("spread") or {}).get("mean")
        if sa and sb:
            ratio[key] = sa / sb
    summary["targets"]["decode_ratios"] = ratio
    summary["simulator"] = simulator_comparison(summary)
    summary["elapsed_seconds"] = time.monotonic() - start
    save()
    print(open(os.path.join(args.out, "table.txt")).read(), flush=True)
    return 0


def _num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())

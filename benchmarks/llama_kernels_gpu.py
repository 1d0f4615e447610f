#!/usr/bin/env python3
"""The ``fused`` variant's kernels on a real GPU: each product's tile swept, beside cuBLAS; the fused step.

    PYTHONUNBUFFERED=1 python3 benchmarks/llama_kernels_gpu.py "$OUT" [--models llama-3.1-8b llama-3.2-1b]

Read-only towards the card. For each model (random weights on the card, bf16) it prints and writes to
``$OUT/kernels.json``:

* ``products``: every weight shape of a decode step (Q/K/V with the norm, O with the residual, gate/up
  with norm and SwiGLU, down with the residual, the LM head with the norm), all layers' matrices in turn
  in one CUDA graph (distinct memory: nothing served from L2), in TB/s: cuBLAS's plain product and each
  tile of ``--configs`` (the defaults first); the best tile per shape;
* ``step``: the decode step in a graph (ms, tokens/s, share of the card's datasheet bound), ``graph``'s
  and ``fused``'s side by side, and the fused step's kernels by time (the profiler);
* ``agreement``: the fused decode against ``graph``'s over 32 greedy steps from the same prompt (tokens
  equal, the largest logit difference).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from gpuperfd.device.roofline import hbm_bandwidth  # noqa: E402
from gpuperfd.probe_child.workloads.llama.kernels import GemvConfig, gemv, gemv_config  # noqa: E402
from gpuperfd.probe_child.workloads.llama.static import StaticLlama  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_llama  # noqa: E402

#: ``--tiles deep``: more bytes in flight a program (longer steps, more stages, more warps) and thinner row
#: blocks, for a card whose HBM outruns the H100's (the H200's 4.8 TB/s).
DEEP = [GemvConfig(n, k, w, s) for n, k, w, s in (
    (2, 512, 4, 3), (2, 1024, 8, 3), (2, 2048, 8, 3), (4, 512, 4, 4), (4, 512, 4, 5), (4, 512, 8, 4),
    (4, 1024, 4, 3), (4, 1024, 8, 3), (4, 1024, 8, 4), (4, 2048, 8, 3), (4, 256, 4, 5), (8, 256, 4, 4),
    (8, 512, 4, 4), (8, 512, 8, 4), (8, 1024, 8, 4), (16, 512, 8, 4))]
CONFIGS = [*(GemvConfig(n, k, w, 3) for n, k, w in itertools.product((4, 8, 16), (256, 512), (4, 8))),
           GemvConfig(8, 1024, 8, 3), GemvConfig(16, 1024, 8, 3), GemvConfig(8, 512, 4, 2), GemvConfig(8, 512, 4, 5)]


def timed_graph(body: Any, reps: int = 20) -> float:
    """Milliseconds of one replay of ``body`` captured in a graph (after warm-up)."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(3):
        graph.replay()
    return event_ms(graph.replay, reps)


def event_ms(step: Any, reps: int) -> float:
    """Milliseconds of one ``step()`` on the card, the mean of ``reps`` timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def product_kinds(s: StaticLlama) -> dict[str, tuple[list[torch.Tensor], dict[str, Any]]]:
    return {"qkv": ([l.qkv for l in s.layers], {"norm": True}), "o": ([l.o for l in s.layers], {"residual": True}),
            "gate_up": ([l.gate_up for l in s.layers], {"norm": True, "swiglu": True}),
            "down": ([l.down for l in s.layers], {"residual": True}), "lm_head": ([s.lm_head], {"norm": True})}


def sweep_products(s: StaticLlama, configs: list[GemvConfig]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, (weights, mode) in product_kinds(s).items():
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        rows = weights[0].shape[0] // (2 if mode.get("swiglu") else 1)
        xs = [torch.randn(w.shape[1], dtype=w.dtype, device=w.device) for w in weights]
        ys = [torch.empty(rows, dtype=w.dtype, device=w.device) for w in weights]
        gamma = torch.ones(weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device)
        entry: dict[str, Any] = {"shape": list(weights[0].shape), "count": len(weights), "default": None, "tiles": []}

        def cublas() -> None:
            for x, w in zip(xs, weights):
                torch.matmul(x.view(1, -1), w.t())

        ms = timed_graph(cublas)
        entry["cublas_tb_s"] = nbytes / ms / 1e9
        default = gemv_config(rows, weights[0].shape[1], hbm_bandwidth(torch.cuda.get_device_name()))
        for cfg in [default, *[c for c in configs if c != default]]:
            def ours(cfg: GemvConfig = cfg) -> None:
                for x, w, y in zip(xs, weights, ys):
                    gemv(w, x, y, norm=gamma if mode.get("norm") else None, residual=y if mode.get("residual") else None,
                         swiglu=bool(mode.get("swiglu")), config=cfg)
            try:
                tb = nbytes / timed_graph(ours) / 1e9
                row = {"config": cfg.__dict__, "tb_s": tb}
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit
                row = {"config": cfg.__dict__, "error": repr(exc)[-300:]}
            entry["tiles"].append(row)
            if cfg == default:
                entry["default"] = row
        ok = [t for t in entry["tiles"] if "tb_s" in t]
        entry["best"] = max(ok, key=lambda t: t["tb_s"]) if ok else None
        out[kind] = entry
        print(f"  {kind} {entry['shape']}: cuBLAS {entry['cublas_tb_s']:.2f} TB/s, default "
              f"{(entry['default'] or {}).get('tb_s', 0):.2f}, best {entry['best']}", flush=True)
    return out


def decode_ms(s: StaticLlama, pos: int, steps: int = 100) -> float:
    for _ in range(5):
        s.run_decode()
    s.pos.fill_(pos)
    ms = event_ms(s.run_decode, steps)
    s.pos.fill_(pos)
    return ms


def profile_step(s: StaticLlama, steps: int = 10) -> list[dict[str, Any]]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            s.run_decode()
        torch.cuda.synchronize()
    rows = []
    for k in prof.key_averages():
        if getattr(k, "device_type", None) != DeviceType.CUDA:
            continue
        us = getattr(k, "self_device_time_total", None) or getattr(k, "self_cuda_time_total", 0)
        rows.append({"name": k.key[:80], "per_step": k.count / steps, "us_per_step": us / steps})
    return sorted(rows, key=lambda r: -r["us_per_step"])[:15]


def model_entry(name: str, configs: list[GemvConfig], prompt: int = 128, context: int = 256) -> dict[str, Any]:
    torch.manual_seed(0)
    model = build_llama(name, torch.device("cuda"), torch.bfloat16)
    entry: dict[str, Any] = {}
    bandwidth = hbm_bandwidth(torch.cuda.get_device_name())
    with torch.inference_mode():
        graph = StaticLlama(model, 1, prompt, context)
        fused = StaticLlama(model, 1, prompt, context, fused_decode=True)
        entry["weight_bytes"] = graph.weight_bytes()
        prompts = torch.randint(0, model.config.vocab_size, (1, prompt), device="cuda")
        for s in (graph, fused):
            s.seq[:, :prompt].copy_(prompts)
            s.capture()
            s.run_prefill()
        agree_steps, tokens_equal, worst = 32, 0, 0.0
        for _ in range(agree_steps):
            graph.run_decode()
            fused.run_decode()
            worst = max(worst, (graph.last_logits().float() - fused.last_logits().float()).abs().max().item())
            tokens_equal += int(torch.equal(graph.seq, fused.seq))
            fused.seq.copy_(graph.seq)  # the same next input for both
        entry["agreement"] = {"steps": agree_steps, "steps_tokens_equal": tokens_equal, "max_logit_diff": worst}
        print(f"  agreement: {entry['agreement']}", flush=True)
        for label, s in (("graph", graph), ("fused", fused)):
            s.run_prefill()
            ms = decode_ms(s, prompt + 1)
            bound = bandwidth / entry["weight_bytes"] if bandwidth else None
            entry[f"{label}_step"] = {"ms": ms, "tok_s": 1e3 / ms, "share_of_bytes_read": (1e3 / ms / bound) if bound else None}
            print(f"  {label} step: {ms:.3f} ms, {1e3 / ms:.1f} tok/s, share {entry[f'{label}_step']['share_of_bytes_read']}",
                  flush=True)
        entry["fused_kernels"] = profile_step(fused)
        entry["products"] = sweep_products(fused, configs)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "llama-3.2-1b"])
    parser.add_argument("--quick", action="store_true", help="the default tiles only (no sweep)")
    parser.add_argument("--tiles", choices=("h100", "deep"), default="h100",
                        help="the tiles to sweep: the H100 sweep's set, or deeper ones for a faster HBM")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d")}
    import triton

    result["triton"] = triton.__version__
    for name in args.models:
        print(name, flush=True)
        t0 = time.monotonic()
        try:
            result[name] = model_entry(name, [] if args.quick else DEEP if args.tiles == "deep" else CONFIGS)
        except Exception as exc:  # noqa: BLE001 - the next model still runs
            import traceback

            result[name] = {"error": traceback.format_exc()[-3000:]}
            print(result[name]["error"], flush=True)
        result[name]["seconds"] = time.monotonic() - t0
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "kernels.json"), "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

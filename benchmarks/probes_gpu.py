#!/usr/bin/env python3
"""Run every default probe on a real GPU, in one go, and check the issue's targets.

    PYTHONUNBUFFERED=1 python3 benchmarks/probes_gpu.py --out "$OUT"

Read-only towards the card: it never changes power limits, clocks, persistence
or compute mode. What it does, in order:

1. In a child process: the card's bf16 matmul ceiling (8192^3, random data,
   median of 20 timed products) and a correctness check of the static-cache
   GPT-2 decode against Hugging Face (fp32 greedy tokens must match).
2. The probe points, each a one-shot session (``measure_once``) with the NVML idle check and
   process watch: GPT-2 124M decode at batch 1 (graph, then eager generate()
   in the same run), every default probe, then optional extras while the time
   budget lasts (GQA attention, more batch sizes, forced CUDA error and OOM).
3. A table of the figures and the targets: GPU-busy >= 0.9, CV <= 1 %, a
   measured point <= 10 s, graph decode >= 5x eager at batch 1, ViT-B/16 bf16
   b128 >= 50 % of the matmul rate.

Writes ``results.jsonl`` (every ProbeResult in full), ``summary.json`` (table
rows, environment, targets) and ``table.txt`` under ``--out``, after each point,
so a run cut short still leaves what it measured. ``--cpu-smoke`` runs the same
script on the CPU with tiny presets (to check the script before a GPU call).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuperfd.console import format_table  # noqa: E402
from gpuperfd.probe_data.result import PRIMARY_METRIC, ProbeResult, summarize  # noqa: E402
from gpuperfd.probe_data.request import ProbeRequest  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec, default_timeout  # noqa: E402
from gpuperfd.probing.executors import ChildProcessExecutor, measure_once  # noqa: E402


def run_point(spec: ProbeSpec, timeout: float, device: Any) -> ProbeResult:
    """One point in a child, as ``gpuperfd probe`` runs it (``device`` None: no idle check, no watch)."""
    import threading

    os.environ.setdefault("GPUPERFD_PROBE_NICE", "0")  # nothing to yield to: measured at normal priority
    executor = ChildProcessExecutor(timeout, compile_cache=False, idle_wait_seconds=10.0)
    return measure_once(executor, device, ProbeRequest.from_spec(spec, timeout), threading.Event())

MAIN_LATENCY = {"llm": "tpot_seconds", "vit": "batch_seconds", "attention": "batch_seconds", "train": "step_seconds"}

# (name, spec fields, essential, rough cost in seconds for the budget check)
GPU_POINTS: list[tuple[str, dict[str, Any], bool, float]] = [
    ("llm_graph_b1", {"probe": "llm", "preset": "gpt2", "variant": "graph", "batch_size": 1}, True, 25),
    ("llm_eager_b1", {"probe": "llm", "preset": "gpt2", "variant": "eager", "batch_size": 1}, True, 30),
    ("llm_graph_default", {"probe": "llm", "preset": "gpt2"}, True, 25),
    ("attention_default", {"probe": "attention", "preset": "default"}, True, 20),
    ("train_default", {"probe": "train", "preset": "gpt2"}, True, 30),
    ("vit_eager_b128", {"probe": "vit", "preset": "vit-b16", "variant": "eager"}, True, 25),
    ("vit_compiled_default", {"probe": "vit", "preset": "vit-b16"}, True, 60),
    ("vit_fused_b128", {"probe": "vit", "preset": "vit-b16", "variant": "fused"}, False, 25),
    ("fault_cuda_error", {"probe": "llm", "preset": "tiny", "device": "cuda", "inject_fault": "cuda_error"}, False, 15),
    ("fault_oom", {"probe": "llm", "preset": "tiny", "device": "cuda", "inject_fault": "oom",
                   "memory_limit_bytes": 1 << 30}, False, 15),
    ("attention_gqa_g4", {"probe": "attention", "preset": "gqa"}, False, 20),
    ("vit_compiled_b1", {"probe": "vit", "preset": "vit-b16", "batch_size": 1}, False, 35),
    ("llm_graph_b512", {"probe": "llm", "preset": "gpt2", "batch_size": 512}, False, 30),
    ("llm_eager_default", {"probe": "llm", "preset": "gpt2", "variant": "eager"}, False, 40),
    ("attention_gqa_g8", {"probe": "attention", "preset": "gqa", "n_groups": 8}, False, 20),
    ("vit_eager_b1", {"probe": "vit", "preset": "vit-b16", "variant": "eager", "batch_size": 1}, False, 25),
    ("llm_graph_b32", {"probe": "llm", "preset": "gpt2", "batch_size": 32}, False, 25),
]


def _cpu_points() -> list[tuple[str, dict[str, Any], bool, float]]:
    """The same sequence on the CPU with tiny presets (smoke test of this script)."""
    out = []
    for name, fields, essential, cost in GPU_POINTS:
        fields = dict(fields, preset="tiny", device="cpu")
        if fields["probe"] == "vit" and fields.get("variant") is None:
            fields["variant"] = "fused"  # compiling on a small CPU takes longer than the smoke test
        if fields["probe"] != "llm":
            fields.pop("batch_size", None)
        if fields.get("n_groups"):
            fields["n_groups"] = 2
        if fields.get("inject_fault") == "oom":
            fields["memory_limit_bytes"] = 256 << 20
        out.append((name, fields, essential, 5.0))
    return out


# --- reference measurements (child process: the parent stays off the GPU) --------------


def _reference(queue: Any, cpu: bool) -> None:
    out: dict[str, Any] = {}
    try:
        import torch

        from gpuperfd.probe_child.workloads.gpt2_static import StaticGPT2
        from gpuperfd.probe_child.workloads.models import build_gpt2

        device = torch.device("cpu" if cpu else "cuda")
        out["torch"] = torch.__version__
        if not cpu:
            out["gpu"] = torch.cuda.get_device_name(0)
            n = 8192
            a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
            for _ in range(5):
                a @ b
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                a @ b
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            times.sort()
            out["matmul_bf16_8192_tflops"] = 2 * n**3 / times[len(times) // 2] / 1e12
            del a, b
        # Static-cache decode == Hugging Face greedy decode (fp32, so ties are not an issue).
        spec = ProbeSpec("llm", preset="tiny" if cpu else "gpt2", device=str(device), dtype="float32")
        torch.manual_seed(0)
        model = build_gpt2(spec, device, torch.float32)
        prompts = torch.randint(0, model.config.vocab_size, (2, 32), device=device)
        static = StaticGPT2(model, 2, 32, 16)
        with torch.inference_mode():
            if not cpu:
                static.capture()
            ours = static.generate(prompts)
            ref = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=16,
                                 min_new_tokens=16, do_sample=False, pad_token_id=0)[:, 32:]
        out["static_decode_matches_hf_fp32"] = bool(torch.equal(ours, ref))
        out["static_decode_cuda_graph"] = bool(static.graphs)
    except Exception as exc:  # noqa: BLE001 - report, do not stop the benchmark
        out["error"] = f"{type(exc).__name__}: {exc}"
    queue.put(out)


def reference(cpu: bool, timeout: float = 180.0) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_reference, args=(queue, cpu))
    proc.start()
    try:
        return queue.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"reference step failed: {exc}"}
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


# --- ViT diagnosis (why is torch.compile slower?) -------------------------------------


def _vit_diag(queue: Any, batch: int, max_seconds: float) -> None:
    out: dict[str, Any] = {}
    try:
        import torch

        from gpuperfd.probe_child.workloads.models import build_vit
        from gpuperfd.probe_child.workloads.vit_fused import FusedViT

        t_start = time.monotonic()
        dev = torch.device("cuda")
        spec = ProbeSpec("vit", preset="vit-b16", batch_size=batch)
        model = build_vit(spec, dev, torch.bfloat16)
        x = torch.randn(batch, 3, 224, 224, device=dev, dtype=torch.bfloat16)
        fused = FusedViT(model)
        candidates = [
            ("hf_eager", lambda: model(pixel_values=x).logits, False),
            ("fused_eager", lambda: fused(x), False),
            ("fused_compiled", torch.compile(fused.__call__), True),
            ("hf_compiled", torch.compile(model), True),
        ]
        for name, fn, compiled in candidates:
            if time.monotonic() - t_start > max_seconds:
                out[name] = "skipped: time"
                continue
            call = (lambda fn=fn: fn(pixel_values=x).logits) if name == "hf_compiled" else (
                lambda fn=fn: fn(x) if compiled else fn())
            res: dict[str, Any] = {}
            with torch.inference_mode():
                t = time.monotonic()
                for _ in range(3):
                    ref = call()
                torch.cuda.synchronize()
                res["warm_s"] = time.monotonic() - t
                times = []
                for _ in range(20):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(); call(); b.record(); b.synchronize()
                    times.append(a.elapsed_time(b))
                times.sort()
                res["ms_median"] = times[10]
                # CUDA graph of the same call
                try:
                    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for _ in range(2):
                            call()
                    torch.cuda.current_stream().wait_stream(s)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        call()
                    gt = []
                    for _ in range(20):
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record(); g.replay(); b.record(); b.synchronize()
                        gt.append(a.elapsed_time(b))
                    gt.sort()
                    res["graph_ms_median"] = gt[10]
                    del g
                except Exception as exc:  # noqa: BLE001
                    res["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(2):
                        call()
                    torch.cuda.synchronize()
                try:
                    res["kernels"] = prof.key_averages().table(sort_by="self_device_time_total", row_limit=14,
                                                               max_name_column_width=70)
                except Exception:  # noqa: BLE001 - older torch spells it "cuda"
                    res["kernels"] = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14,
                                                               max_name_column_width=70)
            res["tflops_graph"] = (2 * 0 + batch * 35.15e9) / (res.get("graph_ms_median") or res["ms_median"]) / 1e9
            out[name] = res
            print(f"vit diag {name}: warm {res['warm_s']:.1f}s {res['ms_median']:.2f} ms, "
                  f"graph {res.get('graph_ms_median')} ms", flush=True)
        try:
            import torch._dynamo.utils as dutils

            out["graph_breaks"] = {k: dict(v) for k, v in dutils.counters.items() if "break" in k}
        except Exception:  # noqa: BLE001
            pass
    except Exception:  # noqa: BLE001
        import traceback

        out["error"] = traceback.format_exc()[-2000:]
    queue.put(out)


def vit_diagnose(out_dir: str, batch: int = 128, max_seconds: float = 240.0) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_vit_diag, args=(queue, batch, max_seconds))
    proc.start()
    try:
        res = queue.get(timeout=max_seconds + 180)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    with open(os.path.join(out_dir, "vit_diag.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    for name, r in res.items():
        if isinstance(r, dict) and "kernels" in r:
            print(f"=== {name}: {r.get('ms_median'):.2f} ms eager-launch, graph {r.get('graph_ms_median')} ms")
            print(r["kernels"])
        else:
            print(name, r)


# --- environment ------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                           "host": platform.node(), "python": platform.python_version(),
                           "cpus": os.cpu_count()}
    try:
        query = "name,driver_version,power.limit,power.default_limit,clocks.max.sm,clocks.max.memory,memory.total"
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        env["nvidia_smi"] = f"unavailable: {exc}"
    for name in ("torch", "transformers"):
        try:
            out = subprocess.run([sys.executable, "-c", f"import {name}; print({name}.__version__)"],
                                 capture_output=True, text=True, timeout=60)
            env[name] = out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env[name] = None
    return env


def open_device() -> Any:
    try:
        from gpuperfd.device.nvml import NvmlBackend

        devices = NvmlBackend(indices=None).devices()
        return devices[0] if devices else None
    except Exception as exc:  # noqa: BLE001
        print(f"NVML unavailable in the parent: {exc}", flush=True)
        return None


# --- figures ----------------------------------------------------------------------------


def row_for(name: str, result: ProbeResult, matmul_tflops: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"point": name, "status": result.status, "reason": result.failure_reason,
                           "wall_s": result.wall_seconds}
    if not result.ok:
        row["error"] = (result.error_message or "").splitlines()[0][:200] if result.error_message else None
        return row
    summary = summarize(result)
    metric = PRIMARY_METRIC[result.probe]
    stats = summary["throughput"].get(metric) or {}
    row.update({
        "metric": metric,
        "mean": stats.get("mean"),
        "cv_pct": stats["cv"] * 100 if stats.get("cv") is not None else None,
        "j_per_unit": result.energy_per_unit_joules,
        "unit": result.work_unit,
        "power_w": result.average_power_watts,
        "busy": result.gpu_busy_ratio,
        "busy_method": result.extra.get("gpu_busy_method"),
        "nvml_util": result.gpu_utilization_mean_ratio,
        "window_s": result.measured_seconds / len(result.repeats) if result.repeats else None,
        "repeats": len(result.repeats),
        "peak_mem_gb": result.peak_memory_bytes / 1e9 if result.peak_memory_bytes else None,
        "sm_mhz": result.sm_clock_hertz_mean / 1e6 if result.sm_clock_hertz_mean else None,
        "clock_events": ",".join(result.clock_events_seen),
        "temp_max_c": result.temperature_celsius_max,
        "cuda_graph": result.extra.get("cuda_graph"),
    })
    lat = summary["latencies"].get(MAIN_LATENCY[result.probe])
    if lat:
        row.update({"lat": MAIN_LATENCY[result.probe], "p50_ms": lat["p50"] * 1e3, "p95_ms": lat["p95"] * 1e3,
                    "p99_ms": lat["p99"] * 1e3})
    if result.probe == "llm":
        ttft = summary["latencies"].get("ttft_seconds")
        if ttft:
            row["ttft_p50_ms"] = ttft["p50"] * 1e3
        row["prompt_tok_s"] = result.throughput.get("prompt_tokens_per_second")
        row["requests_s"] = result.throughput.get("requests_per_second")
    flops = result.throughput.get("model_flops_per_second") or result.throughput.get("flops_per_second")
    if flops:
        row["tflops"] = flops / 1e12
        if matmul_tflops:
            row["pct_matmul"] = 100 * flops / 1e12 / matmul_tflops
    if "loss" in result.extra:
        row["loss"] = result.extra.get("loss")
    for key in ("sdpa_backend", "decode_sdpa_backend", "cuda_graph_error", "busy_error", "telemetry_error"):
        if result.extra.get(key):
            row[key] = result.extra[key]
    return row


def targets(rows: dict[str, dict[str, Any]], essential: list[str]) -> list[dict[str, Any]]:
    out = []

    def add(name: str, value: Any, goal: str, met: bool | None) -> None:
        out.append({"target": name, "value": value, "goal": goal, "met": met})

    for point in essential:
        r = rows.get(point)
        if not r or r.get("status") != "ok":
            add(f"{point} ran", r.get("status") if r else "not run", "ok", False)
            continue
        if point == "llm_eager_b1":
            continue  # the comparison variant has no busy/CV target
        add(f"{point} GPU-busy", r.get("busy"), ">= 0.9", r.get("busy") is not None and r["busy"] >= 0.9)
        add(f"{point} CV", r.get("cv_pct"), "<= 1 %", r.get("cv_pct") is not None and r["cv_pct"] <= 1.0)
        add(f"{point} window", r.get("window_s"), "<= 10 s", r.get("window_s") is not None and r["window_s"] <= 10)
    g, e = rows.get("llm_graph_b1", {}), rows.get("llm_eager_b1", {})
    if g.get("mean") and e.get("mean"):
        ratio = g["mean"] / e["mean"]
        add("GPT-2 b1 graph / eager generate()", ratio, ">= 5x", ratio >= 5)
    v = rows.get("vit_compiled_default", {})
    if v.get("pct_matmul") is not None:
        add("ViT-B/16 bf16 b128 % of matmul", v["pct_matmul"], ">= 50 %", v["pct_matmul"] >= 50)
    ve = rows.get("vit_eager_b128", {})
    if ve.get("pct_matmul") is not None:
        add("(eager ViT-B/16 b128 % of matmul)", ve["pct_matmul"], "info", None)
    return out


TABLE_COLUMNS = [("point", "point"), ("status", "status"), ("mean", "rate"), ("metric", "metric"), ("cv_pct", "CV%"),
                 ("j_per_unit", "J/unit"), ("power_w", "W"), ("busy", "busy"), ("nvml_util", "nvml"),
                 ("p50_ms", "p50ms"), ("p95_ms", "p95ms"), ("p99_ms", "p99ms"), ("tflops", "TFLOP/s"),
                 ("window_s", "win s"), ("wall_s", "wall s")]


def render(rows: list[dict[str, Any]], tgt: list[dict[str, Any]], ref: dict[str, Any]) -> str:
    table = format_table([h for _, h in TABLE_COLUMNS],
                         [[r.get(k) if k != "metric" else (r.get(k) or "").replace("_per_second", "/s")
                           for k, _ in TABLE_COLUMNS] for r in rows])
    lines = [table, ""]
    lines.append(f"reference: {json.dumps(ref)}")
    lines.append(format_table(["target", "value", "goal", "met"],
                              [[t["target"], t["value"], t["goal"], t["met"]] for t in tgt]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "probes_gpu_out"))
    parser.add_argument("--budget-seconds", type=float, default=540.0,
                        help="skip optional points once this much time has passed")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny presets on the CPU")
    parser.add_argument("--only", nargs="*", help="run only these point names")
    parser.add_argument("--vit-diagnose", action="store_true",
                        help="time and profile ViT candidates (HF eager/compiled, fused eager/compiled) and exit")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.vit_diagnose:
        vit_diagnose(args.out)
        return 0
    t0 = time.monotonic()
    points = _cpu_points() if args.cpu_smoke else GPU_POINTS
    if args.only:
        points = [p for p in points if p[0] in args.only]

    env = environment()
    print(f"environment: {json.dumps(env)}", flush=True)
    ref = reference(cpu=args.cpu_smoke)
    print(f"reference: {json.dumps(ref)}", flush=True)
    matmul = ref.get("matmul_bf16_8192_tflops")
    device = None if args.cpu_smoke else open_device()

    rows: dict[str, dict[str, Any]] = {}
    results_path = os.path.join(args.out, "results.jsonl")
    open(results_path, "w").close()
    essential = [name for name, _, ess, _ in points if ess]
    for name, fields, is_essential, cost in points:
        elapsed = time.monotonic() - t0
        if not is_essential and elapsed + cost > args.budget_seconds:
            print(f"[{elapsed:6.1f}s] skip {name}: budget", flush=True)
            rows[name] = {"point": name, "status": "skipped"}
            continue
        spec = ProbeSpec(**fields)
        timeout = min(default_timeout(spec), 300.0 if spec.variant != "compiled" else 420.0)
        print(f"[{elapsed:6.1f}s] run {name}: {spec.params()} variant={spec.variant}", flush=True)
        result = run_point(spec, timeout, device)
        if result.failure_reason == "gpu_busy":
            # Say so, then measure anyway without the check: one lease, no second chance.
            print(f"  idle check refused {name}: {result.error_message}; retrying without it", flush=True)
            result = run_point(spec, timeout, None)
            result.extra["idle_check_refused"] = True
        with open(results_path, "a") as fh:
            fh.write(json.dumps({"point": name, **result.to_dict()}) + "\n")
        rows[name] = row_for(name, result, matmul)
        brief = {k: rows[name].get(k) for k in ("status", "reason", "mean", "cv_pct", "busy", "j_per_unit",
                                                 "wall_s", "error", "cuda_graph_error")}
        print(f"[{time.monotonic() - t0:6.1f}s] done {name}: {json.dumps(brief, default=str)}", flush=True)
        tgt = targets(rows, essential)
        with open(os.path.join(args.out, "summary.json"), "w") as fh:
            json.dump({"environment": env, "reference": ref, "rows": list(rows.values()), "targets": tgt}, fh,
                      indent=1, default=str)

    tgt = targets(rows, essential)
    text = render(list(rows.values()), tgt, ref)
    with open(os.path.join(args.out, "table.txt"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump({"environment": env, "reference": ref, "rows": list(rows.values()), "targets": tgt}, fh,
                  indent=1, default=str)
    print(text, flush=True)
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

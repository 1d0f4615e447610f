"""Where a ViT AOT package's child dies on a GPU (load, call, CUDA-graph capture), per variant, each in
its own process: custom-op GELU or aten's, single-threaded runner or not. Diagnosis only (issue 60)."""
import faulthandler, os, subprocess, sys, tempfile, time
faulthandler.enable()
VARIANTS = ["custom-single", "custom-multi", "aten-single", "aten-multi"]


def child(variant: str, folder: str, size: str) -> None:
    import torch
    import torch.nn.functional as F
    from gpuperfd.probe_child.workloads import aot_package, vit_fused
    if variant.startswith("aten"):
        vit_fused.gelu = F.gelu  # the module's forward looks the name up at call time
    single = variant.endswith("single")
    from transformers import ViTConfig, ViTForImageClassification
    cfg = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8) if size == "tiny" else {})
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # cpu: checks the script
    with torch.device(dev):
        m = ViTForImageClassification(ViTConfig(**cfg, num_labels=1000, attn_implementation="sdpa")).to(torch.bfloat16).eval()
    b = 4 if size == "tiny" else 128
    x = torch.randn(b, 3, m.config.image_size, m.config.image_size, device=dev, dtype=torch.bfloat16)
    with torch.inference_mode():
        f = vit_fused.FusedViT(m)
        w = f.weights()
        ref = f(x)
    t = time.perf_counter()
    path = aot_package.Path(folder) / f"{variant.split('-')[0]}.pt2"
    if not path.exists():
        with torch.no_grad():
            ep = torch.export.export(vit_fused.ExportableViT(f), (x, *w))
        torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
    print(variant, "compiled", round(time.perf_counter() - t, 2), flush=True)
    t = time.perf_counter()
    c = torch._inductor.aoti_load_package(str(path), run_single_threaded=single, device_index=0 if dev.type == "cuda" else -1)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync(); print(variant, "loaded", round(time.perf_counter() - t, 3), flush=True)
    with torch.inference_mode():
        out = c(x, *w); sync()
        print(variant, "called, max err", float((out.float() - ref.float()).abs().max()), flush=True)
        if dev.type == "cpu":
            return
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                c(x, *w)
        torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            go = c(x, *w)
        g.replay(); torch.cuda.synchronize()
        print(variant, "graph ok, err", float((go.float() - ref.float()).abs().max()), flush=True)
        if size != "tiny":
            for name, fn in (("graph", g.replay), ("eager-aot", lambda: c(x, *w))):
                for _ in range(5): fn()
                torch.cuda.synchronize(); t = time.perf_counter()
                for _ in range(50): fn()
                torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 50
                print(variant, name, f"{b / dt:.0f} images/s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        child(sys.argv[1], sys.argv[2], sys.argv[3]); sys.exit(0)
    size = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    folder = tempfile.mkdtemp()
    for v in VARIANTS:
        r = subprocess.run([sys.executable, __file__, v, folder, size], capture_output=True, text=True, timeout=400)
        lines = [l for l in (r.stdout + r.stderr).splitlines() if "arn" not in l and "cls.__new__" not in l]
        print(f"--- {v}: rc {r.returncode}"); print("\n".join(lines[:8] + ["..."] + lines[-12:]) if len(lines) > 20 else "\n".join(lines))

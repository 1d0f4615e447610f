"""The probe workloads (torch; imported only inside the probe child).

Each module has ``build(spec, ctx) -> Workload``. The registry names the module per probe, so the
harness picks a workload by name without importing every workload, and the workloads import only
:mod:`gpuperfd.probe_child.context`, never the harness that runs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gpuperfd.probe_data.shapes import is_llama

if TYPE_CHECKING:
    from gpuperfd.probe_child.context import ProbeContext, Workload
    from gpuperfd.probe_data.spec import ProbeSpec

#: Probe name -> module that builds its workload.
WORKLOAD_MODULES: dict[str, str] = {
    "llm": "gpuperfd.probe_child.workloads.llm",
    "vit": "gpuperfd.probe_child.workloads.vit",
    "attention": "gpuperfd.probe_child.workloads.attention",
    "train": "gpuperfd.probe_child.workloads.train",
}


#: The llm probe's Llama family builds here (it extends the GPT-2 module's workloads, so the GPT-2
#: module never imports it back).
LLAMA_MODULE = "gpuperfd.probe_child.workloads.llama.probe"

#: Probe name -> modules its build imports that touch no GPU (transformers' model code): what a
#: child told to wait for its build imports beforehand (:func:`preload`).
PRELOAD_MODULES: dict[str, tuple[str, ...]] = {
    "llm": ("transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama"),
    "vit": ("transformers.models.vit.modeling_vit",),
    "train": ("transformers.models.gpt2.modeling_gpt2",),
}


#: What a ``compiled`` variant's build imports on top: torch.compile's Dynamo and Inductor (~800 modules).
#: Left to the build, they were most of ViT's 6 s build in a ready child on an H200 (its compile, the cache
#: warm, took 1.6-2.1 s of it: benchmarks/child_costs.py); importing them makes no CUDA call.
COMPILER_MODULES: tuple[str, ...] = ("torch._dynamo", "torch._inductor.compile_fx")


def preload(probe: str, variant: str | None = None) -> None:
    """Import what building ``probe`` (``variant``) needs, without building it: CPU work only (no CUDA
    call), so a child can do it before the GPU is taken and the build then starts from the model code."""
    importlib.import_module(WORKLOAD_MODULES[probe])
    if probe == "llm":
        importlib.import_module(LLAMA_MODULE)
    for name in PRELOAD_MODULES.get(probe, ()) + (COMPILER_MODULES if variant == "compiled" else ()):
        importlib.import_module(name)


def build(spec: ProbeSpec, ctx: ProbeContext) -> Workload:
    """Build the workload of ``spec.probe`` (model, buffers, CUDA graphs) in this process."""
    try:
        module_name = WORKLOAD_MODULES[spec.probe]
    except KeyError:  # pragma: no cover - spec validation stops this
        raise ValueError(f"probe: unknown probe {spec.probe!r}") from None
    if spec.probe == "llm" and is_llama(spec.model):  # the Llama family of llm (seed 004): its own module
        module_name = LLAMA_MODULE
    return importlib.import_module(module_name).build(spec, ctx)

"""The probe workloads (torch; imported only inside the probe child).

Each module has ``build(spec, ctx) -> Workload``. The registry (``probe_data/kinds.py``) names each kind's
module by its dotted path, so the harness picks a workload by name without importing every workload, and
the workloads import only :mod:`gpuperfd.probe_child.context`, never the harness that runs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gpuperfd.probe_data.kinds import probe_kind
from gpuperfd.probe_data.shapes import is_llama

if TYPE_CHECKING:
    from gpuperfd.probe_child.context import ProbeContext, Workload
    from gpuperfd.probe_data.spec import ProbeSpec


#: What a ``compiled`` variant's build imports on top: torch.compile's Dynamo and Inductor (~800 modules).
#: Left to the build, they were most of ViT's 6 s build in a ready child on an H200 (its compile, the cache
#: warm, took 1.6-2.1 s of it: benchmarks/child_costs.py); importing them makes no CUDA call.
COMPILER_MODULES: tuple[str, ...] = ("torch._dynamo", "torch._inductor.compile_fx")


def build_imports(probe: str, variant: str | None = None) -> tuple[str, ...]:
    """The modules building ``probe`` (``variant``) imports that touch no GPU, in import order."""
    kind = probe_kind(probe)
    compiler = COMPILER_MODULES if variant == "compiled" else ()
    return tuple(name for name in (kind.workload_module, kind.llama_module, *kind.preload_modules, *compiler)
                 if name is not None)


def preload(probe: str, variant: str | None = None) -> None:
    """Import what building ``probe`` (``variant``) needs, without building it: CPU work only (no CUDA
    call), so a child can do it before the GPU is taken and the build then starts from the model code."""
    for name in build_imports(probe, variant):
        importlib.import_module(name)


def build(spec: ProbeSpec, ctx: ProbeContext) -> Workload:
    """Build the workload of ``spec.probe`` (model, buffers, CUDA graphs) in this process."""
    try:
        kind = probe_kind(spec.probe)
    except KeyError:  # pragma: no cover - spec validation stops this
        raise ValueError(f"probe: unknown probe {spec.probe!r}") from None
    # the Llama family (seed 004) builds in its own module, which extends the GPT-2 module's workloads
    module_name = kind.llama_module if kind.llama_module and is_llama(spec.model) else kind.workload_module
    return importlib.import_module(module_name).build(spec, ctx)

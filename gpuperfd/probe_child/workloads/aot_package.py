"""A forward compiled ahead of time and kept on disk, so a later child loads it instead of tracing it.

Why: ViT's compiled forward costs every child 1.6-2.1 s of ``torch.compile`` even with the compile
caches warm (Dynamo traces the Python again and Inductor looks its graph up), and that is most of
the gap between a ViT turn and its target (docs/benchmarks.md, issue 60). An AOTInductor package is
the compiled graph itself: a shared library and its metadata. Loading one takes milliseconds.

The package is compiled from a forward whose weights are all arguments (``ExportableViT``), so it
holds code only: it runs on the weights the child built (random or ``weights_path``), and the answer
checks see the same tensors the model has. Its file name is a hash of everything the code depends on
(the shapes of every input, their dtypes and the device, the GPU's model and compute capability,
torch's version, the forward's source): a changed one is a new package, never a wrong one.

The first child of a shape exports and compiles (what ``torch.compile`` would have cost, plus the
package's C++ build); the package is written beside the compile caches, to a temporary name and
renamed, so two children compiling the same shape at once leave one whole package. A package that
cannot be loaded (truncated, built by another torch) is compiled again and replaced; a compile that
fails leaves the caller on ``torch.compile``, with the reason in the result.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from gpuperfd.probe_data.spec import AOT_CACHE_ENV

__all__ = ["Loaded", "cache_dir", "load_or_compile", "package_key"]


@dataclass(frozen=True)
class Loaded:
    """A package's forward and how it came: ``source`` is ``loaded`` (found on disk) or ``compiled``
    (built by this child); ``seconds`` the load or the export and compile; ``replaced`` why a package
    on disk was not used (empty when none was there or it loaded)."""

    forward: Callable[..., torch.Tensor]
    source: str
    seconds: float
    path: Path
    replaced: str = ""


def cache_dir() -> Path | None:
    """The folder of this child's packages (:data:`AOT_CACHE_ENV`), or None when it has none."""
    value = os.environ.get(AOT_CACHE_ENV, "")
    return Path(value) if value else None


def package_key(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], constants: str) -> str:
    """A hash of what the compiled code depends on: every input's shape, stride, dtype and device,
    the GPU's model and compute capability, torch's version, the source of the module's file and
    ``constants`` (the Python numbers the forward bakes in: heads, patch size, epsilon)."""
    parts = [torch.__version__, type(module).__qualname__, inspect.getsource(inspect.getmodule(module) or module),
             constants]
    for device in sorted({t.device for t in inputs}, key=str):
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            parts.append(f"{props.name} sm{props.major}{props.minor}")
    parts.extend(f"{tuple(t.shape)}{t.stride()}{t.dtype}{t.device.type}" for t in inputs)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def load_or_compile(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], constants: str,
                    folder: Path) -> Loaded:
    """The package of ``module`` for ``inputs``' shapes from ``folder``, compiled and kept there first
    when it is missing or cannot be loaded (``constants``: see :func:`package_key`). Raises what the
    export or compile raised."""
    path = folder / f"{package_key(module, inputs, constants)}.pt2"
    replaced = ""
    if path.exists():
        start = time.perf_counter()
        try:
            forward = _load(path, inputs)
            return Loaded(forward, "loaded", time.perf_counter() - start, path)
        except Exception as exc:  # noqa: BLE001 - any unloadable package is rebuilt, the reason kept
            replaced = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    start = time.perf_counter()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with torch.inference_mode(False), torch.no_grad():
        program = torch.export.export(module, inputs)
    fd, scratch = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".pt2", dir=folder)
    os.close(fd)
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=scratch)
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    forward = _load(path, inputs)
    return Loaded(forward, "compiled", time.perf_counter() - start, path, replaced)


def _load(path: Path, inputs: tuple[torch.Tensor, ...]) -> Callable[..., torch.Tensor]:
    """The package's forward on ``inputs``' device: called with the same arguments as the module."""
    device = inputs[0].device
    index = device.index if device.type == "cuda" and device.index is not None else -1
    # single-threaded: no locking around the run, which a CUDA graph's capture must not meet
    compiled: Any = torch._inductor.aoti_load_package(str(path), run_single_threaded=True, device_index=index)
    return compiled  # type: ignore[no-any-return]

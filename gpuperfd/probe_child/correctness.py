"""Answer checks inside the probe child: is this GPU computing the right numbers? (imports torch)

A GPU with silent data corruption passes every telemetry check (no XID, no ECC count,
normal clocks). Every probe point therefore checks its own numbers, outside the measured
windows, with two checks that together cost a few forward passes (docs/probes.md, "Correctness"):

* ``repeat``: the workload's own output on fixed inputs (the window's first batch, through the
  window's path: eager, compiled or CUDA graph) computed twice must be bitwise identical. A
  fingerprint (integer sum of the raw words, float64 sum and sum of squares, and a hash of a
  strided sample of the raw bytes) is compared: on-device reductions plus one small copy. The
  integer sum of the raw words changes by exactly +-2^k for any single flipped bit, so one wrong
  bit anywhere in the output is seen. The fingerprint also goes in the record, for peers.
* ``slice``: a few rows of one real product of the probe, recomputed on the CPU in float64 from
  the same (already rounded) operands: rows of attention for the attention probe, rows of a
  matrix product with the model's largest weight for the others, on fresh random inputs each
  time. Compared by ||out - ref|| / ||ref|| and by the largest element error, against
  :data:`TOLERANCES` (per precision; NaN or inf never passes). This catches a unit that is
  wrong the same way every time, which the repeat check cannot.

The test-only ``wrong_result_element`` / ``wrong_result_bit`` faults perturb the second output
and the slice (see :func:`perturb`), and are refused unless ``GPUPERFD_TEST_FAULTS=1``.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "TOLERANCES",
    "Tolerance",
    "SliceCheck",
    "fingerprint",
    "precision_of",
    "perturb",
    "run_checks",
    "TEST_FAULTS_ENV",
]

from gpuperfd.probe_data.spec import TEST_FAULTS_ENV  # the switch without which wrong-result faults are refused
#: Elements of the strided raw-byte sample hashed into the fingerprint.
SAMPLE_ELEMENTS = 4096
#: Columns of a matrix-product slice recomputed on the CPU (rows x columns x inner float64 products).
MAX_SLICE_COLUMNS = 4096


@dataclass(frozen=True)
class Tolerance:
    """Bounds of one precision: ``norm`` on ||out - ref|| / ||ref||, ``element`` on the largest
    |out - ref| / max(|ref|, rms(ref)) (the rms floor keeps near-zero references from dominating)."""

    norm: float
    element: float
    why: str


#: Per precision of the checked product. The repeat check is bitwise on every path (eager,
#: torch.compile, CUDA graph): the same kernels on the same inputs in the same order give the
#: same bits on one GPU, so it has no tolerance. The reasons are in docs/probes.md too.
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(1e-5, 1e-4, "fp32 accumulation of K terms errs ~sqrt(K)*6e-8 (<2e-6 at K=1024); "
                                     "1e-5 leaves 5x margin and still sees a wrong mantissa bit above bit 16"),
    "tf32": Tolerance(2e-3, 2e-2, "TF32 rounds operands to 10 mantissa bits (u=4.9e-4); norm errors land near "
                                  "3e-4 (METHOD.md), 2e-3 is ~6x that"),
    "float16": Tolerance(5e-3, 3e-2, "fp16 output rounding is 2^-11 per element and fp32 accumulation adds "
                                     "little; 5e-3 is ~10x the rounding"),
    "bfloat16": Tolerance(2e-2, 6e-2, "bf16 output rounding is 2^-9 (2e-3) per element; flash attention also "
                                      "rounds P to bf16 before P@V (~4e-3); 2e-2 covers both with margin, "
                                      "a wrong exponent or high mantissa bit is far above it"),
}


def precision_of(dtype: torch.dtype, device: torch.device) -> str:
    """The :data:`TOLERANCES` key of a product in ``dtype`` on ``device`` (TF32 when CUDA allows it)."""
    if dtype == torch.float32:
        if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
        return "float32"
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        raise ValueError(f"correctness: no tolerance for dtype {name}")
    return name


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(tensors: list[torch.Tensor]) -> tuple[str, bool]:
    """(fingerprint string, all finite) of ``tensors``: exact integer word sum, float64 sum and sum of
    squares (on device), and a blake2b of a strided sample of the raw bytes (one small copy)."""
    parts: list[str] = []
    finite = True
    digest = hashlib.blake2b(digest_size=8)
    for t in tensors:
        flat = t.detach().contiguous().view(-1)
        words = flat.view(_INT_VIEW[flat.element_size()]).sum(dtype=torch.int64)
        if flat.is_floating_point():
            s1 = flat.sum(dtype=torch.float64)
            s2 = torch.linalg.vector_norm(flat, dtype=torch.float64)
            vals = torch.stack([s1, s2]).cpu().tolist()
            finite = finite and all(math.isfinite(v) for v in vals)
        else:
            vals = [float(flat.sum(dtype=torch.float64))]
        stride = max(1, flat.numel() // SAMPLE_ELEMENTS)
        digest.update(bytes(flat[::stride].contiguous().view(torch.uint8).cpu().tolist()))
        parts.append(f"{int(words) & 0xFFFFFFFFFFFFFFFF:016x}/" + "/".join(v.hex() for v in vals))
    return ";".join(parts) + "#" + digest.hexdigest(), finite


def perturb(tensor: torch.Tensor, kind: str, index: int = 0) -> None:
    """FOR TESTS ONLY: make ``tensor`` wrong in place at flat ``index``: ``wrong_result_element`` adds
    the tensor's rms (or 1) to it, ``wrong_result_bit`` flips the top mantissa bit (bit 0 of an
    integer). Refused unless ``GPUPERFD_TEST_FAULTS=1``."""
    if os.environ.get(TEST_FAULTS_ENV) != "1":
        raise RuntimeError(f"wrong-result faults are for tests only: set {TEST_FAULTS_ENV}=1 to use them")
    with torch.inference_mode():  # the outputs are inference tensors: change them where they were made
        if tensor.is_contiguous():
            _perturb(tensor.view(-1), kind, index)
        else:  # a strided slice (a device product's first columns): the one element, as a view
            coords = torch.unravel_index(torch.tensor(index), tuple(tensor.shape))
            _perturb(tensor[tuple(int(c) for c in coords)].view(1), kind, 0)


def _perturb(flat: torch.Tensor, kind: str, index: int) -> None:
    if kind == "wrong_result_element":
        if flat.is_floating_point():
            rms = float(torch.linalg.vector_norm(flat.float())) / math.sqrt(max(flat.numel(), 1))
            flat[index] += rms if rms > 0 else 1.0
        else:
            flat[index] += 1
    elif kind == "wrong_result_bit":
        bit = {torch.float32: 22, torch.float16: 9, torch.bfloat16: 6, torch.float64: 51}.get(flat.dtype, 0)
        words = flat.view(_INT_VIEW[flat.element_size()])
        one = torch.ones((), dtype=words.dtype, device=words.device)
        words[index] ^= one << bit
    else:
        raise ValueError(f"perturb: unknown wrong-result fault {kind!r}")


@dataclass
class SliceCheck:
    """A slice of a device product and its float64 CPU reference, with the tolerance that applies."""

    name: str
    out: torch.Tensor
    ref: torch.Tensor
    precision: str

    def compare(self) -> dict[str, Any]:
        """Errors of ``out`` against ``ref``; ``ok`` only if all finite and within the tolerance."""
        out = self.out.detach().to("cpu", torch.float64)
        ref = self.ref.detach().to("cpu", torch.float64)
        diff = (out - ref).abs()
        ref_norm = float(ref.norm())
        rms = ref_norm / math.sqrt(max(ref.numel(), 1))
        finite = bool(torch.isfinite(out).all()) and bool(torch.isfinite(ref).all())
        norm_rel = float((out - ref).norm()) / ref_norm if ref_norm > 0 else float(diff.max())
        rel = diff / ref.abs().clamp(min=rms if rms > 0 else 1.0)
        tol = TOLERANCES[self.precision]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float(rel.max()) if rel.numel() else 0.0
        ok = finite and norm_rel <= tol.norm and max_rel <= tol.element
        return {"name": self.name, "ok": ok, "precision": self.precision, "elements": int(ref.numel()),
                # None where a NaN/inf made the error unmeasurable (JSON has no NaN; the check failed)
                "max_abs_error": max_abs if finite else None, "max_rel_error": max_rel if finite else None,
                "norm_rel_error": norm_rel if finite else None}


def fresh_generator() -> torch.Generator:
    """A CPU generator seeded from the OS: every slice check draws new inputs (METHOD.md)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def matmul_slice(weight: torch.Tensor, dtype: torch.dtype, rows: int = 8, name: str = "matmul") -> SliceCheck:
    """``rows`` fresh random rows times ``weight`` (the model's own, cast to ``dtype``) on its device,
    against the same product of the same rounded operands in float64 on the CPU."""
    w = weight.detach()
    if w.shape[0] > w.shape[1]:  # the short side is the inner dimension: an embedding's is its width, not
        w = w.T                  # its vocabulary (a 50k-term sum would test split-K reductions, not units)
    if w.dtype != dtype:
        w = w.to(dtype)
    x_cpu = torch.randn(rows, w.shape[0], generator=fresh_generator(), dtype=torch.float32).to(dtype)
    with torch.inference_mode():
        out = x_cpu.to(w.device) @ w
    cols = min(w.shape[1], MAX_SLICE_COLUMNS)
    ref = x_cpu.double() @ w[:, :cols].to("cpu", torch.float64)
    return SliceCheck(name, out[:, :cols], ref, precision_of(dtype, w.device))


def largest_matrix(module: torch.nn.Module) -> torch.Tensor:
    """The model's largest 2-D parameter (embedding or MLP weight): the product the slice check uses."""
    mats = [p for p in module.parameters() if p.dim() == 2]
    if not mats:
        raise ValueError("correctness: the model has no 2-D weight to check")
    return max(mats, key=lambda p: p.numel())


def weight_slice(model: torch.nn.Module, dtype: torch.dtype) -> Any:
    """A :class:`CheckPlan` ``slice``: the product with the model's largest weight (:func:`matmul_slice`)."""
    return lambda _outputs: matmul_slice(largest_matrix(model), dtype)


@dataclass
class CheckPlan:
    """What a workload offers the checks: its output on fixed inputs, and a slice to recompute.

    ``output(perturb_with)`` runs the probe's own computation on the window's first batch and
    returns its output tensors; ``slice(outputs)`` returns the slice check (it may reuse the
    outputs, e.g. attention rows); ``peer_comparable`` is False where the output depends on how
    many steps ran (training: weights move), so peers compare only like with like.
    """

    output: Any
    slice: Any
    path: str
    peer_comparable: bool = True
    notes: dict[str, Any] = field(default_factory=dict)


def run_checks(plan: CheckPlan, synchronize: Any, fault: str | None = None) -> dict[str, Any]:
    """Run the repeat and slice checks; the ``correctness`` dict of the result.

    ``fault`` (tests only) perturbs the second output and the slice before they are compared.
    """
    t0 = time.perf_counter()
    synchronize()
    fp1, finite1 = fingerprint(plan.output())
    second = plan.output()
    if fault is not None:
        perturb(second[0], fault)
    fp2, finite2 = fingerprint(second)
    sliced: SliceCheck = plan.slice(second)
    if fault is not None:
        perturb(sliced.out, fault, _largest_index(sliced.ref))
    cmp = sliced.compare()
    synchronize()
    failed = []
    if fp1 != fp2:
        failed.append("repeat")
    if not (finite1 and finite2):
        failed.append("non_finite")
    if not cmp["ok"]:
        failed.append("slice")
    return {
        "status": "mismatch" if failed else "ok",
        "checks": 2,
        "failed_checks": failed,
        "max_abs_error": cmp["max_abs_error"],
        "max_rel_error": cmp["max_rel_error"],
        "norm_rel_error": cmp["norm_rel_error"],
        "elements_checked": cmp["elements"] + sum(t.numel() for t in second),
        "fingerprint": fp2 if not failed else fp1,
        "repeat_fingerprints_equal": fp1 == fp2,
        "peer_comparable": plan.peer_comparable,
        "precision": cmp["precision"],
        "slice": cmp["name"],
        "path": plan.path,
        "seconds": time.perf_counter() - t0,
        **plan.notes,
    }


def _largest_index(ref: torch.Tensor) -> int:
    """Flat index of the reference's largest magnitude: a perturbation there is a large relative error."""
    return int(ref.detach().reshape(-1).abs().argmax())

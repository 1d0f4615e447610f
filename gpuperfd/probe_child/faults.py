"""Faults injected on purpose inside the probe child, for the runner's isolation tests
(see ``ProbeSpec.inject_fault``)."""

from __future__ import annotations

import os
import signal
import time

import torch

from gpuperfd.probe_child.context import ProbeContext


def inject_process_fault(kind: str) -> None:
    """The faults any probe process can play (a probe child, an interconnect worker): an exception,
    a hang, a crash (SIGSEGV); any other kind is left to the caller."""
    if kind == "exception":
        raise RuntimeError("injected fault: exception")
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)
        raise RuntimeError("injected crash did not kill the process")


def inject_fault(kind: str, ctx: ProbeContext) -> None:
    """Fail on purpose, for the runner's isolation tests (see ProbeSpec.inject_fault)."""
    inject_process_fault(kind)
    if kind == "oom":
        limit = ctx.spec.memory_limit_bytes or (512 << 20)
        if ctx.spec.memory_limit_bytes is None:
            ctx.apply_memory_limit(limit)
        chunk = 64 << 20
        held: list[torch.Tensor] = []
        try:
            # A real allocation failure: RLIMIT_AS on CPU, the allocator's cap on CUDA.
            # torch.empty does not touch the pages, so the CPU path costs no physical memory.
            while True:
                held.append(torch.empty(chunk, dtype=torch.uint8, device=ctx.device))
                if len(held) * chunk > 4 * limit + (1 << 30):
                    raise torch.OutOfMemoryError(
                        f"injected oom: allocated {len(held) * chunk} bytes without hitting the {limit}-byte limit"
                    )
        finally:
            held.clear()
    if kind == "cuda_error":
        if ctx.is_cuda:
            # Out-of-bounds gather: a device-side assert, the sticky kind of CUDA error.
            values = torch.zeros(4, device=ctx.device)
            index = torch.tensor([1 << 20], device=ctx.device)
            values[index].sum().item()
            torch.cuda.synchronize()
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected fault; no GPU here)")
    raise ValueError(f"inject_fault: unknown fault {kind!r}")



"""One rank of the interconnect probe: ``python -m gpuperfd.probe_child.interconnect.worker ...``.

Started once per GPU of the set by :mod:`gpuperfd.probing.interconnect.runner` (never imported by
the parent). Every rank joins one ``torch.distributed`` group (NCCL on ``cuda:<gpu>``, gloo on a
CPU; env rendezvous on 127.0.0.1), then:

1. peer copies, one ordered pair at a time (the request's ``pairs``, or every ordered pair of the set;
   a barrier between pairs, so pairs never share a link):
   on GPUs the source rank copies ``cuda:a -> cuda:b`` (``copy_``, CUDA events) while the other
   ranks wait in a host-side (gloo) barrier, so no waiting rank has a kernel on a GPU meanwhile (with
   an NCCL barrier, the destination rank's barrier kernel spinning on its GPU cut the copy into it to
   30 % at 256 MiB and 8 % at 64 MiB, on H100 and H200 pairs alike: a false "degraded" verdict;
   docs/benchmarks.md); on a CPU the
   source rank ``send``s to the destination rank; the destination's bytes are compared with the
   source's (the same seeded pattern);
2. an all-reduce at each size: rank r's tensor holds r + 1, so every element must come back
   n (n + 1) / 2 (exact in bfloat16 for small n); the latency of a repeat is the slowest rank's;
3. rank 0 gathers everything and writes the :class:`InterconnectResult` as JSON (``--out``).

A failure writes ``{reason, message, traceback}`` to ``--error`` and exits 1; the parent then
ends every rank (a rank blocked in a collective never returns by itself). CUDA numbering is NVML's
(``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``CUDA_VISIBLE_DEVICES`` dropped by the parent), so GPU i is
``cuda:i``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gpuperfd.probe_child.child import classify_exception, die_with_parent
from gpuperfd.probe_child.faults import inject_process_fault
from gpuperfd.probe_data.interconnect import (AllReduce, InterconnectRequest, InterconnectResult, PeerCopy,
                                              bus_bandwidth)
from gpuperfd.probe_data.result import percentile

__all__ = ["main"]

FAULTS = ("exception", "crash", "hang", "wrong_sum", "wrong_copy")


class Rank:
    """This process's place in the group: its rank, the GPU it stands for, and its torch device."""

    def __init__(self, rank: int, gpus: list[int], cuda: bool) -> None:
        self.rank = rank
        self.gpus = gpus
        self.world = len(gpus)
        self.cuda = cuda
        self.device = torch.device(f"cuda:{gpus[rank]}") if cuda else torch.device("cpu")
        #: The group whose barrier waits on the host: gloo beside NCCL on GPUs (made by every rank
        #: after the default group), the default (gloo) group on a CPU.
        self.host_group: Any = None

    def host_barrier(self) -> None:
        """Wait for every rank without a kernel on any GPU (a copy under way keeps its GPUs alone)."""
        dist.barrier(group=self.host_group)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _pattern(src: int, dst: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """The same pseudo-random bytes wherever it is made for a pair (seeded by the pair), made on
    ``device`` itself (256 MiB drawn on a CPU takes seconds, per pair)."""
    gen = torch.Generator(device=device).manual_seed(src * 1009 + dst)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen, device=device)


def _cuda_copy(me: Rank, dst_gpu: int, nbytes: int, request: InterconnectRequest,
               fault: str | None = None) -> tuple[list[float], bool]:
    """Copy ``cuda:me -> cuda:dst_gpu`` warmup + repeats times; per-repeat seconds and the check."""
    src = _pattern(me.gpus[me.rank], dst_gpu, nbytes, me.device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst_gpu}")
    times = []
    with torch.cuda.device(me.device):
        for i in range(request.warmup + request.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            if i >= request.warmup:
                times.append(start.elapsed_time(end) / 1e3)
    if fault == "wrong_copy":
        dst[0] ^= 1  # one flipped bit: the check must see it
    ok = bool(torch.equal(dst.to(me.device), src))
    del dst
    return times, ok


def _cpu_copy(me: Rank, src_rank: int, dst_rank: int, nbytes: int, request: InterconnectRequest,
              fault: str | None = None) -> tuple[list[float], bool]:
    """A gloo send/recv as the "copy": timed on the receiver after a barrier (CPU tests, CI)."""
    expected = _pattern(src_rank, dst_rank, nbytes, me.device)
    buf = torch.empty(nbytes, dtype=torch.uint8) if me.rank == dst_rank else expected.clone()
    if fault == "wrong_copy" and me.rank == src_rank:
        buf[0] ^= 1  # one flipped bit: the destination's check must see it
    times = []
    for i in range(request.warmup + request.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        if me.rank == src_rank:
            dist.send(buf, dst=dst_rank)
        elif me.rank == dst_rank:
            dist.recv(buf, src=src_rank)
        if i >= request.warmup and me.rank == dst_rank:
            times.append(time.perf_counter() - t0)
    return times, me.rank != dst_rank or bool(torch.equal(buf, expected))


def _cv(values: list[float]) -> float | None:
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def open_peers(me: Rank) -> float:
    """Open this process's context on every other GPU of the set, with peer access to it, every rank at
    once and before any timed copy; the seconds it took. Left to each pair's first copy, the context
    was made inside the pairs, one pair at a time: n (n - 1) times in a row on a node of n GPUs."""
    t0 = time.perf_counter()
    if me.cuda:
        here = torch.zeros(1, dtype=torch.uint8, device=me.device)
        for gpu in me.gpus:
            if gpu != me.gpus[me.rank]:
                torch.empty(1, dtype=torch.uint8, device=f"cuda:{gpu}").copy_(here)
        torch.cuda.synchronize(me.device)
    return time.perf_counter() - t0


def peer_copies(me: Rank, request: InterconnectRequest, fault: str | None = None) -> list[dict[str, Any]]:
    """Every ordered pair in turn; the records this rank measured (the source on GPUs, the
    destination on a CPU)."""
    mine = []
    rank_of = {gpu: rank for rank, gpu in enumerate(me.gpus)}
    for src_gpu, dst_gpu in request.ordered_pairs(tuple(me.gpus)):
        a, b = rank_of[src_gpu], rank_of[dst_gpu]
        measurer = a if me.cuda else b
        if me.cuda and me.rank == a:
            times, ok = _cuda_copy(me, dst_gpu, request.copy_bytes, request, fault)
        elif not me.cuda:  # every rank takes part in the pair's barriers
            times, ok = _cpu_copy(me, a, b, request.copy_bytes, request, fault)
        else:
            times, ok = [], True
        if me.rank == measurer:
            rate = request.copy_bytes / statistics.median(times)
            mine.append(dataclass_dict(PeerCopy(src=src_gpu, dst=dst_gpu, bytes=request.copy_bytes,
                                                bandwidth_bytes_per_second=rate, repeats=len(times),
                                                cv=_cv([request.copy_bytes / t for t in times]), ok=ok)))
        me.host_barrier()
    return mine


def dataclass_dict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)


def _timed_allreduce(me: Rank, tensor: torch.Tensor, fill: float) -> float:
    """One all-reduce of a freshly filled tensor; this rank's seconds."""
    tensor.fill_(fill)
    me.sync()
    dist.barrier()
    if me.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(tensor)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    dist.all_reduce(tensor)
    return time.perf_counter() - t0


def all_reduce(me: Rank, nbytes: int, request: InterconnectRequest, fault: str | None) -> dict[str, Any]:
    """Warmup, then ``repeats`` timed all-reduces of ``nbytes`` per rank, and the checked sum."""
    dtype = getattr(torch, request.dtype)
    numel = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
    tensor = torch.empty(numel, dtype=dtype, device=me.device)
    fill = float(me.rank + 1) + (1.0 if fault == "wrong_sum" else 0.0)
    for _ in range(request.warmup):
        _timed_allreduce(me, tensor, fill)
    mine = [_timed_allreduce(me, tensor, fill) for _ in range(request.repeats)]
    expected = me.world * (me.world + 1) / 2
    flags = torch.tensor([1 if bool(torch.all(tensor == expected)) else 0], dtype=torch.int32, device=me.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    slowest = torch.tensor(mine, dtype=torch.float64, device=me.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective lasts as long as its slowest rank
    times = slowest.tolist()
    real_bytes = numel * tensor.element_size()
    p50 = percentile(times, 50) or 0.0
    return dataclass_dict(AllReduce(
        bytes=real_bytes, ranks=me.world, latency_p50_seconds=p50, latency_p99_seconds=percentile(times, 99) or 0.0,
        algorithm_bandwidth_bytes_per_second=real_bytes / p50 if p50 > 0 else 0.0,
        bus_bandwidth_bytes_per_second=bus_bandwidth(real_bytes, p50, me.world) if p50 > 0 else 0.0,
        repeats=len(times), sum_ok=bool(flags.item() == 1)))


def _inject(fault: str | None) -> None:
    """Fail on purpose (tests: a failing rank must take no process or GPU with it); the wrong-result
    faults are played where the copies and sums are made."""
    if fault is not None:
        inject_process_fault(fault)


def run(me: Rank, request: InterconnectRequest, fault: str | None) -> dict[str, Any] | None:
    """The whole probe on this rank; rank 0 returns the result's dict, the others None."""
    started_at = time.time()
    opened = open_peers(me)
    me.host_barrier()  # every rank's contexts are open: no pair's copy shares its GPUs with one being made
    pairs_started = time.perf_counter()
    copies = peer_copies(me, request, fault)
    pairs_seconds = time.perf_counter() - pairs_started
    _inject(fault)
    reduces = [all_reduce(me, size, request, fault) for size in request.allreduce_bytes]
    gathered: list[Any] = [None] * me.world
    dist.all_gather_object(gathered, copies)
    if me.rank != 0:
        return None
    all_copies = sorted((PeerCopy(**c) for part in gathered for c in part), key=lambda c: (c.src, c.dst))
    sums = tuple(AllReduce(**r) for r in reduces)
    bad = [f"{c.src}->{c.dst}" for c in all_copies if not c.ok] + [f"all-reduce {r.bytes} B" for r in sums if not r.sum_ok]
    result = InterconnectResult(
        gpus=tuple(me.gpus), status="failed" if bad else "ok", failure_reason="wrong_result" if bad else None,
        error_message=f"wrong result: {', '.join(bad)}" if bad else None, backend="nccl" if me.cuda else "gloo",
        started_at=started_at, wall_seconds=time.time() - started_at, copies=tuple(all_copies), allreduce=sums,
        extra={"dtype": request.dtype, "torch": torch.__version__,
               "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
               "open_peers_seconds": round(opened, 3), "copies_seconds": round(pairs_seconds, 3)})
    return result.to_dict()


def _write(path: str, body: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(body, fh)
    os.replace(tmp, path)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuperfd-interconnect-worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--gpus", required=True, help="comma-separated GPU indices of the set, rank order")
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--request", required=True, help="the InterconnectRequest as JSON")
    parser.add_argument("--out", required=True)
    parser.add_argument("--error", required=True)
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--fault", choices=FAULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    die_with_parent(args.parent_pid)
    try:  # the daemon's probes are background work (GPUPERFD_PROBE_NICE, as the probe child's)
        if (niceness := int(os.environ.get("GPUPERFD_PROBE_NICE", "0"))) > 0:
            os.nice(niceness)
    except (ValueError, OSError):
        pass
    gpus = [int(g) for g in args.gpus.split(",")]
    body = json.loads(args.request)
    body["gpus"] = gpus
    request = InterconnectRequest.from_dict(body)
    me = Rank(args.rank, gpus, args.device == "cuda")
    try:
        if me.cuda:
            torch.cuda.set_device(me.device)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("nccl" if me.cuda else "gloo", rank=me.rank, world_size=me.world,
                                timeout=timedelta(seconds=request.timeout_seconds),
                                **({"device_id": me.device} if me.cuda else {}))
        if me.cuda:
            me.host_group = dist.new_group(backend="gloo")
        result = run(me, request, args.fault)
        if result is not None:
            _write(args.out, result)
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, classified
        _write(args.error, {"rank": me.rank, "gpu": gpus[me.rank], "reason": classify_exception(exc),
                            "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main())

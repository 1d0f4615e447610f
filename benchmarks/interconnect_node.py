"""The interconnect probe on a lent node of two or more GPUs, read-only (issue 44).

What it measures and prints (and writes as JSON to ``--out``):

1. ``--runs`` (5) runs of the probe across ``--gpus`` (default 0,1) at the reference's sizes
   (peer copies of 256 MiB each way; NCCL all-reduce at 256 MiB and 1 GiB per rank): each figure's
   median and CV over the runs, against the reference (2x H200 NV18: peer copies 375-380 GB/s each
   way; all-reduce bus bandwidth 271 GB/s at 256 MiB and 316 GB/s at 1 GiB);
2. its GPU time: each run's wall time times the GPUs it held (the set is held for the whole run);
3. that it yields: a foreign job (a plain CUDA context on the last GPU of the set) starts mid-run;
   the run must end ``skipped / preempted`` within a few watch intervals, and no worker may be left
   on any GPU of the set;
4. bad input: a set naming a GPU that is not on the node, and one GPU alone, are refused before
   anything starts; a failing rank (an injected exception) fails the run and leaves no worker and
   no GPU held.

Read-only: it never sets a power limit, clock or mode; NCCL_NVLS_ENABLE is passed through as the
operator set it (off on lent machines). Run from the repo root on the node:

    PYTHONUNBUFFERED=1 python3 benchmarks/interconnect_node.py --out interconnect-node.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuperfd.device.nvml import NvmlBackend  # noqa: E402
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult  # noqa: E402
from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor  # noqa: E402

GB = 1e9
REFERENCE = {"copy_gbps": (375.0, 380.0), "busbw_gbps": {256 << 20: 271.0, 1 << 30: 316.0}}
FOREIGN_JOB = ("import os, time, torch; torch.ones(1, device='cuda:%d'); print('ready', flush=True); "
               "time.sleep(120)")


def _cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 and statistics.fmean(values) else None


def _figures(result: InterconnectResult) -> dict[str, float]:
    out = {f"copy {c.src}->{c.dst} GB/s": c.bandwidth_bytes_per_second / GB for c in result.copies}
    for a in result.allreduce:
        out[f"allreduce {a.bytes >> 20} MiB busbw GB/s"] = a.bus_bandwidth_bytes_per_second / GB
        out[f"allreduce {a.bytes >> 20} MiB p50 ms"] = a.latency_p50_seconds * 1e3
    return out


def repeatability(devices: list[Any], gpus: tuple[int, ...], runs: int, request: InterconnectRequest) -> dict[str, Any]:
    """``runs`` runs: every figure's values, median and CV; GPU time; energy; every sum checked."""
    executor = ProcessInterconnectExecutor("cuda")
    results = []
    for i in range(runs):
        result = executor.run(devices, request, threading.Event())
        print(f"run {i + 1}/{runs}: {result.status} {result.failure_reason or ''} {result.wall_seconds:.1f} s "
              f"{_figures(result) if result.ok else result.error_message}")
        results.append(result)
    ok = [r for r in results if r.ok]
    names = sorted({k for r in ok for k in _figures(r)})
    table = {}
    for name in names:
        values = [_figures(r)[name] for r in ok if name in _figures(r)]
        table[name] = {"values": values, "median": statistics.median(values), "cv": _cv(values)}
    return {"runs": [r.to_dict() for r in results], "figures": table,
            "all_checks_ok": all(c.ok for r in ok for c in r.copies) and all(a.sum_ok for r in ok for a in r.allreduce),
            "gpu_seconds_per_run": [r.wall_seconds * len(gpus) for r in results if r.wall_seconds],
            "energy_joules_per_run": [r.energy_joules for r in results]}


def against_reference(table: dict[str, Any]) -> list[str]:
    """One line per figure that has a reference: measured median vs the reference."""
    lines = []
    low, high = REFERENCE["copy_gbps"]
    for name, row in table.items():
        if name.startswith("copy"):
            lines.append(f"{name}: {row['median']:.1f} (reference {low:.0f}-{high:.0f}), CV {row['cv'] or 0:.2%}")
    for size, ref in REFERENCE["busbw_gbps"].items():
        row = table.get(f"allreduce {size >> 20} MiB busbw GB/s")
        if row is not None:
            lines.append(f"all-reduce {size >> 20} MiB busbw: {row['median']:.1f} GB/s (reference {ref:.0f}, "
                         f"{row['median'] / ref:.0%}), CV {row['cv'] or 0:.2%}")
    return lines


def yields(devices: list[Any], gpus: tuple[int, ...]) -> dict[str, Any]:
    """A foreign job on the set's last GPU mid-run: the run gives way and leaves nothing behind. Timed
    from the job's process appearing on its GPU (its CUDA context made: before that no reader can see
    it) until no worker is left on any GPU of the set; the job's own start is reported apart."""
    executor = ProcessInterconnectExecutor("cuda")  # the daemon's watch interval
    request = InterconnectRequest(gpus=gpus, copy_bytes=256 << 20, allreduce_bytes=(1 << 30,), repeats=20000,
                                  warmup=3, timeout_seconds=300)
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    box: dict[str, Any] = {}
    target = devices[gpus[-1]]

    def start_job() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len({p.pid for d in devices for p in d.compute_processes()}) < len(gpus):
            time.sleep(0.2)  # every worker holds its GPU: the probe is under way
        time.sleep(3.0)
        box["job"] = job = subprocess.Popen([sys.executable, "-c", FOREIGN_JOB % gpus[-1]], env=env,
                                            stdout=subprocess.PIPE)
        box["started"] = time.monotonic()
        while time.monotonic() < deadline and job.pid not in {p.pid for p in target.compute_processes()}:
            time.sleep(0.005)
        box["appeared"] = time.monotonic()
        workers = set(executor.last_pids)
        while time.monotonic() < deadline and workers & {p.pid for d in devices for p in d.compute_processes()}:
            time.sleep(0.005)
        box["workers_gone"] = time.monotonic()

    thread = threading.Thread(target=start_job, daemon=True)
    thread.start()
    result = executor.run(devices, request, threading.Event())
    ended = time.monotonic()
    thread.join(30)
    job = box.get("job")
    left = sorted({p.pid for d in devices for p in d.compute_processes()} - ({job.pid} if job else set()))
    if job is not None:
        job.kill()
        job.wait()
    appeared = box.get("appeared")
    return {"status": result.status, "failure_reason": result.failure_reason, "message": result.error_message,
            "seconds_from_job_start_to_yield": ended - box["started"] if "started" in box else None,
            "job_start_to_its_context_seconds": appeared - box["started"] if appeared and "started" in box else None,
            "yield_seconds": (box["workers_gone"] - appeared) if appeared and "workers_gone" in box else None,
            "run_returned_after_appearing_seconds": ended - appeared if appeared else None,
            "workers_left_on_gpus": left, "workers_alive": [p for p in executor.last_pids if Path(f"/proc/{p}").exists()]}


def bad_input_and_failure(devices: list[Any], gpus: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    executor = ProcessInterconnectExecutor("cuda")
    for label, asked in (("missing_gpu", (gpus[0], 97)), ("one_gpu", (gpus[0],))):
        try:
            executor.run(devices, InterconnectRequest(gpus=asked), threading.Event())
            out[label] = "NOT REFUSED"
        except ValueError as exc:
            out[label] = f"refused: {exc}"
    failing = ProcessInterconnectExecutor("cuda", inject_fault=(1, "exception"))
    result = failing.run(devices, InterconnectRequest(gpus=gpus, allreduce_bytes=(1 << 20,), repeats=3),
                         threading.Event())
    out["failing_rank"] = {"status": result.status, "failure_reason": result.failure_reason,
                           "workers_alive": [p for p in failing.last_pids if Path(f"/proc/{p}").exists()],
                           "compute_processes_after": sorted({p.pid for d in devices for p in d.compute_processes()})}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0,1")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="interconnect-node.json")
    parser.add_argument("--yield-only", type=int, default=0, metavar="N",
                        help="only the yield, N times (issue 50: the node probe gives way within 0.5 s)")
    args = parser.parse_args()
    gpus = tuple(int(g) for g in args.gpus.split(","))
    backend = NvmlBackend(indices=None)
    devices = backend.devices()
    limits_before = [d.power_limits().enforced_watts for d in devices]
    print(f"node: {[d.info().name for d in devices]}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
    request = InterconnectRequest(gpus=gpus, copy_bytes=256 << 20, allreduce_bytes=(256 << 20, 1 << 30),
                                  repeats=20, warmup=5, timeout_seconds=300)
    report: dict[str, Any] = {"gpus": gpus, "gpu_names": [d.info().name for d in devices],
                              "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "reference": str(REFERENCE)}
    if args.yield_only:
        report["yields"] = [yields(devices, gpus) for _ in range(args.yield_only)]
        report["power_limits_unchanged"] = limits_before == [d.power_limits().enforced_watts for d in devices]
        backend.close()
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
        for row in report["yields"]:
            print(f"yield: {row}")
        print(f"power limits unchanged: {report['power_limits_unchanged']}; written {args.out}")
        return 0
    report["repeatability"] = repeatability(devices, gpus, args.runs, request)
    report["against_reference"] = against_reference(report["repeatability"]["figures"])
    report["yield"] = yields(devices, gpus)
    report["bad_input_and_failure"] = bad_input_and_failure(devices, gpus)
    report["power_limits_unchanged"] = limits_before == [d.power_limits().enforced_watts for d in devices]
    backend.close()
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print("\n".join(report["against_reference"]))
    print(f"GPU seconds per run: {report['repeatability']['gpu_seconds_per_run']}")
    print(f"yield: {report['yield']}")
    print(f"bad input and failure: {report['bad_input_and_failure']}")
    print(f"power limits unchanged: {report['power_limits_unchanged']}; written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

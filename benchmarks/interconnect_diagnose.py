"""Why a node's copies or fabric state read wrong: raw NVML fabric calls and one-process copies.

Read-only. Prints, per GPU, what each NVML fabric call answers (the unversioned
nvmlDeviceGetGpuFabricInfo and nvmlDeviceGetGpuFabricInfoV with each struct version) beside what
gpuperfd's fabric_state() returns; then peer copies of ``--bytes`` between every ordered pair in ONE
process (no other context on either GPU), median of 10, the reference's method.

    python3 benchmarks/interconnect_diagnose.py [--bytes 1073741824]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def fabric_calls() -> None:
    import pynvml

    from gpuperfd.device.errors import DeviceError
    from gpuperfd.device.nvml import NvmlBackend

    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        for label, fn, struct in (
                ("unversioned", "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
                ("V v2", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                ("V v3", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t")):
            info = getattr(pynvml, struct)()
            try:
                getattr(pynvml, fn)(handle, ctypes.byref(info))
                fields = {name: getattr(info, name) for name, _ in info._fields_ if name != "clusterUuid"}
                print(f"GPU {i} {label}: {fields}")
            except pynvml.NVMLError as exc:
                print(f"GPU {i} {label}: NVMLError {exc.value} {exc}")
    pynvml.nvmlShutdown()
    backend = NvmlBackend(indices=None)
    for device in backend.devices():
        try:
            print(f"GPU {device.index} gpuperfd fabric_state(): {device.fabric_state()}")
        except DeviceError as exc:
            print(f"GPU {device.index} gpuperfd fabric_state(): {type(exc).__name__}: {exc}")
    backend.close()


def one_process_copies(nbytes: int) -> None:
    import torch

    n = torch.cuda.device_count()
    bufs = {i: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}").random_(0, 256) for i in range(n)}
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{b}")
            times = []
            with torch.cuda.device(a):
                for k in range(13):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dst.copy_(bufs[a], non_blocking=True)
                    end.record()
                    end.synchronize()
                    if k >= 3:
                        times.append(start.elapsed_time(end) / 1e3)
            ok = torch.equal(dst.to(f"cuda:{a}"), bufs[a])
            print(f"one process copy {a}->{b}: {nbytes / statistics.median(times) / 1e9:.1f} GB/s "
                  f"(median of {len(times)}, {nbytes >> 20} MiB, bytes ok {ok})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 30)
    args = parser.parse_args()
    fabric_calls()
    one_process_copies(args.bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The real interconnect executor: one worker process per GPU of the set, always all ended.

The workers (``python -m gpuperfd.probe_child.interconnect.worker``, started by module name; NCCL on
GPUs, gloo on a CPU) rendezvous on 127.0.0.1 and run the probe together; rank 0 writes the result as
JSON to a file (:meth:`InterconnectResult.to_dict`: nothing of torch crosses into the parent). Each
worker leads its own process group (``start_new_session``) and dies with its parent
(``PR_SET_PDEATHSIG``); with ``record_dir`` each is recorded as a probe child, so
:func:`~gpuperfd.probing.child.runner.end_leftover_children` ends what a SIGKILLed daemon left.

A collective does not fail by itself when one rank dies: the others block in it. So the parent
watches every worker and ends *all* of them (SIGTERM, then SIGKILL, each group) on every way out:

===========================  =====================================================
what happened                result
===========================  =====================================================
a rank raised                failed / ``exception``, ``oom`` or ``cuda_error`` (named rank)
a rank died by a signal      failed / ``crash``
a sum or copy came back      failed / ``wrong_result`` (the workers' own check)
wrong
timeout passed               failed / ``timeout``
a foreign compute process    skipped / ``preempted``: the probe gave way to a user's job
on a GPU of the set
``abort`` set                aborted / ``aborted``
===========================  =====================================================

Energy over the window is the sum over the set of each GPU's energy counter difference, read here
(the device layer), never in a worker. This module imports neither torch nor numpy.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD, INTERCONNECT_WORKER_MODULE, busy_reason, gave_way
from gpuperfd.probing.interconnect.gpu_set import check_set
from gpuperfd.probing.child.runner import (_LIVE, _LIVE_LOCK, _Child, _descendants, _kill, _log_tail, _record_child,
                                     _signal_name, child_env)

__all__ = ["ProcessInterconnectExecutor", "WORKER_MODULE"]

log = logging.getLogger(__name__)

WORKER_MODULE = INTERCONNECT_WORKER_MODULE
#: How long the other ranks may take to exit after rank 0 wrote the result (a hung teardown is ended).
_TEARDOWN_GRACE_SECONDS = 10.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous of rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _energy(devices: Sequence[Device]) -> float | None:
    """The set's summed energy counters (J); None when any GPU cannot report it."""
    try:
        return sum(d.energy_joules() for d in devices)
    except DeviceError:
        return None


class _Workers:
    """The started ranks: their processes, records and logs; :meth:`end` kills every group."""

    def __init__(self, folder: Path, record_dir: Path | None) -> None:
        self.folder = folder
        self.record_dir = record_dir
        self.procs: list[_Child] = []
        self.records: list[Path] = []

    def start(self, args: list[str], env: dict[str, str], rank: int) -> None:
        with open(self.folder / f"rank-{rank}.log", "wb") as logf:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                     start_new_session=True, env=env, close_fds=True)
        proc = _Child(popen)
        self.procs.append(proc)
        with _LIVE_LOCK:
            _LIVE[popen.pid] = proc
        if (record := _record_child(self.record_dir, popen.pid)) is not None:
            self.records.append(record)

    def pids(self) -> set[int]:
        """Every worker and everything below it (NCCL's helpers): ours on the GPUs."""
        out: set[int] = set()
        for proc in self.procs:
            out.add(proc.pid or 0)
            out |= _descendants(proc.pid or 0)
        return out

    def end(self) -> None:
        """Every rank gone, its group with it, its record removed (called on every way out)."""
        for proc in self.procs:
            _kill(proc, grace=0.5 if proc.is_alive() else 0)
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid or 0, None)
        for record in self.records:
            try:
                record.unlink()
            except OSError:
                pass

    def log_tail(self, rank: int) -> str:
        return _log_tail(str(self.folder / f"rank-{rank}.log"))


class ProcessInterconnectExecutor:
    """Runs the interconnect probe in worker processes (the :class:`InterconnectExecutor` protocol).

    ``device_kind``: ``cuda`` (NCCL, one rank per GPU of ``devices``) or ``cpu`` (gloo; one rank per
    device given, or ``ranks`` ranks standing for 0..ranks-1 when none is: nothing watched).
    ``inject_fault``: (rank, kind) for tests only (worker.FAULTS)."""

    def __init__(self, device_kind: str = "cuda", ranks: int | None = None, watch_interval: float = 0.1,
                 idle_utilization_threshold: float = DEFAULT_IDLE_THRESHOLD, idle_wait_seconds: float = 5.0,
                 record_dir: Path | str | None = None, env: dict[str, str] | None = None,
                 inject_fault: tuple[int, str] | None = None) -> None:
        if device_kind not in ("cuda", "cpu"):
            raise ValueError(f"device: must be cuda or cpu, got {device_kind!r}")
        self.device_kind = device_kind
        self.ranks = ranks
        self.watch_interval = watch_interval
        self.idle_utilization_threshold = idle_utilization_threshold
        self.idle_wait_seconds = idle_wait_seconds
        self.record_dir = Path(record_dir) if record_dir is not None else None
        self.env = dict(env or {})
        self.inject_fault = inject_fault
        #: The pids of the last run's workers (tests check none is left).
        self.last_pids: list[int] = []

    def gpus_for(self, devices: Sequence[Device], request: InterconnectRequest) -> tuple[int, ...]:
        """The set this run measures (ValueError naming what is wrong, before anything starts).

        With ``devices`` the set is checked against their indices (on a CPU each rank then stands
        for one of them, and they are watched as on GPUs); a CPU run without devices has ``ranks``."""
        if devices:
            return check_set(request.gpus, [d.index for d in devices])
        if self.device_kind == "cuda":
            raise ValueError("gpus: no GPUs given to the interconnect probe")
        node = list(range(self.ranks)) if self.ranks is not None else list(request.gpus or ())
        return check_set(request.gpus, node, what="rank")

    def run(self, devices: Sequence[Device], request: InterconnectRequest,
            abort: threading.Event) -> InterconnectResult:
        """Blocks until the run ends; every worker is gone when it returns (ValueError for a bad set)."""
        gpus = self.gpus_for(devices, request)
        watched = sorted((d for d in devices if d.index in gpus), key=lambda d: gpus.index(d.index))
        started_at, t0 = time.time(), time.monotonic()
        for device in watched:  # a user's job first: no worker starts on a busy GPU
            busy = busy_reason(device, self.idle_utilization_threshold, wait_seconds=self.idle_wait_seconds)
            if busy is not None:
                status, reason = gave_way(busy)
                return self._result(gpus, status, reason, f"GPU {device.index}: {busy.message}", started_at, t0)
        energy_before = _energy(watched) if watched else None
        folder = Path(tempfile.mkdtemp(prefix="gpuperfd-interconnect-"))
        workers = _Workers(folder, self.record_dir)
        try:
            self._start(workers, gpus, request)
            result = self._wait(workers, gpus, request, abort, watched, started_at, t0)
        finally:
            workers.end()
            self.last_pids = [p.pid or 0 for p in workers.procs]
            shutil.rmtree(folder, ignore_errors=True)
        energy_after = _energy(watched) if watched and energy_before is not None else None
        return _finish(result, energy_before, energy_after, time.monotonic() - t0)

    def _start(self, workers: _Workers, gpus: tuple[int, ...], request: InterconnectRequest) -> None:
        env = child_env({**self.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        env.pop("CUDA_VISIBLE_DEVICES", None)  # cuda:i must be NVML's GPU i
        body = {k: v for k, v in _request_dict(request).items() if k != "gpus"}
        port = free_port()
        for rank in range(len(gpus)):
            fault = self.inject_fault[1] if self.inject_fault and self.inject_fault[0] == rank else None
            args = [sys.executable, "-m", WORKER_MODULE, "--rank", str(rank), "--gpus", ",".join(map(str, gpus)),
                    "--device", self.device_kind, "--port", str(port), "--request", json.dumps(body),
                    "--out", str(workers.folder / "result.json"), "--error", str(workers.folder / f"error-{rank}.json"),
                    "--parent-pid", str(os.getpid()), *(["--fault", fault] if fault else [])]
            workers.start(args, env, rank)

    def _wait(self, workers: _Workers, gpus: tuple[int, ...], request: InterconnectRequest, abort: threading.Event,
              watched: Sequence[Device], started_at: float, t0: float) -> InterconnectResult:
        """Until every rank exited well (the result), or the first thing that ends them all."""
        deadline = t0 + request.timeout_seconds
        next_watch = time.monotonic()
        done_at: float | None = None  # when rank 0 exited well (the result is written)
        while True:
            if abort.is_set():
                return self._result(gpus, "aborted", "aborted", "interconnect probe aborted by the caller", started_at, t0)
            if time.monotonic() >= deadline:
                return self._result(gpus, "failed", "timeout", f"interconnect probe did not finish within "
                                    f"{request.timeout_seconds:.0f} s; every worker killed", started_at, t0)
            if watched and time.monotonic() >= next_watch:
                next_watch = time.monotonic() + self.watch_interval
                if (preempted := self._foreign(workers, watched, started_at, t0, gpus)) is not None:
                    return preempted
            codes = [p.exitcode for p in workers.procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                return self._rank_failure(workers, gpus, failed, codes[failed], started_at, t0)
            finished = all(c == 0 for c in codes) or (  # or rank 0 wrote it and a teardown hangs
                codes[0] == 0 and (done_at := done_at or time.monotonic()) + _TEARDOWN_GRACE_SECONDS < time.monotonic())
            if finished:
                # a process that came and went between two looks disturbed the copies all the same
                if watched and (preempted := self._foreign(workers, watched, started_at, t0, gpus)) is not None:
                    return preempted
                return self._read_result(workers, gpus, started_at, t0)
            abort.wait(0.05)

    def _foreign(self, workers: _Workers, watched: Sequence[Device], started_at: float, t0: float,
                 gpus: tuple[int, ...]) -> InterconnectResult | None:
        ours = workers.pids()
        for device in watched:
            try:
                foreign = sorted({p.pid for p in device.compute_processes()} - ours)
            except DeviceError:
                continue
            if foreign:
                return self._result(gpus, "skipped", "preempted",
                                    f"another compute process appeared on GPU {device.index} "
                                    f"(pid {', '.join(map(str, foreign))}); probe gave way", started_at, t0,
                                    foreign_pids=foreign, gpu=device.index)
        return None

    def _rank_failure(self, workers: _Workers, gpus: tuple[int, ...], rank: int, code: int | None,
                      started_at: float, t0: float) -> InterconnectResult:
        error_file = workers.folder / f"error-{rank}.json"
        try:
            body = json.loads(error_file.read_text())
        except (OSError, ValueError):
            body = None
        where = f"rank {rank} (GPU {gpus[rank]})"
        if body is not None:
            reason = body.get("reason") if body.get("reason") in ("exception", "oom", "cuda_error") else "exception"
            return self._result(gpus, "failed", reason, f"{where}: {body.get('message')}", started_at, t0,
                                rank=rank, traceback=body.get("traceback"))
        text = (f"{where} died with {_signal_name(-code)}" if code is not None and code < 0
                else f"{where} exited with code {code} without a result")
        tail = workers.log_tail(rank)
        return self._result(gpus, "failed", "crash", text + (f"\n--- rank log (tail) ---\n{tail}" if tail else ""),
                            started_at, t0, rank=rank, exit_code=code)

    def _read_result(self, workers: _Workers, gpus: tuple[int, ...], started_at: float,
                     t0: float) -> InterconnectResult:
        try:
            return InterconnectResult.from_dict(json.loads((workers.folder / "result.json").read_text()))
        except (OSError, ValueError, TypeError) as exc:
            return self._result(gpus, "failed", "crash", f"the workers exited without a readable result: {exc}",
                                started_at, t0)

    def _result(self, gpus: tuple[int, ...], status: str, reason: str | None, message: str | None,
                started_at: float, t0: float, **extra: Any) -> InterconnectResult:
        return InterconnectResult(gpus=gpus, status=status, failure_reason=reason, error_message=message,
                                  backend="nccl" if self.device_kind == "cuda" else "gloo", started_at=started_at,
                                  wall_seconds=time.monotonic() - t0, extra=extra)


def _request_dict(request: InterconnectRequest) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(request)


def _finish(result: InterconnectResult, before: float | None, after: float | None, wall: float) -> InterconnectResult:
    """The parent's own figures on the workers' result: wall time and energy over the window."""
    import dataclasses

    energy = after - before if before is not None and after is not None and after >= before else None
    extra = dict(result.extra)
    if result.wall_seconds is not None and result.ok:
        extra["workers_wall_seconds"] = result.wall_seconds
    return dataclasses.replace(result, wall_seconds=wall, energy_joules=energy, extra=extra)

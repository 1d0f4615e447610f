"""The probe child's entry point: ``python -m gpuperfd.probe_child.child --fd N --spec JSON ...``
(started by :class:`gpuperfd.probing.child.runner.ProbeChild`, by module name).

Kept free of top-level torch imports on purpose: it must start (and die with its
parent) before anything heavy loads.

Protocol over a two-way pipe, JSON messages only (:mod:`gpuperfd.probe_data.wire`): the
child builds the workload once (model, compile, CUDA graphs) and says ``ready``;
then for each ``measure`` request it measures one point at whatever cap the parent
has set and answers ``result``, with ``progress`` messages in between; ``build``
(with another spec) drops the workload and builds that one in the same process
(one child serves every probe of a sweep round: torch's import, the CUDA context
and the compile caches in memory are paid once); ``--defer-build`` and ``preload`` (with
the next spec) import a probe's code without building it, before the parent takes the GPU
(a ``build`` follows); ``stop`` or
the parent's end of the pipe closing ends it. Any exception is sent as ``error``
(reason, message, traceback) and ends the child: a CUDA error can poison the
context, so the parent starts a fresh child for the next point. The child's stdout and stderr go to a log file whose
tail the parent attaches to crash reports (faulthandler writes the native stack
there on SIGSEGV).
"""

from __future__ import annotations

import importlib
import faulthandler
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from gpuperfd.probe_data import wire

__all__ = ["main", "classify_exception"]

_CUDA_ERROR_MARKERS = (
    "cuda error",
    "cudaerror",
    "cublas_status",
    "cudnn_status",
    "cudnn error",
    "device-side assert",
    "illegal memory access",
    "nccl error",
    "cuda driver error",
)


def classify_exception(exc: BaseException) -> str:
    """Map an exception to a failure reason: "oom", "cuda_error", "exception", or the reason an
    exception names itself (``failure_reason``: "no_room", a point the card cannot hold)."""
    if getattr(exc, "failure_reason", None) == "no_room":
        return "no_room"
    torch = sys.modules.get("torch")
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError):
        return "oom"
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return "oom"
    if "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text:
        return "oom"
    if torch is not None and isinstance(exc, getattr(torch, "AcceleratorError", ())):
        return "cuda_error"
    if any(marker in text for marker in _CUDA_ERROR_MARKERS):
        return "cuda_error"
    return "exception"


def _redirect_output(log_path: str | None) -> None:
    """Send fd 1 and 2 to the log file (C libraries and faulthandler write there too)."""
    if not log_path:
        return
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to SIGKILL us when the parent dies (PR_SET_PDEATHSIG), and exit now if it
    already has: a probe must never outlive the daemon or CLI that started it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, 9, 0, 0, 0)  # SIGKILL
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:  # died before prctl took effect
        os._exit(4)


def _release_memory() -> None:
    """Free the dropped workload: Python objects, then the CUDA caching allocator's blocks."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _become_probe_process(log_path: str | None, parent_pid: int | None) -> None:
    """Die with the parent, lead our own process group, log to the file, nice ourselves, and fix
    the environment (GPU numbering, no network for models) before anything heavy loads."""
    die_with_parent(parent_pid)
    try:
        os.setpgid(0, 0)  # own process group: the parent can kill us and our workers at once
    except OSError:
        pass
    _redirect_output(log_path)
    faulthandler.enable()
    # The daemon runs probes as background work: a niced child leaves the exporter's
    # threads the CPU they need to answer scrapes on time (GPUPERFD_PROBE_NICE).
    try:
        niceness = int(os.environ.get("GPUPERFD_PROBE_NICE", "0"))
        if niceness > 0:
            os.nice(niceness)
    except (ValueError, OSError):
        pass
    # Deterministic GPU numbering (NVML order) and never reach the network for models.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda_initialized() -> bool:
    """Whether this process has a CUDA context (asked without making one): a deferred child must not."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


class _Session:
    """What one child holds between requests: the spec, the built workload, the import time to report."""

    def __init__(self, spec: Any, conn: Any, identity: dict[str, Any]) -> None:
        from gpuperfd.probe_child import harness, workloads

        self.harness, self.workloads = harness, workloads
        self.spec = spec
        self.conn = conn
        self.identity = identity
        self.prepared: Any = None
        self.import_seconds = 0.0

    def progress(self, **body: Any) -> None:
        wire.send(self.conn, "progress", body)

    def start(self, t_start: float, defer_build: bool, also: Sequence[tuple[str, str | None]] = ()) -> None:
        """The first ``ready``: after the imports only (deferred: this probe's; then ``also``'s, the other
        (probe, variant) pairs its round may run, while nothing is asked), or after the build."""
        if defer_build:
            self.workloads.preload(self.spec.probe, self.spec.variant)
            self.import_seconds = time.perf_counter() - t_start
            wire.send(self.conn, "ready", {"import_seconds": self.import_seconds, "deferred": True,
                                           "cuda_initialized": _cuda_initialized()})
            self.import_ahead(also)
        else:
            self.import_seconds = time.perf_counter() - t_start
            self.prepared = self.harness.prepare(self.spec, progress=self.progress, identity=self.identity)
            wire.send(self.conn, "ready", {"import_seconds": self.import_seconds,
                                           "setup_seconds": self.prepared.setup_seconds, **self.identity})

    def import_ahead(self, also: Sequence[tuple[str, str | None]]) -> None:
        """Import ``also``'s build code after ``ready``, one module at a time while no request waits: a
        child that imported every probe of its round before saying ready was ready later (llm's took 11.8 s
        from its turn on a lent H200, against 5-6 s), and a round that takes it now waits for one module
        at most (Dynamo, the largest, ~3 s) before its build starts."""
        for probe, variant in also:
            for name in self.workloads.build_imports(probe, variant):
                if self.conn.poll(0):
                    return
                importlib.import_module(name)

    def serve(self) -> None:
        """Answer requests until ``stop`` or the parent's end closes."""
        while True:
            try:
                kind, body = wire.recv(self.conn)
            except EOFError:  # the parent is gone or done with us
                return
            if kind == "stop":
                return
            if kind == "preload":
                self.preload(body)
            elif kind == "build":
                self.build(body)
            elif kind == "measure":
                self.measure(body)
            else:
                raise ValueError(f"unknown request {kind!r}")

    def preload(self, body: dict[str, Any]) -> None:
        """The round's next probe: drop this one, import that one's code, no build."""
        from gpuperfd.probe_data.spec import ProbeSpec

        t_preload = time.perf_counter()
        self.prepared = None
        _release_memory()
        self.spec = ProbeSpec.from_dict(body["spec"])
        self.workloads.preload(self.spec.probe, self.spec.variant)
        wire.send(self.conn, "ready", {"import_seconds": time.perf_counter() - t_preload, "deferred": True,
                                       "cuda_initialized": _cuda_initialized()})

    def build(self, body: dict[str, Any]) -> None:
        """Another probe in the same child: torch, CUDA context and caches stay."""
        from gpuperfd.probe_data.spec import ProbeSpec

        t_build = time.perf_counter()
        self.prepared = None  # the old workload's memory goes before the new one is built
        _release_memory()
        self.spec = ProbeSpec.from_dict(body["spec"])
        self.prepared = self.harness.prepare(self.spec, progress=self.progress, identity=self.identity)
        self.import_seconds = 0.0
        wire.send(self.conn, "ready", {"import_seconds": 0.0, "setup_seconds": self.prepared.setup_seconds,
                                       "rebuild_seconds": time.perf_counter() - t_build, **self.identity})

    def measure(self, body: dict[str, Any]) -> None:
        """One point at whatever cap the parent has set."""
        if self.prepared is None:
            raise ValueError("measure before build: nothing is built in this child")
        t_point = time.perf_counter()
        result = self.harness.measure(self.prepared, progress=self.progress,
                                      settle_seconds=float(body.get("settle_seconds", 0)))
        result.wall_seconds = time.perf_counter() - t_point
        result.extra["import_seconds"] = self.import_seconds if self.prepared.measured_points == 1 else 0.0
        wire.send(self.conn, "result", result.to_dict())


def _send_error(conn: Any, exc: BaseException, identity: dict[str, Any]) -> int:
    """Tell the parent why the child ends; the exit code (1, or 3 when even that fails)."""
    reason = classify_exception(exc)
    body = {
        "reason": reason,
        # a point without room says why in its own words ("preset: ... needs about ..."), field first
        "message": (str(exc) if reason == "no_room" else f"{type(exc).__name__}: {exc}")[:4000],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:],
        **identity,
    }
    try:
        traceback.print_exc()
        wire.send(conn, "error", body)
    except Exception:  # noqa: BLE001 - the parent will see a crash instead
        return 3
    return 1


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass


def main(spec_dict: dict[str, Any], conn: Any, log_path: str | None = None, parent_pid: int | None = None,
         defer_build: bool = False, also: Sequence[tuple[str, str | None]] = ()) -> None:
    """Build the probe once, then measure one point per ``measure`` request; exits with os._exit.

    ``defer_build``: import torch and what the probe's build needs (:func:`workloads.preload`),
    touch no GPU, say ``ready`` and wait for a ``build``: the parent starts the child before it
    takes the GPU, so the imports are not GPU time; ``also``: the other (probe, variant) pairs whose code
    it imports too (a round runs the GPU's due probes in one child). Every message is JSON
    (:mod:`gpuperfd.probe_data.wire`): the parent never unpickles anything.
    """
    t_start = time.perf_counter()
    _become_probe_process(log_path, parent_pid)
    code = 0
    identity: dict[str, Any] = {}
    try:
        from gpuperfd.probe_data.spec import ProbeSpec

        session = _Session(ProbeSpec.from_dict(spec_dict), conn, identity)
        session.start(t_start, defer_build, also)
        session.serve()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        code = _send_error(conn, exc, identity)
    finally:
        _close_quietly(conn)
    # Skip interpreter teardown: CUDA and NVML atexit handlers can hang after an error,
    # and the result is already with the parent.
    os._exit(code)


def _cli(argv: list[str] | None = None) -> None:
    """``python -m gpuperfd.probe_child.child``: the pipe is an inherited socket (``--fd``)."""
    import argparse
    import json

    from gpuperfd.probe_child.import_guard import mark_unused_absent

    mark_unused_absent()  # before anything imports torch or transformers

    parser = argparse.ArgumentParser(prog="gpuperfd.probe_child.child")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the parent (inherited)")
    parser.add_argument("--spec", required=True, help="the ProbeSpec as JSON")
    parser.add_argument("--defer-build", action="store_true",
                        help="import only (no GPU call), then wait for a build request")
    parser.add_argument("--preload-also", default="[]",
                        help="with --defer-build: JSON [[probe, variant], ...] whose code is imported too")
    parser.add_argument("--log", default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    also = [(str(probe), None if variant is None else str(variant)) for probe, variant in json.loads(args.preload_also)]
    main(json.loads(args.spec), wire.Channel.from_fd(args.fd), args.log, args.parent_pid, args.defer_build, also)


if __name__ == "__main__":
    _cli()

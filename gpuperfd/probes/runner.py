"""Run one probe in a child process and always come back with a :class:`ProbeResult`.

Why a child: a probe loads torch and a model, owns a CUDA context, and can run out
of memory, hit a CUDA error (which poisons the context for good), segfault in a
library or hang in a kernel. None of that may take the caller (the daemon, a
sweep, the CLI) down. The child is started with the ``spawn`` context (never
``fork``: a forked CUDA or NVML state is undefined), puts itself in its own process
group so compile workers die with it, and sends back one message: a result or a
classified error. Everything else is inferred here:

===========================  =====================================================
what happened                result
===========================  =====================================================
GPU not idle before start    failed / ``gpu_busy`` (the child is never started)
child raised                 failed / ``exception``, ``oom`` or ``cuda_error``
child died by a signal       failed / ``crash`` (e.g. SIGSEGV), log tail attached
child exited without a word  failed / ``crash``
hard timeout passed          failed / ``timeout`` (process group killed)
another GPU process appeared aborted / ``aborted`` (process group killed)
``should_abort()`` true      aborted / ``aborted``
===========================  =====================================================

After a kill the runner waits (briefly) for the child to vanish from the GPU's
process list, so the next probe starts on a free GPU.

No orphans: the child asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG``), the parent kills the child's process group on every exit
path (return, exception, ``atexit``), and with ``record_dir`` each child's pid
and start time are written to disk so that a restarted daemon ends what a
SIGKILLed one left (:func:`end_leftover_children`, start time checked first so a
reused pid is never killed).

This module imports neither torch nor transformers (checked by a test): the
daemon imports it and must stay small.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuperfd.device.base import Device
from gpuperfd.probes import child as _child
from gpuperfd.probes.result import ProbeResult
from gpuperfd.probes.spec import ProbeSpec, default_timeout

__all__ = ["run_probe", "check_idle", "ProgressCallback", "end_leftover_children"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[dict[str, Any]], None]

#: How long a child may take to exit after it has sent its result.
_EXIT_GRACE_SECONDS = 15.0
#: How long to wait for a killed child to leave the GPU's process list.
_FREE_WAIT_SECONDS = 10.0
_LOG_TAIL_BYTES = 4000


def _device_error_types() -> tuple[type[BaseException], ...]:
    from gpuperfd.device.errors import DeviceError

    return (DeviceError,)


def _compute_pids(device: Device) -> list[int] | None:
    """PIDs with a compute context on ``device``; None when the driver cannot tell."""
    try:
        return [p.pid for p in device.compute_processes()]
    except _device_error_types() as exc:
        log.debug("compute_processes unavailable: %s", exc)
        return None


def check_idle(
    device: Device,
    utilization_threshold: float = 0.1,
    own_pids: Iterable[int] = (),
    wait_seconds: float = 5.0,
    poll_interval: float = 0.25,
) -> str | None:
    """None if ``device`` is idle, else why not.

    Idle means: no compute process other than ``own_pids`` and SM utilization at or
    under the threshold. NVML's utilization covers the last sample period (up to a
    second), so right after a previous probe it can still read high; the check
    therefore retries for up to ``wait_seconds`` before giving up.
    """
    own = set(own_pids)
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    while True:
        reason = None
        pids = _compute_pids(device)
        foreign = sorted(set(pids or []) - own)
        if foreign:
            reason = f"GPU is in use by other compute process(es): pid {', '.join(map(str, foreign))}"
        else:
            try:
                util = device.utilization().gpu_ratio
            except _device_error_types():
                util = None
            if util is not None and util > utilization_threshold:
                reason = f"GPU utilization is {util:.0%}, above the idle threshold {utilization_threshold:.0%}"
        if reason is None or time.monotonic() >= deadline:
            return reason
        time.sleep(poll_interval)


def _descendants(pid: int) -> set[int]:
    """PIDs of every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for kid in children.get(stack.pop(), []):
            if kid not in out:
                out.add(kid)
                stack.append(kid)
    return out


def _kill(proc: multiprocessing.process.BaseProcess, grace: float = 1.0) -> None:
    """Terminate the child's process group (the child and anything it started), then kill it."""
    pid = proc.pid
    if pid is None:
        return

    def send(sig: int) -> None:
        try:
            if os.getpgid(pid) == pid:  # the child made its own group: take all of it
                os.killpg(pid, sig)
                return
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError, OSError):
            pass

    if proc.is_alive():
        send(signal.SIGTERM)
        proc.join(grace)
    if proc.is_alive():
        send(signal.SIGKILL)
        proc.join(10.0)
    else:
        # The leader is gone; make sure its group (compile workers) is too.
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass


#: Children running now, killed (with their groups) if this process exits normally mid-probe.
_LIVE: dict[int, multiprocessing.process.BaseProcess] = {}
_LIVE_LOCK = threading.Lock()
RECORD_PREFIX = "probe-child."


def _kill_live_children() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for proc in live:
        _kill(proc, grace=0.2)


atexit.register(_kill_live_children)


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _record_child(record_dir: Path | None, pid: int) -> Path | None:
    if record_dir is None:
        return None
    start = process_start_time(pid)
    path = Path(record_dir) / f"{RECORD_PREFIX}{pid}"
    try:
        Path(record_dir).mkdir(parents=True, exist_ok=True)
        path.write_text(f"{pid} {start}\n")
    except OSError as exc:
        log.warning("cannot record probe child %d in %s: %s", pid, record_dir, exc)
        return None
    return path


def end_leftover_children(record_dir: Path | str) -> list[int]:
    """End probe children a previous (killed) instance left running; returns the pids ended.

    A record names a pid and its start time; a pid whose start time differs is someone
    else's process now and is left alone. The child's whole process group is killed.
    """
    ended: list[int] = []
    try:
        records = sorted(Path(record_dir).glob(RECORD_PREFIX + "*"))
    except OSError:
        return ended
    for path in records:
        try:
            pid_text, start_text = path.read_text().split()[:2]
            pid, start = int(pid_text), int(start_text)
        except (OSError, ValueError):
            pid, start = 0, None
        if pid > 0 and start is not None and process_start_time(pid) == start:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError, OSError):
                    pass
            ended.append(pid)
            log.warning("ended probe child %d left running by an earlier gpuperfd", pid)
        try:
            path.unlink()
        except OSError:
            pass
    return ended


def _wait_gpu_free(device: Device | None, pid: int | None) -> bool | None:
    """True once ``pid`` holds no context on ``device`` (None: cannot tell)."""
    if device is None or pid is None:
        return None
    deadline = time.monotonic() + _FREE_WAIT_SECONDS
    while True:
        pids = _compute_pids(device)
        if pids is None:
            return None
        if pid not in pids:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - _LOG_TAIL_BYTES, 0))
            return fh.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def run_probe(
    spec: ProbeSpec,
    timeout_seconds: float | None = None,
    device: Device | None = None,
    idle_utilization_threshold: float = 0.1,
    watch_interval: float = 0.5,
    own_pids: Iterable[int] = (),
    on_progress: ProgressCallback | None = None,
    should_abort: Callable[[], bool] | None = None,
    idle_wait_seconds: float = 5.0,
    record_dir: Path | str | None = None,
) -> ProbeResult:
    """Run ``spec`` in a child process and return its result; never raises for child failures.

    ``device``: the GPU the probe will use, for the idle check before start and the
    watch for other compute processes while it runs (None: neither). ``own_pids``:
    processes of ours that may use the GPU (the child and its descendants are always
    allowed). ``on_progress`` receives the child's progress messages (phase, repeat).
    ``should_abort`` is polled; returning True stops the probe with status "aborted".
    ``record_dir``: where the child's pid and start time are recorded while it runs (the daemon's
    state directory), for :func:`end_leftover_children` after a crash.
    """
    timeout = float(timeout_seconds) if timeout_seconds is not None else default_timeout(spec)
    started_at = time.time()
    t0 = time.monotonic()
    own = set(own_pids)
    base: dict[str, Any] = {
        "probe": spec.probe,
        "variant": spec.variant,
        "preset": spec.preset,
        "params": spec.params(),
        "device": spec.device,
        "started_at": started_at,
    }

    def finish(reason: str, message: str, status: str = "failed", **extra: Any) -> ProbeResult:
        result = ProbeResult.failure(reason=reason, message=message, status=status, **base)
        result.wall_seconds = time.monotonic() - t0
        result.extra.update(extra)
        return result

    if device is not None:
        busy = check_idle(device, idle_utilization_threshold, own, wait_seconds=idle_wait_seconds)
        if busy is not None:
            return finish("gpu_busy", busy)

    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    fd, log_path = tempfile.mkstemp(prefix=f"gpuperfd-probe-{spec.probe}-", suffix=".log")
    os.close(fd)
    proc = ctx.Process(
        target=_child.main,
        args=(spec.to_dict(), sender, log_path, os.getpid()),
        name=f"gpuperfd-probe-{spec.probe}",
        daemon=False,  # a daemonic process may not start children; torch.compile needs workers
    )
    payload: tuple[str, Any] | None = None
    outcome: ProbeResult | None = None
    record: Path | None = None
    try:
        proc.start()
        with _LIVE_LOCK:
            _LIVE[proc.pid or 0] = proc
        record = _record_child(Path(record_dir) if record_dir is not None else None, proc.pid or 0)
        sender.close()  # the child holds the only writer: EOF when it dies
        deadline = t0 + timeout
        next_watch = time.monotonic()
        pipe_open = True
        while payload is None:
            now = time.monotonic()
            if now >= deadline:
                _kill(proc)
                freed = _wait_gpu_free(device, proc.pid)
                outcome = finish(
                    "timeout", f"probe did not finish within {timeout:.0f} s; child killed",
                    gpu_freed=freed, log_tail=_log_tail(log_path),
                )
                break
            if should_abort is not None and should_abort():
                _kill(proc)
                outcome = finish("aborted", "probe aborted by the caller", status="aborted",
                                 gpu_freed=_wait_gpu_free(device, proc.pid))
                break
            if device is not None and now >= next_watch:
                next_watch = now + watch_interval
                pids = _compute_pids(device)
                if pids:
                    allowed = own | {proc.pid} | _descendants(proc.pid or 0)
                    foreign = sorted(set(pids) - allowed)
                    if foreign:
                        _kill(proc)
                        outcome = finish(
                            "aborted",
                            f"another compute process appeared on the GPU (pid {', '.join(map(str, foreign))}); "
                            "probe aborted",
                            status="aborted",
                            foreign_pids=foreign,
                            gpu_freed=_wait_gpu_free(device, proc.pid),
                        )
                        break
            wait = min(deadline, next_watch if device is not None else deadline) - time.monotonic()
            wait = min(max(wait, 0.01), 0.2)
            if pipe_open and receiver.poll(wait):
                try:
                    kind, body = receiver.recv()
                except (EOFError, OSError):
                    pipe_open = False
                    continue
                if kind == "progress":
                    if on_progress is not None:
                        try:
                            on_progress(body)
                        except Exception:  # noqa: BLE001 - a UI callback must not stop the probe
                            log.exception("progress callback failed")
                    continue
                payload = (kind, body)
                break
            if not pipe_open:
                time.sleep(wait)
            if not proc.is_alive():
                # Drain what it sent before dying, then judge by the exit code.
                while pipe_open and receiver.poll(0):
                    try:
                        kind, body = receiver.recv()
                    except (EOFError, OSError):
                        pipe_open = False
                        break
                    if kind != "progress":
                        payload = (kind, body)
                        break
                if payload is None:
                    proc.join(1.0)
                    code = proc.exitcode
                    tail = _log_tail(log_path)
                    if code is not None and code < 0:
                        message = f"probe process died with {_signal_name(-code)}"
                    else:
                        message = f"probe process exited with code {code} without a result"
                    if tail:
                        message += f"\n--- child log (tail) ---\n{tail}"
                    outcome = finish("crash", message, exit_code=code, gpu_freed=_wait_gpu_free(device, proc.pid))
                break

        if payload is not None:
            proc.join(_EXIT_GRACE_SECONDS)
            if proc.is_alive():  # result is in hand; a teardown hang must not block us
                _kill(proc)
            kind, body = payload
            if kind == "result":
                outcome = ProbeResult.from_dict(body)
                outcome.started_at = started_at
                outcome.wall_seconds = time.monotonic() - t0
                outcome.extra.setdefault("child_wall_seconds", body.get("wall_seconds"))
            else:
                reason = body.get("reason", "exception")
                message = body.get("message", "probe failed")
                outcome = finish(
                    reason if reason in ("exception", "oom", "cuda_error") else "exception",
                    message,
                    traceback=body.get("traceback"),
                    exit_code=proc.exitcode,
                    gpu_freed=_wait_gpu_free(device, proc.pid),
                )
                for key in ("gpu_name", "compute_capability", "gpu_uuid"):
                    if body.get(key):
                        setattr(outcome, key, body[key])
    except BaseException:
        # KeyboardInterrupt or a bug here: never leave a probe running on the GPU.
        _kill(proc)
        raise
    finally:
        if proc.is_alive():
            _kill(proc)
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid or 0, None)
        if record is not None:
            try:
                record.unlink()
            except OSError:
                pass
        receiver.close()
        try:
            os.unlink(log_path)
        except OSError:
            pass
    assert outcome is not None
    return outcome

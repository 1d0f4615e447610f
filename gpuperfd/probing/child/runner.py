"""Run one probe in a child process and always come back with a :class:`ProbeResult`.

Why a child: a probe loads torch and a model, owns a CUDA context, and can run out
of memory, hit a CUDA error (which poisons the context for good), segfault in a
library or hang in a kernel. None of that may take the caller (the daemon, a
sweep, the CLI) down. The child is a fresh interpreter, ``python -m
gpuperfd.probe_child.child`` (never ``fork``: a forked CUDA or NVML state is
undefined), started in its own process group so compile workers die with it; it
speaks over one socket pair, passed as a file descriptor, and sends back results
or a classified error as JSON (:mod:`gpuperfd.probe_data.wire`: a pickle would import
torch here).

Why not ``multiprocessing``'s spawn: it starts multiprocessing's resource tracker
beside the daemon (a second Python process, 16.5 MB, a zombie after the daemon
exits) and the child's torch/tqdm locks register semaphores with it ("leaked
semaphore objects" at every shutdown). The pipe needs neither, so the daemon's
footprint stays one process. :class:`ProbeChild` keeps one child for several points (a warm sweep: build
once, measure per cap); the busy check before a start is its session's
(:class:`~gpuperfd.probing.child.session.WarmChildSession`). Everything else is inferred here:

===========================  =====================================================
what happened                result
===========================  =====================================================
GPU busy before start        skipped / ``preempted``: a user's job came first (the
                             child is never started); failed / ``gpu_busy`` only
                             when the driver cannot tell (:func:`~gpuperfd.probing.gates.idle.gave_way`)
child raised                 failed / ``exception``, ``oom`` or ``cuda_error``
child died by a signal       failed / ``crash`` (e.g. SIGSEGV), log tail attached
child exited without a word  failed / ``crash``
SIGKILL not sent by us       failed / ``host_oom`` when the cgroup's ``oom_kill``
                             count rose (or cannot be read), else ``crash``
hard timeout passed          failed / ``timeout`` (process group killed)
another GPU process appeared skipped / ``preempted`` (process group killed): the
                             probe gave way to a user's job, not a failure
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
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuperfd.device.base import Device
from gpuperfd.probe_data import wire
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.gates.idle import PROBE_CHILD_MODULE
from gpuperfd.system.cgroup_memory import oom_kill_count

__all__ = ["ProbeChild", "ProgressCallback", "end_leftover_children"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[dict[str, Any]], None]

#: How long a child may take to exit after it has sent its result.
_EXIT_GRACE_SECONDS = 15.0
#: How often a running child's parent looks for a user's job on its GPU. A read of the GPU's compute
#: processes costs 20 us at the median, 41 us at p99 on an H200 (benchmarks/watch_cost.py), so a
#: job waits at most this long to be seen, and the yield stays well inside 0.25 s.
WATCH_INTERVAL_SECONDS = 0.05
#: How long to wait for a killed child to leave the GPU's process list.
_FREE_WAIT_SECONDS = 10.0
_LOG_TAIL_BYTES = 4000


def _compute_pids(device: Device) -> list[int] | None:
    """PIDs with a compute context on ``device`` (the watch while a probe runs); None when the driver cannot tell."""
    from gpuperfd.device.errors import DeviceError

    try:
        return [p.pid for p in device.compute_processes()]
    except DeviceError as exc:
        log.debug("compute_processes unavailable: %s", exc)
        return None


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


#: The child's entry point, started by module name: the parent never imports the child package.
CHILD_MODULE = PROBE_CHILD_MODULE


class _Child:
    """A started probe child: the few process calls the runner needs, over ``subprocess.Popen``.

    It is reaped with ``os.wait4`` (not Popen's ``waitpid``) so that the kernel's account of its
    peak resident memory (``ru_maxrss``) comes back with its exit status: the admission of probe
    children (:mod:`gpuperfd.probing.gates.admission`) sizes the next rounds from it. The kernel folds the
    high-water mark of the memory the child was forked with (the parent's, before the exec) into
    it, so it errs high by at most the parent's size: the daemon's ~60 MB, the safe direction."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid: int | None = popen.pid
        #: The child's peak resident memory in bytes, known once it has been reaped.
        self.peak_rss_bytes: int | None = None
        self._lock = threading.Lock()

    def _reap(self) -> bool:
        """True once the child has exited (and was reaped here, its peak RSS kept)."""
        with self._lock:
            if self.popen.returncode is not None:
                return True
            try:
                pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: Popen knows its code
                return self.popen.poll() is not None
            if pid == 0:
                return False
            self.peak_rss_bytes = usage.ru_maxrss * 1024  # KiB on Linux
            self.popen.returncode = os.waitstatus_to_exitcode(status)
            return True

    def is_alive(self) -> bool:
        return not self._reap()

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while not self._reap():
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    @property
    def exitcode(self) -> int | None:
        """As multiprocessing's: negative for a signal, None while running."""
        self._reap()
        return self.popen.returncode


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours, the package's own folder first on ``PYTHONPATH`` (the child
    must import this very gpuperfd, however the parent found it), plus ``extra``."""
    import sysconfig

    import gpuperfd

    root = Path(gpuperfd.__file__).resolve().parent.parent
    env = dict(os.environ)
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if root not in installed:  # a source tree or a path the caller added: the child gets it too
        # (an installed package's folder is never put ahead of the standard library)
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def _kill(proc: _Child, grace: float = 1.0) -> None:
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
_LIVE: dict[int, _Child] = {}
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


class ProbeChild:
    """The parent's end of one probe child: built once, then measured at one cap per request.

    A warm sweep keeps one child for all its caps (model, compile and CUDA graphs
    once; :class:`~gpuperfd.probing.child.session.WarmChildSession`, which also checks the GPU is
    free before a child starts); a one-shot point is such a session of one point. Every wait watches the same
    things: the deadline, ``should_abort``, a foreign process on ``device``, the child
    dying. Any failure ends the child (a failed CUDA context is never reused), the
    failure comes back as a :class:`ProbeResult` (nothing raises for the child's
    faults), and :attr:`alive` turns False: the caller may start a new one.
    """

    def __init__(
        self,
        spec: ProbeSpec,
        device: Device | None = None,
        own_pids: Iterable[int] = (),
        watch_interval: float = WATCH_INTERVAL_SECONDS,
        on_progress: ProgressCallback | None = None,
        should_abort: Callable[[], bool] | None = None,
        record_dir: Path | str | None = None,
        env: dict[str, str] | None = None,
        on_peak: Callable[[str, int], None] | None = None,
    ) -> None:
        self.spec = spec
        #: With a deferred build: the other (probe, variant) pairs whose code the child imports before its
        #: GPU is taken (the probes its round may run after ``spec``'s).
        self.also_preload: tuple[tuple[str, str | None], ...] = ()
        #: Told (probe, peak host RSS in bytes) for each probe this child ran, once it has exited.
        self.on_peak = on_peak
        #: The child's peak resident memory in bytes, once it has exited (``ru_maxrss``).
        self.peak_rss_bytes: int | None = None
        self._probes: set[str] = set()
        self._oom_kills_at_start: int | None = None
        #: Extra environment for the child (e.g. compile cache folders under the state directory).
        self.env = dict(env or {})
        self.device = device
        self.own = set(own_pids)
        self.watch_interval = watch_interval
        self.on_progress = on_progress
        self.should_abort = should_abort
        self.record_dir = Path(record_dir) if record_dir is not None else None
        #: What the child said when it was built (setup_seconds, import_seconds, identity).
        self.ready: dict[str, Any] | None = None
        #: Parent-side seconds from spawn to ``ready``.
        self.start_seconds: float | None = None
        self._proc: _Child | None = None
        self._conn: Any = None
        self._log_path = ""
        self._record: Path | None = None
        self._dead = False
        #: Whether the child has reported progress on the current request (it began measuring).
        self.progressed = False
        #: Whether a workload is built in it (False after a deferred start or a preload).
        self.built = False
        #: Whether a request is out that the child has not answered yet (its start, a build, a point):
        #: it is busy (importing, building, measuring) and reads no ``stop`` until it is done.
        self.busy = False

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._dead and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _base(self, started_at: float) -> dict[str, Any]:
        spec = self.spec
        return {"probe": spec.probe, "variant": spec.variant, "preset": spec.preset, "params": spec.params(),
                "device": spec.device, "started_at": started_at}

    def start(self, deadline: float, defer_build: bool = False) -> ProbeResult | None:
        """Spawn the child and wait until it has built the workload; a failure result, or None when ready.

        ``defer_build``: the child only imports (torch, the probe's model code; no GPU call) and
        waits: :meth:`rebuild` builds it once the GPU is taken."""
        t0 = time.monotonic()
        self._probes.add(self.spec.probe)
        self._oom_kills_at_start = self.oom_kills()
        ours, theirs = socket.socketpair()
        fd, self._log_path = tempfile.mkstemp(prefix=f"gpuperfd-probe-{self.spec.probe}-", suffix=".log")
        args = [sys.executable, "-m", CHILD_MODULE, "--fd", str(theirs.fileno()), "--log", self._log_path,
                "--parent-pid", str(os.getpid()), "--spec", json.dumps(self.spec.to_dict()),
                *(["--defer-build"] if defer_build else []),
                *(["--preload-also", json.dumps(self.also_preload)] if defer_build and self.also_preload else [])]
        try:
            popen = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, pass_fds=(theirs.fileno(),),
                # Its own session and process group from the first instruction (setsid in the fork, no
                # preexec_fn: safe in a threaded daemon, and Python 3.10 has no process_group=):
                # killpg takes its compile workers too.
                start_new_session=True,
                env=child_env(self.env), close_fds=True,
            )
        finally:
            theirs.close()  # the child holds the only other end: EOF when it dies
            os.close(fd)
        self._conn = wire.Channel(ours)
        self._proc = _Child(popen)
        with _LIVE_LOCK:
            _LIVE[self._proc.pid or 0] = self._proc
        self._record = _record_child(self.record_dir, self._proc.pid or 0)
        message = self._answer(deadline, time.time(), t0)
        if isinstance(message, ProbeResult):
            return message
        self.ready = message
        self.start_seconds = time.monotonic() - t0
        self.built = not defer_build
        return None

    def preload(self, spec: ProbeSpec, deadline: float) -> ProbeResult | None:
        """Drop this child's workload and import ``spec``'s code without building it (no GPU call);
        a failure result (the child is then gone), or None when done. :meth:`rebuild` builds it."""
        return self._request("preload", spec, deadline, built=False)

    def rebuild(self, spec: ProbeSpec, deadline: float) -> ProbeResult | None:
        """Build another probe in this same child (its imports and CUDA context kept); a failure
        result (the child is then gone), or None when ready."""
        return self._request("build", spec, deadline, built=True)

    def _request(self, kind: str, spec: ProbeSpec, deadline: float, built: bool) -> ProbeResult | None:
        t0 = time.monotonic()
        started_at = time.time()
        if not self.alive:
            return self._failure("crash", "probe process is not running", started_at, t0)
        self.spec = spec
        self._probes.add(spec.probe)
        self.built = False
        try:
            wire.send(self._conn, kind, {"spec": spec.to_dict()})
        except (OSError, ValueError):
            pass  # it died: the wait below says how
        message = self._answer(deadline, started_at, t0)
        if isinstance(message, ProbeResult):
            return message
        self.ready = message
        self.start_seconds = time.monotonic() - t0
        self.built = built
        return None

    def measure(self, deadline: float, settle_seconds: float = 0.0, cap_watts: float | None = None) -> ProbeResult:
        """Measure one point at the cap set now (``cap_watts``, for the record); never raises for the child."""
        t0 = time.monotonic()
        started_at = time.time()
        self.progressed = False
        if not self.alive:
            return self._failure("crash", "probe process is not running", started_at, t0)
        try:
            wire.send(self._conn, "measure", {"settle_seconds": settle_seconds, "power_limit_watts": cap_watts})
        except (OSError, ValueError):
            pass  # it died: the wait below says how
        message = self._answer(deadline, started_at, t0)
        if isinstance(message, ProbeResult):
            return message
        result = ProbeResult.from_dict(message)
        result.started_at = started_at
        result.extra.setdefault("child_wall_seconds", message.get("wall_seconds"))
        result.wall_seconds = time.monotonic() - t0
        return result

    def _answer(self, deadline: float, started_at: float, t0: float) -> dict[str, Any] | ProbeResult:
        """:meth:`_await` with the child marked busy meanwhile (what :meth:`close` reads)."""
        self.busy = True
        try:
            return self._await(deadline, started_at, t0)
        finally:
            self.busy = False

    def close(self) -> None:
        """Ask the child to stop, then make sure it and its process group are gone; clean up.

        A busy child (importing, building, measuring: another thread waits for its answer) reads no
        ``stop`` until it is done, which took up to the 15 s grace for a child importing torch on a
        lent H200 and held the caller (the dispatcher, a round giving way) as long: it is killed at
        once. An idle child is asked, so it can end its CUDA context cleanly."""
        proc = self._proc
        if proc is None:
            return
        if self.busy:
            _kill(proc, grace=0.2)
        elif self.alive:
            try:
                wire.send(self._conn, "stop")
            except (OSError, ValueError):
                pass
            proc.join(_EXIT_GRACE_SECONDS)
        if proc.is_alive():  # a teardown hang must not block us
            _kill(proc)
        else:
            _kill(proc, grace=0)  # the leader is gone: its group (compile workers) goes too
        self._dead = True
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid or 0, None)
        if self._record is not None:
            try:
                self._record.unlink()
            except OSError:
                pass
            self._record = None
        try:
            self._conn.close()
        except OSError:
            pass
        try:
            os.unlink(self._log_path)
        except OSError:
            pass
        self._account(proc)

    #: The cgroup's OOM-kill count (a parameter for tests): read at start and when a child dies of SIGKILL.
    oom_kills: Callable[[], int | None] = staticmethod(oom_kill_count)

    def _account(self, proc: _Child) -> None:
        """The exited child's peak RSS, told once for each probe it ran (the admission's estimate)."""
        if self.peak_rss_bytes is not None or proc.peak_rss_bytes is None:
            return
        self.peak_rss_bytes = proc.peak_rss_bytes
        if self.on_peak is not None:
            for probe in sorted(self._probes):
                self.on_peak(probe, proc.peak_rss_bytes)

    def _death(self, code: int | None) -> tuple[str, str]:
        """(reason, words) for a child that died on its own: a SIGKILL we did not send is the
        kernel's OOM killer when the cgroup's ``oom_kill`` count rose (or cannot be read): the
        host's memory, never the GPU's fault."""
        if code is not None and code < 0:
            text = f"probe process died with {_signal_name(-code)}"
            if -code == signal.SIGKILL:
                before, after = self._oom_kills_at_start, self.oom_kills()
                if before is None or after is None or after > before:
                    seen = "the cgroup's oom_kill count rose" if after is not None and before is not None else \
                        "no OOM counter readable"
                    return "host_oom", (f"{text}, not sent by gpuperfd: killed for host memory ({seen}); "
                                        "see the memory limit and docs/operations.md, sizing")
            return "crash", text
        return "crash", f"probe process exited with code {code} without a result"

    def _failure(self, reason: str, message: str, started_at: float, t0: float, status: str = "failed",
                 **extra: Any) -> ProbeResult:
        result = ProbeResult.failure(reason=reason, message=message, status=status, **self._base(started_at))
        result.wall_seconds = time.monotonic() - t0
        result.extra.update(extra)
        return result

    def _end(self, reason: str, message: str, started_at: float, t0: float, status: str = "failed",
             **extra: Any) -> ProbeResult:
        """Kill the child and return the failure (the GPU is waited free first)."""
        proc = self._proc
        assert proc is not None
        _kill(proc)
        self._dead = True
        self._account(proc)
        extra.setdefault("gpu_freed", _wait_gpu_free(self.device, proc.pid))
        return self._failure(reason, message, started_at, t0, status, **extra)

    def _poll(self, wait: float) -> bool:
        """Whether a message waits (True also when the pipe broke: :meth:`_receive` then says closed)."""
        try:
            return bool(self._conn.poll(wait))
        except (OSError, ValueError):  # closed under us (close() from another thread)
            return True

    def _receive(self) -> tuple[str, dict[str, Any]] | None:
        """One message, or None when the pipe is closed or garbled (the child is then judged by its exit)."""
        try:
            return wire.recv(self._conn)
        except (EOFError, OSError, ValueError):
            return None

    def _await(self, deadline: float, started_at: float, t0: float) -> dict[str, Any] | ProbeResult:
        """Wait for the child's next ``ready`` or ``result`` body, passing progress on; a failure result otherwise."""
        proc = self._proc
        assert proc is not None
        device = self.device
        next_watch = time.monotonic()
        pipe_open = True
        while True:
            now = time.monotonic()
            if now >= deadline:
                timeout = deadline - t0
                return self._end("timeout", f"probe did not finish within {timeout:.0f} s; child killed",
                                 started_at, t0, log_tail=_log_tail(self._log_path))
            if self.should_abort is not None and self.should_abort():
                return self._end("aborted", "probe aborted by the caller", started_at, t0, status="aborted")
            if device is not None and now >= next_watch:
                next_watch = now + self.watch_interval
                pids = _compute_pids(device)
                if pids:
                    allowed = self.own | {proc.pid} | _descendants(proc.pid or 0)
                    foreign = sorted(set(pids) - allowed)
                    if foreign:
                        return self._end(  # a user's job wants the GPU: give it back, not a failure
                            "preempted",
                            f"another compute process appeared on the GPU (pid {', '.join(map(str, foreign))}); "
                            "probe gave way",
                            started_at, t0, status="skipped", foreign_pids=foreign,
                        )
            wait = min(deadline, next_watch if device is not None else deadline) - time.monotonic()
            wait = min(max(wait, 0.01), 0.2)
            if pipe_open and self._poll(wait):
                message = self._receive()
                if message is None:
                    pipe_open = False
                    continue
                kind, body = message
                if kind == "progress":
                    self.progressed = True
                    if self.on_progress is not None:
                        try:
                            self.on_progress(body)
                        except Exception:  # noqa: BLE001 - a UI callback must not stop the probe
                            log.exception("progress callback failed")
                    continue
                if kind in ("ready", "result"):
                    return body
                return self._error(body, started_at, t0)
            if not pipe_open:
                time.sleep(wait)
            if not proc.is_alive():
                # Drain what it sent before dying, then judge by the exit code.
                while pipe_open and self._poll(0):
                    message = self._receive()
                    if message is None:
                        break
                    if message[0] in ("ready", "result"):
                        self._dead = True
                        return message[1]
                    if message[0] == "error":
                        return self._error(message[1], started_at, t0)
                proc.join(1.0)
                code = proc.exitcode
                tail = _log_tail(self._log_path)
                reason, text = self._death(code)
                if tail:
                    text += f"\n--- child log (tail) ---\n{tail}"
                return self._end(reason, text, started_at, t0, exit_code=code)

    def _error(self, body: dict[str, Any], started_at: float, t0: float) -> ProbeResult:
        """The child reported an exception (and exits): a failure result with its traceback."""
        proc = self._proc
        assert proc is not None
        proc.join(_EXIT_GRACE_SECONDS)
        reason = body.get("reason", "exception")
        if reason == "no_room":  # the point does not fit this card: not run, not the GPU's failure
            result = self._end(reason, str(body.get("message", "no room")), started_at, t0, status="skipped",
                               exit_code=proc.exitcode)
        else:
            result = self._end(
                reason if reason in ("exception", "oom", "cuda_error") else "exception",
                str(body.get("message", "probe failed")), started_at, t0,
                traceback=body.get("traceback"), exit_code=proc.exitcode,
            )
        for key in ("gpu_name", "compute_capability", "gpu_uuid"):
            if body.get(key):
                setattr(result, key, body[key])
        return result


"""Process helpers the tests share: whether a child (probe or daemon) is still running, and ending one."""

from __future__ import annotations

import signal
import subprocess


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a SIGKILLed child not yet reaped is dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().decode(errors="replace").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def end(proc: subprocess.Popen, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int:
    """``proc`` ended: sent ``sig`` if still running, SIGKILLed if it has not exited ``timeout`` seconds
    later, and reaped; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode

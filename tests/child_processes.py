"""Process helpers the tests share: whether a child (probe or daemon) is still running."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a SIGKILLed child not yet reaped is dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().decode(errors="replace").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""The one emergency command: every cap of ours back, in every state directory, truthfully.

``gpuperfd apply --revert`` and ``gpuperfd restore-caps`` both run :func:`restore_everything`: every
journal entry of ours (apply mode's and a sweep's, a corrupt one too) in the configured state directory
and every other one the node's registry names. Each GPU's cap lock is taken first (waiting a little for a
sweep's point), so a running daemon's pass or sweep never races it: the daemon finds its entry gone and
the operator's cap back, and leaves the GPU quietly. Each cap is put back by the one rule
(:func:`~gpuperfd.caps.journal.put_back`: only over a cap we set), and the words say what the
board reads afterwards. A missing or unreadable state directory is refused (exit 2, the path named).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuperfd.caps.journal import CapJournal, CapRecord, CorruptJournal, restore_pending
from gpuperfd.caps.ownership import GpuBusy, safe_name
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError


@dataclass(frozen=True)
class Restored:
    """One journal entry handled (``ok``: no cap of ours is left changed by it)."""

    gpu: int
    ok: bool
    words: str
    #: A live sweep owns the GPU and returns to the cap it found itself (not a failure of this command).
    owned: bool = False


def state_dir_problem(state_dir: Path) -> str | None:
    """Why ``state_dir`` cannot be searched for a journal (missing, not a directory, unreadable), or None."""
    if not state_dir.exists():
        return f"state directory {state_dir} does not exist: no power-cap journal there"
    if not state_dir.is_dir():
        return f"state directory {state_dir} is not a directory: no power-cap journal there"
    try:
        os.listdir(state_dir)
    except OSError as exc:
        return f"state directory {state_dir} is unreadable ({exc.strerror or exc}): its journal cannot be read"
    return None


def _newest_first(journals: Iterable[CapJournal]) -> list[CapJournal]:
    """Where two directories hold an entry for one GPU, the newer is put back first (as at start)."""
    def newest(journal: CapJournal) -> float:
        return max((e.recorded_at for _, e in journal.entries() if isinstance(e, CapRecord)), default=0.0)

    return sorted(journals, key=newest, reverse=True)


def restore_everything(journals: Iterable[CapJournal], devices: Sequence[Device],
                       wait_seconds: float = 10.0) -> list[Restored]:
    """Every entry of every journal put back under its GPU's lock (a live daemon's applied caps too)."""
    by_name: dict[str, Device] = {}
    for device in devices:
        try:
            by_name[safe_name(device.info().uuid)] = device
        except DeviceError:
            continue
    done: list[Restored] = []
    for journal in _newest_first(journals):
        for path, entry in journal.entries():
            name = path.name[: -len(CapJournal.SUFFIX)]
            device = by_name.get(name)
            index = entry.gpu_index if isinstance(entry, CapRecord) else -1
            if device is None:
                done.append(Restored(index, False, f"{path}: its GPU is not on this node; entry kept"))
                continue
            done.append(_one(journal, path, name, entry, device, wait_seconds))
    return done


def _one(journal: CapJournal, path: Path, name: str, entry: CapRecord | CorruptJournal, device: Device,
         wait_seconds: float) -> Restored:
    lock = journal.lock(name)
    try:
        lock.acquire(wait_seconds=wait_seconds)
    except GpuBusy as busy:
        who = f"pid {busy.owner_pid}" if busy.owner_pid else "another process"
        return Restored(device.index, False, f"gpu {device.index}: {path}: a running sweep ({who}) owns this GPU "
                                             "and restores it when it ends; not touched (run this again then)",
                        owned=True)
    except OSError as exc:
        return Restored(device.index, False, f"gpu {device.index}: {path}: cannot take the GPU's cap lock in "
                                             f"{journal.state_dir} ({exc.strerror or exc}); not touched")
    try:
        actions = restore_pending(journal, [device], only=[name], lock=False, applied_too=True)
    finally:
        lock.release()
    try:
        reads = f"{device.power_limits().enforced_watts:.0f} W"
    except DeviceError as exc:
        reads = f"unreadable ({exc.reason})"
    left = os.path.lexists(path)
    what = "; ".join(actions) or f"gpu {device.index}: not restored"
    if isinstance(entry, CapRecord) and what.startswith(f"gpu {device.index}: {entry.original_watts:.0f} W"):
        what = what.replace(f"{entry.original_watts:.0f} W", f"operator's cap {entry.original_watts:.0f} W back", 1)
    was = (f" (apply mode held {entry.applied_watts:.0f} W)" if isinstance(entry, CapRecord)
           and entry.applied_watts is not None else "")
    words = f"{what}{was}; the board reads {reads}" + (f"; entry kept: {path}" if left else "")
    return Restored(device.index, not left, words)

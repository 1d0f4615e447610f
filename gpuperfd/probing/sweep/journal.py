"""The power-cap journal: the operator's original limit, on disk before any change.

One small JSON file per GPU (keyed by UUID, so a renumbered GPU is still found)
in the state directory. It is written atomically (temp file, fsync, rename,
fsync of the directory) before the first cap change and removed after the
original limit is back. A file left behind means the daemon died mid-sweep;
:func:`restore_pending` puts the original limit back at the next start, before
anything else runs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError, InvalidArgument

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class CapRecord:
    uuid: str
    gpu_index: int
    original_watts: float
    default_watts: float
    recorded_at: float
    pid: int


class CorruptJournal(Exception):
    """A journal file that cannot be parsed; carries its path."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: unreadable power-cap journal entry ({reason})")
        self.path = path


class CapJournal:
    """Records and clears original power limits in ``state_dir``."""

    SUFFIX = ".cap.json"

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)

    def _path(self, uuid: str) -> Path:
        return self.state_dir / (_SAFE.sub("_", uuid) + self.SUFFIX)

    def record(self, device: Device, original_watts: float, default_watts: float) -> CapRecord:
        """Persist the original limit; raises OSError if it cannot be made durable."""
        info = device.info()
        record = CapRecord(info.uuid, device.index, original_watts, default_watts, time.time(), os.getpid())
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._path(info.uuid)
        if path.exists():  # an earlier, unrestored change: its original is the true one
            try:
                return self._read(path)
            except CorruptJournal:
                log.warning("replacing unreadable journal entry %s", path)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(asdict(record), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return record

    def clear(self, uuid: str) -> None:
        self._path(uuid).unlink(missing_ok=True)

    def _read(self, path: Path) -> CapRecord:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            record = CapRecord(
                uuid=str(data["uuid"]),
                gpu_index=int(data["gpu_index"]),
                original_watts=float(data["original_watts"]),
                default_watts=float(data["default_watts"]),
                recorded_at=float(data.get("recorded_at", 0.0)),
                pid=int(data.get("pid", 0)),
            )
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise CorruptJournal(path, f"{type(exc).__name__}: {exc}") from None
        if not 0 < record.original_watts < math.inf:  # NaN, inf, 0 or negative: not a cap anyone set
            raise CorruptJournal(path, f"original_watts {record.original_watts!r} is not a usable power limit")
        return record

    def entries(self) -> list[tuple[Path, CapRecord | CorruptJournal]]:
        """Every journal file with its record, or the parse error for a corrupt one."""
        if not self.state_dir.is_dir():
            return []
        found: list[tuple[Path, CapRecord | CorruptJournal]] = []
        for path in sorted(self.state_dir.glob("*" + self.SUFFIX)):
            try:
                found.append((path, self._read(path)))
            except CorruptJournal as exc:
                found.append((path, exc))
        return found



def _remove(path: Path) -> None:
    """Delete a handled journal entry; one that cannot be deleted is logged, never fatal at start."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove journal entry %s: %s; remove it by hand", path, exc)


def _uuid_from_filename(path: Path) -> str:
    return path.name[: -len(CapJournal.SUFFIX)]


def restore_pending(journal: CapJournal, devices: Iterable[Device]) -> list[str]:
    """Put back every original limit the journal holds; returns what was done, for logs.

    A corrupt entry cannot say what the operator had, so the safe action is the
    board's default limit (logged as such). Entries for GPUs not present stay on
    disk for a later start. Never raises for a single GPU's failure.
    """
    by_uuid: dict[str, Device] = {}
    for device in devices:
        try:
            by_uuid[device.info().uuid] = device
        except DeviceError as exc:
            log.warning("gpu %d: cannot read identity to check the cap journal: %s", device.index, exc)
    actions: list[str] = []
    for path, entry in journal.entries():
        if isinstance(entry, CorruptJournal):
            uuid_guess = _uuid_from_filename(path)
            device = next((d for u, d in by_uuid.items() if _SAFE.sub("_", u) == uuid_guess), None)
            if device is None:
                log.error("%s; no matching GPU, leaving it for inspection", entry)
                continue
            try:
                default = device.power_limits().default_watts
                device.set_power_limit(default)
            except DeviceError as exc:
                log.error("%s; restoring the default limit failed: %s", entry, exc)
                continue
            log.error("%s; restored gpu %d to its default limit %.0f W as the safe choice", entry, device.index, default)
            _remove(path)
            actions.append(f"gpu {device.index}: default {default:.0f} W (corrupt journal)")
            continue
        device = by_uuid.get(entry.uuid)
        if device is None:
            log.warning("journal holds a cap for %s, which is not on this node now; kept", entry.uuid)
            continue
        try:
            device.set_power_limit(entry.original_watts)
        except InvalidArgument as exc:  # the board refuses the recorded value: the default is the safe choice
            try:
                default = device.power_limits().default_watts
                device.set_power_limit(default)
            except DeviceError as exc2:
                log.error("gpu %d: restoring the default limit failed: %s", device.index, exc2)
                continue
            log.error(
                "gpu %d: the board refused the journal's original cap %.0f W (%s); restored its default limit %.0f W",
                device.index, entry.original_watts, exc, default,
            )
            _remove(path)
            actions.append(f"gpu {device.index}: default {default:.0f} W (journal cap refused)")
            continue
        except DeviceError as exc:
            log.error("gpu %d: restoring original cap %.0f W failed: %s", device.index, entry.original_watts, exc)
            continue
        _remove(path)
        log.warning(
            "gpu %d: restored original power cap %.0f W left changed by pid %d", device.index, entry.original_watts, entry.pid
        )
        actions.append(f"gpu {device.index}: {entry.original_watts:.0f} W")
    return actions

"""The operator's word on a GPU's cap, kept on disk until the operator gives the GPU back (issue 61).

When apply mode finds a cap on the board that is not one it set (an operator's ``nvidia-smi -pl``), it
leaves the GPU and never fights the cap. That choice must outlive the process: before this file, a
restart forgot it and applied the recommended cap over the operator's again. So the controller writes
an :class:`OperatorHold` (``<uuid>.operator-hold.json`` in the state directory, atomically: temp file,
fsync, rename, fsync of the directory) and every pass, in this and every later process, reads it
before deciding anything: a held GPU is never applied. Only the operator ends a hold:
``gpuperfd apply --release GPU`` or ``POST /api/v1/apply/release?gpu=N`` (:func:`release_hold`).

Holds are read from the configured state directory and every other one in the node's registry (as
the cap journal is: :func:`~gpuperfd.caps.journal.journals_for`), so a state directory
changed by an edit or a reload hides none; a release removes the GPU's hold from all of them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuperfd.caps.ownership import safe_name
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.system.files import replace_file

log = logging.getLogger(__name__)

SUFFIX = ".operator-hold.json"
#: A hold is ~300 bytes; anything much larger is not one (and is not read whole).
MAX_HOLD_BYTES = 16 * 1024


@dataclass(frozen=True)
class OperatorHold:
    """One GPU an operator took from apply mode: the cap found on the board and since when."""

    uuid: str
    gpu_index: int
    watts: float
    #: Wall-clock seconds when apply mode found the operator's cap.
    since: float
    detail: str = ""
    #: ``overridden`` (a cap of their own: the override alert stands) or ``reverted`` (their own cap set
    #: back by hand: the GPU stays out quietly, as at the moment it left).
    kind: str = "overridden"

    def since_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))


class ReleaseError(ValueError):
    """A release that cannot be done; the message says why."""


class NoSuchGpu(ReleaseError):
    """The GPU named is not on this node."""


class NotHeld(ReleaseError):
    """No operator holds the GPU named: there is nothing to give back."""


def _path(state_dir: Path, uuid: str) -> Path:
    return Path(state_dir) / (safe_name(uuid) + SUFFIX)


def write_hold(state_dir: Path, hold: OperatorHold) -> bool:
    """Keep ``hold`` in ``state_dir``, durably; False (logged) when it cannot be written: the GPU is
    still left alone by this process, but a restart would not know it."""
    try:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        replace_file(_path(state_dir, hold.uuid), json.dumps(asdict(hold)).encode(), 0o600)
    except OSError as exc:
        log.error("gpu %d: cannot keep the operator's %.0f W in %s (%s): a restart would apply over it",
                  hold.gpu_index, hold.watts, state_dir, exc.strerror or exc)
        return False
    return True


def _read(path: Path) -> OperatorHold | None:
    """One hold file, or None (logged) when it is not a small regular file holding a hold."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _unreadable(path, exc.strerror or str(exc))
    try:
        raw = os.read(fd, MAX_HOLD_BYTES + 1)
        if len(raw) > MAX_HOLD_BYTES:
            raise ValueError("too large")
        data = json.loads(raw)
        return OperatorHold(str(data["uuid"]), int(data["gpu_index"]), float(data["watts"]), float(data["since"]),
                            str(data.get("detail", "")), str(data.get("kind", "overridden")))
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return _unreadable(path, type(exc).__name__)
    finally:
        os.close(fd)


def _unreadable(path: Path, why: str) -> OperatorHold:
    """A hold file that cannot be read still holds its GPU: an unreadable word of the operator's frees nothing."""
    log.warning("%s: unreadable operator hold (%s); the GPU stays held until given back", path, why)
    return OperatorHold(path.name[: -len(SUFFIX)], -1, 0.0, 0.0, f"unreadable hold file {path}")


def hold_of(state_dirs: Iterable[Path], uuid: str) -> OperatorHold | None:
    """The GPU's hold in the first of ``state_dirs`` that keeps one, or None."""
    for state_dir in state_dirs:
        found = _read(_path(state_dir, uuid))
        if found is not None:
            return found
    return None


def holds_in(state_dirs: Iterable[Path]) -> list[OperatorHold]:
    """Every GPU's hold (one per UUID, the first directory's), by GPU index."""
    found: dict[str, OperatorHold] = {}
    for state_dir in state_dirs:
        if not Path(state_dir).is_dir():
            continue
        for path in sorted(Path(state_dir).glob("*" + SUFFIX)):
            hold = _read(path)
            if hold is not None:
                found.setdefault(safe_name(hold.uuid), hold)
    return sorted(found.values(), key=lambda h: (h.gpu_index, h.uuid))


def release_hold(state_dirs: Sequence[Path], devices: Sequence[Device], gpu: int) -> OperatorHold:
    """Give GPU ``gpu`` (an index of ``devices``) back to apply mode: its hold goes from every state
    directory. NoSuchGpu, NotHeld (both ReleaseError), each naming the GPU and what was wrong."""
    device = next((d for d in devices if d.index == gpu), None)
    if device is None:
        have = ", ".join(str(d.index) for d in devices) or "none"
        raise NoSuchGpu(f"GPU {gpu} does not exist on this node (its GPUs: {have})")
    try:
        uuid = device.info().uuid
    except DeviceError as exc:
        raise ReleaseError(f"GPU {gpu}: cannot read its identity ({exc}); nothing released") from None
    hold = hold_of(state_dirs, uuid)
    if hold is None:
        searched = ", ".join(str(d) for d in state_dirs)
        raise NotHeld(f"GPU {gpu} is not held by an operator (no hold in {searched}): nothing to give back")
    for state_dir in state_dirs:
        try:
            _path(state_dir, uuid).unlink(missing_ok=True)
        except OSError as exc:
            raise ReleaseError(f"GPU {gpu}: cannot remove its hold in {state_dir} ({exc.strerror or exc}); "
                               "the GPU stays held") from None
    log.warning("gpu %d: the operator gave the GPU back to apply mode (held at %.0f W since %s)", gpu, hold.watts,
                hold.since_text())
    return hold

"""The power-cap journal: the operator's original limit, on disk before any change.

One small JSON file per GPU (keyed by UUID, so a renumbered GPU is still found)
in the state directory. It is written atomically (temp file, fsync, rename,
fsync of the directory) before the first cap change and removed after the
original limit is back. A file left behind means the daemon died mid-sweep;
:func:`restore_pending` puts the original limit back at the next start, before
anything else runs.

Where a journal may be: the state directory is a setting, and a reload or an
edited config can change it while a sweep journals in the old one. So every
directory that ever held an entry is first written to the node's *registry of
state directories* (:func:`node_registry`: a fixed file, not a setting) and every
start restores from all of them (:func:`journals_for`, :func:`restore_all`).

Whose cap is on the board (issue 51). NVML says what a limit is, never who set it. So every write of
ours is journaled *before* it happens (:meth:`CapJournal.intend`: the cap it replaces and the one it
sets, with the writer's pid and process start time), and every write that puts a cap back goes
through one rule, :func:`put_back`: read the cap; write only if it is one we set (the entry's last
pair, or the applied cap); otherwise the cap is someone else's (an operator's), it stays, and the
journal's decisions file (:data:`DECISIONS`) records whom we believed. A writer that died leaves its
pair behind, so a cap it left is told from an operator's: it is one of the two caps of its pair.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from typing import TYPE_CHECKING

from gpuperfd.caps.ownership import GpuBusy, GpuLock, apply_lock_name, is_owned, safe_name
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError, InvalidArgument
from gpuperfd.system.files import replace_file

if TYPE_CHECKING:
    from gpuperfd.config import Config

log = logging.getLogger(__name__)

#: The registry of state directories on a node with real GPUs. Fixed on purpose (the unit's
#: StateDirectory): no reloadable or per-command setting may move it.
NODE_REGISTRY = Path("/var/lib/gpuperfd/state-dirs.json")
#: Beside a simulated node's ``simulation.state_file`` (its "boards"): the registry of that node.
SIMULATED_REGISTRY_SUFFIX = ".state-dirs.json"
#: More directories than anyone uses; a registry beyond this is cut to the ones still on disk.
MAX_REGISTERED = 256

#: A journal entry is ~200 bytes; anything much larger is not one (and is not read whole).
MAX_ENTRY_BYTES = 64 * 1024
#: Beside the node's registry: one cap lock per GPU for every state directory (ownership.GpuLock).
NODE_LOCKS = "gpuperfd-cap-locks"
#: In each state directory: one JSON line per cap we found changed, whom we took it for, what we did.
DECISIONS = "cap-decisions.jsonl"
MAX_DECISIONS_BYTES = 256 * 1024


@dataclass(frozen=True)
class CapRecord:
    uuid: str
    gpu_index: int
    original_watts: float
    default_watts: float
    recorded_at: float
    pid: int
    #: The cap ``gpuperfd apply`` holds on this GPU (None: a sweep's entry). A sweep on an applied GPU
    #: returns to the cap it found and leaves the entry; a restore puts ``original_watts`` back.
    applied_watts: float | None = None
    #: A sweep on the applied GPU could not put the applied cap back: the cap it left is not someone
    #: else's choice, so apply mode rolls back to ``original_watts`` instead of leaving it there.
    sweep_unrestored: bool = False
    #: The last write of ours, journaled before it was made: the cap it replaced and the one it set.
    #: A writer killed around that write leaves one of the two on the board; any other cap is not ours.
    #: None in an entry of an older version (whose every cap is taken for its writer's, as before).
    last_from: float | None = None
    last_to: float | None = None
    #: The last writer's process start time (clock ticks after boot, /proc/PID/stat field 22): with
    #: ``pid`` it names one process, never a later one that reuses the pid (0: unknown).
    pid_start: int = 0

    def ours(self) -> set[int]:
        """The caps (rounded watts) a writer of ours may have left on the board."""
        return {round(w) for w in (self.last_from, self.last_to, self.applied_watts) if w is not None}

    def knows_its_writes(self) -> bool:
        return self.last_to is not None

    def writer_alive(self) -> bool:
        """True while the process that last wrote this entry runs (never true for this process)."""
        return self.pid != os.getpid() and self.pid_start != 0 and process_start(self.pid) == self.pid_start


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields after its last ')'
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def own_identity() -> tuple[int, int]:
    """(pid, process start time) of this process, for the journal's writer fields."""
    pid = os.getpid()
    return pid, process_start(pid) or 0


class CapChangedByOther(Exception):
    """The cap is not the one we set: someone else (an operator) changed it; theirs stays."""

    def __init__(self, gpu: int, found: float, ours: float | None) -> None:
        said = f"not the {ours:.0f} W we set" if ours is not None else "not one we set"
        super().__init__(f"gpu {gpu}: the cap reads {found:.0f} W, {said}: someone else changed it; theirs stays")
        self.found = found


class CorruptJournal(Exception):
    """A journal file that cannot be parsed; carries its path."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: unreadable power-cap journal entry ({reason})")
        self.path = path


class JournalWriteError(OSError):
    """The journal entry could not be made durable; nothing was changed and no temp file is left."""


class CapJournal:
    """Records and clears original power limits in ``state_dir``.

    ``registry``: the node's registry of state directories (:func:`node_registry`); the
    directory is registered there before its first entry is written (None: not registered,
    e.g. simulated GPUs whose limits die with the process).
    """

    SUFFIX = ".cap.json"

    def __init__(self, state_dir: Path | str, registry: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.registry = registry

    @classmethod
    def for_config(cls, config: Config) -> CapJournal:
        """The journal of ``config``'s state directory, registered in its node's registry."""
        return cls(config.probes.state_dir, node_registry(config))

    def _path(self, uuid: str) -> Path:
        return self.state_dir / (safe_name(uuid) + self.SUFFIX)

    def lock(self, name: str) -> GpuLock:
        """The cap lock of GPU ``name`` (safe UUID) for writers of this journal: this directory's, and the
        node's (beside its registry) so writers journaling in other state directories are excluded too."""
        node = None if self.registry is None else self.registry.parent / NODE_LOCKS
        return GpuLock(self.state_dir, name, node)

    def path_for(self, uuid: str) -> Path:
        return self._path(uuid)

    def record(self, device: Device, original_watts: float, default_watts: float,
               applied_watts: float | None = None, to_watts: float | None = None) -> CapRecord:
        """Persist the original limit; JournalWriteError (one clear line) if it cannot be made durable.

        An existing entry's original is kept (it is the true one); ``applied_watts`` (apply mode) is
        written into it, so the operator's cap journaled first is never lost. ``to_watts``: the cap
        about to be set (journaled with the one it replaces, see :meth:`intend`); default the applied one."""
        info = device.info()
        pid, start = own_identity()
        target = applied_watts if to_watts is None else to_watts
        record = CapRecord(info.uuid, device.index, original_watts, default_watts, time.time(), pid,
                           applied_watts, last_from=original_watts if target is not None else None,
                           last_to=target, pid_start=start)
        path = self._path(info.uuid)
        if os.path.lexists(path):  # an earlier, unrestored change: its original is the true one
            try:
                earlier = self._read(path)
                if applied_watts is None or earlier.applied_watts == applied_watts:
                    return earlier
                record = replace(earlier, applied_watts=applied_watts, pid=pid, pid_start=start,
                                 last_from=original_watts, last_to=target)
            except CorruptJournal:
                log.warning("replacing unreadable journal entry %s", path)
        if self.registry is not None:
            register_state_dir(self.registry, self.state_dir)
        self._write(path, record, make_dir=True)
        return record

    def _write(self, path: Path, record: CapRecord, make_dir: bool = False) -> None:
        """Make ``record`` the entry at ``path``, durably; JournalWriteError (one clear line) if it cannot."""
        try:
            if make_dir:
                self.state_dir.mkdir(parents=True, exist_ok=True)
            replace_file(path, json.dumps(asdict(record)).encode(), 0o600)
        except OSError as exc:
            raise JournalWriteError(
                exc.errno, f"cannot write the power-cap journal in {self.state_dir} ({exc.strerror or exc}); "
                "the cap was not changed"
            ) from None

    def intend(self, uuid: str, from_watts: float, to_watts: float) -> CapRecord | None:
        """Journal, before it is made, a write of ours: ``to_watts`` over ``from_watts`` (durable).

        The entry then names this process as its writer. None when the GPU has no entry (nothing
        to put back: the caller writes nothing it must restore). JournalWriteError if it cannot be
        written: the caller must not write the cap then (a cap we cannot claim would be an operator's)."""
        path = self._path(uuid)
        try:
            entry = self._read(path)
        except CorruptJournal:
            return None
        pid, start = own_identity()
        entry = replace(entry, last_from=float(from_watts), last_to=float(to_watts), pid=pid, pid_start=start)
        self._write(path, entry)
        return entry

    def believe(self, uuid: str, whose: str, watts: float, detail: str) -> None:
        """Record in :data:`DECISIONS` whom the cap on the board was taken for (``operator``, a dead
        ``writer``, ``ours``) and what was done; best effort (logged), the log is bounded."""
        path = self.state_dir / DECISIONS
        line = json.dumps({"time": time.time(), "uuid": uuid, "believed": whose, "watts": watts,
                           "detail": detail, "pid": os.getpid()}) + "\n"
        try:
            if path.exists() and path.stat().st_size > MAX_DECISIONS_BYTES:
                kept = path.read_bytes()[-MAX_DECISIONS_BYTES // 2:]
                replace_file(path, kept[kept.find(b"\n") + 1:], 0o600)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot record the cap decision in %s: %s", path, exc.strerror or exc)

    def decisions(self) -> list[dict[str, object]]:
        """The decisions file's records, oldest first (unreadable lines skipped)."""
        try:
            lines = (self.state_dir / DECISIONS).read_text().splitlines()
        except OSError:
            return []
        found = []
        for text in lines:
            try:
                found.append(json.loads(text))
            except ValueError:
                continue
        return found

    def mark_sweep_unrestored(self, uuid: str, left: bool = True) -> bool:
        """Say in an applied GPU's entry that a sweep left its cap changed, or (``left`` False) that the
        applied cap is back (see CapRecord); False when the GPU has no applied entry or it cannot be
        written (logged: apply mode then takes a changed cap for an override)."""
        path = self._path(uuid)
        try:
            entry = self._read(path)
            if entry.applied_watts is None:
                return False
            replace_file(path, json.dumps(asdict(replace(entry, sweep_unrestored=left))).encode(), 0o600)
            return True
        except (CorruptJournal, OSError) as exc:
            log.error("cannot mark %s as left changed by a sweep: %s", path, exc)
            return False

    def clear(self, uuid: str) -> None:
        self._path(uuid).unlink(missing_ok=True)

    def entry(self, uuid: str) -> CapRecord | None:
        """The GPU's entry, or None when there is none or it is unreadable (logged)."""
        path = self._path(uuid)
        if not os.path.lexists(path):
            return None
        try:
            return self._read(path)
        except CorruptJournal as exc:
            log.warning("%s", exc)
            return None

    def _read(self, path: Path) -> CapRecord:
        """Parse one entry; CorruptJournal for anything that is not a small regular file of valid JSON."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            why = "a symbolic link" if os.path.islink(path) else f"{type(exc).__name__}: {exc}"
            raise CorruptJournal(path, why) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CorruptJournal(path, "not a regular file")
            if info.st_size > MAX_ENTRY_BYTES:
                raise CorruptJournal(path, f"{info.st_size} bytes, larger than any journal entry")
            raw = os.read(fd, MAX_ENTRY_BYTES + 1)
        except OSError as exc:
            raise CorruptJournal(path, f"{type(exc).__name__}: {exc}") from None
        finally:
            os.close(fd)
        if len(raw) > MAX_ENTRY_BYTES:
            raise CorruptJournal(path, "larger than any journal entry")
        try:
            # bytes, not str: json detects UTF-8 with or without a byte-order mark (what some
            # editors write), UTF-16 and UTF-32 (RFC 8259 section 8.1); invalid UTF-8 still fails.
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            last_from, last_to = data.get("last_from"), data.get("last_to")
            record = CapRecord(
                uuid=str(data["uuid"]),
                gpu_index=int(data["gpu_index"]),
                original_watts=float(data["original_watts"]),
                default_watts=float(data["default_watts"]),
                recorded_at=float(data.get("recorded_at", 0.0)),
                pid=int(data.get("pid", 0)),
                applied_watts=None if data.get("applied_watts") is None else float(data["applied_watts"]),
                sweep_unrestored=data.get("sweep_unrestored", False) is True,
                last_from=None if last_from is None else float(last_from),
                last_to=None if last_to is None else float(last_to),
                pid_start=int(data.get("pid_start", 0)),
            )
        except RecursionError:
            raise CorruptJournal(path, "nested too deeply") from None
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptJournal(path, f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not 0 < record.original_watts < math.inf:  # NaN, inf, 0 or negative: not a cap anyone set
            raise CorruptJournal(path, f"original_watts {record.original_watts!r} is not a usable power limit")
        if safe_name(record.uuid) != _uuid_from_filename(path):  # the file name says which GPU, not the content
            raise CorruptJournal(path, f"it names GPU {record.uuid[:80]!r}, not the GPU of its file name")
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
            except Exception as exc:  # noqa: BLE001 - one entry's failure is that entry's alone
                found.append((path, CorruptJournal(path, f"{type(exc).__name__}: {str(exc)[:200]}")))
        return found



def _remove(path: Path) -> None:
    """Delete a handled journal entry; one that cannot be deleted is logged, never fatal at start."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("cannot remove journal entry %s: %s; remove it by hand", path, exc)


def _uuid_from_filename(path: Path) -> str:
    return path.name[: -len(CapJournal.SUFFIX)]


def restore_pending(
    journal: CapJournal,
    devices: Iterable[Device],
    *,
    only: Iterable[str] | None = None,
    lock: bool = True,
    applied_too: bool = False,
) -> list[str]:
    """Put back every original limit the journal holds; returns what was done, for logs.

    Only entries whose GPU lock is free are touched (a live sweeper restores its own;
    ``lock=False``: the caller holds the lock). ``only``: GPU UUIDs to consider (None:
    all). A corrupt entry cannot say what the operator had, so the safe action is the
    board's default limit (logged as such). Entries for GPUs not present stay on disk
    for a later start. Never raises for a single entry's failure. ``applied_too`` (the emergency
    commands, holding the GPU's lock): an applied cap a live daemon holds is put back too.
    """
    by_name: dict[str, Device] = {}
    for device in devices:
        try:
            by_name[safe_name(device.info().uuid)] = device
        except DeviceError as exc:
            log.warning("gpu %d: cannot read identity to check the cap journal: %s", device.index, exc)
    wanted = None if only is None else {safe_name(u) for u in only}
    actions: list[str] = []
    for path, entry in journal.entries():
        name = _uuid_from_filename(path)
        if wanted is not None and name not in wanted:
            continue
        device = by_name.get(name)
        if device is None:
            if isinstance(entry, CorruptJournal):
                log.error("%s; no matching GPU, leaving it for inspection", entry)
            else:
                log.warning("journal holds a cap for %s, which is not on this node now; kept", entry.uuid)
            continue
        if (not applied_too and isinstance(entry, CapRecord) and entry.applied_watts is not None
                and (holder := is_owned(journal.state_dir, apply_lock_name(name))) is not None):
            log.info("gpu %d: %.0f W is applied by a running daemon (pid %d), which restores it; left to it",
                     device.index, entry.applied_watts, holder)
            continue
        gpu_lock = _lock_entry(journal, name, path) if lock else None
        if gpu_lock is False:
            continue
        try:
            done = _restore_one(device, path, entry, journal)
        except Exception:  # noqa: BLE001 - one entry's failure must not stop the others
            log.exception("gpu %d: restoring the journal entry %s failed", device.index, path)
            done = None
        finally:
            if isinstance(gpu_lock, GpuLock):
                gpu_lock.release()
        if done:
            actions.append(done)
    return actions


def _lock_entry(journal: CapJournal, name: str, path: Path) -> GpuLock | None | bool:
    """The entry's lock (held), None (no lock needed or possible), or False: a live owner has it."""
    gpu_lock = journal.lock(name)
    try:
        gpu_lock.acquire()
        return gpu_lock
    except GpuBusy as busy:
        if busy.owner_pid == os.getpid():  # our own sweep, at daemon stop: we restore it ourselves
            return None
        log.warning("%s: GPU %s; left to its owner, which restores it", path, busy)
        return False
    except OSError as exc:  # e.g. a read-only state directory: no one can hold a lock we cannot see
        if is_owned(journal.state_dir, name) is not None:
            log.warning("%s: GPU is owned by a running process; left to it", path)
            return False
        log.debug("cannot lock %s (%s); nobody holds it", path, exc)
        return None


@dataclass(frozen=True)
class PutBack:
    """What :func:`put_back` found and did."""

    #: The board reads the target now (written, or it already did).
    ok: bool
    #: The cap the board read before anything was written.
    found: float
    written: bool = False
    #: The cap was not one we set: someone else's (an operator's); nothing was written, it stays.
    theirs: bool = False


def put_back(journal: CapJournal, device: Device, uuid: str, target: float, ours: Iterable[float] | None,
             why: str, _tries: int = 3) -> PutBack:
    """THE rule for every write that puts a cap back (a sweep's end, a rollback, stop, revert,
    restore-caps, start-up recovery): read the cap first and write ``target`` only if the cap is
    one we set (``ours``; None: an entry of an older version, whose every cap is its writer's).

    A cap that is not ours is someone else's choice: it stays, nothing is written, the decision is
    journaled (:meth:`CapJournal.believe`) and the result says ``theirs`` (the caller drops its entry
    and, in apply mode, the GPU leaves apply mode). The write itself is journaled first
    (:meth:`CapJournal.intend`) and read back: DeviceError if it does not read back.
    """
    found = device.power_limits().enforced_watts
    if round(found) == round(target):
        return PutBack(True, found)
    mine = None if ours is None else {round(w) for w in ours}
    if mine is not None and round(found) not in mine:
        journal.believe(uuid, "operator", found,
                        f"{why}: the cap reads {found:.0f} W, not one we set "
                        f"({', '.join(f'{w} W' for w in sorted(mine)) or 'none'}); left as it is, "
                        f"{target:.0f} W not written")
        log.warning("gpu %d: %s: the cap reads %.0f W, not one we set: someone else's, left as it is (%.0f W not "
                    "written)", device.index, why, found, target)
        return PutBack(False, found, theirs=True)
    try:  # a target is always the entry's original or a cap of its pair: a crash after it is still told
        journal.intend(uuid, found, target)
    except JournalWriteError as exc:  # a restore must not wait on a state directory that turned read-only
        log.warning("gpu %d: %s; putting %.0f W back all the same", device.index, exc, target)
    again = device.power_limits().enforced_watts  # right before the write: a change during the fsync
    if round(again) != round(found):
        if _tries <= 1:
            raise DeviceError(f"the cap keeps changing ({found:.0f} W, then {again:.0f} W); {target:.0f} W not written")
        return put_back(journal, device, uuid, target, None if mine is None else list(mine), why, _tries - 1)
    device.set_power_limit(target)
    back = device.power_limits().enforced_watts
    if round(back) != round(target):
        raise DeviceError(f"power cap set to {target:.0f} W but reads back {back:.0f} W")
    return PutBack(True, found, written=True)


def _restore_one(device: Device, path: Path, entry: CapRecord | CorruptJournal,
                 journal: CapJournal | None = None) -> str | None:
    if isinstance(entry, CorruptJournal):
        try:
            default = device.power_limits().default_watts
            device.set_power_limit(default)
        except DeviceError as exc:
            log.error("%s; restoring the default limit failed: %s", entry, exc)
            return None
        log.error("%s; restored gpu %d to its default limit %.0f W as the safe choice", entry, device.index, default)
        _remove(path)
        return f"gpu {device.index}: default {default:.0f} W (corrupt journal)"
    journal = journal if journal is not None else CapJournal(path.parent)
    ours = entry.ours() if entry.knows_its_writes() else None
    try:
        done = put_back(journal, device, entry.uuid, entry.original_watts, ours, "restoring the journaled cap")
    except InvalidArgument as exc:  # the board refuses the recorded value: the default is the safe choice
        try:
            default = device.power_limits().default_watts
            device.set_power_limit(default)
        except DeviceError as exc2:
            log.error("gpu %d: restoring the default limit failed: %s", device.index, exc2)
            return None
        log.error(
            "gpu %d: the board refused the journal's original cap %.0f W (%s); restored its default limit %.0f W",
            device.index, entry.original_watts, exc, default,
        )
        _remove(path)
        return f"gpu {device.index}: default {default:.0f} W (journal cap refused)"
    except DeviceError as exc:
        log.error("gpu %d: restoring original cap %.0f W failed: %s", device.index, entry.original_watts, exc)
        return None
    _remove(path)
    if done.theirs:
        return (f"gpu {device.index}: {done.found:.0f} W kept: not a cap we set (an operator's); "
                f"the journaled {entry.original_watts:.0f} W not written")
    if not done.written:
        log.info("gpu %d: the journaled cap %.0f W is already back", device.index, entry.original_watts)
        return f"gpu {device.index}: {entry.original_watts:.0f} W (already back)"
    log.warning(
        "gpu %d: restored original power cap %.0f W left changed by pid %d", device.index, entry.original_watts, entry.pid
    )
    return f"gpu {device.index}: {entry.original_watts:.0f} W"


# --- where journals may be: the node's registry of state directories --------------------------


def node_registry(config: Config) -> Path | None:
    """The registry file of the GPUs ``config`` drives; never derived from ``probes.state_dir``.

    Real GPUs: :data:`NODE_REGISTRY`, one per node. Simulated GPUs keep their limits in
    ``simulation.state_file`` (their "boards"), so their registry lies beside it; without a
    state file the limits die with the process and nothing needs finding later (None).
    """
    if config.device.backend == "nvml":
        return NODE_REGISTRY
    state_file = config.simulation.state_file
    return None if state_file is None else Path(str(state_file) + SIMULATED_REGISTRY_SUFFIX)


def read_registry(registry: Path) -> list[Path]:
    """The state directories recorded in ``registry`` (absolute paths); [] if none or unreadable (logged)."""
    try:
        with open(registry, "rb") as handle:
            raw = handle.read(MAX_ENTRY_BYTES * 16 + 1)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("cannot read the registry of state directories %s (%s); only the configured one is searched",
                  registry, exc.strerror or exc)
        return []
    try:
        if len(raw) > MAX_ENTRY_BYTES * 16:
            raise ValueError("too large")
        data = json.loads(raw)
        dirs = [Path(item) for item in data["state_dirs"] if isinstance(item, str) and os.path.isabs(item)]
    except (RecursionError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        log.error("registry of state directories %s is unreadable (%s); only the configured one is searched",
                  registry, type(exc).__name__)
        return []
    return dirs[: MAX_REGISTERED * 4]


def register_state_dir(registry: Path, state_dir: Path) -> bool:
    """Record ``state_dir`` in ``registry`` (durably, under a lock) before it holds a journal entry.

    Best effort: a registry that cannot be written is logged and the journal still works in
    ``state_dir`` (a start with the same state directory finds it). True if it is registered.
    """
    wanted = Path(os.path.abspath(state_dir))
    if wanted in read_registry(registry):
        return True
    try:
        registry.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(registry.parent / (registry.name + ".lock"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            dirs = read_registry(registry)  # again, under the lock: another writer may have added one
            if wanted in dirs:
                return True
            dirs.append(wanted)
            if len(dirs) > MAX_REGISTERED:  # forget directories that are gone; never one that exists
                dirs = [d for d in dirs if d.is_dir() or d == wanted]
            replace_file(registry, json.dumps({"state_dirs": [str(d) for d in dirs]}, indent=1).encode(), 0o644)
        finally:
            os.close(lock_fd)
    except OSError as exc:
        log.warning(
            "cannot record state directory %s in %s (%s); its journal is found only by a start with the same "
            "probes.state_dir", wanted, registry, exc.strerror or exc,
        )
        return False
    return True


def journals_for(config: Config) -> list[CapJournal]:
    """Every journal a previous instance on this node may have left: the configured state
    directory first, then every other one in the node's registry (missing ones skipped)."""
    registry = node_registry(config)
    first = CapJournal(config.probes.state_dir, registry)
    journals = [first]
    seen = {os.path.abspath(first.state_dir)}
    for state_dir in read_registry(registry) if registry is not None else []:
        key = os.path.abspath(state_dir)
        if key not in seen and state_dir.is_dir():
            seen.add(key)
            journals.append(CapJournal(state_dir, registry))
    return journals


def restore_all(journals: Iterable[CapJournal], devices: Iterable[Device]) -> list[str]:
    """:func:`restore_pending` over several journals. Where two hold an entry for one GPU, the
    older entry is applied last (the newer one recorded a cap a crash had already changed)."""
    devices = list(devices)

    def newest(journal: CapJournal) -> float:
        return max((e.recorded_at for _, e in journal.entries() if isinstance(e, CapRecord)), default=0.0)

    actions: list[str] = []
    for journal in sorted(journals, key=newest, reverse=True):
        try:
            actions += restore_pending(journal, devices)
        except Exception:  # noqa: BLE001 - one directory's failure must not stop the others
            log.exception("restoring the power-cap journal in %s failed", journal.state_dir)
    return actions

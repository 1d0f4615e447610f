"""One owner per GPU's power cap, across processes: an exclusive ``flock`` per GPU.

The lock file (``<uuid>.cap.lock`` in the state directory, next to the journal)
is locked for the whole of a sweep or probe run, and taken *before* the journal
entry of that GPU is read: an entry whose lock is free belongs to a process that
died, and only then may it be restored. The kernel drops the lock when the owner
dies (SIGKILL included), so a waiter takes over at once. The owner's pid is
written into the file for messages ("owned by pid N"); the lock, not the pid,
decides.

The lock file is opened read-only (``O_CREAT`` creates it): holding no file open
for writing keeps a state directory that turns read-only under us remountable.

A state directory is a setting, so two writers may journal in two of them (a ``gpuperfd sweep
--state-dir X`` beside the daemon). ``node_dir`` (the node's lock folder beside its registry of state
directories, :meth:`~gpuperfd.caps.journal.CapJournal.lock`) adds one lock per GPU for the
whole node, taken first, so they exclude each other too (issue 51); best effort where that folder
cannot be written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
LOCK_SUFFIX = ".cap.lock"


def safe_name(uuid: str) -> str:
    """The file-name form of a GPU UUID (journal entries and locks share it)."""
    return _SAFE.sub("_", uuid)


class GpuBusy(Exception):
    """Another live process owns this GPU's cap; ``owner_pid`` names it (0 when unknown)."""

    def __init__(self, name: str, owner_pid: int) -> None:
        who = f"pid {owner_pid}" if owner_pid else "another process"
        super().__init__(f"{name} is owned by {who} (a sweep or probe is running on it)")
        self.owner_pid = owner_pid


class GpuLock:
    """The exclusive, cross-process lock on one GPU's cap (``name``: the safe UUID)."""

    def __init__(self, state_dir: Path | str, name: str, node_dir: Path | None = None) -> None:
        self.path = Path(state_dir) / (name + LOCK_SUFFIX)
        self.name = name
        self._fd: int | None = None
        #: The node-wide lock of this GPU (None: this state directory's lock only).
        self._node = (GpuLock(node_dir, name) if node_dir is not None
                      and os.path.abspath(node_dir) != os.path.abspath(state_dir) else None)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def owner(self) -> int | None:
        """Without taking it: the owner pid (0: unknown) if a live process (this one included) holds this
        lock or its node-wide one, else None."""
        held = is_owned(self.path.parent, self.name)
        if held is None and self._node is not None:
            held = self._node.owner()
        return held

    def owner_pid(self) -> int:
        """The pid the current (or last) owner wrote; 0 when unknown."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            text = os.read(fd, 32).decode("ascii", "replace").strip()
        except OSError:
            return 0
        finally:
            os.close(fd)
        return int(text) if text.isdigit() else 0

    def acquire(self, wait_seconds: float = 0.0, poll: float = 0.05, cancel: Callable[[], bool] | None = None) -> None:
        """Take the lock; GpuBusy if another process holds it after ``wait_seconds`` (or once
        ``cancel()`` is true); OSError if the state directory cannot hold a lock file."""
        node_held = False
        if self._node is not None:
            try:
                self._node.acquire(wait_seconds, poll, cancel)
                node_held = True
            except OSError:  # a node folder we cannot write (not root): this directory's lock alone
                pass
        try:
            self._acquire(wait_seconds, poll, cancel)
        except BaseException:
            if node_held and self._node is not None:
                self._node.release()
            raise

    def _acquire(self, wait_seconds: float, poll: float, cancel: Callable[[], bool] | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_seconds
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline or (cancel is not None and cancel()):
                    raise GpuBusy(self.name, self.owner_pid())
                time.sleep(poll)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._write_pid()

    def _write_pid(self) -> None:
        try:
            wfd = os.open(self.path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(wfd, f"{os.getpid()}\n".encode())
            finally:
                os.close(wfd)
        except OSError:
            pass  # the pid is for messages only; the flock is what counts

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock
        if self._node is not None:
            self._node.release()

    def __enter__(self) -> GpuLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def apply_lock_name(name: str) -> str:
    """The lock name of ``gpuperfd apply``'s hold on a GPU's cap (``name``: the safe UUID). The daemon
    holds it while a cap it applied stands: a journal entry with an applied cap is restored only when
    this lock is free (its daemon is gone), never under a live one."""
    return name + ".apply"


def is_owned(state_dir: Path | str, name: str) -> int | None:
    """Without taking it: the owner pid (0: unknown) if a live process holds the lock, else None.

    Needs no write access (for probes that change no cap and for users without rights to the
    state directory); a missing lock file means no owner.
    """
    path = Path(state_dir) / (name + LOCK_SUFFIX)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return GpuLock(state_dir, name).owner_pid()
    finally:
        os.close(fd)
    return None

"""Replace a small state file so that a crash never leaves it torn.

The power-cap journal, the node's registry of state directories, the saved health
verdicts and the node-feature-discovery file are each read by someone who must see
either the old content or the new one: the next start restoring a cap, NFD's worker
turning lines into node labels. One routine writes them all.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a new file beside ``path``, fsync it, rename it over ``path`` and fsync
    the folder: after a crash at any point ``path`` holds the old bytes or the new ones.

    The temporary file is created exclusively (a file or symlink planted under its name is never
    followed) and removed again if anything fails; ``mode`` is set as given, whatever the umask.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

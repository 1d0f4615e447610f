"""Who a GPU process is: name, user, systemd unit or cgroup, Slurm job, read from /proc.

NVML gives only a PID; the rest comes from ``<proc_root>/<pid>/``. The root is
a parameter so tests point it at a fixture tree. In a container without the
host's PID namespace the PIDs NVML reports are not in our /proc: every field
is then empty, and the process is still counted with its memory.

The Slurm job id comes from the cgroup path (``.../job_1234/...``, cgroup v1
and v2 layouts of slurmd) or, failing that, ``SLURM_JOB_ID`` in the process
environment (readable by root only).
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass
from pathlib import Path

_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
_UNIT = re.compile(r"[^/]+\.(?:service|scope)$")
#: Environment files can be large; the job id is near the start when set by slurmstepd.
_ENVIRON_LIMIT = 256 * 1024


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    name: str = ""
    user: str = ""
    unit: str = ""  # systemd unit (x.service, x.scope) or, if none, the cgroup path
    slurm_job: str = ""


def _read(path: Path, limit: int = 64 * 1024) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(limit)
    except OSError:  # gone, or not ours to read: the field stays empty
        return None


def _user(status: bytes | None) -> str:
    for line in (status or b"").splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                uid = int(fields[1])
                try:
                    return pwd.getpwuid(uid).pw_name
                except KeyError:
                    return str(uid)
    return ""


def _cgroup_path(cgroup: bytes | None) -> str:
    """The cgroup v2 path (``0::/...``), else the first v1 line's path."""
    paths = []
    for line in (cgroup or b"").decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            if parts[0] == "0" and parts[1] == "":
                return parts[2]
            paths.append(parts[2])
    return next((p for p in paths if p != "/"), "")


def _unit(path: str) -> str:
    for part in reversed(path.split("/")):
        if _UNIT.fullmatch(part):
            return part
    return path


def _slurm_job(path: str, environ: bytes | None) -> str:
    match = _SLURM_CGROUP.search(path)
    if match:
        return match.group(1)
    for entry in (environ or b"").split(b"\0"):
        if entry.startswith(b"SLURM_JOB_ID="):
            value = entry.split(b"=", 1)[1].decode("ascii", "replace")
            return value if value.isdigit() else ""
    return ""


def identify(pid: int, proc_root: Path = Path("/proc"), names: bool = False) -> ProcessIdentity:
    """The process's identity; name, user and unit only with ``names`` (they may be private)."""
    base = proc_root / str(pid)
    cgroup = _cgroup_path(_read(base / "cgroup"))
    job = _slurm_job(cgroup, _read(base / "environ", _ENVIRON_LIMIT))
    if not names:
        return ProcessIdentity(pid, slurm_job=job)
    comm = (_read(base / "comm") or b"").decode("utf-8", "replace").strip()
    return ProcessIdentity(pid, comm, _user(_read(base / "status")), _unit(cgroup), job)

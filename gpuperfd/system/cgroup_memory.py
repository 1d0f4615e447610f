"""The memory this process may use, as its cgroup says, and the few /proc figures beside it.

Why: every probe child costs about 1.6 GiB of host memory; a container whose cgroup limit
is sized for one child is OOM-killed when several GPUs probe at once. The admission of probe
children (:mod:`gpuperfd.probing.gates.admission`) sizes itself from :func:`memory_limit_bytes`.

cgroup v2: the process's cgroup from ``/proc/self/cgroup`` (``0::/path``), its ``memory.max``
and its ancestors' (the smallest wins; ``max`` is no limit). cgroup v1: the memory
controller's ``memory.limit_in_bytes`` (a value near 2**63 is no limit). Inside a container
with a cgroup namespace the path is ``/`` and the mount is the container's own cgroup. The
roots are parameters so tests point at fixture trees, as node_exporter's ``--path.*`` flags do.
Nothing readable: None (no limit known), never an exception.
"""

from __future__ import annotations

from pathlib import Path

PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: cgroup v1 reports "no limit" as the largest page-aligned int64 (9223372036854771712); anything
#: at or above 2**60 bytes (an exbibyte) is read as no limit.
UNLIMITED_V1 = 2**60


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_paths(proc_root: Path, pid: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory controller path) of the process, from /proc/<pid>/cgroup."""
    text = _read(proc_root / pid / "cgroup") or ""
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _own_and_ancestors(base: Path, path: str) -> list[Path]:
    """The cgroup folder of ``path`` below ``base`` and each parent up to ``base`` (those that exist);
    just ``base`` when the path is not visible there (a namespaced container's mount)."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    folders = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    found = [f for f in folders if f.is_dir()]
    return found or [base]


def _v2_limit(folder: Path) -> int | None:
    text = _read(folder / "memory.max")
    if text is None or text.strip() in ("", "max"):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def memory_limit_bytes(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT, pid: str = "self") -> int | None:
    """The smallest memory limit over the process's cgroup and its ancestors, bytes; None: no limit known."""
    v2, v1 = _cgroup_paths(proc_root, pid)
    if v2 is not None and (cgroup_root / "cgroup.controllers").exists():
        limits = [v for v in (_v2_limit(f) for f in _own_and_ancestors(cgroup_root, v2)) if v is not None]
        return min(limits) if limits else None
    if v1 is None:
        return None
    folder = _own_and_ancestors(cgroup_root / "memory", v1)[0]
    try:
        value = int((_read(folder / "memory.limit_in_bytes") or "").strip())
    except ValueError:
        return None
    return None if value >= UNLIMITED_V1 else value


def oom_kill_count(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT, pid: str = "self") -> int | None:
    """How many processes the kernel's OOM killer has killed in the process's cgroup (v2
    ``memory.events`` ``oom_kill``, v1 ``memory.oom_control`` ``oom_kill``); None when unreadable."""
    path = _own_file(proc_root, cgroup_root, pid, "memory.events", "memory.oom_control")
    if path is None:
        return None
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def status_bytes(field: str, pid: str = "self", proc_root: Path = PROC_ROOT) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (``VmRSS``, ``VmHWM``) in bytes; None when unreadable."""
    for line in (_read(proc_root / pid / "status") or "").splitlines():
        if line.startswith(field + ":"):
            words = line.split()
            if len(words) >= 2 and words[1].isdigit():
                return int(words[1]) * 1024
    return None


def _own_file(proc_root: Path, cgroup_root: Path, pid: str, v2_name: str, v1_name: str) -> Path | None:
    """The file ``v2_name`` (cgroup v2) or ``v1_name`` (v1 memory controller) of the process's own cgroup;
    None when neither hierarchy is known."""
    v2, v1 = _cgroup_paths(proc_root, pid)
    if v2 is not None and (cgroup_root / "cgroup.controllers").exists():
        return _own_and_ancestors(cgroup_root, v2)[0] / v2_name
    if v1 is not None:
        return _own_and_ancestors(cgroup_root / "memory", v1)[0] / v1_name
    return None


def _cgroup_used(proc_root: Path, cgroup_root: Path, pid: str) -> int | None:
    """The bytes the process's own cgroup uses now (v2 ``memory.current``, v1 ``memory.usage_in_bytes``)."""
    path = _own_file(proc_root, cgroup_root, pid, "memory.current", "memory.usage_in_bytes")
    if path is None:
        return None
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def host_available(proc_root: Path = PROC_ROOT) -> int | None:
    """The host's ``MemAvailable`` (/proc/meminfo), bytes; None when unreadable."""
    for line in (_read(proc_root / "meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            words = line.split()
            return int(words[1]) * 1024 if len(words) >= 2 and words[1].isdigit() else None
    return None


def memory_available(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT,
                     pid: str = "self") -> list[tuple[int, str]]:
    """What the process may still allocate, each figure with words saying where it comes from: the
    host's available memory and what the cgroup's limit leaves. A process that would build more than
    the smallest is killed half-way (a 32 GB model under a 10 GiB limit, issue 61): check it first."""
    found: list[tuple[int, str]] = []
    gib = 2**30
    if (available := host_available(proc_root)) is not None:
        found.append((available, f"the host has {available / gib:.1f} GiB available"))
    limit = memory_limit_bytes(proc_root, cgroup_root, pid)
    if limit is not None:
        used = _cgroup_used(proc_root, cgroup_root, pid) or 0
        found.append((max(limit - used, 0), f"the cgroup's memory limit of {limit / gib:.1f} GiB leaves "
                                            f"{max(limit - used, 0) / gib:.1f} GiB ({used / gib:.1f} GiB used)"))
    return found

"""The cgroup memory limit and OOM counter, read from fixture trees (v1 and v2)."""

from __future__ import annotations

from pathlib import Path

from gpuperfd.system.cgroup_memory import memory_limit_bytes, oom_kill_count, status_bytes


def _tree(tmp_path: Path, cgroup_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_v2_limit_of_the_own_cgroup(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "cgroup.controllers": "cpu memory\n", "kubepods/pod1/ctr/memory.max": "2684354560\n",
        "kubepods/pod1/ctr/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n"})
    assert memory_limit_bytes(proc, root) == 2560 * 2**20
    assert oom_kill_count(proc, root) == 2


def test_v2_smallest_of_own_and_ancestors_and_max_is_no_limit(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "cgroup.controllers": "memory\n", "kubepods/memory.max": "max\n",
        "kubepods/pod1/memory.max": "1073741824\n", "kubepods/pod1/ctr/memory.max": "max\n"})
    assert memory_limit_bytes(proc, root) == 2**30
    (root / "kubepods/pod1/memory.max").write_text("max\n")
    assert memory_limit_bytes(proc, root) is None


def test_v2_namespaced_container_reads_the_mount_root(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/\n", {"cgroup.controllers": "memory\n", "memory.max": "536870912\n"})
    assert memory_limit_bytes(proc, root) == 512 * 2**20


def test_v1_limit_and_the_huge_value_is_no_limit(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/x\n", {
        "memory/docker/abc/memory.limit_in_bytes": "4294967296\n",
        "memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"})
    assert memory_limit_bytes(proc, root) == 4 * 2**30
    assert oom_kill_count(proc, root) == 5
    (root / "memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit_bytes(proc, root) is None


def test_nothing_readable_is_no_limit(tmp_path: Path) -> None:
    assert memory_limit_bytes(tmp_path / "proc", tmp_path / "cgroup") is None
    assert oom_kill_count(tmp_path / "proc", tmp_path / "cgroup") is None
    proc, root = _tree(tmp_path, "0::/a\n", {"cgroup.controllers": "memory\n", "a/memory.max": "garbage\n"})
    assert memory_limit_bytes(proc, root) is None


def test_status_fields_of_this_process() -> None:
    rss, hwm = status_bytes("VmRSS"), status_bytes("VmHWM")
    assert rss is not None and hwm is not None and 0 < rss <= hwm
    assert status_bytes("NoSuchField") is None


def test_memory_available_is_the_hosts_and_what_the_cgroups_limit_leaves(tmp_path: Path) -> None:
    """Issue 61: a 32 GB model was built on a CPU under a 10 GiB limit and killed after 38 s; the child
    now compares its need with these figures first (the smallest refuses, named)."""
    from gpuperfd.system.cgroup_memory import memory_available

    proc, root = _tree(tmp_path, "0::/ctr\n", {"cgroup.controllers": "memory\n", "ctr/memory.max": "10737418240\n",
                                                "ctr/memory.current": "1073741824\n"})
    (proc / "meminfo").write_text("MemTotal:       65536000 kB\nMemAvailable:   33554432 kB\n")
    found = memory_available(proc, root)
    assert min(found) == (9 * 2**30, "the cgroup's memory limit of 10.0 GiB leaves 9.0 GiB (1.0 GiB used)")
    assert (32 * 2**30, "the host has 32.0 GiB available") in found
    (root / "ctr/memory.max").write_text("max\n")
    (proc / "meminfo").write_text("garbage\n")
    assert memory_available(proc, root) == []  # nothing readable: no figure, never an exception

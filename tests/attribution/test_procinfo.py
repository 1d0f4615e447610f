"""Per-process attribution on bare metal: /proc fixture trees (Slurm cgroup v1/v2, systemd, environ), top N, opt-in names."""

from __future__ import annotations

import os
import pwd

from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.attribution.procinfo import ProcessIdentity, identify
from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.telemetry.collectors.processes import ProcessesCollector
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler

ROOT_USER = pwd.getpwuid(0).pw_name


def fake_proc(root, pid, comm, uid, cgroup, environ=b""):
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "comm").write_text(comm + "\n")
    (base / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")
    (base / "cgroup").write_text(cgroup)
    (base / "environ").write_bytes(environ)


def test_slurm_job_from_cgroup_v2_v1_and_environment(tmp_path):
    fake_proc(tmp_path, 101, "python", 0, "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    fake_proc(tmp_path, 102, "python", 0, "12:memory:/slurm/uid_1000/job_77/step_batch\n11:cpu:/\n")
    fake_proc(tmp_path, 103, "python", 0, "0::/user.slice/user-1000.slice/session-3.scope\n",
              b"HOME=/root\0SLURM_JOB_ID=9001\0PATH=/bin\0")
    fake_proc(tmp_path, 104, "vllm", 0, "0::/system.slice/vllm.service\n", b"SLURM_JOB_ID=$(rm -rf /)\0")
    assert identify(101, tmp_path).slurm_job == "4242"
    assert identify(102, tmp_path).slurm_job == "77"
    assert identify(103, tmp_path).slurm_job == "9001"
    assert identify(104, tmp_path).slurm_job == ""  # not a job id: dropped, never published
    # names off (the default): nothing private leaves the node
    assert identify(104, tmp_path) == ProcessIdentity(104)
    assert identify(104, tmp_path, names=True) == ProcessIdentity(104, "vllm", ROOT_USER, "vllm.service", "")
    assert identify(103, tmp_path, names=True).unit == "session-3.scope"


def test_vanished_or_unreadable_process_has_empty_fields(tmp_path):
    assert identify(999, tmp_path, names=True) == ProcessIdentity(999)
    fake_proc(tmp_path, 5, "x", 123456789, "garbage without colons")
    assert identify(5, tmp_path, names=True) == ProcessIdentity(5, "x", "123456789", "", "")  # unknown uid: number


def test_collector_publishes_top_n_by_memory_with_identity(tmp_path):
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=2))
    device = backend.devices()[0]
    for n in range(8):
        pid = 2000 + n
        device.add_foreign_process(pid=pid, memory_bytes=(n + 1) << 30)
        fake_proc(tmp_path, pid, f"worker{n}", 0, f"0::/system.slice/slurmstepd.scope/job_{500 + n}/step_0\n")
    for names in (False, True):
        sampler = Sampler(backend, [device], [ProcessesCollector(top_n=3, expose_names=names, proc_root=tmp_path)])
        sampler.sample_once()
        text = Exporter(sampler, "simulated").render().decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        memory = {s.labels["pid"]: s.value for s in samples if s.name == "gpuperf_compute_process_memory_bytes"}
        info = {s.labels["pid"]: s.labels for s in samples if s.name == "gpuperf_compute_process_info"}
        assert memory == {"2007": 8 << 30, "2006": 7 << 30, "2005": 6 << 30}  # the three biggest only
        assert {pid: labels["slurm_job"] for pid, labels in info.items()} == {"2007": "507", "2006": "506", "2005": "505"}
        assert {labels["name"] for labels in info.values()} == ({"worker7", "worker6", "worker5"} if names else {""})
        assert {labels["user"] for labels in info.values()} == ({ROOT_USER} if names else {""})
        totals = {s.name: s.value for s in samples if s.name.startswith("gpuperf_compute_processes")}
        assert totals == {"gpuperf_compute_processes": 8, "gpuperf_compute_processes_memory_bytes": 36 << 30}


def test_pid_reused_by_another_process_is_read_again(tmp_path):
    backend = SimulatedBackend(SimulationConfig(gpus=1))
    device = backend.devices()[0]
    collector = ProcessesCollector(proc_root=tmp_path)
    device.add_foreign_process(pid=7, memory_bytes=1 << 30)
    fake_proc(tmp_path, 7, "a", 0, "0::/slurm/job_1/step_0\n")
    assert [p.labels[-1] for p in collector.read(device) if p.metric == "gpuperf_compute_process_info"] == ["1"]
    device.remove_foreign_process(7)
    collector.read(device)  # the process left the GPU: its identity is forgotten
    os.rename(tmp_path / "7", tmp_path / "old7")
    fake_proc(tmp_path, 7, "b", 0, "0::/slurm/job_2/step_0\n")
    device.add_foreign_process(pid=7, memory_bytes=1 << 30)
    assert [p.labels[-1] for p in collector.read(device) if p.metric == "gpuperf_compute_process_info"] == ["2"]

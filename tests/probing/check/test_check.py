"""``gpuperfd check`` end to end: the real CLI (subprocess) on simulated GPUs with faults from a
config file, as an operator writes them, and the one-shot flow in-process where a test needs to
hold a lock, start a foreign process or swap the executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuperfd.caps.ownership import GpuLock, safe_name
from gpuperfd.config import config_from_mapping
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.check import flow as check_mod
from gpuperfd.commands.check import (EXIT_DEGRADED, EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, EXIT_USAGE,
                                        CheckOptions)
from gpuperfd.probing.check.flow import CheckRequest, run_check
from gpuperfd.probing.executors import PerPointExecutor, measure_once

ROOT = Path(__file__).resolve().parents[3]


def write_config(tmp_path: Path, gpus: int = 2, simulation: str = "", extra: str = "") -> Path:
    path = tmp_path / "check.yaml"
    path.write_text(f"""
device: {{backend: simulated}}
simulation:
  gpus: {gpus}
  seed: 1
{simulation}
probes: {{state_dir: {tmp_path / "state"}}}
{extra}
""")
    return path


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUPERFD_CONFIG": ""}
    proc = subprocess.run([sys.executable, "-m", "gpuperfd", "check", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def gpus_of(body: dict) -> dict:
    return {g["gpu"]: g for g in body["gpus"]}


def checks_of(gpu: dict) -> set[str]:
    return {r["check"] for r in gpu["reasons"]}


def test_healthy_node_exits_0_and_measures_against_the_shipped_figure(tmp_path: Path) -> None:
    proc = cli("--config", str(write_config(tmp_path)), "--json")
    assert proc.returncode == EXIT_HEALTHY, proc.stdout + proc.stderr
    body = json.loads(proc.stdout)
    assert body["state"] == "healthy" and body["check"]["probed"] == [0, 1]
    for gpu in body["gpus"]:
        assert gpu["state"] == "healthy"
        measured = next(r for r in gpu["reasons"] if r["check"] == "check_probe_measured")
        evidence = measured["evidence"]
        assert evidence["probe"] == "llm" and evidence["preset"] == "gpt2"
        assert evidence["expected"]["model"] == "H100" and evidence["expected"]["units_per_second"] == 104_269.5
        assert 0.9 < evidence["units_per_second"] / evidence["expected"]["units_per_second"] < 1.1
        assert evidence["correctness"]["status"] == "ok"  # the simulated executor's answers check out


def test_slow_gpu_is_degraded_against_expected_and_peers(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpus=4, simulation="  degrade: [{gpu: 1, sm_clock_factor: 0.5, "
                          "memory_bandwidth_factor: 0.5}]")
    proc = cli("--config", str(config), "--json")
    assert proc.returncode == EXIT_DEGRADED, proc.stdout + proc.stderr
    gpus = gpus_of(json.loads(proc.stdout))
    assert gpus[1]["state"] == "degraded" and gpus[1]["action"] == "check_hardware"
    assert {"check_below_expected", "probe_slower_than_peers"} <= checks_of(gpus[1])
    assert all(gpus[i]["state"] == "healthy" for i in (0, 2, 3))


def test_table_output_names_state_action_reasons_and_expected(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpus=4, simulation="  degrade: [{gpu: 1, sm_clock_factor: 0.5, "
                          "memory_bandwidth_factor: 0.5}]")
    proc = cli("--config", str(config))
    assert proc.returncode == EXIT_DEGRADED
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("degraded (action check_hardware)")
    row = next(line for line in lines if line.startswith("1 "))
    assert "degraded" in row and "check_hardware" in row and "104,270" in row and row.rstrip().endswith("ok")
    assert any("check_below_expected" in line and "of the expected 104,270 token/s of an H100" in line
               for line in lines)


def test_passive_faults_make_the_node_unhealthy(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpus=3, simulation="  ecc_errors: [{gpu: 1, uncorrected: 2}]\n"
                          "  xid_events: [{gpu: 2, xid: 48}]")
    proc = cli("--config", str(config), "--json", "--quick")
    assert proc.returncode == EXIT_UNHEALTHY, proc.stdout + proc.stderr
    gpus = gpus_of(json.loads(proc.stdout))
    assert (gpus[1]["state"], gpus[1]["action"]) == ("unhealthy", "reset_gpu")
    assert "ecc_uncorrectable_volatile" in checks_of(gpus[1])
    assert "xid" in checks_of(gpus[2]) and gpus[2]["state"] == "unhealthy"
    assert gpus[0]["state"] == "healthy"
    assert all("--quick" in r["message"] for g in gpus.values() for r in g["reasons"] if r["check"] == "check_not_probed")


def test_quick_probes_nothing(tmp_path: Path) -> None:
    proc = cli("--config", str(write_config(tmp_path)), "--json", "--quick")
    assert proc.returncode == EXIT_HEALTHY
    body = json.loads(proc.stdout)
    assert body["check"]["probed"] == [] and body["check"]["phases_seconds"]["probe"] < 0.5
    assert all(checks_of(g) == {"check_not_probed"} for g in body["gpus"])


def test_quick_with_require_probe_is_could_not_check(tmp_path: Path) -> None:
    proc = cli("--config", str(write_config(tmp_path)), "--quick", "--require-probe")
    assert proc.returncode == EXIT_UNKNOWN, proc.stdout


def test_gpu_that_does_not_answer_is_unknown_within_the_timeout(tmp_path: Path) -> None:
    """GPU 1's utilization call hangs inside the (simulated) library: the call gate's timeout, which the
    check's command sets to a quarter of the passive read's budget (0.5 s at --timeout 6), sets it aside,
    so GPU 0's reads queued behind it finish and GPU 0 is probed; the gate is the one bound on the hang."""
    config = write_config(tmp_path, simulation="  faults: [{gpu: 1, call: utilization, kind: slow, "
                          "delay_seconds: 120}]")
    start = time.monotonic()
    proc = cli("--config", str(config), "--json", "--timeout", "6")
    took = time.monotonic() - start
    assert proc.returncode == EXIT_UNKNOWN, proc.stdout + proc.stderr
    gpus = gpus_of(json.loads(proc.stdout))
    assert gpus[1]["state"] == "unknown" and "check_probe_failed" in checks_of(gpus[1])
    assert gpus[0]["state"] == "healthy" and "check_probe_measured" in checks_of(gpus[0])
    assert took < 60  # bounded by --timeout (6 s) plus start-up, far from the fault's 120 s


def test_the_checks_call_gate_timeout_is_a_quarter_of_its_passive_budget(tmp_path: Path) -> None:
    """The command's config bounds a hung device call (the gate, device/serial.py) by the check's own
    budget, never above what the config file allows."""
    path = str(write_config(tmp_path))
    assert CheckOptions(config=path, timeout=6).load_config().device.call_timeout_seconds == 0.5  # budget 2 s
    assert CheckOptions(config=path, timeout=60).load_config().device.call_timeout_seconds == 3.0  # 12 s
    assert CheckOptions(config=path, timeout=600).load_config().device.call_timeout_seconds == 5.0  # configured
    short = tmp_path / "short.yaml"
    short.write_text(Path(path).read_text().replace("{backend: simulated}", "{backend: simulated, call_timeout_seconds: 1}"))
    assert CheckOptions(config=str(short), timeout=60).load_config().device.call_timeout_seconds == 1.0


def test_mig_gpu_is_checked_at_the_parent_level_and_not_probed(tmp_path: Path) -> None:
    proc = cli("--config", str(write_config(tmp_path, simulation="  mig: [{gpu: 1}]")), "--json")
    assert proc.returncode == EXIT_HEALTHY, proc.stdout + proc.stderr
    body = json.loads(proc.stdout)
    gpus = gpus_of(body)
    assert body["check"]["probed"] == [0]
    reason = next(r for r in gpus[1]["reasons"] if r["check"] == "check_not_probed")
    assert reason["message"] == "MIG enabled: checked at the parent GPU's level, not probed"


# -- bad input ---------------------------------------------------------------------------


def test_gpu_index_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("--config", str(write_config(tmp_path)), "--gpus", "9")
    assert proc.returncode == EXIT_USAGE
    assert "GPU index 9 does not exist" in proc.stderr and "0, 1" in proc.stderr


def test_config_that_does_not_parse_is_a_usage_error_naming_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("simulation: {gpus: many}\n")
    proc = cli("--config", str(bad), "--simulate", "2")
    assert proc.returncode == EXIT_USAGE and str(bad) in proc.stderr and "simulation.gpus" in proc.stderr
    bad.write_text("simulation: [\n")
    proc = cli("--config", str(bad))
    assert proc.returncode == EXIT_USAGE and "not valid YAML" in proc.stderr


@pytest.mark.parametrize("args", [["--gpus", "x"], ["--timeout", "0"], ["--preset", "nope"]])
def test_bad_flags_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    proc = cli("--config", str(write_config(tmp_path)), *args)
    assert proc.returncode == EXIT_USAGE, proc.stderr


def _parse_check(args: list[str], capsys) -> tuple[int, str]:
    import argparse

    from gpuperfd.commands.check import register

    parser = argparse.ArgumentParser(prog="gpuperfd")
    register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["check", *args])
    return int(exited.value.code), capsys.readouterr().err


def test_a_reversed_gpu_range_is_named_as_such(capsys) -> None:
    code, err = _parse_check(["--gpus", "0,3-1"], capsys)
    assert code == EXIT_USAGE and "'3-1' is a reversed range: write 1-3" in err
    assert "no GPU index given" not in err


def test_json_and_line_are_exclusive(capsys) -> None:
    code, err = _parse_check(["--json", "--line"], capsys)
    assert code == EXIT_USAGE and "--line: not allowed with argument --json" in err


def test_no_driver_is_could_not_check(tmp_path: Path) -> None:
    config = tmp_path / "nvml.yaml"
    config.write_text(f"device: {{backend: nvml}}\nprobes: {{state_dir: {tmp_path}}}\n")
    proc = cli("--config", str(config), "--json")
    if proc.returncode == EXIT_HEALTHY:
        pytest.fail("a node with a driver ran this test; it checks the no-driver path")
    assert proc.returncode == EXIT_UNKNOWN
    assert "could not check" in proc.stderr and "driver" in proc.stderr
    assert json.loads(proc.stdout)["state"] == "unknown"


# -- in-process: locks, busy GPUs, deadline, correctness, read-only ------------------------


def _config(tmp_path: Path, gpus: int = 2, **simulation):
    return config_from_mapping({"device": {"backend": "simulated"},
                                "simulation": {"gpus": gpus, "seed": 1, **simulation},
                                "probes": {"state_dir": str(tmp_path / "state")}})


def _run(config, backend, **request):
    return run_check(config, CheckRequest(timeout_seconds=request.pop("timeout_seconds", 30), **request),
                     opener=lambda _c: backend)


def _by_gpu(outcome):
    return {v.gpu: v for v in outcome.verdicts}


@pytest.fixture
def real_gpus(monkeypatch):
    """The simulated GPUs stand in for real ones: the check takes each probed GPU's lock, as beside a daemon."""
    monkeypatch.setattr(check_mod, "shares_gpus", lambda _config: True)


def test_gpu_owned_by_a_sweep_is_not_probed_and_the_lock_is_never_fought(tmp_path: Path, real_gpus) -> None:
    config = _config(tmp_path)
    backend = SimulatedBackend(config.simulation)
    lock = GpuLock(config.probes.state_dir, safe_name(backend.devices()[0].info().uuid))
    lock.acquire()
    try:
        outcome = _run(config, backend)
        assert lock.held
    finally:
        lock.release()
    assert outcome.probed == [1]
    assert outcome.not_probed[0].startswith(f"not probed: owned by pid {os.getpid()}")
    assert _by_gpu(outcome)[0].state == "healthy"
    assert _run(config, backend, require_probe=True).probed == [0, 1]  # released: both probed now


def test_our_lock_is_held_during_the_probe_and_released_after(tmp_path: Path, real_gpus, monkeypatch) -> None:
    config = _config(tmp_path, gpus=1)
    config.probes.state_dir.mkdir()  # the daemon's state directory exists
    backend = SimulatedBackend(config.simulation)
    uuid = backend.devices()[0].info().uuid
    seen = []
    real = check_mod.choose_executor

    def spying(cfg, name, **kw):
        executor = real(cfg, name, **kw)

        def run(device, schedule, abort):
            from gpuperfd.caps.ownership import is_owned
            seen.append(is_owned(config.probes.state_dir, safe_name(uuid)))
            return measure_once(executor, device, schedule, abort)
        return PerPointExecutor(run)

    monkeypatch.setattr(check_mod, "choose_executor", spying)
    _run(config, backend)
    from gpuperfd.caps.ownership import is_owned
    assert seen == [os.getpid()] and is_owned(config.probes.state_dir, safe_name(uuid)) is None


def test_gpu_with_a_foreign_process_is_not_probed(tmp_path: Path) -> None:
    config = _config(tmp_path)
    backend = SimulatedBackend(config.simulation)
    backend.devices()[1].add_foreign_process(424242, 1 << 30)
    outcome = _run(config, backend)
    assert outcome.probed == [0]
    assert "424242" in outcome.not_probed[1] and "foreign_process" in outcome.not_probed[1]
    assert _by_gpu(_run(config, backend, require_probe=True))[1].state == "unknown"


def test_a_probing_daemons_child_is_named_as_such_not_as_a_foreign_process(tmp_path: Path) -> None:
    """`gpuperfd check` beside a probing daemon: the process on the GPU is the daemon's probe child
    (``python -m gpuperfd.probe_child.child``) and the daemon holds the GPU's cap lock; the check says
    so, instead of calling it a user's compute process (foreign_process)."""
    config = _config(tmp_path)
    backend = SimulatedBackend(config.simulation)
    gpu = backend.devices()[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "gpuperfd.probe_child.child"])
    lock = GpuLock(config.probes.state_dir, safe_name(gpu.info().uuid))
    lock.acquire()  # the daemon's sweep of this GPU
    try:
        gpu.add_foreign_process(child.pid, 1 << 30)
        outcome = _run(config, backend)
    finally:
        lock.release()
        child.kill()
        child.wait()
    assert outcome.probed == [0]
    assert outcome.not_probed[1] == (f"not probed: busy: gpuperfd is probing this GPU (pid {child.pid}), "
                                     f"its power cap owned by pid {os.getpid()}")


def test_probe_that_outlives_the_deadline_is_unknown_never_healthy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(check_mod, "SIMULATED_MEASURE_SECONDS", 60.0)
    config = _config(tmp_path)
    start = time.monotonic()
    outcome = _run(config, SimulatedBackend(config.simulation), timeout_seconds=4)
    assert time.monotonic() - start < 15  # the deadline (4 s) holds, not the 60 s window
    for verdict in outcome.verdicts:
        assert verdict.state == "unknown"
        assert [r.evidence["failure_reason"] for r in verdict.reasons if r.check == "check_probe_failed"] == ["timeout"]


def test_a_check_probe_that_gives_way_to_a_users_job_is_unknown_and_blames_nothing(tmp_path: Path, monkeypatch) -> None:
    """A user's job lands on GPU 1 while the check measures it: its probe gives way (skipped, preempted);
    the verdict cannot say the GPU is healthy, and asks nobody to act (not contact_support)."""
    monkeypatch.setattr(check_mod, "SIMULATED_MEASURE_SECONDS", 2.0)
    real = check_mod.choose_executor

    def arriving_job(cfg, name, **kw):
        executor = real(cfg, name, **kw)

        def run(device, schedule, abort):
            if device.index == 1:
                threading.Timer(0.3, lambda: device.add_foreign_process(434343, 1 << 30)).start()
            return measure_once(executor, device, schedule, abort)
        return PerPointExecutor(run)

    monkeypatch.setattr(check_mod, "choose_executor", arriving_job)
    config = _config(tmp_path)
    verdicts = _by_gpu(_run(config, SimulatedBackend(config.simulation)))
    reason = next(r for r in verdicts[1].reasons if r.check == "check_probe_failed")
    assert (reason.evidence["status"], reason.evidence["failure_reason"]) == ("skipped", "preempted")
    assert (verdicts[1].state, verdicts[1].action) == ("unknown", "none")
    assert verdicts[0].state == "healthy"


def test_correctness_mismatch_is_unhealthy(tmp_path: Path, monkeypatch) -> None:
    real = check_mod.choose_executor

    def corrupting(cfg, name, **kw):
        executor = real(cfg, name, **kw)

        def run(device, schedule, abort):
            result = measure_once(executor, device, schedule, abort)
            if device.index == 1:
                result.correctness = {"status": "mismatch", "checks": 2, "failed_checks": ["repeat"],
                                      "max_abs_error": 3.5, "max_rel_error": 0.8, "elements_checked": 4096}
            return result
        return PerPointExecutor(run)

    monkeypatch.setattr(check_mod, "choose_executor", corrupting)
    config = _config(tmp_path)
    verdicts = _by_gpu(_run(config, SimulatedBackend(config.simulation)))
    reason = next(r for r in verdicts[1].reasons if r.check == "check_correctness")
    assert (verdicts[1].state, verdicts[1].action) == ("unhealthy", "contact_support")
    assert reason.evidence["max_abs_error"] == 3.5 and verdicts[0].state == "healthy"


def test_check_changes_no_power_cap(tmp_path: Path) -> None:
    config = _config(tmp_path, initial_power_limits={0: 500.0})
    backend = SimulatedBackend(config.simulation)
    before = [d.power_limits().enforced_watts for d in backend.devices()]
    outcome = _run(config, backend)
    assert [d.power_limits().enforced_watts for d in backend.devices()] == before == [500.0, 700.0]
    # GPU 0 runs at 500 W: the 700 W figure does not apply, and the output says so.
    measured = next(r for r in _by_gpu(outcome)[0].reasons if r.check == "check_probe_measured")
    assert "500 W: peers only" in measured.message and measured.evidence["expected"].get("units_per_second") is None


def test_no_state_directory_is_probed_without_creating_one(tmp_path: Path, real_gpus) -> None:
    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": 1, "seed": 1},
                                  "probes": {"state_dir": str(tmp_path / "never-made")}})
    outcome = _run(config, SimulatedBackend(config.simulation))
    assert outcome.probed == [0] and not (tmp_path / "never-made").exists()


def test_a_simulated_check_writes_nothing_under_the_state_directory(tmp_path: Path) -> None:
    """Read-only means read-only: simulated GPUs are nobody else's, so no lock file is made or rewritten."""
    config = _config(tmp_path)
    config.probes.state_dir.mkdir()
    outcome = _run(config, SimulatedBackend(config.simulation))
    assert outcome.probed == [0, 1] and list(config.probes.state_dir.iterdir()) == []


def test_a_real_check_with_a_probe_child_never_creates_the_state_directory(tmp_path: Path, real_gpus) -> None:
    """The probe child's compile cache and child record live in the state directory when it exists;
    a check must not create it (a node where no daemon ever ran)."""
    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": 1, "seed": 1},
                                  "probes": {"state_dir": str(tmp_path / "never-made"), "executor": "child",
                                             "torch_device": "cpu"}})
    outcome = _run(config, SimulatedBackend(config.simulation), preset="tiny")
    assert outcome.probed == [0] and not (tmp_path / "never-made").exists()


def test_lock_file_made_by_root_belongs_to_the_state_directory_owner(tmp_path: Path, real_gpus) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a file to another user")  # CI and the dev VMs run as root
    config = _config(tmp_path, gpus=1)
    config.probes.state_dir.mkdir()
    os.chown(config.probes.state_dir, 4321, 4321)
    backend = SimulatedBackend(config.simulation)
    _run(config, backend)
    lock = config.probes.state_dir / (safe_name(backend.devices()[0].info().uuid) + ".cap.lock")
    assert (lock.stat().st_uid, lock.stat().st_gid) == (4321, 4321)


@pytest.fixture
def daemon_child():
    """A process the check takes for a daemon's probe child (``python -m gpuperfd.probe_child.child``),
    running Python by the time the test gets it (its /proc cmdline is its own)."""
    ready = "import time; print('ready', flush=True); time.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c", ready, "-m", "gpuperfd.probe_child.child"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    yield child
    child.kill()
    child.wait()
    child.stdout.close()


def _on_gpu_between(gpu, pid: int, start: float, end: float) -> list[threading.Timer]:
    """The daemon's child holds ``gpu`` from ``start`` to ``end`` seconds from now (another state
    directory: no lock of ours is held)."""
    timers = [threading.Timer(start, gpu.add_foreign_process, (pid, 1 << 30)),
              threading.Timer(end, gpu.remove_foreign_process, (pid,))]
    for timer in timers:
        timer.daemon = True
        timer.start()
    return timers


@pytest.mark.parametrize("start", [0.0, 0.4], ids=["there-at-the-start", "arriving-mid-probe"])
def test_a_daemons_probe_child_is_waited_for_not_given_way_to(tmp_path: Path, real_gpus, daemon_child,
                                                             start: float) -> None:
    """On a 2x H100 node a check beside a daemon with its own state directory was preempted by the
    daemon's probe child and answered unknown (exit 12): it waits for the child within its deadline."""
    config = _config(tmp_path)
    backend = SimulatedBackend(config.simulation)
    gpu = backend.devices()[1]
    if start == 0.0:
        gpu.add_foreign_process(daemon_child.pid, 1 << 30)
    timers = _on_gpu_between(gpu, daemon_child.pid, start, 2.0)
    try:
        outcome = _run(config, backend, timeout_seconds=30)
    finally:
        for timer in timers:
            timer.cancel()
    assert sorted(outcome.probed) == [0, 1], outcome.not_probed
    assert _by_gpu(outcome)[1].state == "healthy", _by_gpu(outcome)[1].to_dict()


def test_a_daemons_probe_child_that_stays_past_the_deadline_is_named_not_unknown(
        tmp_path: Path, real_gpus, daemon_child) -> None:
    config = _config(tmp_path, gpus=1)
    backend = SimulatedBackend(config.simulation)
    backend.devices()[0].add_foreign_process(daemon_child.pid, 1 << 30)
    outcome = _run(config, backend, timeout_seconds=6)
    assert outcome.probed == []
    assert outcome.not_probed[0] == (f"not probed: busy: gpuperfd is probing this GPU (pid {daemon_child.pid}) "
                                     "until the check's deadline")
    assert _by_gpu(outcome)[0].state != "unknown"

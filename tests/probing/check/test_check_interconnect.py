"""``gpuperfd check``'s interconnect step: with two or more GPUs free it runs (here the real gloo
workers against simulated GPUs) inside the check's time bound, its result under ``interconnect``, and
a wrong sum is charged to the GPU whose own probe gave wrong answers; with none named, the set is
unknown (measure again), never condemned (issue 61)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuperfd.config import config_from_mapping
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.health.evaluate import GpuInputs
from gpuperfd.health.interconnect import UNATTRIBUTED, wrong_sum_rows
from gpuperfd.health.judge import judge, run_row
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probing.check.interconnect import apply_to_inputs
from gpuperfd.probing.check.flow import CheckRequest, run_check
from gpuperfd.commands.check import render_table
from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor


def _check(tmp_path: Path, gpus: int = 2, timeout: float = 30, quick: bool = False, fault=None, busy=None):
    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": gpus, "seed": 1},
                                  "probes": {"state_dir": str(tmp_path / "state")}})
    backend = SimulatedBackend(config.simulation)
    if busy is not None:
        backend.devices()[busy].add_foreign_process(999_997, 1 << 30)
    executor = ProcessInterconnectExecutor("cpu", idle_wait_seconds=0, inject_fault=fault)
    t0 = time.monotonic()
    outcome = run_check(config, CheckRequest(timeout_seconds=timeout, quick=quick), opener=lambda _c: backend,
                        interconnect=(executor, "cpu"))
    return outcome, time.monotonic() - t0, executor


def test_two_idle_gpus_get_an_interconnect_probe_in_the_json_within_the_bound(tmp_path: Path) -> None:
    outcome, took, _ = _check(tmp_path, timeout=30)
    ic = json.loads(json.dumps(outcome.summary()))["interconnect"]  # as the check's --json prints it
    assert ic["status"] == "ok" and ic["gpus"] == [0, 1], ic
    assert [(c["src"], c["dst"]) for c in ic["copies"]] == [(0, 1), (1, 0)]
    assert all(a["sum_ok"] for a in ic["allreduce"]) and len(ic["allreduce"]) == 2
    assert ic["energy_joules"] is not None and ic["energy_joules"] > 0  # the simulated GPUs' counters
    assert {v.state for v in outcome.verdicts} == {"healthy"}
    assert took < 30 and outcome.phases["total"] < 30
    line = render_table(outcome.verdicts, "node", outcome.summary()).splitlines()[-2]
    assert line.startswith("interconnect GPUs 0,1: ok, slowest copy") and "sums ok" in line


def test_a_wrong_sum_no_gpus_own_probe_explains_makes_the_set_unknown_not_unhealthy(tmp_path: Path) -> None:
    """Both GPUs' own probes pass and rank 1's sum is wrong: once both were unhealthy, contact_support
    ("replace the GPU if it fails"); the run cannot say which GPU it was, so each is unknown: measure again."""
    outcome, _, _ = _check(tmp_path, fault=(1, "wrong_sum"))
    assert outcome.summary()["interconnect"]["failure_reason"] == "wrong_result"
    for verdict in outcome.verdicts:
        assert (verdict.state, verdict.action) == ("unknown", "none"), verdict.reasons
        reason = next(r for r in verdict.reasons if r.check == "interconnect_wrong_unattributed")
        assert "all-reduce sum" in reason.message and "measure again" in reason.message
        assert "GPUs 0,1" in reason.message
        assert not any(r.check == "probe_wrong_result" for r in verdict.reasons)


def _ok_run() -> dict:
    return run_row({"status": "ok", "probe": "llm", "preset": "gpt2", "correctness": {"status": "ok"}}, 700.0, 1.0)


WRONG_SUM = InterconnectResult(gpus=(0, 1, 2), status="failed", failure_reason="wrong_result",
                               error_message="sums differ")


def test_a_wrong_sum_with_no_culprit_named_charges_no_gpu_with_a_replacement() -> None:
    """The no-culprit case as the judge sees it: three GPUs whose own probes passed, a wrong sum across them."""
    rows = wrong_sum_rows(WRONG_SUM, {g: [_ok_run()] for g in (0, 1, 2)}, 2.0)
    assert sorted(rows) == [0, 1, 2] and {r["failure_reason"] for r in rows.values()} == {UNATTRIBUTED}
    inputs: dict[int | None, GpuInputs] = {g: GpuInputs(gpu=g, uuid=f"GPU-{g}", runs=[_ok_run()]) for g in (0, 1, 2)}
    apply_to_inputs(WRONG_SUM.to_dict(), inputs, 2.0)
    verdicts = judge(list(inputs.values()), None, 3.0)
    assert [(v.state, v.action) for v in verdicts] == [("unknown", "none")] * 3
    assert all(inputs[g].runs[-1]["probe"] == "llm" for g in (0, 1, 2))  # the GPU's own run stays the one judged


def test_a_wrong_sum_is_charged_to_the_gpu_whose_own_probe_gave_wrong_answers() -> None:
    wrong = run_row({"status": "failed", "failure_reason": "wrong_result", "probe": "llm", "preset": "gpt2"}, 700.0, 1.0)
    rows = wrong_sum_rows(WRONG_SUM, {0: [_ok_run()], 1: [wrong], 2: [_ok_run()]}, 2.0)
    assert list(rows) == [1] and rows[1]["failure_reason"] == "wrong_result"
    mismatch = {**_ok_run(), "correctness": {"status": "mismatch"}}
    assert list(wrong_sum_rows(WRONG_SUM, {0: [_ok_run()], 1: [_ok_run()], 2: [mismatch]}, 2.0)) == [2]
    assert wrong_sum_rows(InterconnectResult(gpus=(0, 1), status="ok"), {0: [wrong], 1: []}, 2.0) == {}


def test_gpuperfd_check_charges_the_bad_gpu_alone_and_its_healthy_peer_stays_healthy(tmp_path: Path) -> None:
    """`simulation.degrade: [{gpu: 1, wrong_results: true}]` and the real `gpuperfd check`: GPU 0 was
    unhealthy, contact_support, from the interconnect's sum ("interconnect/check at  W computed wrong ...")."""
    config = tmp_path / "check.yaml"
    config.write_text("device: {backend: simulated}\n"
                      "simulation: {gpus: 2, seed: 1, degrade: [{gpu: 1, wrong_results: true}]}\n"
                      f"probes: {{state_dir: {tmp_path / 'state'}}}\n")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root), "GPUPERFD_CONFIG": ""}

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuperfd", "check", "--config", str(config), *args],
                              capture_output=True, text=True, env=env, timeout=120, cwd=root)

    body = json.loads(check("--json").stdout)
    assert body["check"]["interconnect"]["failure_reason"] == "wrong_result"
    gpus = {g["gpu"]: g for g in body["gpus"]}
    assert (gpus[0]["state"], gpus[0]["action"]) == ("healthy", "none"), gpus[0]["reasons"]
    assert (gpus[1]["state"], gpus[1]["action"]) == ("unhealthy", "contact_support")
    charged = [r["message"] for r in gpus[1]["reasons"] if r["check"] == "probe_wrong_result"]
    assert any(m.startswith("interconnect/check computed wrong numbers (") for m in charged), charged
    table = check()
    assert table.returncode != 0 and " at  W" not in table.stdout and "gpu 0: [" not in table.stdout, table.stdout


def test_a_hanging_rank_is_ended_within_the_checks_timeout(tmp_path: Path) -> None:
    outcome, took, executor = _check(tmp_path, timeout=14, fault=(0, "hang"))
    ic = outcome.summary()["interconnect"]
    assert (ic["status"], ic["failure_reason"]) == ("failed", "timeout")
    assert took < 14 + 1
    assert executor.last_pids and all(not Path(f"/proc/{pid}").exists() for pid in executor.last_pids)


def test_too_little_time_left_says_so_and_starts_nothing(tmp_path: Path) -> None:
    outcome, took, executor = _check(tmp_path, timeout=6)
    assert "not run" in outcome.summary()["interconnect"]["not_run"]
    assert "interconnect: not run" in render_table(outcome.verdicts, "node", outcome.summary())
    assert executor.last_pids == [] and took < 6 + 1


def test_one_free_gpu_or_quick_runs_no_interconnect_probe(tmp_path: Path) -> None:
    outcome, _, _ = _check(tmp_path, gpus=2, busy=1)
    assert outcome.probed == [0] and "interconnect" not in outcome.summary()
    outcome, _, _ = _check(tmp_path, gpus=3, quick=True)
    assert "interconnect" not in outcome.summary()


def test_the_checks_own_executor_choice_runs_workers_and_creates_no_state_directory(tmp_path: Path) -> None:
    from gpuperfd.probing.check.interconnect import run_interconnect

    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": 2, "seed": 1},
                                  "probes": {"executor": "child", "torch_device": "cpu",
                                             "state_dir": str(tmp_path / "state")}})
    backend = SimulatedBackend(config.simulation)
    result = run_interconnect(config, backend, backend.devices(), time.monotonic() + 30)
    assert result["status"] == "ok" and result["backend"] == "gloo"
    assert not (tmp_path / "state").exists()


def test_a_pair_at_half_bandwidth_is_judged_in_the_check(tmp_path: Path) -> None:
    """The simulated node's pair 0-1 copies at half speed with every link up (no event): the check's
    interconnect step measures it and both GPUs come out degraded, named and with the action."""
    config = config_from_mapping({
        "device": {"backend": "simulated"},
        "simulation": {"gpus": 2, "seed": 1, "interconnect_faults": [{"kind": "half_bandwidth", "gpu": 0, "peer": 1}]},
        "probes": {"state_dir": str(tmp_path / "state")}})
    backend = SimulatedBackend(config.simulation)
    outcome = run_check(config, CheckRequest(timeout_seconds=30), opener=lambda _c: backend)
    assert outcome.summary()["interconnect"]["backend"] == "simulated"
    for verdict in outcome.verdicts:
        assert verdict.state == "degraded", verdict
        assert any(r.check == "interconnect_below_expected" for r in verdict.reasons), verdict.reasons


def test_a_cpu_run_of_the_workers_is_not_judged_against_the_links(tmp_path: Path) -> None:
    """The gloo workers on the CPU copy host memory: their GB/s are never compared with NVLink's."""
    outcome, _, _ = _check(tmp_path)
    assert outcome.summary()["interconnect"]["backend"] == "gloo"
    assert not any(r.check == "interconnect_below_expected" for v in outcome.verdicts for r in v.reasons)

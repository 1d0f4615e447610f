"""Power-cap sweeps on the simulated GPU: change, restore, journal, clamping, recommendation."""

from __future__ import annotations

import csv
import json
import logging
import threading

import pytest

from gpuperfd.caps.guard import CapGuard
from gpuperfd.caps.journal import CapJournal, restore_pending
from gpuperfd.config import ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend
from gpuperfd.probe_data.recommend import SweepPoint, recommend
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.executors import SIMULATED_PROFILE, simulated_executor
from gpuperfd.probing.sweep.caps import CapSpecError, parse_cap_list, resolve_caps
from gpuperfd.probing.sweep.sweeper import SweepAborted, run_sweep


@pytest.fixture
def gpu():
    backend = SimulatedBackend(SimulationConfig(gpus=2, seed=3, initial_power_limits={0: 650.0}))
    return backend.devices()[0]


def ok_result(probe: str = "vit") -> ProbeResult:
    return ProbeResult(probe=probe, variant="t", preset="p", measured_seconds=1.0, units_of_work=100.0,
                       energy_per_unit_joules=1.0, work_unit="image")


def test_sweep_changes_each_cap_then_restores_the_operators_cap(gpu, tmp_path):
    journal = CapJournal(tmp_path)
    seen = []

    def run_point(cap):
        seen.append((cap, gpu.power_limits().enforced_watts))
        entries = journal.entries()
        assert len(entries) == 1 and entries[0][1].original_watts == 650.0  # journaled before the change
        return ok_result()

    points = run_sweep(gpu, journal, [600, 400, 250], run_point, settle_seconds=0)
    assert seen == [(600, 600.0), (400, 400.0), (250, 250.0)]
    assert [p.cap_watts for p in points] == [600, 400, 250]
    assert gpu.power_limits().enforced_watts == 650.0  # the operator's, not the maximum
    assert journal.entries() == []


def test_failure_mid_sweep_still_restores(gpu, tmp_path):
    journal = CapJournal(tmp_path)

    def run_point(cap):
        if cap == 400:
            raise RuntimeError("probe exploded")
        return ok_result()

    with pytest.raises(RuntimeError):
        run_sweep(gpu, journal, [600, 400, 250], run_point, settle_seconds=0)
    assert gpu.power_limits().enforced_watts == 650.0
    assert journal.entries() == []


def test_abort_between_points_restores_and_reports(gpu, tmp_path):
    journal = CapJournal(tmp_path)
    abort = threading.Event()

    def run_point(cap):
        abort.set()  # e.g. SIGTERM arrives during the first point
        return ok_result()

    with pytest.raises(SweepAborted):
        run_sweep(gpu, journal, [600, 400], run_point, settle_seconds=0, abort=abort)
    assert gpu.power_limits().enforced_watts == 650.0
    assert journal.entries() == []


def test_read_only_never_changes_the_cap(gpu, tmp_path):
    calls = []
    original = gpu.set_power_limit
    gpu.set_power_limit = lambda w: calls.append(w) or original(w)  # type: ignore[method-assign]
    points = run_sweep(gpu, CapJournal(tmp_path), [600, 400], lambda cap: ok_result(), read_only=True)
    assert calls == []
    assert [p.cap_watts for p in points] == [650.0]
    assert CapJournal(tmp_path).entries() == []


def test_out_of_range_caps_are_clamped_with_a_warning(gpu, caplog):
    with caplog.at_level(logging.WARNING):
        caps = resolve_caps(parse_cap_list("900,0.5,100,max,default"), gpu.power_limits())
    assert caps == [700, 350, 200]
    assert "900 W is outside the board's range 200-700 W; using 700 W" in caplog.text
    assert "100 W is outside" in caplog.text


@pytest.mark.parametrize("bad", ["", "abc", "-5", "0", "300,,400", "nan"])
def test_bad_cap_lists_are_rejected(bad):
    with pytest.raises(CapSpecError):
        parse_cap_list(bad)


def test_journal_left_by_a_crash_is_restored_at_start(gpu, tmp_path):
    journal = CapJournal(tmp_path)
    guard = CapGuard(gpu, journal)
    guard.set(300.0)  # ... and the process dies here: no restore
    assert gpu.power_limits().enforced_watts == 300.0
    actions = restore_pending(CapJournal(tmp_path), [gpu])
    assert actions == ["gpu 0: 650 W"]
    assert gpu.power_limits().enforced_watts == 650.0
    assert journal.entries() == []


def test_second_change_keeps_the_first_original(gpu, tmp_path):
    journal = CapJournal(tmp_path)
    CapGuard(gpu, journal).set(300.0)  # crashed sweep
    CapGuard(gpu, journal).set(250.0)  # a later sweep before any restart must not record 300 as original
    restore_pending(journal, [gpu])
    assert gpu.power_limits().enforced_watts == 650.0


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b'{"uuid": "x"}', b""])
def test_corrupt_journal_restores_the_default_limit_and_logs(gpu, tmp_path, caplog, content):
    journal = CapJournal(tmp_path)
    CapGuard(gpu, journal).set(300.0)
    path = journal.entries()[0][0]
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR):
        actions = restore_pending(journal, [gpu])
    assert gpu.power_limits().enforced_watts == 700.0  # the board default: the safe choice
    assert "unreadable power-cap journal entry" in caplog.text and "default limit 700 W" in caplog.text
    assert actions and journal.entries() == []


def test_unreadable_state_dir_is_a_clear_error_not_a_crash(gpu, tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    guard = CapGuard(gpu, CapJournal(blocked / "state"))
    with pytest.raises(OSError):
        guard.set(300.0)
    assert gpu.power_limits().enforced_watts == 650.0  # nothing changed when the journal cannot be written


def test_recommendation_matches_the_simulators_true_optimum(tmp_path):
    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=11))
    gpu = backend.devices()[0]
    caps = [700, 650, 600, 550, 500, 450, 400, 350, 300, 250, 200]
    execute = simulated_executor(measure_seconds=0.05, seed=1, noise=0.002)
    for probe in ("llm", "vit", "train"):
        schedule = ScheduleConfig(probe=probe, interval_seconds=60)
        points = run_sweep(gpu, CapJournal(tmp_path), caps, lambda cap: execute.measure(gpu, schedule, threading.Event(), 0.0),
                           settle_seconds=0)
        best = recommend(points, 0.10)
        truth = gpu.true_optimal_cap(WORKLOAD_PROFILES[SIMULATED_PROFILE[probe]], caps, 0.10)
        assert abs(best.cap_watts - truth) <= 50, (probe, best, truth)  # within one cap step
        assert 200 < best.cap_watts < 700
        assert 0 < best.energy_saving_ratio < 0.5 and 0 <= best.slowdown_ratio <= 0.10
        # energy per unit really moves with the cap, as measured from the simulated hardware counter
        energies = {p.cap_watts: p.result.energy_per_unit_joules for p in points}
        assert energies[best.cap_watts] < energies[700]


def test_recommend_ignores_failed_points_and_breaks_ties_downward():
    def point(cap, rate, energy, status="ok"):
        result = ProbeResult(probe="vit", variant="t", preset="p", status=status,
                             failure_reason=None if status == "ok" else "oom",
                             measured_seconds=1.0, units_of_work=rate, energy_per_unit_joules=energy)
        return SweepPoint(cap, result)

    best = recommend([point(700, 100, 1.0), point(600, 95, 0.8), point(500, 93, 0.8), point(400, 50, 0.1, "failed")])
    assert best.cap_watts == 500 and best.slowdown_ratio == pytest.approx(0.07)
    assert best.energy_saving_ratio == pytest.approx(0.2)
    assert recommend([]) is None


def test_sweep_cli_on_simulated_gpu(tmp_path):
    from gpuperfd.cli import main

    out = tmp_path / "points.jsonl"
    code = main(["sweep", "--simulate", "1", "--probe", "attention", "--caps", "max,500,300", "--settle", "0",
                 "--no-stop-early",
                 "--state-dir", str(tmp_path / "state"), "--output", str(out), "--no-progress"])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["power_cap_watts"] for r in rows] == [700, 500, 300]
    assert all(r["schema"] == "gpuperfd.run/1" and r["source"] == "sweep" for r in rows)
    assert all(r["result"]["status"] == "ok" and r["result"]["units_of_work"] > 0 for r in rows)
    assert len({r["sweep_id"] for r in rows}) == 1 and all(r["gpu"]["uuid"].startswith("GPU-") for r in rows)
    # a second sweep appends to the same file; it never overwrites
    assert main(["sweep", "--simulate", "1", "--probe", "attention", "--caps", "300", "--settle", "0",
                 "--state-dir", str(tmp_path / "state"), "--output", str(out), "--no-progress"]) == 0
    assert len(out.read_text().splitlines()) == 4


def test_sweep_cli_caps_out_of_range_are_errors_unless_clamp(tmp_path, capsys):
    from gpuperfd.cli import main

    base = ["sweep", "--simulate", "1", "--probe", "vit", "--state-dir", str(tmp_path), "--settle", "0",
            "--no-progress"]
    for caps in ("9999", "1.5", "700W,100W"):
        assert main([*base, "--caps", caps]) == 2
        err = capsys.readouterr().err
        assert "outside this GPU's range 200-700 W" in err and "--clamp" in err and len(err.splitlines()) == 1
    out = tmp_path / "clamped.csv"
    assert main([*base, "--caps", "9999,700W", "--clamp", "--output", str(out)]) == 0
    with out.open() as handle:
        assert [float(r["power_cap_watts"]) for r in csv.DictReader(handle)] == [700.0]


def test_sweep_cli_refused_caps_create_no_state_dir(tmp_path, capsys):
    """A cap out of range is refused before the state directory is touched: no directory, no lock."""
    from gpuperfd.cli import main

    state = tmp_path / "st2"
    code = main(["sweep", "--simulate", "1", "--probe", "llm", "--caps", "9000", "--state-dir", str(state),
                 "--settle", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--caps: cap 9000.0 is 9000 W, outside this GPU's range 200-700 W" in err
    assert not state.exists() and list(tmp_path.iterdir()) == []


def test_sweep_cli_option_errors_are_one_line(tmp_path, capsys):
    from gpuperfd.cli import main

    code = main(["sweep", "--simulate", "1", "--probe", "llm", "--caps", "700", "--state-dir", str(tmp_path),
                 "--option", "batch_size=0"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert "batch_size: must be between 1 and 65536, got 0" in err
    assert "pydantic" not in err and "http" not in err and "ScheduleConfig" not in err


def test_sweep_output_is_report_input_inference_and_training_side_by_side(tmp_path, capsys):
    """Seed 001's workflow in two commands: sweep llm and train, then `gpuperfd report --history`."""
    from gpuperfd.cli import main

    out = tmp_path / "sweep.jsonl"
    code = main(["sweep", "--simulate", "1", "--probe", "llm,train", "--caps", "max,500,300", "--settle", "0",
                 "--no-stop-early", "--state-dir", str(tmp_path / "state"), "--output", str(out), "--no-progress",
                 "--report", str(tmp_path / "direct")])
    assert code == 0
    assert main(["report", "--history", str(out), "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    assert "1 GPU(s), 2 series, 6 runs" in printed
    assert "llm/gpt2" in printed and "train/gpt2" in printed
    for folder in ("direct", "report"):
        summary = (tmp_path / folder / "summary.csv").read_text()
        assert "llm" in summary and "train" in summary and "training" in summary and "inference" in summary
    assert (tmp_path / "direct" / "summary.csv").read_text().splitlines()[0] == \
        (tmp_path / "report" / "summary.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("args,words", [
    (["--caps", "fast"], "--caps"),
    (["--caps", "300", "--output", "x.txt"], ".csv or .jsonl"),
    (["--caps", "300", "--gpu", "5"], "no such GPU"),
])
def test_sweep_cli_rejects_bad_input(tmp_path, capsys, args, words):
    from gpuperfd.cli import main

    code = main(["sweep", "--simulate", "1", "--probe", "vit", "--state-dir", str(tmp_path), *args])
    assert code == 2
    assert words in capsys.readouterr().err


def _fast_config(tmp_path):
    path = tmp_path / "sim.yaml"
    path.write_text("probes:\n  simulated_measure_seconds: 0.2\n")
    return str(path)


def test_sweep_labels_simulated_telemetry_and_one_line_per_point(tmp_path, capsys):
    """--label lands in every record and the CSV; simulated points fill temperature mean, memory
    utilization and (train) the loss; off a terminal each finished point is one line on stderr."""
    from gpuperfd.cli import main

    out = tmp_path / "train.csv"
    code = main(["sweep", "--simulate", "1", "--config", _fast_config(tmp_path), "--probe", "train",
                 "--caps", "700,400", "--no-stop-early", "--settle", "0", "--state-dir", str(tmp_path / "state"),
                 "--label", "dataset=wikitext", "--label", "framework=hf", "--output", str(out)])
    assert code == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("sweep train gpu0 ")]
    assert len(lines) == 2
    assert "1/2: 700 W: ok " in lines[0] and "token/s" in lines[0] and "left)" in lines[0]
    assert "2/2: 400 W: ok " in lines[1] and "(done in " in lines[1]
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["labels"] for r in rows] == ["dataset=wikitext;framework=hf"] * 2
    for row in rows:
        assert 20 < float(row["temperature_celsius_mean"]) <= float(row["temperature_celsius_max"]) < 110
        assert 0 < float(row["memory_utilization_ratio"]) <= 1
        assert 0 < float(row["loss"]) <= float(row["loss_first"])


def test_sweep_label_errors_are_usage_errors(tmp_path, capsys):
    from gpuperfd.cli import main

    for label, words in (("dataset", "expected KEY=VALUE"), ("batch_size=4", "already a column")):
        code = main(["sweep", "--simulate", "1", "--probe", "vit", "--caps", "700", "--state-dir", str(tmp_path),
                     "--label", label])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.splitlines()) == 1


def test_sweep_read_only_says_which_caps_it_did_not_measure(tmp_path, capsys):
    from gpuperfd.cli import main

    code = main(["sweep", "--simulate", "1", "--config", _fast_config(tmp_path), "--probe", "vit",
                 "--caps", "current,400", "--read-only", "--settle", "0", "--state-dir", str(tmp_path / "s"),
                 "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert "read-only: measured the current cap 700 W only; 400 W not measured" in err


def test_a_sweep_that_gives_way_to_a_users_job_restores_the_operators_cap(tmp_path, capsys):
    """The one owned sweep (daemon and `gpuperfd sweep`): a user's process appears on the GPU
    mid-measurement at a lowered cap; the sweep ends there as preempted (not failed), the cap the
    operator had comes back, and the CLI's table says skipped (preempted)."""
    from gpuperfd.probing.observer import Observers
    from gpuperfd.probing.scheduling.schedule_request import planned_from_schedule
    from gpuperfd.commands.sweep import _print_results
    from gpuperfd.probing.sweep.owned import OwnedStatus, SweepRequest, run_owned_sweep

    gpu = SimulatedBackend(SimulationConfig(gpus=1, seed=3, initial_power_limits={0: 650.0})).devices()[0]
    schedule = ScheduleConfig(probe="attention", interval_seconds=60, caps=["max", 500, 300], settle_seconds=0)
    executor = simulated_executor(0.6, seed=1)
    seen = []

    class Watch:
        def on_cap(self, watts):
            seen.append(watts)
            if watts == 500:  # a user's job lands while the sweep holds 500 W
                threading.Timer(0.2, lambda: gpu.add_foreign_process(717171, 1 << 30)).start()

        def on_measuring(self, running):
            pass

        def on_point(self, point):
            pass

    outcome = run_owned_sweep(gpu, CapJournal(tmp_path / "state"), SweepRequest([planned_from_schedule(schedule)], None), executor,
                              lambda s, o: Observers([Watch()]), threading.Event())
    assert outcome.status is OwnedStatus.PREEMPTED and "717171" in outcome.detail
    points = outcome.sweeps[0][1]
    assert [(round(p.cap_watts), p.result.status, p.result.failure_reason) for p in points] == [
        (700, "ok", None), (500, "skipped", "preempted")]  # 300 W never set
    assert seen == [700, 500, None] and gpu.power_limits().enforced_watts == 650.0
    assert not CapJournal(tmp_path / "state").entries()  # the journal entry is gone: nothing left to restore
    assert _print_results(0.05, "attention", points, 3) == 0  # not a failure
    printed = capsys.readouterr().out
    assert "skipped (preempted)" in printed
    assert "sweep interrupted after 1 of 3 points: no recommendation" in printed and "recommended cap" not in printed


def test_restore_caps_says_when_the_state_dir_is_missing_and_exits_2(tmp_path, capsys):
    """A mistyped --state-dir is not "all restored": the script running it hears so, and nothing is created."""
    from gpuperfd.cli import main

    missing = tmp_path / "nonexistent"
    assert main(["restore-caps", "--simulate", "1", "--state-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"state directory {missing} does not exist: no power-cap journal there" in err
    assert not missing.exists()


def test_restore_caps_with_nothing_to_restore_says_so_and_succeeds(tmp_path, capsys):
    from gpuperfd.cli import main

    state = tmp_path / "state"
    state.mkdir()
    assert main(["restore-caps", "--simulate", "1", "--state-dir", str(state)]) == 0
    captured = capsys.readouterr()
    assert f"nothing to restore (no power-cap journal entry in {state})" in captured.out and captured.err == ""
    assert list(state.iterdir()) == []


def test_a_point_without_room_stops_the_sweep_and_restores(gpu, tmp_path):
    """No cap makes the card's memory larger: a preset that does not fit is tried once, not at every cap."""
    journal = CapJournal(tmp_path)
    seen = []

    def run_point(cap):
        seen.append(cap)
        return ProbeResult.failure("llm", "graph", "llama-3.1-8b", "no_room", "preset: llama-3.1-8b ... not run",
                                   status="skipped")

    points = run_sweep(gpu, journal, [600, 400, 250], run_point, settle_seconds=0)
    assert seen == [600] and [(p.result.status, p.result.failure_reason) for p in points] == [("skipped", "no_room")]
    assert gpu.power_limits().enforced_watts == 650.0 and journal.entries() == []


def _listing(folder) -> list[str] | None:
    from pathlib import Path

    root = Path(folder)
    return sorted(str(p) for p in root.rglob("*")) if root.exists() else None


def test_a_simulated_sweep_without_a_state_dir_writes_nothing_outside_a_temporary_one(tmp_path, monkeypatch):
    """``sweep --simulate`` once created /var/lib/gpuperfd (a real node's directory) and left a .cap.lock
    there for a simulated GPU whose caps die with the process."""
    import tempfile

    from gpuperfd.cli import main
    from gpuperfd.config import ProbesConfig

    default = ProbesConfig().state_dir
    before = _listing(default)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPERFD_CONFIG", raising=False)
    assert main(["sweep", "--simulate", "1", "--probe", "attention", "--caps", "max,300", "--settle", "0",
                 "--no-progress"]) == 0
    assert _listing(default) == before
    assert list(tmp_path.iterdir()) == []  # the temporary state directory is gone too


def test_a_sweep_whose_lower_caps_were_ruled_out_says_so_not_zero_percent(capsys):
    """700 W measured, 300 W skipped by the early stop: the CLI once printed "recommended cap: 700 W:
    0.0% less energy per token, 0.0% slower than 700 W"; the landing page said "no recommendation"."""
    from gpuperfd.commands.sweep import _print_results

    ok = ProbeResult(probe="llm", variant="graph", preset="gpt2", started_at=1.0, measured_seconds=1.0,
                     units_of_work=1000.0, work_unit="token", energy_per_unit_joules=0.4, average_power_watts=400.0)
    ruled_out = ProbeResult.failure("llm", "graph", "gpt2", "early_stop", "clearly slower", status="skipped",
                                    started_at=2.0)
    assert _print_results(0.10, "llm", [SweepPoint(700.0, ok), SweepPoint(300.0, ruled_out)]) == 0
    printed = capsys.readouterr().out
    assert "0.0% less energy" not in printed and "recommended cap" not in printed
    assert "no recommendation: the lower caps were ruled out" in printed


def test_restore_caps_on_simulated_gpus_without_a_state_file_has_nothing_to_restore(tmp_path, monkeypatch, capsys):
    """It once answered "state directory /var/lib/gpuperfd does not exist" (exit 2) for GPUs whose caps
    never outlive their process."""
    from gpuperfd.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPERFD_CONFIG", raising=False)
    assert main(["restore-caps", "--simulate", "1"]) == 0
    assert "nothing to restore (simulated GPUs without simulation.state_file" in capsys.readouterr().out

"""Where a report or a run file goes, checked before anything runs: only the last folder is created
(``report --out /nonexistent/a/b`` and ``sweep --report`` grew that tree at /), and an empty ``--out``
or ``--output`` is refused (it wrote into the current directory, or wrote nothing without a word)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuperfd.cli import main

pytest.importorskip("matplotlib")

HISTORY = Path(__file__).parents[1] / "data" / "history-h100-sim.jsonl"


def test_report_out_empty_or_under_a_missing_folder_is_refused_and_nothing_is_written(tmp_path, monkeypatch,
                                                                                       capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--history", str(HISTORY), "--out", ""]) == 2
    assert "--out: empty" in capsys.readouterr().err
    deep = tmp_path / "nonexistent" / "a" / "b"
    assert main(["report", "--history", str(HISTORY), "--out", str(deep)]) == 2
    assert f"its parent {deep.parent} does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["report", "--history", str(HISTORY), "--out", str(tmp_path / "new")]) == 0  # the last folder: made
    assert (tmp_path / "new" / "report.html").is_file()


def test_a_sweeps_report_folder_is_checked_before_the_sweep(tmp_path, capsys) -> None:
    deep = tmp_path / "nonexistent" / "r"
    assert main(["sweep", "--simulate", "1", "--probe", "llm", "--caps", "300", "--state-dir", str(tmp_path / "s"),
                 "--report", str(deep)]) == 2
    assert f"--report {deep}: its parent" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no sweep ran: no state directory either


@pytest.mark.parametrize("argv", [["probe", "llm", "--simulate", "1"],
                                  ["sweep", "--simulate", "1", "--probe", "llm", "--caps", "300"]])
def test_an_empty_output_is_refused_not_ignored(argv: list[str], tmp_path, capsys) -> None:
    assert main([*argv, "--output", ""]) == 2
    assert "output: empty" in capsys.readouterr().err


def test_a_sweep_stopped_mid_way_gets_no_recommendation_from_the_report_either(tmp_path, capsys) -> None:
    """The sweep CLI said "interrupted after 3 of 6 points, no recommendation"; the report of its own
    output once recommended "500 W ... 0 W less while busy" from those three points."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sweep.jsonl"
    sweep = subprocess.Popen([sys.executable, "-m", "gpuperfd", "sweep", "--simulate", "1", "--probe", "llm",
                              "--caps", "700,600,500,400,300,200", "--settle", "0", "--no-stop-early",
                              "--state-dir", str(tmp_path / "state"), "--output", str(out), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.1)
    sweep.send_signal(signal.SIGINT)
    _, err = sweep.communicate(timeout=60)
    assert "no recommendation" in err
    assert main(["report", "--history", str(out), "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert "no recommendation (fewer than two measured caps, or its latest sweep was cut short)" in printed
    assert " W (" not in printed  # no cap named


@pytest.mark.parametrize(("planned", "recommends"), [(6, False), (3, True)])
def test_a_sweep_stopped_between_two_points_is_known_by_its_plan(planned: int, recommends: bool, tmp_path) -> None:
    """A stop between two points leaves no aborted record: each record says how many points its sweep
    was to measure, and three of six is a sweep cut short."""
    import json

    from gpuperfd.probe_data.record import build_record
    from gpuperfd.probe_data.result import ProbeResult
    from gpuperfd.report import build_report, load_history

    path = tmp_path / "runs.jsonl"
    with path.open("w") as handle:
        for n, (cap, rate, energy) in enumerate(((700, 1000.0, 0.40), (600, 990.0, 0.35), (500, 960.0, 0.31))):
            result = ProbeResult(probe="llm", variant="graph", preset="gpt2", started_at=100.0 + n,
                                 measured_seconds=1.0, units_of_work=rate, work_unit="token",
                                 energy_per_unit_joules=energy, average_power_watts=rate * energy)
            record = build_record(result, "sweep", power_cap_watts=cap, sweep_id="cli-1", sweep_points=planned,
                                  gpu={"uuid": "GPU-1", "index": 0, "name": "NVIDIA H100 80GB HBM3"})
            handle.write(json.dumps(record) + "\n")
    rec = build_report(load_history([path]), max_slowdown=0.10, remove_outliers=False).series[0].recommendation
    assert (rec is not None) == recommends
    if recommends:
        assert rec.cap_watts == 500

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

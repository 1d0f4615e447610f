"""``gpuperfd report --facet KEY``: one report per label value, and an index that sets them side by side."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuperfd.cli import main

pytest.importorskip("matplotlib")


def _probe(out: Path, *labels: str) -> None:
    argv = ["probe", "vit", "--simulate", "1", "--batch-size", "1", "8", "--repeats", "2", "--measure-seconds", "0.05",
            "--no-progress", "--output", str(out)]
    for label in labels:
        argv += ["--label", label]
    assert main(argv) == 0


def test_facet_writes_one_report_per_label_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "vit.csv"
    _probe(runs, "dataset=cifar10")
    _probe(runs, "dataset=food/101")  # a value that is not a safe folder name
    _probe(runs)  # no dataset label at all
    out = tmp_path / "report"
    assert main(["report", "--history", str(runs), "--facet", "dataset", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dataset = cifar10:" in printed and "dataset = food/101:" in printed and "dataset = (unset):" in printed
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["dataset-unset", "dataset=cifar10", "dataset=food_101"]
    for folder in folders:
        with (out / folder / "points.csv").open() as handle:
            points = list(csv.DictReader(handle))
        # each facet holds its own runs only: two batch sizes, one label value
        assert len(points) == 2
        assert {p["labels"] for p in points} == {"" if folder == "dataset-unset" else
                                                 "dataset=" + folder.split("=", 1)[1].replace("_", "/")}
    index = (out / "index.html").read_text()
    assert index.count("<img") == 3 and 'href="dataset=food_101/report.html"' in index
    assert "dataset = food/101" in index


def test_facet_on_a_label_no_run_has_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "vit.jsonl"
    _probe(runs, "dataset=cifar10")
    capsys.readouterr()
    assert main(["report", "--history", str(runs), "--facet", "driver", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run has the label 'driver'" in err[0] and "dataset" in err[0]
    assert not (tmp_path / "r").exists()

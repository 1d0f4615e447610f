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


def _sweep_runs(tmp_path: Path) -> Path:
    """Two facets of one workload at clearly different throughput (batch 1 and batch 32)."""
    config = tmp_path / "fast.yaml"
    config.write_text("probes:\n  simulated_measure_seconds: 0.05\n")
    runs = tmp_path / "sweeps.jsonl"
    for batch, label in ((1, "small"), (32, "large")):
        assert main(["sweep", "--simulate", "1", "--config", str(config), "--probe", "vit", "--caps", "max,500,300",
                     "--settle", "0", "--no-stop-early", "--state-dir", str(tmp_path / "state"), "--no-progress",
                     "--option", f"batch_size={batch}", "--label", f"size={label}", "--output", str(runs)]) == 0
    return runs


def _rate_ylims(runs: Path, free: bool) -> dict[str, tuple[float, float]]:
    """Each facet's throughput panel's y range, drawn as `report --facet size` draws it."""
    from gpuperfd.report import build_report, load_history
    from gpuperfd.report.facets import split_by_label
    from gpuperfd.report.figures import cap_figure, cap_panel_ranges
    from gpuperfd.report.scales import merge, shared

    reports = {v: build_report(s, 0.1) for v, s in split_by_label(load_history([str(runs)]), "size").items()}
    ranges = None if free else merge(cap_panel_ranges(r) for r in reports.values())
    out = {}
    for value, report in reports.items():
        with shared(ranges):
            fig = cap_figure(report)
        ax = next(a for a in fig.get_axes() if getattr(a, "gpuperfd_panel", (None,))[0] == (("vit", "vit-b16"), "rate"))
        out[value] = ax.get_ylim()
    return out


def test_facets_share_each_panels_y_scale_unless_freed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = _sweep_runs(tmp_path)
    shared_lims = _rate_ylims(runs, free=False)
    assert shared_lims["small"] == shared_lims["large"]
    free_lims = _rate_ylims(runs, free=True)
    assert free_lims["small"] != free_lims["large"]
    low, high = shared_lims["small"]  # the shared scale holds both facets' data
    assert low <= min(v[0] for v in free_lims.values()) * 1.2 and high >= max(v[1] for v in free_lims.values()) * 0.9
    for flags in ([], ["--free-y"]):
        assert main(["report", "--history", str(runs), "--facet", "size", "--out", str(tmp_path / "r"), *flags]) == 0


def test_free_y_without_facet_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "vit.csv"
    _probe(runs, "dataset=cifar10")
    capsys.readouterr()
    assert main(["report", "--history", str(runs), "--free-y", "--out", str(tmp_path / "r")]) == 2
    assert "--free-y frees the y-scales of facets; it needs --facet KEY" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()

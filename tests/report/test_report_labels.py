"""Issue 34, item 2: runs with different ``--label`` values are never merged, and the report tells them apart."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuperfd.probe_data.record import append_records, build_record
from gpuperfd.probe_data.result import ProbeResult

pytest.importorskip("matplotlib")


def _vit(rate: float, batch: int, started: float) -> ProbeResult:
    return ProbeResult(probe="vit", variant="eager", preset="tiny", device="cpu", started_at=started,
                       measured_seconds=1.0, units_of_work=rate, work_unit="image",
                       params={"model": "tiny", "batch_size": batch},
                       throughput={"images_per_second": rate}, latencies={"batch_seconds": [batch / rate] * 3},
                       peak_memory_bytes=1 << 20)


def test_two_labelled_studies_on_one_host_stay_apart(tmp_path: Path) -> None:
    from gpuperfd.cli import main
    from gpuperfd.report import build_report, load_history
    from gpuperfd.report.figures import axes_figure, axis_rows, bar_figure, bar_groups, empty_panels

    files = []
    for dataset, rate in (("cifar10", 100.0), ("food101", 50.0)):
        path = tmp_path / f"vit-{dataset}.csv"
        append_records(path, [build_record(_vit(rate, b, 1e9 + b), "probe", host="same-host",
                                           labels={"dataset": dataset}) for b in (1, 8)])
        files.append(path)
    report = build_report(load_history(files))
    assert len(report.series) == 4
    assert all(p.runs == 1 for s in report.series for p in s.points)  # never averaged together
    assert {(s.labels["dataset"], s.batch_size): s.points[0].rate for s in report.series} == {
        ("cifar10", 1): 100.0, ("cifar10", 8): 100.0, ("food101", 1): 50.0, ("food101", 8): 50.0}
    assert [(p, c) for p, c, _, _ in bar_groups(report)] == [("vit", ["dataset"])]
    assert empty_panels(bar_figure(report)) == []
    # a label is also an axis (categorical), next to the parameters that vary
    assert [(p, f) for p, f, _, _ in axis_rows(report)] == [("vit", "batch_size"), ("vit", "dataset")]
    assert empty_panels(axes_figure(report)) == []
    out = tmp_path / "r"
    assert main(["report", "--history", *map(str, files), "--out", str(out)]) == 0
    with (out / "points.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["labels"] for r in rows) == ["dataset=cifar10"] * 2 + ["dataset=food101"] * 2
    assert "dataset=food101" in (out / "report.html").read_text()

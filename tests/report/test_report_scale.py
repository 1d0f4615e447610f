"""Issue 34, item 5: one noisy point never flattens a chart (log scale, ringed outliers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuperfd.probe_data.record import append_records, build_record
from gpuperfd.probe_data.result import ProbeResult

pytest.importorskip("matplotlib")


def _llm(batch: int, prompt: int, rate: float) -> ProbeResult:
    return ProbeResult(probe="llm", variant="graph", preset="gpt2", device="cpu", started_at=1e9 + batch + prompt,
                       measured_seconds=1.0, units_of_work=rate, work_unit="token",
                       params={"model": "gpt2", "batch_size": batch, "prompt_tokens": prompt},
                       throughput={"output_tokens_per_second": rate},
                       latencies={"ttft_seconds": [0.01] * 3, "tpot_seconds": [1.0 / rate] * 3},
                       peak_memory_bytes=(1 << 20) * batch)


def _report(tmp_path: Path, log_y: bool | None = None):
    from gpuperfd.report import build_report, load_history

    runs = tmp_path / "m.jsonl"
    if not runs.exists():
        rates = {(4, 256): 4700.0, (4, 512): 4650.0, (32, 256): 4720.0, (32, 512): 19.9, (4, 896): 4600.0,
                 (32, 896): 4680.0}
        append_records(runs, [build_record(_llm(b, p, r), "probe", host="h") for (b, p), r in rates.items()])
    return build_report(load_history([runs]), log_y=log_y)


def _rate_axes(fig):
    return [ax for ax in fig.get_axes() if "throughput" in ax.get_ylabel()]


def test_one_slow_point_gets_a_log_axis_and_a_ring(tmp_path: Path) -> None:
    from gpuperfd.report.figures import axes_figure, empty_panels

    fig = axes_figure(_report(tmp_path))
    assert empty_panels(fig) == []
    rate = _rate_axes(fig)
    assert rate and all(ax.get_yscale() == "log" for ax in rate)  # 4700 / 19.9 > 100: automatic
    assert all(getattr(ax, "gpuperfd_outliers", 0) == 1 for ax in rate)  # a single-run matrix still marks it
    memory = [ax for ax in fig.get_axes() if "memory" in ax.get_ylabel()]
    assert all(ax.get_yscale() == "linear" for ax in memory)  # 8x span: no reason for a log axis


def test_log_y_forced_on_and_off(tmp_path: Path) -> None:
    from gpuperfd.report.figures import axes_figure, panel_outliers, wants_log

    assert all(ax.get_yscale() == "linear" for ax in _rate_axes(axes_figure(_report(tmp_path, log_y=False))))
    fig = axes_figure(_report(tmp_path, log_y=True))
    assert all(ax.get_yscale() == "log" for ax in fig.get_axes() if ax.get_ylabel())
    assert wants_log([1.0, 2.0], True) and not wants_log([1.0, 200.0], False) and wants_log([1.0, 200.0], None)
    assert not wants_log([0.0, 200.0], True)  # zero cannot be on a log axis
    assert panel_outliers([4700, 4650, 4720, 19.9, 4600]) == [3]
    assert panel_outliers([100, 200, 400, 800, 1600]) == []  # a real trend is not an outlier
    assert panel_outliers([1, 1000]) == []  # too few points to judge


def test_report_cli_takes_log_y(tmp_path: Path) -> None:
    from gpuperfd.cli import main

    _report(tmp_path)
    assert main(["report", "--history", str(tmp_path / "m.jsonl"), "--log-y", "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["report", "--history", str(tmp_path / "m.jsonl"), "--log-y", "--linear-y"])

"""report/realized.py: apply mode's realized savings from the daemon's history lines (issue 45)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuperfd.report import load_history
from gpuperfd.report.realized import realized_lines, realized_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apply"))
from simfleet import make_node  # noqa: E402


def test_realized_savings_per_gpu_model_and_all_from_history(tmp_path) -> None:  # type: ignore[no-untyped-def]
    history = tmp_path / "history.jsonl"
    node = make_node(tmp_path, gpus=2, history=history)
    node.sweep()  # before apply: no point carries an applied cap
    assert realized_rows(load_history([history]).runs) == []
    node.controller.tick()
    node.sweep()
    node.sweep()
    rows = realized_rows(load_history([history]).runs)
    assert sorted(r.gpu.split("/")[1] for r in rows) == ["0", "1"]
    for r in rows:
        state = node.controller.states[int(r.gpu.split("/")[1])]
        assert r.applied_cap_watts == state.applied_watts and r.operator_cap_watts == 700.0 and r.sweeps == 2
        assert r.power_saved_watts > 50 and 0 < r.energy_saving_ratio < 0.6 and r.throughput_loss_ratio <= 0.10
        assert r.mwh_per_year == pytest.approx(r.power_saved_watts * 8766 / 1e6)
    lines = realized_lines(rows)
    total = sum(r.power_saved_watts for r in rows)
    assert any(line.strip().startswith("all GPUs llm/gpt2: 2 GPU(s)") and f"{total:.0f} W less" in line
               for line in lines)
    assert any(line.strip().startswith(f"{rows[0].model} llm/gpt2") for line in lines)


def test_the_report_page_and_summary_carry_the_realized_savings(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from gpuperfd.commands.report import main
    import argparse

    history = tmp_path / "history.jsonl"
    node = make_node(tmp_path, gpus=2, history=history)
    node.sweep()
    node.controller.tick()
    node.sweep()
    args = argparse.Namespace(history=[str(history)], prometheus=None, start=None, end=None, step=None,
                              out=str(tmp_path / "report"), max_slowdown=0.10, keep_outliers=False,
                              rule="within-slowdown", log_y=None, no_rotated=False, facet=None, free_y=False)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "realized savings of apply mode" in out and "all GPUs llm/gpt2: 2 GPU(s)" in out
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Realized savings of apply mode" in page and "700 W" in page

"""``gpuperfd report`` on the llm probe's Llama runs: seed 004's table (TTFT, time per token, tokens/s
per configuration, variants as frameworks, the roofline beside the decode figure) and the speculative
curve with its note, from records the probe wrote."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpuperfd.commands import probe as probe_cli  # noqa: E402
from gpuperfd.report import build_report, write_report  # noqa: E402
from gpuperfd.report.records import load_history  # noqa: E402
from gpuperfd.report.seed004 import seed004_rows, speculative_figure  # noqa: E402


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seed004") / "llama.jsonl"
    parser = argparse.ArgumentParser(prog="gpuperfd")
    probe_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["probe", "llm", "--preset", "llama-tiny", "llama-tiny-spec", "--variant", "graph",
                              "eager", "speculative", "--acceptance-rates", "0.4", "0.8", "--repeats", "2",
                              "--measure-seconds", "0.1", "--no-progress", "--output", str(path)])
    assert probe_cli.main(args) == 0
    return path


def test_the_report_has_seed_004s_table_and_curve(history: Path, tmp_path: Path) -> None:
    report = build_report(load_history([str(history)]), 0.1)
    rows = seed004_rows(report)
    variants = sorted({r["variant"] for r in rows})
    assert variants == ["eager", "graph", "speculative"]
    for row in rows:
        assert row["model"] == "llama-tiny" and row["tokens"] == "16+8"
        assert row["output_tokens_per_second"] > 0
        if row["variant"] != "speculative":
            assert row["ttft_ms"] > 0 and row["tpot_ms"] > 0 and row["decode_tokens_per_second"] > 0
            assert row["roofline_tokens_per_second"] is None  # a CPU has no HBM bandwidth to compare with
    assert speculative_figure(report) is not None
    files = write_report(report, tmp_path / "out")
    html = files.html.read_text()
    section = html[html.index('id="seed004"'):]
    section = section[:section.index("</section>")]
    assert "TTFT ms" in section and "HBM roofline tok/s" in section
    assert "random weights: the acceptance rate is not measured" in section
    assert "at acceptance 0.4:" in section and 'alt="speculative tokens/s against the acceptance rate"' in section


def test_no_llama_run_no_section(history: Path, tmp_path: Path) -> None:
    gpt2 = tmp_path / "gpt2.jsonl"
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    for record in lines:  # the same records as if another model family had run them
        record["result"]["preset"] = "tiny"
    gpt2.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    report = build_report(load_history([str(gpt2)]), 0.1)
    assert seed004_rows(report) == [] and speculative_figure(report) is None
    assert 'id="seed004"' not in write_report(report, tmp_path / "out").html.read_text()

"""``gpuperfd probe``: sweeps, the results table, CSV/JSONL output, usage errors (exit 2)."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from gpuperfd.probes import cli
from gpuperfd.probes.result import ProbeResult

FAST = ["--preset", "tiny", "--repeats", "2", "--measure-seconds", "0.1", "--no-progress"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuperfd")
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["probe", *argv])


def test_register_wires_main() -> None:
    args = parse(["llm"])
    assert args.func is cli.main and args.probe == "llm"


def test_sweep_expands_to_one_spec_per_point() -> None:
    specs = cli.build_specs(parse(["llm", "--preset", "tiny", "--variant", "both", "--batch-size", "1", "3"]))
    assert [(s.variant, s.batch_size) for s in specs] == [("graph", 1), ("graph", 3), ("eager", 1), ("eager", 3)]
    groups = cli.build_specs(parse(["attention", "--preset", "tiny", "--n-groups", "1", "2", "4"]))
    assert [s.n_groups for s in groups] == [1, 2, 4]


def test_jsonl_output_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    code = cli.main(parse(["attention", *FAST, "--n-groups", "1", "2", "--output", str(out)]))
    assert code == 0
    lines = out.read_text().splitlines()
    results = [ProbeResult.from_dict(json.loads(line)) for line in lines]
    assert [r.params["n_groups"] for r in results] == [1, 2]
    assert all(r.ok and len(r.repeats) == 2 for r in results)
    table = capsys.readouterr().out
    assert "attention/sdpa" in table and "flops/s" in table and "CV%" in table
    assert "g=2" in table


def test_csv_output(tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    code = cli.main(parse(["llm", *FAST, "--variant", "both", "--output", str(out)]))
    assert code == 0
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["variant"] for r in rows] == ["graph", "eager"]
    for row in rows:
        assert row["status"] == "ok" and row["work_unit"] == "token"
        assert float(row["throughput.output_tokens_per_second"]) > 0
        assert float(row["throughput.output_tokens_per_second.cv"]) >= 0
        assert float(row["latency.ttft_seconds.p99"]) >= float(row["latency.ttft_seconds.p50"]) > 0
        assert row["param.batch_size"] == "2"
        assert row["energy_joules"] == ""  # CPU: no energy counter


def test_json_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(parse(["vit", *FAST, "--json"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["probe"] == "vit" and data[0]["throughput"]["images_per_second"] > 0


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["vit", "--preset", "tiny", "--output", "out.txt"], "output"),
        (["vit", "--preset", "tiny", "--prompt-tokens", "5"], "prompt_tokens"),
        (["llm", "--preset", "tiny", "--batch-size", "0"], "batch_size"),
        (["llm", "--preset", "nope"], "preset"),
        (["llm", "--preset", "tiny", "--n-groups", "2"], "n_groups"),
        (["attention", "--preset", "tiny", "--n-groups", "3"], "n_groups"),
        (["llm", "--preset", "tiny", "--variant", "warp"], "variant"),
        (["llm", "--preset", "tiny", "--dtype", "int4"], "dtype"),
        (["llm", "--preset", "tiny", "--timeout", "0"], "timeout"),
    ],
)
def test_bad_input_exits_2_naming_the_field(argv: list[str], field: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(parse(argv))
    assert code == 2
    err = capsys.readouterr().err
    assert f"gpuperfd probe: {field}:" in err, err


def test_result_row_flattens_failures() -> None:
    failed = ProbeResult.failure("llm", "graph", "tiny", reason="timeout", message="took too long\nmore")
    row = cli.result_row(failed)
    assert row["status"] == "failed" and row["failure_reason"] == "timeout"
    assert row["error_message"] == "took too long"
    table = cli.results_table([failed])
    assert "failed:timeout" in table

"""``gpuperfd probe``: sweeps, the results table, CSV/JSONL output, usage errors (exit 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpuperfd.commands import probe as cli
from gpuperfd.probing import matrix
from probe_cli_args import options, parse
from gpuperfd.probe_data.record import CSV_COLUMNS, build_record, record_row
from gpuperfd.probe_data.result import ProbeResult

FAST = ["--preset", "tiny", "--repeats", "2", "--measure-seconds", "0.1", "--no-progress"]


def test_register_wires_main() -> None:
    args = parse(["llm"])
    assert args.func is cli.main and args.probe == "llm"


def test_sweep_expands_to_one_spec_per_point() -> None:
    specs = matrix.build_specs(options(["llm", "--preset", "tiny", "--variant", "both", "--batch-size", "1", "3"]))
    assert [(s.variant, s.batch_size) for s in specs] == [("graph", 1), ("graph", 3), ("eager", 1), ("eager", 3)]
    groups = matrix.build_specs(options(["attention", "--preset", "tiny", "--n-groups", "1", "2", "4"]))
    assert [s.n_groups for s in groups] == [1, 2, 4]


def test_jsonl_output_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    code = cli.main(parse(["attention", *FAST, "--n-groups", "1", "2", "--output", str(out)]))
    assert code == 0
    lines = out.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(r["schema"] == "gpuperfd.run/1" and r["source"] == "probe" and r["gpu"]["name"] == "cpu"
               and r["host"] for r in records)
    results = [ProbeResult.from_dict(r["result"]) for r in records]
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
    assert list(rows[0]) == list(CSV_COLUMNS)
    for row in rows:
        assert row["status"] == "ok" and row["work_unit"] == "token"
        assert float(row["output_tokens_per_second"]) > 0 and float(row["requests_per_second"]) > 0
        assert float(row["units_per_second_cv"]) >= 0
        assert float(row["ttft_p99_seconds"]) >= float(row["ttft_p50_seconds"]) > 0
        assert float(row["tpot_mean_seconds"]) > 0 and int(row["peak_memory_bytes"]) > 0
        assert row["batch_size"] == "2" and row["gpu_name"] == "cpu" and row["host"]
        assert row["energy_joules"] == ""  # CPU: no energy counter
    # A second run appends under the same header; a file of another format is refused, untouched.
    assert cli.main(parse(["llm", *FAST, "--output", str(out)])) == 0
    with out.open() as fh:
        assert len(list(csv.DictReader(fh))) == 3
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert cli.main(parse(["llm", *FAST, "--output", str(other)])) == 2
    assert other.read_text() == "a,b\n1,2\n"


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
        (["llm", "--preset", "tiny", "--n-groups", "3"], "n_groups"),
        (["llm", "--preset", "tiny", "--variant", "eager", "--n-groups", "2"], "n_groups"),
        (["llm", "--preset", "tiny", "tiny-x2", "--prompt-tokens", "64", "128"], "output_tokens"),
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


def test_failure_row_and_table() -> None:
    failed = ProbeResult.failure("llm", "graph", "tiny", reason="timeout", message="took too long\nmore")
    row = record_row(build_record(failed, "probe", host="h"))
    assert set(row) == set(CSV_COLUMNS)
    assert row["status"] == "failed" and row["failure_reason"] == "timeout" and row["error"] == "took too long"
    table = cli.results_table([failed])
    assert "failed:timeout" in table


def test_matrix_is_the_product_of_every_list() -> None:
    specs = matrix.build_specs(options(["llm", "--preset", "tiny", "tiny-x2", "--batch-size", "1", "2",
                                   "--prompt-tokens", "8", "16", "--n-groups", "1", "2"]))
    assert len(specs) == 16
    assert {(s.model, s.batch_size, s.prompt_tokens, s.n_groups) for s in specs} == {
        (m, b, t, g) for m in ("tiny", "tiny-x2") for b in (1, 2) for t in (8, 16) for g in (1, 2)}


def test_config_file_describes_the_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bench.json"
    config.write_text(json.dumps({"probe": "llm", "preset": "tiny", "variant": ["graph", "eager"],
                                  "prompt_tokens": 8, "output_tokens": [4, 8], "warmup": 2, "repeats": 3}))
    specs = matrix.build_specs(options(["--config", str(config)]))
    assert [(s.variant, s.output_tokens, s.warmup, s.repeats) for s in specs] == [
        ("graph", 4, 2, 3), ("graph", 8, 2, 3), ("eager", 4, 2, 3), ("eager", 8, 2, 3)]
    # flags override the file
    specs = matrix.build_specs(options(["--config", str(config), "--repeats", "1", "--variant", "graph"]))
    assert [(s.variant, s.repeats) for s in specs] == [("graph", 1), ("graph", 1)]
    config.write_text(json.dumps({"probe": "llm", "batchsize": 4}))
    assert cli.main(parse(["--config", str(config)])) == 2
    err = capsys.readouterr().err
    assert "config:" in err and "'batchsize'" in err
    config.write_text("probe: llm\nbatch_size: [1, 0]\n")
    assert cli.main(parse(["--config", str(config)])) == 2
    assert "gpuperfd probe: batch_size:" in capsys.readouterr().err


SIM = ["--simulate", "1", "--repeats", "3", "--measure-seconds", "0.05"]


def test_simulate_runs_on_the_simulator_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpt2.csv"
    code = cli.main(parse(["llm", "--preset", "gpt2", *SIM, "--label", "dataset=synthetic", "--output", str(out)]))
    assert code == 0
    captured = capsys.readouterr()
    assert "SIMULATED" in captured.err and "SIMULATED" in captured.out
    assert "llm/simulated" in captured.out
    # off a terminal: one line for the finished point, naming it simulated
    assert "llm/simulated gpt2 b=" in captured.err and ": ok " in captured.err and "token/s" in captured.err
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1
    row = rows[0]
    assert row["variant"] == "simulated" and row["gpu_backend"] == "simulated" and row["labels"] == "dataset=synthetic"
    for column in ("requests_per_second", "request_mean_seconds", "gpu_utilization_ratio", "temperature_celsius_mean",
                   "temperature_celsius_max", "memory_utilization_ratio", "average_power_watts",
                   "energy_per_unit_joules", "peak_memory_bytes"):
        assert row[column] not in ("", None), column
    assert float(row["average_power_watts"]) > 100  # an H100 under load, not a CPU


@pytest.mark.parametrize(("flag", "name"), [("h200", "NVIDIA H200"), ("A100", "NVIDIA A100-SXM4-80GB"),
                                            (None, "NVIDIA H100 80GB HBM3")])
def test_simulate_model_picks_the_simulated_card(flag: str | None, name: str, tmp_path: Path) -> None:
    """``probe --simulate`` always simulated an H100; the fleet and the daemon could pick the card."""
    out = tmp_path / "vit.jsonl"
    argv = ["vit", *SIM, "--no-progress", "--output", str(out)] + (["--simulate-model", flag] if flag else [])
    assert cli.main(parse(argv)) == 0
    record = json.loads(out.read_text())
    assert record["gpu"]["name"] == name and ProbeResult.from_dict(record["result"]).gpu_name == name


def test_a_card_the_simulator_does_not_model_is_refused_by_name() -> None:
    with pytest.raises(SystemExit):
        parse(["vit", "--simulate", "1", "--simulate-model", "H300"])


def test_simulate_pools_one_window_per_repeat(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    code = cli.main(parse(["train", *SIM, "--simulate", "2", "--device", "cuda:1", "--no-progress",
                           "--output", str(out)]))
    assert code == 0
    record = json.loads(out.read_text())
    result = ProbeResult.from_dict(record["result"])
    assert len(result.repeats) == 3 and result.device == "sim:1"
    assert result.extra["loss"] > 0 and result.extra["loss_first"] >= result.extra["loss"]
    rates = [rep.throughput["tokens_per_second"] for rep in result.repeats]
    assert min(rates) <= result.throughput["tokens_per_second"] <= max(rates)
    assert result.energy_joules == pytest.approx(sum(rep.energy_joules for rep in result.repeats))


@pytest.mark.parametrize("argv,words", [
    (["--simulate", "1", "--device", "cpu"], "--simulate runs on simulated GPUs"),
    (["--simulate", "1", "--device", "cuda:1"], "--simulate 1 makes GPUs 0..0"),
    (["--simulate", "0"], "at least 1 simulated GPU"),
    (["--label", "nolabel"], "expected KEY=VALUE"),
    (["--label", "variant=x"], "already a column"),
    (["--simulate-model", "H200"], "simulate_model: goes with --simulate N"),
])
def test_simulate_and_label_usage_errors(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(parse(["vit", *argv])) == 2
    assert words in capsys.readouterr().err


def test_table_drops_columns_no_point_has_and_shows_attention_latency(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(parse(["attention", *SIM, "--no-progress"]))
    assert code == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert "TTFT" not in header and "req/s" not in header
    assert "iteration" in table and "p99 ms" in header


def test_starting_estimate_depends_on_the_device_and_is_redone_from_the_first_point() -> None:
    """Seed 002's CPU matrix took about 12 s for 4 points on a quiet machine (the old estimate, 8 s
    of fixed cost a point, said 33 s: 2.7 times too high)."""
    points = matrix.build_specs(options(["llm", "--preset", "tiny", "tiny-x2", "--batch-size", "1", "4",
                                    "--prompt-tokens", "16", "--output-tokens", "4", "--repeats", "2",
                                    "--measure-seconds", "0.1", "--warmup", "1"]))
    estimate = matrix.estimate_seconds(points)
    assert 12.0 / 1.5 <= estimate <= 12.0 * 1.5
    on_gpu = matrix.build_specs(options(["llm", "--preset", "tiny", "--device", "cuda", "--repeats", "2",
                                    "--measure-seconds", "0.1"]))
    assert matrix.estimate_seconds(on_gpu) > matrix.estimate_seconds(points[:1]) + 10
    # a loaded machine: the first point took 11 s, so the 3 left take about 3 x 11 s
    assert matrix.refined_estimate(points[0], 11.0, points[1:]) == pytest.approx(33.0, rel=0.05)
    assert matrix.estimate_seconds(points, simulated=True) == pytest.approx(4 * 2 * 0.1)


def test_correctness_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's check column: ok for a checked run, MISMATCH for wrong numbers, - when not checked;
    the CSV carries the correctness columns."""
    out = tmp_path / "r.csv"
    assert cli.main(parse(["attention", *FAST, "--output", str(out)])) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "status" in line)
    assert "check" in header.split()
    row = next(csv.DictReader(out.open()))
    assert row["correctness_status"] == "ok" and int(row["correctness_checks"]) == 2
    assert int(row["correctness_elements_checked"]) > 0 and row["correctness_fingerprint"]
    wrong = ProbeResult.failure("vit", "eager", "tiny", reason="wrong_result", message="wrong result: repeat")
    wrong.correctness = {"status": "mismatch", "checks": 2, "max_abs_error": 0.5, "max_rel_error": 0.4,
                         "elements_checked": 10}
    text = cli.results_table([wrong, ProbeResult.failure("llm", "graph", "tiny", reason="timeout", message="x")])
    assert "MISMATCH" in text and "failed:wrong_result" in text
    assert cli.correctness_cell({"status": "not_checked"}) == "-" and cli.correctness_cell({}) == "-"


def test_a_dataset_that_is_not_token_ids_is_refused_before_any_point_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--dataset /etc/passwd` failed inside the child seconds later; now it is refused at once, like --weights."""
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    out = tmp_path / "out.csv"
    code = cli.main(parse(["llm", "--preset", "gpt2", *SIM, "--dataset", str(passwd), "--output", str(out)]))
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert f"dataset_path: {passwd}: unsupported file type (no suffix) for llm" in err
    assert not out.exists()


def test_cpu_float16_is_warned_once_and_a_timeout_says_what_to_change(
        capsys: pytest.CaptureFixture[str]) -> None:
    """An explicit --dtype float16 on the CPU runs (the user's choice) with one warning for the matrix; a point
    that runs out of time names the flags that help (a 1 s bound: the child cannot even import torch)."""
    code = cli.main(parse(["llm", "--preset", "tiny", "--device", "cpu", "--dtype", "float16", "--batch-size", "1", "2",
                           "--timeout", "1", "--no-progress"]))
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILURE
    assert err.count("warning: --dtype float16 on the CPU (2 point(s))") == 1
    hint = ("the point ran out of its 1 s on the CPU: change --timeout S, --dtype float32, "
            "or a smaller --preset or --batch-size")
    assert err.count(hint) == 2, err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_timeout_that_bounds_nothing_is_bad_input(value: str) -> None:
    """Issue 61 (a careless operator's try): ``--timeout nan`` passed the "<= 0" check and ran the point
    with no bound at all (a comparison with nan is always false); ``inf`` the same."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpuperfd", "probe", "llm", "--simulate", "1", "--timeout", value,
                           "--no-progress"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert f"gpuperfd probe: timeout: must be a finite number of seconds > 0, got {float(value)}" in done.stderr


def test_a_billion_laughs_config_is_named_as_such(tmp_path: Path) -> None:
    """``probe --config`` with a YAML bomb said only "is not valid YAML or JSON" (issue 61's bomb, here)."""
    import subprocess
    import sys

    bomb = tmp_path / "bomb.yaml"
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, 7):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]")
    bomb.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "gpuperfd", "probe", "--config", str(bomb), "--simulate", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr) < 400
    assert done.stderr.startswith(f"gpuperfd probe: config: {bomb}: its aliases (*name) expand it to "), done.stderr

"""``gpuperfd probe interconnect`` on the CPU path (gloo ranks): table, JSON, CSV/JSONL, bad input."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.commands import interconnect as interconnect_cli
from gpuperfd.commands import probe as cli

FAST = ["--device", "cpu", "--copy-size", "16KiB", "--size", "4KiB", "64KiB", "--repeats", "2", "--warmup", "0"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["probe", *argv])


def run(argv: list[str]) -> int:
    args = parse(argv)
    return args.func(args)


def test_table_and_csv_one_row_per_ordered_pair_and_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ic.csv"
    assert run(["interconnect", *FAST, "--ranks", "3", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("interconnect gloo ranks 0,1,2: ok")
    pairs = [line.split()[:5] for line in text.splitlines() if line.startswith("rank ")]
    assert [(p[1], p[4]) for p in pairs] == [("0", "1"), ("0", "2"), ("1", "0"), ("1", "2"), ("2", "0"), ("2", "1")]
    assert [line.split()[:3] for line in text.splitlines() if line.strip().endswith(" ok") and "KiB" in line
            and "->" not in line] == [["4", "KiB", "3"], ["64", "KiB", "3"]]
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(interconnect_cli.CSV_COLUMNS)
    assert [r["kind"] for r in rows] == ["copy"] * 6 + ["allreduce"] * 2
    assert all(r["check_ok"] == "True" and float(r["bandwidth_bytes_per_second"] or r["bus_bandwidth_bytes_per_second"]) > 0
               for r in rows)
    assert run(["interconnect", *FAST, "--ranks", "2", "--output", str(out)]) == 0  # appends under one header
    with open(out, newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 8 + 4


def test_json_and_jsonl_carry_the_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ic.jsonl"
    assert run(["interconnect", *FAST, "--gpus", "0,1", "--ranks", "2", "--json", "--output", str(out)]) == 0
    result = InterconnectResult.from_dict(json.loads(capsys.readouterr().out))
    assert result.ok and result.backend == "gloo" and result.gpus == (0, 1)
    assert all(a.sum_ok for a in result.allreduce) and len(result.copies) == 2
    line = json.loads(out.read_text().splitlines()[0])
    assert line["schema"] == interconnect_cli.SCHEMA and line["host"] and line["source"] == "probe"
    assert line["gpus"] == [{"index": 0}, {"index": 1}] and InterconnectResult.from_dict(line["result"]) == result


@pytest.mark.parametrize("argv, words", [
    (["--device", "cpu", "--ranks", "1"], "ranks: --ranks N (at least 2)"),
    (["--device", "cpu", "--ranks", "2", "--gpus", "0,0"], "rank 0 is named twice"),
    (["--device", "cpu", "--ranks", "2", "--gpus", "0,5"], "no rank 5 on this node"),
    (["--device", "cpu", "--gpus", "1"], "at least two ranks"),
    (["--device", "cpu", "--batch-size", "8"], "batch_size: not an interconnect setting"),
    (["--device", "cuda:1"], "device: interconnect runs on cuda"),
    (["--device", "cpu", "--repeats", "0"], "repeats: must be at least 1"),
    (["--device", "cpu", "--dtype", "int8"], "dtype: interconnect takes one of"),
    (["--device", "cpu", "--label", "a=b"], "label: not an interconnect setting"),
    (["--device", "cpu", "--no-idle-check"], "no_idle_check: the interconnect probe always"),
])
def test_bad_input_exits_2_naming_it_and_starts_nothing(argv: list[str], words: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.csv"
    assert run(["interconnect", *argv, "--output", str(out)]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_an_existing_file_of_another_format_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs.csv"
    out.write_text("probe,variant\nllm,graph\n")
    assert run(["interconnect", "--device", "cpu", "--output", str(out)]) == 2
    assert "not a gpuperfd interconnect file" in capsys.readouterr().err
    assert out.read_text() == "probe,variant\nllm,graph\n"


def test_sizes_parse_binary_units_and_refuse_garbage() -> None:
    assert [interconnect_cli.byte_size(t) for t in ("4096", "64KiB", "256MiB", "1G")] == [4096, 65536, 256 << 20, 1 << 30]
    for bad in ("0", "12XB", "-1", "MiB"):
        with pytest.raises(argparse.ArgumentTypeError):
            interconnect_cli.byte_size(bad)


def test_interconnect_flags_are_refused_by_the_other_probes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["llm", "--preset", "tiny", "--gpus", "0,1"]) == 2
    assert "gpus: an interconnect setting" in capsys.readouterr().err


def test_gpus_asked_for_without_a_driver_is_an_error_never_a_cpu_run(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuperfd.device import nvml
    from gpuperfd.device.errors import DriverNotFound

    def no_driver(*_args, **_kwargs):
        raise DriverNotFound("no NVIDIA driver found")

    monkeypatch.setattr(nvml, "NvmlBackend", no_driver)
    assert run(["interconnect", "--gpus", "0,1"]) == 3  # no driver: 3, as every command
    captured = capsys.readouterr()
    assert "no NVIDIA driver found" in captured.err and captured.out == ""


def test_one_simulated_gpu_is_counted_not_named_as_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """``--simulate 1`` once answered "needs at least two GPUs, got 0": the 0 was GPU 0's index."""
    assert run(["interconnect", "--simulate", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs at least two GPUs; this node has 1 (GPU 0)" in err and "got 0" not in err

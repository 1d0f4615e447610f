"""The run record: one format for probe, sweep and history; fixed CSV columns; append or refuse; reading."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpuperfd.probe_data.record import (
    CSV_COLUMNS,
    SCHEMA,
    RecordError,
    append_records,
    build_record,
    normalize,
    read_records,
    record_from_row,
    record_row,
)
from gpuperfd.probe_data.result import ProbeResult, RepeatResult

GPU = {"index": 1, "uuid": "GPU-abc", "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.1",
       "compute_capability": "9.0", "memory_total_bytes": 80 << 30, "backend": "nvml", "pci_bus_id": "0:1", "serial": "s"}


def _result(device: str = "cuda:0", **extra: object) -> ProbeResult:
    return ProbeResult(
        probe="llm", variant="graph", preset="gpt2", device=device, gpu_name="NVIDIA H100 80GB HBM3",
        gpu_uuid="GPU-abc", started_at=1_700_000_000.0, measured_seconds=2.0, units_of_work=400.0,
        work_unit="token", params={"model": "gpt2", "batch_size": 8, "prompt_tokens": 128, "n_groups": 2},
        throughput={"output_tokens_per_second": 200.0, "requests_per_second": 3.0},
        latencies={"ttft_seconds": [0.01, 0.02, 0.03], "tpot_seconds": [0.001] * 4},
        energy_joules=800.0, average_power_watts=400.0, energy_per_unit_joules=2.0,
        peak_memory_bytes=3 << 30, allocated_memory_bytes=2 << 30, temperature_celsius_max=70.0,
        gpu_utilization_mean_ratio=0.97,
        repeats=[RepeatResult(0, 1.0, 190.0), RepeatResult(1, 1.0, 210.0)],
        extra={"torch_version": "2.13.0", "temperature_celsius_mean": 66.0, "loss": None, **extra},
    )


def test_record_has_who_where_when_and_every_metric() -> None:
    record = build_record(_result(), "sweep", gpu=GPU, host="node-a", power_cap_watts=500.0, sweep_id="s1")
    assert record["schema"] == SCHEMA and record["host"] == "node-a" and record["source"] == "sweep"
    assert record["gpu"]["uuid"] == "GPU-abc" and record["gpu"]["driver_version"] == "580.1"
    assert "serial" not in record["gpu"] and record["torch_version"] == "2.13.0"
    assert record["telemetry"]["temperature_celsius_mean"] == 66.0
    assert record["telemetry"]["gpu_utilization_ratio"] == 0.97 and record["power_cap_watts"] == 500.0
    json.dumps(record)  # plain data only


def test_a_cpu_run_is_labelled_cpu_not_the_gpu_it_was_scheduled_on() -> None:
    record = build_record(_result(device="cpu"), "daemon", gpu=GPU, host="h", power_cap_watts=700.0)
    assert record["gpu"]["name"] == "cpu" and record["gpu"]["uuid"] == "cpu" and record["gpu"]["driver_version"] is None


def test_csv_row_is_the_fixed_columns_and_reads_back() -> None:
    record = build_record(_result(), "probe", gpu=GPU, host="node-a")
    row = record_row(record)
    assert list(row) == list(CSV_COLUMNS)
    assert row["units_per_second"] == 200.0 and row["units_per_second_cv"] == pytest.approx(0.0707, abs=1e-4)
    assert row["ttft_p50_seconds"] == pytest.approx(0.02) and row["n_groups"] == 2 and row["step_mean_seconds"] is None
    back = record_from_row({k: "" if v is None else str(v) for k, v in row.items()})
    result = ProbeResult.from_dict(back["result"])
    assert result.params["batch_size"] == 8 and result.units_of_work / result.measured_seconds == pytest.approx(200.0)
    assert back["result"]["extra"]["latency_stats"]["ttft_seconds"]["p50"] == pytest.approx(0.02)
    assert back["host"] == "node-a" and back["gpu"]["uuid"] == "GPU-abc"


def test_append_never_overwrites_and_refuses_other_formats(tmp_path: Path) -> None:
    out = tmp_path / "runs.csv"
    record = build_record(_result(), "probe", host="h")
    append_records(out, [record])
    append_records(out, [record, record])
    with out.open() as handle:
        assert len(list(csv.DictReader(handle))) == 3
    for name, text in (("old.csv", "cap_watts,status\n700,ok\n"), ("old.jsonl", '{"probe": "llm"}\n'),
                       ("notes.jsonl", "hello\n")):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(RecordError, match="nothing was overwritten"):
            append_records(path, [record])
        assert path.read_text() == text
    with pytest.raises(RecordError, match="must end in .csv or .jsonl"):
        append_records(tmp_path / "x.txt", [record])


def test_reading_files_folders_and_older_shapes(tmp_path: Path) -> None:
    new = build_record(_result(), "daemon", gpu=GPU, host="node-a", power_cap_watts=600.0)
    old_history = {"time": 5.0, "node": "node-b", "gpu": GPU, "power_cap_watts": 500.0, "result": _result().to_dict()}
    bare = _result().to_dict()
    (tmp_path / "history.jsonl").write_text(json.dumps(new) + "\n" + json.dumps(old_history) + "\n")
    (tmp_path / "history.jsonl.1").write_text(json.dumps(bare) + "\n{broken\n")
    append_records(tmp_path / "probe.csv", [new])
    (tmp_path / "report.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "summary.csv").write_text("node,gpu\na,b\n")  # a report's CSV, not runs
    records, skipped = read_records([tmp_path])
    hosts = sorted(r["host"] for r, _ in records)
    assert hosts == ["?", "node-a", "node-a", "node-b"]
    assert any("broken" in s or "line 2" in s or ":2:" in s for s in skipped)
    assert any("summary.csv" in s for s in skipped)
    assert normalize(old_history)["power_cap_watts"] == 500.0 and normalize(old_history)["time"] == 5.0
    with pytest.raises(RecordError, match="not a gpuperfd run file"):
        read_records([tmp_path / "summary.csv"])
    with pytest.raises(RecordError, match="no such file or folder"):
        read_records([tmp_path / "missing.jsonl"])


def test_labels_parse_with_clear_errors() -> None:
    from gpuperfd.probe_data.record import parse_labels

    assert parse_labels(["dataset=cifar10", " framework = hf ", "note=a=b"]) == {
        "dataset": "cifar10", "framework": "hf", "note": "a=b"}
    assert parse_labels([]) == {} and parse_labels(None) == {}
    for bad, words in [("dataset", "expected KEY=VALUE"), ("=x", "the key"), ("1st=x", "the key"),
                       ("dataset=", "empty value"), ("a=x;y", "';'"), ("batch_size=4", "already a column"),
                       ("variant=hf", "already a column")]:
        with pytest.raises(RecordError, match=words) as info:
            parse_labels([bad])
        assert repr(bad) in str(info.value)  # the error names the item
    with pytest.raises(RecordError, match="given twice"):
        parse_labels(["a=1", "a=2"])


def test_labels_travel_in_json_and_csv(tmp_path: Path) -> None:
    from gpuperfd.probe_data.record import apply_labels

    record = build_record(_result(), "probe", gpu=GPU, host="n", labels={"dataset": "food101", "driver": "580"})
    assert record["labels"] == {"dataset": "food101", "driver": "580"}
    row = record_row(record)
    assert row["labels"] == "dataset=food101;driver=580"
    assert record_from_row({k: "" if v is None else str(v) for k, v in row.items()})["labels"] == record["labels"]
    plain = build_record(_result(), "probe", gpu=GPU, host="n")
    assert plain["labels"] == {} and record_row(plain)["labels"] is None
    (labelled,) = apply_labels([plain], {"study": "before"})
    assert labelled["labels"] == {"study": "before"} and plain["labels"] == {}
    for suffix in (".csv", ".jsonl"):
        path = tmp_path / f"runs{suffix}"
        append_records(path, [record, labelled])
        (read, _), (read2, _) = read_records([path])[0]
        assert read["labels"] == record["labels"] and read2["labels"] == {"study": "before"}


def test_a_csv_record_written_again_keeps_its_latency_statistics(tmp_path: Path) -> None:
    first = tmp_path / "a.csv"
    append_records(first, [build_record(_result(), "probe", gpu=GPU, host="n")])
    (record, _), = read_records([first])[0]
    again = record_row(record)
    original = record_row(build_record(_result(), "probe", gpu=GPU, host="n"))
    for column in ("ttft_mean_seconds", "ttft_p99_seconds", "tpot_p50_seconds"):
        assert again[column] == pytest.approx(original[column])


def _checked(status: str = "ok") -> dict:
    return {"status": status, "checks": 2, "max_abs_error": 3.5e-4, "max_rel_error": 2.5e-3,
            "elements_checked": 4096, "fingerprint": "00ff/0x1.8p+3#ab12", "failed_checks": [], "seconds": 0.01}


def test_correctness_round_trips_json_and_csv(tmp_path: Path) -> None:
    wrong = _result()
    wrong.status, wrong.failure_reason, wrong.correctness = "failed", "wrong_result", _checked("mismatch")
    records = [build_record(_result(correctness=None), "probe", gpu=GPU, host="n"),
               build_record(wrong, "daemon", gpu=GPU, host="n")]
    records[0]["result"]["correctness"] = _checked()
    for suffix in (".jsonl", ".csv"):
        path = tmp_path / f"runs{suffix}"
        append_records(path, records)
        back, problems = read_records([path])
        assert not problems
        (first, _), (second, _) = back
        for got, want in ((first, _checked()), (second, _checked("mismatch"))):
            check = ProbeResult.from_dict(got["result"]).correctness
            for key in ("status", "checks", "max_abs_error", "max_rel_error", "elements_checked", "fingerprint"):
                assert check[key] == want[key], (suffix, key)
        assert second["result"]["status"] == "failed" and second["result"]["failure_reason"] == "wrong_result"
    row = record_row(records[1])
    assert row["correctness_status"] == "mismatch" and row["correctness_fingerprint"] == "00ff/0x1.8p+3#ab12"


def test_records_without_correctness_read_as_not_checked() -> None:
    old = build_record(_result(), "daemon", gpu=GPU, host="n")
    del old["result"]["correctness"]  # a record written before issue 31
    assert ProbeResult.from_dict(old["result"]).correctness["status"] == "not_checked"
    row = {k: "" if v is None else str(v) for k, v in record_row(old).items()}
    assert row["correctness_status"] == "not_checked"
    for column in [c for c in CSV_COLUMNS if c.startswith("correctness_")]:
        del row[column]  # a CSV from before the columns existed
    assert ProbeResult.from_dict(record_from_row(row)["result"]).correctness["status"] == "not_checked"
    bogus = ProbeResult.from_dict({**old["result"], "correctness": {"status": "fine"}})
    assert bogus.correctness["status"] == "not_checked"  # an unknown status is not taken as a pass

"""The one run record: what ``probe --output``, ``sweep --output`` and the daemon's history write.

Every run (one probe point at one cap) becomes one record, ``"schema": "gpuperfd.run/1"``:

``{"schema", "time", "host", "source": probe|sweep|daemon, "gpu": {index, uuid, name, driver_version,
compute_capability, memory_total_bytes, backend, pci_bus_id}, "torch_version", "power_cap_watts",
"original_cap_watts", "sweep_id", "telemetry": {means over the measured window}, "result":
ProbeResult.to_dict()}``. A run on a CPU has ``gpu.name == gpu.uuid == "cpu"``.

JSON lines hold records as they are; CSV holds :func:`record_row` under the fixed
:data:`CSV_COLUMNS` (absent values empty), so CSV files of one study concatenate.
:func:`append_records` appends to a file of the same format and refuses anything else;
:func:`read_records` reads files and folders and turns older history lines and bare
probe results into records, so ``gpuperfd report`` reads everything this project wrote.

Pure standard library (the daemon and the probe child both import it; no torch, no numpy).
The columns and the format are documented in docs/reports.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuperfd.probe_data.result import ProbeResult, not_checked, percentile

__all__ = [
    "SCHEMA",
    "CSV_COLUMNS",
    "LATENCY_COLUMNS",
    "RecordError",
    "build_record",
    "record_row",
    "record_from_row",
    "normalize",
    "check_output",
    "parse_labels",
    "labels_text",
    "labels_from_text",
    "record_labels",
    "apply_labels",
    "append_records",
    "read_records",
    "run_files",
]

SCHEMA = "gpuperfd.run/1"
FORMATS = (".csv", ".jsonl")

_PARAMS = ("model", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads", "head_dim",
           "n_groups", "causal", "dtype", "warmup", "repeats", "measure_seconds", "iterations")
_RATES = ("output_tokens_per_second", "prompt_tokens_per_second", "total_tokens_per_second",
          "decode_tokens_per_second", "requests_per_second", "images_per_second", "iterations_per_second",
          "flops_per_second", "bytes_per_second", "tokens_per_second", "steps_per_second", "model_flops_per_second")
#: Latency names every workload reports one of (seconds).
LATENCY_COLUMNS = ("ttft", "tpot", "request", "batch", "iteration", "step")
_STATS = ("mean", "p50", "p95", "p99")
_TELEMETRY = ("temperature_celsius_mean", "temperature_celsius_max", "gpu_utilization_ratio",
              "memory_utilization_ratio", "sm_clock_hertz", "memory_clock_hertz", "power_watts")
#: The answer checks' fields (``result.correctness``), each a ``correctness_<key>`` column.
_CORRECTNESS = ("status", "checks", "max_abs_error", "max_rel_error", "elements_checked", "fingerprint")

#: The CSV columns, in order; every CSV this project writes has exactly these (docs/reports.md).
CSV_COLUMNS: tuple[str, ...] = (
    "schema", "time", "time_utc", "host", "source", "sweep_id", "labels",
    "gpu_index", "gpu_uuid", "gpu_name", "gpu_backend", "driver_version", "compute_capability", "torch_version",
    "probe", "variant", "preset", *_PARAMS,
    "power_cap_watts", "original_cap_watts",
    "status", "failure_reason", "error",
    "work_unit", "units_per_second", "units_per_second_cv", "measured_seconds", "wall_seconds",
    "energy_joules", "energy_per_unit_joules", "average_power_watts", *_RATES,
    *[f"{name}_{stat}_seconds" for name in LATENCY_COLUMNS for stat in _STATS],
    "peak_memory_bytes", "allocated_memory_bytes", "gpu_busy_ratio", "low_gpu_busy",
    *_TELEMETRY, "clock_events", "loss", "loss_first", "model_parameters", "kv_cache_bytes",
    *[f"correctness_{name}" for name in _CORRECTNESS],
)


class RecordError(ValueError):
    """A file or line that is not a run record, or an output file this writer may not append to."""


def finite_or_none(value: Any) -> float | None:
    """The value as a finite float, or None (records carry None, never NaN or inf)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


#: Keys a label may not take: they already tell points apart (or name the record's own fields).
RESERVED_LABELS: frozenset[str] = frozenset(
    {"gpu", "host", "node", "probe", "variant", "preset", "source", "status", "schema", "time", "labels",
     "power_cap_watts", "cap", *_PARAMS})
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def parse_labels(items: list[str] | None) -> dict[str, str]:
    """``["dataset=cifar10", "driver=580"]`` -> ``{"dataset": "cifar10", "driver": "580"}`` (``--label``).

    RecordError naming the bad item: no ``=``, an empty or malformed key, an empty value, a value
    with ``;`` or a line break (the CSV keeps labels as ``k=v;k=v``), a key given twice, or a key
    that is already a column of the record (``batch_size``, ``variant``, ...).
    """
    labels: dict[str, str] = {}
    for item in items or []:
        key, eq, value = str(item).partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise RecordError(f"label {item!r}: expected KEY=VALUE, e.g. --label dataset=cifar10")
        if not _LABEL_KEY.match(key):
            raise RecordError(f"label {item!r}: the key must start with a letter or _ and hold only letters, "
                              "digits, _ . - (at most 64)")
        if key in RESERVED_LABELS:
            raise RecordError(f"label {item!r}: {key!r} is already a column of every record; pick another key")
        if not value:
            raise RecordError(f"label {item!r}: empty value")
        if ";" in value or "\n" in value or "\r" in value:
            raise RecordError(f"label {item!r}: the value may not hold ';' or a line break")
        if key in labels:
            raise RecordError(f"label {key!r} given twice ({labels[key]!r} and {value!r})")
        labels[key] = value
    return labels


def labels_text(labels: dict[str, Any] | None) -> str | None:
    """The CSV cell of a record's labels: ``dataset=cifar10;driver=580`` (sorted by key), None when none."""
    if not labels:
        return None
    return ";".join(f"{k}={labels[k]}" for k in sorted(labels))


def labels_from_text(text: str | None) -> dict[str, str]:
    """The labels of a CSV cell written by :func:`labels_text`."""
    out: dict[str, str] = {}
    for part in (text or "").split(";"):
        key, eq, value = part.partition("=")
        if eq and key.strip():
            out[key.strip()] = value.strip()
    return out


def record_labels(record: dict[str, Any]) -> dict[str, str]:
    """A record's labels as a plain ``{str: str}`` (older records have none)."""
    labels = record.get("labels")
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items() if v is not None}


def apply_labels(records: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """``records`` with ``labels`` added (a record's own labels win on a shared key); for callers that
    build records before they know the labels."""
    return [{**r, "labels": {**dict(labels), **record_labels(r)}} for r in records]


def _mean(values: list[Any]) -> float | None:
    clean = [v for v in (finite_or_none(x) for x in values) if v is not None]
    return sum(clean) / len(clean) if clean else None


def _telemetry(result: ProbeResult) -> dict[str, float | None]:
    """GPU telemetry over the measured window (None where no GPU or no sample)."""
    reps = result.repeats
    extra = result.extra or {}
    return {
        "temperature_celsius_mean": finite_or_none(extra.get("temperature_celsius_mean")),
        "temperature_celsius_max": finite_or_none(result.temperature_celsius_max),
        "gpu_utilization_ratio": finite_or_none(result.gpu_utilization_mean_ratio)
        if result.gpu_utilization_mean_ratio is not None else _mean([r.gpu_utilization_mean_ratio for r in reps]),
        "memory_utilization_ratio": finite_or_none(result.memory_utilization_mean_ratio),
        "sm_clock_hertz": finite_or_none(result.sm_clock_hertz_mean),
        "memory_clock_hertz": finite_or_none(result.memory_clock_hertz_mean),
        "power_watts": finite_or_none(result.average_power_watts),
    }


def _gpu(result: ProbeResult, gpu: dict[str, Any] | None, driver_version: str | None) -> dict[str, Any]:
    if result.device == "cpu" or (result.device or "").startswith("cpu"):
        # The tensors ran on the CPU: whatever GPU the daemon probed did not do the work.
        return {"index": None, "uuid": "cpu", "name": "cpu", "driver_version": None, "compute_capability": None,
                "memory_total_bytes": None, "backend": "cpu", "pci_bus_id": None}
    out: dict[str, Any] = {"index": None, "uuid": result.gpu_uuid, "name": result.gpu_name,
                           "driver_version": driver_version or (result.extra or {}).get("driver_version"),
                           "compute_capability": result.compute_capability, "memory_total_bytes": None,
                           "backend": "nvml", "pci_bus_id": None}
    for key, value in (gpu or {}).items():
        if key != "serial" and value is not None:
            out[key] = value
    return out


def build_record(
    result: ProbeResult | dict[str, Any],
    source: str,
    *,
    gpu: dict[str, Any] | None = None,
    host: str | None = None,
    power_cap_watts: float | None = None,
    original_cap_watts: float | None = None,
    sweep_id: str | None = None,
    driver_version: str | None = None,
    now: float | None = None,
    labels: dict[str, str] | None = None,
    sweep_points: int | None = None,
) -> dict[str, Any]:
    """One run record (see the module docstring). ``gpu`` is a GpuInfo as a dict, when the caller has one.

    ``sweep_points``: how many points the record's sweep was to measure (JSON records of sweeps only):
    a sweep stopped between two points leaves no aborted record, and without the plan the report
    would recommend from the caps it reached (the CLI that ran it said "no recommendation").

    ``labels`` (``--label KEY=VALUE``, checked by :func:`parse_labels`) tell studies apart: the
    report never merges runs whose labels differ.
    """
    if isinstance(result, dict):
        result = ProbeResult.from_dict(result)
    cap = power_cap_watts if power_cap_watts is not None else result.power_limit_watts
    record = {
        "schema": SCHEMA,
        "time": float(result.started_at or (time.time() if now is None else now)),
        "host": host or socket.gethostname(),
        "source": source,
        "gpu": _gpu(result, gpu, driver_version),
        "torch_version": (result.extra or {}).get("torch_version"),
        "power_cap_watts": finite_or_none(cap),
        "original_cap_watts": finite_or_none(original_cap_watts),
        "sweep_id": sweep_id,
        "labels": dict(labels or {}),
        "telemetry": _telemetry(result),
        "result": result.to_dict(),
    }
    if sweep_points is not None:
        record["sweep_points"] = int(sweep_points)
    return record


# --- reading older shapes ----------------------------------------------------------------


def normalize(obj: Any) -> dict[str, Any]:
    """A record from any run line this project wrote; RecordError for anything else.

    Accepts ``gpuperfd.run/1`` records, daemon history lines written before the schema
    (``{"time", "node", "gpu", "power_cap_watts", "result"}``) and bare results
    (the old ``probe --output x.jsonl``).
    """
    if not isinstance(obj, dict):
        raise RecordError(f"not a run record (a JSON {type(obj).__name__})")
    schema = obj.get("schema")
    if schema is not None:
        if schema != SCHEMA:
            raise RecordError(f"schema {schema!r} is not {SCHEMA!r} (written by a newer gpuperfd?)")
        if not isinstance(obj.get("result"), dict):
            raise RecordError("record has no result")
        return obj
    try:
        if isinstance(obj.get("result"), dict):  # a history line from before the schema
            result = ProbeResult.from_dict(obj["result"])
            gpu = obj.get("gpu") if isinstance(obj.get("gpu"), dict) else None
            record = build_record(result, "daemon", gpu=gpu, host=str(obj.get("node") or "?"),
                                  power_cap_watts=obj.get("power_cap_watts"),
                                  original_cap_watts=obj.get("original_cap_watts"), sweep_id=obj.get("sweep_id"))
            record["time"] = float(obj.get("time") or record["time"])
            return record
        if "probe" in obj and "status" in obj and "variant" in obj:  # a bare ProbeResult
            return build_record(ProbeResult.from_dict(obj), "probe", host="?")
    except (TypeError, ValueError, KeyError) as exc:
        raise RecordError(f"not a run record: {exc}") from None
    raise RecordError("not a run record (no 'schema' or 'result' field)")


# --- CSV ---------------------------------------------------------------------------------


def _latency_stats(samples: list[float]) -> dict[str, float | None]:
    clean = [v for v in (finite_or_none(x) for x in samples) if v is not None]
    if not clean:
        return {s: None for s in _STATS}
    return {"mean": sum(clean) / len(clean), "p50": percentile(clean, 50), "p95": percentile(clean, 95),
            "p99": percentile(clean, 99)}


def record_row(record: dict[str, Any]) -> dict[str, Any]:
    """The flat CSV row of a record: exactly :data:`CSV_COLUMNS`, None where a value is absent."""
    result = ProbeResult.from_dict(record["result"])
    gpu = record.get("gpu") or {}
    params = result.params or {}
    extra = result.extra or {}
    tele = record.get("telemetry") or {}
    rate = result.units_of_work / result.measured_seconds if result.ok and result.measured_seconds else None
    per_window = [r.units_of_work / r.measured_seconds for r in result.repeats if r.measured_seconds]
    cv = None
    if len(per_window) > 1:
        mean = sum(per_window) / len(per_window)
        var = sum((v - mean) ** 2 for v in per_window) / (len(per_window) - 1)
        cv = var ** 0.5 / mean if mean else None
    row: dict[str, Any] = dict.fromkeys(CSV_COLUMNS)
    row.update({
        "schema": SCHEMA, "time": record.get("time"),
        "time_utc": datetime.fromtimestamp(float(record.get("time") or 0), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": record.get("host"), "source": record.get("source"), "sweep_id": record.get("sweep_id"),
        "labels": labels_text(record_labels(record)),
        "gpu_index": gpu.get("index"), "gpu_uuid": gpu.get("uuid"), "gpu_name": gpu.get("name"),
        "gpu_backend": gpu.get("backend"), "driver_version": gpu.get("driver_version"),
        "compute_capability": gpu.get("compute_capability"), "torch_version": record.get("torch_version"),
        "probe": result.probe, "variant": result.variant, "preset": result.preset,
        "power_cap_watts": record.get("power_cap_watts"), "original_cap_watts": record.get("original_cap_watts"),
        "status": result.status, "failure_reason": result.failure_reason,
        "error": (result.error_message or "").splitlines()[0] if result.error_message else None,
        "work_unit": result.work_unit, "units_per_second": rate, "units_per_second_cv": cv,
        "measured_seconds": result.measured_seconds, "wall_seconds": result.wall_seconds,
        "energy_joules": result.energy_joules, "energy_per_unit_joules": result.energy_per_unit_joules,
        "average_power_watts": result.average_power_watts,
        "peak_memory_bytes": result.peak_memory_bytes, "allocated_memory_bytes": result.allocated_memory_bytes,
        "gpu_busy_ratio": result.gpu_busy_ratio, "low_gpu_busy": result.low_gpu_busy,
        "clock_events": " ".join(result.clock_events_seen) or None,
        "loss": extra.get("loss"), "loss_first": extra.get("loss_first"),
        "model_parameters": extra.get("model_parameters"), "kv_cache_bytes": extra.get("kv_cache_bytes"),
    })
    for key in _PARAMS:
        row[key] = params.get(key)
    for key in _RATES:
        row[key] = (result.throughput or {}).get(key)
    kept_stats = extra.get("latency_stats") if isinstance(extra.get("latency_stats"), dict) else {}
    for name in LATENCY_COLUMNS:
        samples = (result.latencies or {}).get(f"{name}_seconds") or []
        # A record read back from a CSV keeps statistics, not samples: write those again.
        stats = _latency_stats(samples) if samples else {
            s: finite_or_none((kept_stats.get(f"{name}_seconds") or {}).get(s)) for s in _STATS}
        for stat in _STATS:
            row[f"{name}_{stat}_seconds"] = stats[stat]
    for key in _TELEMETRY:
        row[key] = tele.get(key)
    check = result.correctness
    for key in _CORRECTNESS:
        value = check.get(key)
        row[f"correctness_{key}"] = finite_or_none(value) if key.endswith("_error") else value
    return row


_INT_COLUMNS = {"correctness_checks", "correctness_elements_checked", "gpu_index", "batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads",
                "head_dim", "n_groups", "warmup", "repeats", "iterations", "peak_memory_bytes",
                "allocated_memory_bytes", "model_parameters", "kv_cache_bytes"}
_TEXT_COLUMNS = {"schema", "time_utc", "host", "source", "sweep_id", "labels", "gpu_uuid", "gpu_name", "gpu_backend",
                 "driver_version", "compute_capability", "torch_version", "probe", "variant", "preset", "model",
                 "dtype", "status", "failure_reason", "error", "work_unit", "clock_events", "correctness_status",
                 "correctness_fingerprint"}


def _cell(column: str, text: str) -> Any:
    if text == "":
        return None
    if column in _TEXT_COLUMNS:
        return text
    if column in ("causal", "low_gpu_busy"):
        return text == "True"
    number = float(text)
    return int(number) if column in _INT_COLUMNS else number


def record_from_row(row: dict[str, str]) -> dict[str, Any]:
    """A record from a CSV row: latencies come back as their statistics (``result.extra.latency_stats``)."""
    values = {c: _cell(c, row.get(c) or "") for c in CSV_COLUMNS}
    rate = values["units_per_second"]
    measured = values["measured_seconds"]
    params = {k: values[k] for k in _PARAMS if values[k] is not None}
    latency_stats = {f"{n}_seconds": {s: values[f"{n}_{s}_seconds"] for s in _STATS}
                     for n in LATENCY_COLUMNS if values[f"{n}_mean_seconds"] is not None}
    extra = {k: values[k] for k in ("loss", "loss_first", "model_parameters", "kv_cache_bytes", "torch_version")
             if values[k] is not None}
    extra["latency_stats"] = latency_stats
    extra["temperature_celsius_mean"] = values["temperature_celsius_mean"]
    result = ProbeResult(
        probe=values["probe"] or "?", variant=values["variant"] or "?", preset=values["preset"] or "?",
        params=params, status=values["status"] or "ok", failure_reason=values["failure_reason"],
        error_message=values["error"], device="cpu" if values["gpu_uuid"] == "cpu" else "cuda",
        gpu_name=values["gpu_name"], compute_capability=values["compute_capability"], gpu_uuid=values["gpu_uuid"],
        started_at=values["time"] or 0.0, wall_seconds=values["wall_seconds"] or 0.0, measured_seconds=measured,
        work_unit=values["work_unit"], units_of_work=rate * measured if rate is not None and measured else None,
        throughput={k: values[k] for k in _RATES if values[k] is not None},
        energy_joules=values["energy_joules"], average_power_watts=values["average_power_watts"],
        energy_per_unit_joules=values["energy_per_unit_joules"], peak_memory_bytes=values["peak_memory_bytes"],
        allocated_memory_bytes=values["allocated_memory_bytes"], sm_clock_hertz_mean=values["sm_clock_hertz"],
        memory_clock_hertz_mean=values["memory_clock_hertz"],
        clock_events_seen=(values["clock_events"] or "").split(),
        temperature_celsius_max=values["temperature_celsius_max"],
        gpu_utilization_mean_ratio=values["gpu_utilization_ratio"],
        memory_utilization_mean_ratio=values["memory_utilization_ratio"], gpu_busy_ratio=values["gpu_busy_ratio"],
        low_gpu_busy=bool(values["low_gpu_busy"]), power_limit_watts=values["power_cap_watts"], extra=extra,
        correctness=_correctness_from_row(values),
    )
    return {
        "schema": SCHEMA, "time": values["time"] or 0.0, "host": values["host"] or "?",
        "source": values["source"] or "?", "sweep_id": values["sweep_id"],
        "labels": labels_from_text(values["labels"]),
        "gpu": {"index": values["gpu_index"], "uuid": values["gpu_uuid"], "name": values["gpu_name"],
                "driver_version": values["driver_version"], "compute_capability": values["compute_capability"],
                "backend": values["gpu_backend"]},
        "torch_version": values["torch_version"], "power_cap_watts": values["power_cap_watts"],
        "original_cap_watts": values["original_cap_watts"],
        "telemetry": {k: values[k] for k in _TELEMETRY}, "result": result.to_dict(),
    }


def _correctness_from_row(values: dict[str, Any]) -> dict[str, Any]:
    """The ``correctness`` dict of a CSV row; a row from before the checks (no status) gives not_checked."""
    if values.get("correctness_status") is None:
        return not_checked()
    out = {k: values[f"correctness_{k}"] for k in _CORRECTNESS if k != "fingerprint"}
    if values.get("correctness_fingerprint") is not None:
        out["fingerprint"] = values["correctness_fingerprint"]
    return out


# --- writing -----------------------------------------------------------------------------


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise RecordError(f"output: {path} must end in .csv or .jsonl")
    return suffix


def check_output(path: str | Path) -> None:
    """Refuse, before anything runs, an output this writer would not append to.

    A missing or empty file is fine; an existing CSV must have exactly :data:`CSV_COLUMNS` as its
    header, an existing JSON-lines file must start with a ``gpuperfd.run/1`` record.
    """
    if not str(path).strip():  # an empty --output once meant "no output", silently
        raise RecordError("output: empty; name a FILE.csv or FILE.jsonl (or leave --output out)")
    target = Path(path)
    suffix = _suffix(target)
    if target.is_dir():
        raise RecordError(f"output: {target} is a directory; give a file name ending in {suffix}")
    if not target.exists() or target.stat().st_size == 0:
        if not target.parent.exists():
            raise RecordError(f"output: folder {target.parent} does not exist")
        return
    try:
        with open(target, encoding="utf-8", newline="") as handle:
            first = handle.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"output: cannot read {target} to append to it ({exc})") from None
    refuse = (f"output: {target} exists and is not a gpuperfd run {suffix[1:].upper()} file of this format; "
              "give a new file name (nothing was overwritten)")
    if suffix == ".csv":
        if next(csv.reader([first]), []) != list(CSV_COLUMNS):
            raise RecordError(refuse)
        return
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        raise RecordError(refuse) from None
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        raise RecordError(refuse)


def _csv_text(rows: list[dict[str, Any]], header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def append_records(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to ``path`` (.csv or .jsonl), creating it with a header if new.

    Never truncates: a file of another format raises :class:`RecordError` (see :func:`check_output`).
    """
    target = Path(path)
    check_output(target)
    new = not target.exists() or target.stat().st_size == 0
    if _suffix(target) == ".csv":
        text = _csv_text([record_row(r) for r in records], header=new)
    else:
        text = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in records)
    with open(target, "a", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


# --- reading -----------------------------------------------------------------------------


def _rotated_index(path: Path) -> int | None:
    """``history.jsonl.3`` -> 3 (older backups have higher numbers)."""
    stem, dot, number = path.name.rpartition(".")
    return int(number) if dot and number.isdigit() and stem.endswith(".jsonl") else None


def run_files(path: str | Path, include_rotated: bool = True) -> list[Path]:
    """The run files a path names: the file itself (plus its rotated backups), or a folder's run files."""
    target = Path(path)
    if not target.exists():
        raise RecordError(f"{target}: no such file or folder")
    if target.is_dir():
        found = [p for p in sorted(target.rglob("*")) if p.is_file() and (
            p.suffix.lower() in FORMATS or (include_rotated and _rotated_index(p) is not None))]
        # Oldest first within each history: backups (highest number first), then the live file.
        found.sort(key=lambda p: (str(p.parent), p.name.split(".jsonl")[0], -(_rotated_index(p) or 0)))
        if not found:
            raise RecordError(f"{target}: folder holds no .jsonl or .csv run files")
        return found
    files = [target]
    if include_rotated:
        backups = [p for p in target.parent.glob(target.name + ".*") if _rotated_index(p) is not None]
        files = sorted(backups, key=lambda p: -(_rotated_index(p) or 0)) + files
    return files


def _looks_binary(head: bytes) -> bool:
    return b"\x00" in head or (head[:8] == b"\x89PNG\r\n\x1a\n")


def read_file(path: Path) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
    """(record, None) per run of one file, (None, why) per bad line after the first.

    RecordError when the file is not a run file at all (binary, or its first entry is not a run):
    one error for the file, not one per line.
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError as exc:
        raise RecordError(f"{path}: cannot read ({exc.strerror or exc})") from None
    not_runs = (f"{path}: not a gpuperfd run file (expected JSON lines or CSV written by gpuperfd probe, "
                "sweep or the daemon's history)")
    if _looks_binary(head):
        raise RecordError(not_runs)
    is_csv = path.suffix.lower() == ".csv" or head.lstrip().startswith(b"schema,")
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        if is_csv:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or "schema" not in reader.fieldnames or "probe" not in reader.fieldnames:
                raise RecordError(not_runs + "; its CSV header is not the run columns (docs/reports.md)")
            for number, row in enumerate(reader, 2):
                try:
                    yield record_from_row(row), None
                except (TypeError, ValueError) as exc:
                    yield None, f"{path}:{number}: {exc}"
            return
        first = True
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = normalize(json.loads(line))
            except (json.JSONDecodeError, RecordError) as exc:
                if first:
                    raise RecordError(not_runs + f" (line {number}: {exc})") from None
                yield None, f"{path}:{number}: {exc}"
                continue
            first = False
            yield record, None


def read_records(paths: list[str | Path], include_rotated: bool = True) -> tuple[list[tuple[dict[str, Any], str]], list[str]]:
    """Every record of ``paths`` (files or folders) with its file, and the lines skipped (with why)."""
    records: list[tuple[dict[str, Any], str]] = []
    skipped: list[str] = []
    for path in paths:
        folder = Path(path).is_dir()
        for file in run_files(path, include_rotated):
            try:
                for record, why in read_file(file):
                    if record is not None:
                        records.append((record, str(file)))
                    elif why:
                        skipped.append(why)
            except RecordError as exc:
                if not folder:  # a file named on its own must be a run file
                    raise
                skipped.append(f"{exc} (skipped)")  # a folder may hold other files too
    return records, skipped

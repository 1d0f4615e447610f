"""The report's input: one :class:`Run` per probe run at one cap, from history files.

History lines (see :mod:`gpuperfd.probing.history`) and Prometheus range queries
(:mod:`gpuperfd.report.prometheus`) both become the same records, so everything
after loading (outliers, aggregation, figures) does not care where data came from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuperfd.probe_data.record import RecordError, finite_or_none, normalize, read_records, record_labels
from gpuperfd.probe_data.kinds import spec_kinds, work_unit
from gpuperfd.probe_data.result import MAIN_LATENCY, ProbeResult
from gpuperfd.probe_data.recommend import work_rate
from gpuperfd.probe_data.workload_cost import NOT_MODELLED_KEY

log = logging.getLogger(__name__)

#: Which probes are inference and which are training (the report puts them side by side).
INFERENCE_PROBES: tuple[str, ...] = tuple(kind.name for kind in spec_kinds() if not kind.training)
TRAINING_PROBES: tuple[str, ...] = tuple(kind.name for kind in spec_kinds() if kind.training)
PROBE_ORDER: tuple[str, ...] = (*INFERENCE_PROBES, *TRAINING_PROBES)

#: The latency each probe's charts show (all latencies are in the tables and CSV).
PRIMARY_LATENCY: dict[str, str] = MAIN_LATENCY
LATENCY_TITLES: dict[str, str] = {
    "ttft_seconds": "time to first token",
    "tpot_seconds": "time per output token",
    "request_seconds": "request latency",
    "batch_seconds": "batch latency",
    "iteration_seconds": "iteration time",
    "step_seconds": "step time",
}


class ReportError(Exception):
    """Input the report cannot use (no data, unreachable Prometheus, bad time range)."""


def kind_of(probe: str) -> str:
    return "training" if probe in TRAINING_PROBES else "inference"


@dataclass(frozen=True)
class GpuId:
    """One GPU of one node, as its history lines (or gpuperf_gpu_info) describe it."""

    node: str
    index: int
    uuid: str
    name: str = "?"
    driver_version: str = "?"
    compute_capability: str = "?"
    memory_total_bytes: int | None = None
    backend: str = "?"
    pci_bus_id: str = "?"

    @property
    def key(self) -> tuple[str, str]:
        return (self.node, self.uuid)

    @property
    def model(self) -> str:
        """The model name without the vendor prefix: ``H100 80GB HBM3``."""
        name = self.name
        return name[len("NVIDIA "):] if name.startswith("NVIDIA ") else name


#: Workload parameters that tell points apart (and can be a chart's x axis).
PARAM_KEYS: tuple[str, ...] = ("batch_size", "prompt_tokens", "output_tokens", "seq_len", "image_size", "heads",
                               "head_dim", "n_groups", "causal", "dtype")


@dataclass
class Run:
    """One probe run at one power cap (ok or not); ``cap_watts`` is None where no cap was known (a CPU run)."""

    time: float
    gpu: GpuId
    cap_watts: float | None
    probe: str
    preset: str
    batch_size: int | None
    status: str = "ok"
    failure_reason: str | None = None
    work_unit: str | None = None
    #: Units of work per second over the measured window.
    rate: float | None = None
    energy_per_unit: float | None = None
    power: float | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    #: Latency statistics where the samples are not in the input (CSV): {name: {"mean","p50","p95","p99"}}.
    latency_stats: dict[str, dict[str, float | None]] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    gpu_busy_ratio: float | None = None
    #: GPM means over the measured windows: tensor active (any precision), DRAM bandwidth active.
    gpm_tensor_active_ratio: float | None = None
    gpm_dram_active_ratio: float | None = None
    sweep_id: str | None = None
    #: How many points the run's sweep was to measure (None: not recorded, a CSV, or not a sweep).
    sweep_points: int | None = None
    #: The operator's cap when the run was measured (history: ``original_cap_watts``).
    operator_cap_watts: float | None = None
    #: The cap apply mode held on the GPU while the run's sweep ran (None: none; docs/apply.md).
    applied_cap_watts: float | None = None
    source: str = ""
    variant: str = ""
    model: str = ""
    #: The workload parameters of :data:`PARAM_KEYS` this run had (absent ones left out).
    params: dict[str, Any] = field(default_factory=dict)
    #: Other rates (requests/s, prompt tokens/s, ...).
    throughput: dict[str, float] = field(default_factory=dict)
    temperature: float | None = None
    utilization: float | None = None
    loss: float | None = None
    #: ``--label KEY=VALUE`` of the run (dataset, framework, driver...): runs with other labels never merge.
    labels: dict[str, str] = field(default_factory=dict)
    memory_utilization: float | None = None
    allocated_memory_bytes: int | None = None
    #: Per measured window (JSON input only; CSV keeps the CV): {"rate", "power", "temperature",
    #: "utilization", "memory_utilization", "energy_per_unit"}, None where a window lacks one.
    windows: list[dict[str, float | None]] = field(default_factory=list)
    #: llm: mean seconds to each output token ([TTFT, token 2, ...]) over the traced requests (JSON input).
    token_curve: list[float] = field(default_factory=list)
    #: llm on a Llama model: the run's HBM roofline and speculative figures (``extra.roofline``,
    #: ``extra.speculative``), for seed 004's section of the report.
    llm_figures: dict[str, Any] = field(default_factory=dict)

    @property
    def labels_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.labels.items()))

    @property
    def params_key(self) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted((k, v) for k, v in self.params.items() if k != "batch_size"))

    @property
    def group(self) -> tuple[Any, ...]:
        """Runs that measure the same thing: (GPU, probe, preset, batch size, cap, variant, other params, labels)."""
        cap = round(self.cap_watts) if self.cap_watts is not None else None
        return (self.gpu.key, self.probe, self.preset, self.batch_size, cap, self.variant, self.params_key,
                self.labels_key)


def default_batch_size(probe: str, preset: str) -> int | None:
    """The batch size a preset runs with when the run's params do not say."""
    from gpuperfd.probe_data.spec import PRESETS

    value = PRESETS.get(probe, {}).get(preset, {}).get("batch_size")
    return int(value) if isinstance(value, int) else None


def run_from_record(record: dict[str, Any], source: str = "") -> Run:
    """A ``gpuperfd.run/1`` record as a :class:`Run`; ValueError/TypeError/KeyError on one that is not."""
    result = ProbeResult.from_dict(record["result"])
    gpu = record.get("gpu") or {}
    index = gpu.get("index")
    identity = GpuId(
        node=str(record.get("host") or record.get("node") or "?"),
        index=int(index) if isinstance(index, (int, float)) and not isinstance(index, bool) else -1,
        uuid=str(gpu.get("uuid") or result.gpu_uuid or "?"),
        name=str(gpu.get("name") or result.gpu_name or "?"),
        driver_version=str(gpu.get("driver_version") or "-"),
        compute_capability=str(gpu.get("compute_capability") or result.compute_capability or "-"),
        memory_total_bytes=gpu.get("memory_total_bytes"),
        backend=str(gpu.get("backend") or "?"),
        pci_bus_id=str(gpu.get("pci_bus_id") or "-"),
    )
    cap = finite_or_none(record.get("power_cap_watts"))
    if cap is None:
        cap = finite_or_none(result.power_limit_watts)
    params = result.params if isinstance(result.params, dict) else {}
    batch = params.get("batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool):
        batch = default_batch_size(result.probe, result.preset)
    kept = {k: params[k] for k in PARAM_KEYS if params.get(k) is not None}
    if batch is not None:
        kept["batch_size"] = batch
    latencies = {
        name: [float(v) for v in values if finite_or_none(v) is not None]
        for name, values in (result.latencies or {}).items()
        if isinstance(values, list)
    }
    extra = result.extra or {}
    stats = extra.get("latency_stats") if isinstance(extra.get("latency_stats"), dict) else {}
    tele = record.get("telemetry") or {}
    ok = result.status == "ok"
    temperature = finite_or_none(tele.get("temperature_celsius_mean"))
    if temperature is None:
        temperature = finite_or_none(tele.get("temperature_celsius_max", result.temperature_celsius_max))
    return Run(
        time=float(record.get("time") or result.started_at or 0.0),
        gpu=identity,
        cap_watts=cap,
        probe=result.probe,
        preset=result.preset,
        batch_size=batch,
        status=result.status,
        failure_reason=result.failure_reason,
        work_unit=result.work_unit or work_unit(result.probe),
        rate=finite_or_none(work_rate(result)) if ok else None,
        energy_per_unit=finite_or_none(result.energy_per_unit_joules) if ok else None,
        power=finite_or_none(result.average_power_watts) if ok else None,
        latencies=latencies if ok else {},
        latency_stats=stats if ok else {},
        peak_memory_bytes=result.peak_memory_bytes if ok else None,
        gpu_busy_ratio=finite_or_none(result.gpu_busy_ratio) if ok else None,
        gpm_tensor_active_ratio=finite_or_none(result.gpm_tensor_active_mean_ratio) if ok else None,
        gpm_dram_active_ratio=finite_or_none(result.gpm_dram_active_mean_ratio) if ok else None,
        sweep_id=record.get("sweep_id"),
        sweep_points=record.get("sweep_points") if isinstance(record.get("sweep_points"), int) else None,
        operator_cap_watts=finite_or_none(record.get("original_cap_watts")),
        applied_cap_watts=finite_or_none(extra.get("applied_cap_watts")),
        source=source,
        variant=str(result.variant or ""),
        model=str(params.get("model") or result.preset),
        params=kept,
        throughput={k: v for k, v in (result.throughput or {}).items() if finite_or_none(v) is not None} if ok else {},
        temperature=temperature if ok else None,
        utilization=finite_or_none(tele.get("gpu_utilization_ratio", result.gpu_utilization_mean_ratio)) if ok else None,
        loss=finite_or_none(extra.get("loss")) if ok else None,
        labels=record_labels(record),
        allocated_memory_bytes=result.allocated_memory_bytes if ok else None,
        windows=[_window(r) for r in result.repeats] if ok else [],
        token_curve=_token_curve(result.repeats) if ok else [],
        llm_figures={k: extra[k] for k in ("roofline", "speculative") if isinstance(extra.get(k), dict)} if ok else {},
        memory_utilization=finite_or_none(tele.get("memory_utilization_ratio", result.memory_utilization_mean_ratio))
        if ok else None,
    )


def _token_curve(repeats: list[Any]) -> list[float]:
    """The windows' per-position token times, averaged (weighted by traced requests); [] if none."""
    curves = [(r.extra.get("token_position_seconds"), r.extra.get("token_position_requests") or 1)
              for r in repeats if isinstance(r.extra, dict)]
    curves = [(c, w) for c, w in curves if isinstance(c, list) and c]
    if not curves:
        return []
    length = min(len(c) for c, _ in curves)
    total = sum(w for _, w in curves)
    return [sum(float(c[i]) * w for c, w in curves) / total for i in range(length)]


def _window(repeat: Any) -> dict[str, float | None]:
    seconds = finite_or_none(repeat.measured_seconds)
    units = finite_or_none(repeat.units_of_work)
    return {
        "rate": units / seconds if units is not None and seconds else None,
        "power": finite_or_none(repeat.average_power_watts),
        "temperature": finite_or_none(repeat.temperature_celsius_max),
        "utilization": finite_or_none(repeat.gpu_utilization_mean_ratio),
        "memory_utilization": finite_or_none(repeat.memory_utilization_mean_ratio),
        "energy_per_unit": finite_or_none(repeat.energy_per_unit_joules),
    }


def run_from_history(record: dict[str, Any], source: str = "") -> Run:
    """Any run line this project wrote (record, older history line, bare result) as a :class:`Run`."""
    try:
        return run_from_record(normalize(record), source)
    except RecordError as exc:
        raise ValueError(str(exc)) from None


@dataclass
class Loaded:
    """Runs read from the sources, with what was skipped and why."""

    runs: list[Run]
    sources: list[str]
    skipped: int = 0
    notes: list[str] = field(default_factory=list)


def load_history(
    paths: Iterable[str | Path], start: float | None = None, end: float | None = None, include_rotated: bool = True
) -> Loaded:
    """Runs from run files and folders (JSON lines or CSV, rotated backups too), optionally within [start, end].

    ReportError, once, for a path that is missing or not a run file; bad lines inside a run file
    are counted and summarised in one note.
    """
    paths = list(paths)
    try:
        records, bad = read_records(paths, include_rotated=include_rotated)
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    runs: list[Run] = []
    skipped = len(bad)
    for record, file in records:
        try:
            run = run_from_record(record, file)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            skipped += 1
            bad.append(f"{file}: {exc}")
            continue
        if (start is not None and run.time < start) or (end is not None and run.time > end):
            continue
        runs.append(run)
    notes = []
    if skipped:
        notes.append(f"{skipped} line(s) skipped as not runs (first: {bad[0]})")
        log.warning("%s", notes[0])
    notes.extend(_not_modelled_notes(record for record, _ in records))
    return Loaded(runs, [str(p) for p in paths], skipped, notes)


def _not_modelled_notes(records: Iterable[dict[str, Any]]) -> list[str]:
    """"simulated: variant not modelled (3 runs)": options the simulator's figures do not follow, so
    a flat line across them is not read as a trend (JSON lines keep the list; a CSV row does not)."""
    counts: dict[str, int] = {}
    for record in records:
        extra = (record.get("result") or {}).get("extra") or {}
        for option in extra.get(NOT_MODELLED_KEY) or []:
            counts[str(option)] = counts.get(str(option), 0) + 1
    return [f"simulated: {option} not modelled ({n} run{'s' if n != 1 else ''}): the simulated figures do not "
            "follow it" for option, n in sorted(counts.items())]

"""Prometheus series for probe results, sweeps and the scheduler.

Updated by the probe service when a run ends; read by scrapes like any other
metric, so ``/metrics`` never waits for a probe. Label sets are bounded: the
probes and presets come from the config, caps from the sweep list. Latency
histograms observe runs at the operator's own cap only, so a sweep does not
smear them across caps (per-cap figures are the gauges and the history file).
See docs/metrics.md for the list and the per-GPU series budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gpuperfd.device.base import GpuInfo
from gpuperfd.probe_data.kinds import KINDS, work_unit

if TYPE_CHECKING:
    from gpuperfd.probing.gates.admission import AdmissionState

RUN_LABELS = ("gpu", "uuid", "probe", "preset")
CAP_LABELS = (*RUN_LABELS, "power_cap")
GPU_LABELS = ("gpu", "uuid")

#: Histogram per result latency name, with buckets suited to what it measures (seconds).
LATENCY_HISTOGRAMS: dict[str, tuple[str, str, tuple[float, ...]]] = {
    "ttft_seconds": ("gpuperf_probe_ttft_seconds", "LLM time to first token (prefill), seconds.",
                     (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)),
    "tpot_seconds": ("gpuperf_probe_tpot_seconds", "LLM time per output token (decode step), seconds.",
                     (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)),
    "request_seconds": ("gpuperf_probe_request_latency_seconds", "LLM latency of one whole request, seconds.",
                        (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)),
    "batch_seconds": ("gpuperf_probe_batch_latency_seconds", "ViT latency of one batch, seconds.",
                      (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)),
    "iteration_seconds": ("gpuperf_probe_iteration_seconds", "Attention microbenchmark iteration time, seconds.",
                          (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)),
    "step_seconds": ("gpuperf_probe_step_seconds", "Training step time (forward, backward, optimizer), seconds.",
                     (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)),
}


def cap_label(watts: float) -> str:
    return str(int(round(watts)))


class ProbeMetrics:
    """The probe, sweep and scheduler series, in the daemon's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = CAP_LABELS) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.rate = gauge("gpuperf_probe_work_units_per_second",
                          "Probe throughput in its work unit (output tokens, images, iterations, trained tokens) per second.",
                          (*CAP_LABELS, "unit"))
        self.energy_per_unit = gauge("gpuperf_probe_energy_per_unit_joules",
                                     "Hardware-counter energy over the measured window per unit of work, joules.",
                                     (*CAP_LABELS, "unit"))
        self.power = gauge("gpuperf_probe_average_power_watts", "Average power over the measured window, watts.")
        self.cap_value = gauge("gpuperf_probe_power_cap_watts", "The power cap the probe ran at, as a value, watts.")
        self.prompt_rate = gauge("gpuperf_probe_prompt_tokens_per_second", "LLM prompt (prefill) tokens per second.")
        self.request_rate = gauge("gpuperf_probe_requests_per_second", "LLM requests completed per second.")
        self.peak_memory = gauge("gpuperf_probe_peak_memory_bytes", "Peak device memory allocated by the probe's last ok run, bytes.", RUN_LABELS)
        self.busy = gauge("gpuperf_probe_gpu_busy_ratio", "Share of the measured window the GPU was executing work.")
        self.gpm_tensor = gauge(
            "gpuperf_probe_gpm_tensor_active_ratio",
            "GPM tensor-pipe active ratio (any precision), mean over the probe's measured windows.",
        )
        self.gpm_dram = gauge(
            "gpuperf_probe_gpm_dram_bandwidth_active_ratio",
            "GPM DRAM bandwidth active ratio, mean over the probe's measured windows.",
        )
        self.last_run = gauge("gpuperf_probe_last_run_timestamp_seconds", "Unix time the probe's last ok run ended.", RUN_LABELS)
        self.duration = gauge("gpuperf_probe_run_duration_seconds", "Wall time of the last run, seconds.", RUN_LABELS)
        self.runs = Counter("gpuperf_probe_runs", "Probe runs by result (ok, skipped, failed, aborted) and reason.",
                            (*RUN_LABELS, "result", "reason"), registry=registry)
        self.original_cap = gauge("gpuperf_power_cap_original_watts",
                                  "The operator's power cap, as recorded before any change, watts.", GPU_LABELS)
        self.sweep_in_progress = gauge("gpuperf_sweep_in_progress", "1 while a sweep holds a changed power cap.", GPU_LABELS)
        self.sweep_cap = gauge("gpuperf_sweep_cap_watts", "The power cap a sweep holds now, watts (only during a sweep).",
                               GPU_LABELS)
        self.wrong_results = Counter(
            "gpuperf_probe_wrong_results",
            "Probe runs whose answer checks failed (status failed, reason wrong_result): silent data corruption.",
            RUN_LABELS, registry=registry)
        self.missed = Counter("gpuperf_scheduler_runs_missed", "Scheduled probe runs missed or skipped by the scheduler.",
                              ("probe",), registry=registry)
        # Coverage (issue 50): whether each result is due, the GPU time probes took, the time GPUs were free.
        self.due = gauge("gpuperf_probe_due",
                         "1 while the probe's result on this GPU is due: older than its schedule's interval, none yet, "
                         "or a cron window open and not run; 0 while fresh.", RUN_LABELS)
        self.gpu_seconds = Counter("gpuperf_probe_gpu_seconds",
                                   "Seconds probes held the GPU (probe rounds, interconnect runs): the GPU time probes took.",
                                   GPU_LABELS, registry=registry)
        self.free_seconds = Counter("gpuperf_probe_gpu_free_seconds",
                                    "Seconds the GPU qualified for a probe: not allocated, no foreign process, idle for "
                                    "probes.idle_seconds.", GPU_LABELS, registry=registry)
        self.gpu_time_budget = Gauge("gpuperf_probe_gpu_time_budget_ratio",
                                     "probes.max_gpu_time_ratio: the largest share of a GPU's time probes may take over a "
                                     "rolling day.", registry=registry)
        self.qualified_to_result = Histogram(
            "gpuperf_probe_qualified_to_result_seconds",
            "Seconds from the moment a due probe's GPU qualified (or the result fell due, if later) to its published result.",
            ("probe",), buckets=(1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
            registry=registry)
        # The admission's series join the registry with its first state: absent where no child is started.
        self._registry = registry
        self.memory_budget = Gauge(
            "gpuperf_probe_memory_budget_bytes",
            "Host memory probe children may use together: the memory limit less the daemon and headroom, bytes "
            "(absent: no limit).", ("source",), registry=None)
        self.children_running = Gauge("gpuperf_probe_children_running",
                                      "Probe children admitted and running now (host-memory admission).", registry=None)
        self.children_waiting = Gauge("gpuperf_probe_children_waiting",
                                      "Probe rounds waiting for host memory for their child.", registry=None)
        self.admission_wait = Counter("gpuperf_probe_admission_wait_seconds",
                                      "Seconds probe rounds waited for host memory for their child.", registry=None)
        self.child_peak = Gauge("gpuperf_probe_child_peak_rss_bytes",
                                "Largest peak host RSS measured of a probe's child process, bytes.", ("probe",),
                                registry=None)
        self._waited: float | None = None
        self.histograms = {
            key: Histogram(name, doc, RUN_LABELS, buckets=buckets, registry=registry)
            for key, (name, doc, buckets) in LATENCY_HISTOGRAMS.items()
        }
        self._lock = threading.Lock()
        self._version = 0

    def version(self) -> int:
        """Changes whenever a series changes, so the scrape path can cache the rendered text."""
        return self._version

    def _bump(self) -> None:
        with self._lock:
            self._version += 1

    def set_admission(self, state: AdmissionState) -> None:
        """The host-memory admission's state (:class:`~gpuperfd.probing.gates.admission.Admission`'s listener)."""
        with self._lock:
            if self._waited is None:  # the first state: the series join the registry
                self._waited = 0.0
                for metric in (self.memory_budget, self.children_running, self.children_waiting,
                               self.admission_wait, self.child_peak):
                    self._registry.register(metric)
            self.memory_budget.clear()
            if state.budget_bytes is not None:
                self.memory_budget.labels(state.source).set(state.budget_bytes)
            self.children_running.set(state.running)
            self.children_waiting.set(state.waiting)
            if state.wait_seconds_total > self._waited:
                self.admission_wait.inc(state.wait_seconds_total - self._waited)
                self._waited = state.wait_seconds_total
            for probe, peak in state.peaks.items():
                self.child_peak.labels(probe).set(peak)
            self._version += 1

    def set_due(self, gpu: GpuInfo, probe: str, preset: str, due: bool) -> None:
        """Whether ``probe``/``preset``'s result on ``gpu`` is due now (the scheduler's word)."""
        self.due.labels(*self.gpu_labels(gpu), probe, preset).set(1 if due else 0)
        self._bump()

    def retain_due(self, keep: Callable[[str, str, str], bool]) -> None:
        """Drop the due series of (gpu, probe, preset) no schedule runs any more (after a reload)."""
        for sample in [s for family in self.due.collect() for s in family.samples]:
            if not keep(sample.labels["gpu"], sample.labels["probe"], sample.labels["preset"]):
                self.due.remove_by_labels(sample.labels)
        self._bump()

    def add_gpu_seconds(self, gpu: GpuInfo, seconds: float) -> None:
        """Probes held ``gpu`` for ``seconds`` more."""
        if gpu.uuid:
            self.gpu_seconds.labels(*self.gpu_labels(gpu)).inc(max(0.0, seconds))
            self._bump()

    def add_free_seconds(self, gpu: GpuInfo, seconds: float) -> None:
        """``gpu`` qualified for a probe for ``seconds`` more (the series exists from 0 once seen)."""
        if gpu.uuid:
            self.free_seconds.labels(*self.gpu_labels(gpu)).inc(max(0.0, seconds))
            self._bump()

    def set_gpu_time_budget(self, ratio: float) -> None:
        self.gpu_time_budget.set(ratio)
        self._bump()

    def qualified_to_result_seconds(self, probe: str, seconds: float) -> None:
        self.qualified_to_result.labels(probe).observe(max(0.0, seconds))
        self._bump()

    def result_ages(self, now: float | None = None) -> Iterator[tuple[dict[str, str], float]]:
        """(labels, seconds) of every published result's age: now less its last ok run's end."""
        now = time.time() if now is None else now
        for family in self.last_run.collect():
            for sample in family.samples:
                yield sample.labels, max(0.0, now - sample.value)

    def missed_run(self, probe: str) -> None:
        self.missed.labels(probe).inc()
        self._bump()

    def declare_probes(self, probes: set[str]) -> None:
        """Missed-run counters of the scheduled probes exist from 0, so ``increase()`` has data before a miss."""
        for probe in sorted(probes):
            self.missed.labels(probe)
        self._bump()

    def declare_wrong_results(self, gpu: GpuInfo, probe: str, preset: str) -> None:
        """The wrong-result counter of a scheduled probe exists from 0, so an alert's ``increase()`` sees the first one."""
        self.wrong_results.labels(*self.gpu_labels(gpu), probe, preset)
        self._bump()

    def gpu_labels(self, gpu: GpuInfo) -> tuple[str, str]:
        return (str(gpu.index), gpu.uuid)

    def set_original_cap(self, gpu: GpuInfo, watts: float) -> None:
        self.original_cap.labels(*self.gpu_labels(gpu)).set(watts)
        self.sweep_in_progress.labels(*self.gpu_labels(gpu)).set(0)
        self._bump()

    def set_sweep_cap(self, gpu: GpuInfo, watts: float | None) -> None:
        labels = self.gpu_labels(gpu)
        self.sweep_in_progress.labels(*labels).set(0 if watts is None else 1)
        if watts is None:
            try:
                self.sweep_cap.remove(*labels)
            except KeyError:
                pass
        else:
            self.sweep_cap.labels(*labels).set(watts)
        self._bump()

    def count(self, gpu: GpuInfo, probe: str, preset: str, result: str, reason: str = "") -> None:
        self.runs.labels(*self.gpu_labels(gpu), probe, preset, result, reason).inc()
        self._bump()

    def _cap_gauges(self) -> tuple[Gauge, ...]:
        """Every series labelled by power_cap: one point's result."""
        return (self.rate, self.energy_per_unit, self.power, self.cap_value, self.prompt_rate, self.request_rate, self.busy)

    def forget_cap(self, gpu: GpuInfo, probe: str, preset: str, cap: str) -> None:
        """Remove one point's result series (a failed or skipped point, or a cap no longer scheduled)."""
        labels = dict(zip(CAP_LABELS, (*self.gpu_labels(gpu), probe, preset, cap)))
        for gauge in self._cap_gauges():
            gauge.remove_by_labels(labels)
        self._bump()

    def retain_caps(self, keep: Callable[[str, str, str, str], bool]) -> int:
        """Drop every point whose (gpu, probe, preset, power_cap) ``keep`` refuses (after a reload); returns how many."""
        dropped: set[tuple[str, ...]] = set()
        for gauge in self._cap_gauges():
            for sample in (s for family in gauge.collect() for s in family.samples):
                point = tuple(sample.labels[k] for k in CAP_LABELS)
                if not keep(point[0], point[2], point[3], point[4]):
                    dropped.add(point)
        for point in dropped:
            for gauge in self._cap_gauges():
                gauge.remove_by_labels(dict(zip(CAP_LABELS, point)))
        if dropped:
            self._bump()
        return len(dropped)

    def publish(self, gpu: GpuInfo, result: Any, cap_watts: float, at_operator_cap: bool) -> None:
        """Record one finished probe run (a ProbeResult) at ``cap_watts``.

        A run that gave way to a user's job (skipped, preempted) is only counted: it measured nothing,
        so the cap's last completed result stays published as it was (its last-run timestamp tells its age).
        """
        run = (*self.gpu_labels(gpu), result.probe, result.preset)
        if result.status == "skipped" and result.failure_reason == "preempted":
            self.count(gpu, result.probe, result.preset, "skipped", "preempted")
            return
        self.duration.labels(*run).set(result.wall_seconds or 0.0)
        wrong = self.wrong_results.labels(*run)  # from 0 on the first run, even if apply_config never declared it
        if result.status != "ok":
            # The point's previous result is no longer what this cap does: it must not stay a
            # candidate for the recommendation, so its series go until the cap succeeds again.
            self.forget_cap(gpu, result.probe, result.preset, cap_label(cap_watts))
            self.count(gpu, result.probe, result.preset, result.status, result.failure_reason or "unknown")
            if result.failure_reason == "wrong_result":
                wrong.inc()
            return
        self.count(gpu, result.probe, result.preset, "ok")
        cap = (*run, cap_label(cap_watts))
        unit = work_unit(result.probe, result.work_unit)
        if result.measured_seconds:
            self.rate.labels(*cap, unit).set(result.units_of_work / result.measured_seconds)
        if result.energy_per_unit_joules is not None:
            self.energy_per_unit.labels(*cap, unit).set(result.energy_per_unit_joules)
        if result.average_power_watts is not None:
            self.power.labels(*cap).set(result.average_power_watts)
        self.cap_value.labels(*cap).set(cap_watts)
        throughput = result.throughput or {}
        if "prompt_tokens_per_second" in throughput:
            self.prompt_rate.labels(*cap).set(throughput["prompt_tokens_per_second"])
        if "requests_per_second" in throughput:
            self.request_rate.labels(*cap).set(throughput["requests_per_second"])
        if result.peak_memory_bytes is not None:
            self.peak_memory.labels(*run).set(result.peak_memory_bytes)
        if result.gpu_busy_ratio is not None:
            self.busy.labels(*cap).set(result.gpu_busy_ratio)
        if result.gpm_tensor_active_mean_ratio is not None:
            self.gpm_tensor.labels(*cap).set(result.gpm_tensor_active_mean_ratio)
        if result.gpm_dram_active_mean_ratio is not None:
            self.gpm_dram.labels(*cap).set(result.gpm_dram_active_mean_ratio)
        self.last_run.labels(*run).set(result.started_at + (result.wall_seconds or 0.0))
        if at_operator_cap:
            kind = KINDS.get(result.probe)  # the row says which latency feeds which histogram
            for source, target in (kind.latency_series if kind else {}).items():
                histogram = self.histograms[target].labels(*run)
                for seconds in (result.latencies or {}).get(source, ()):
                    histogram.observe(seconds)
        self._bump()


class ResultAgeCollector:
    """``gpuperf_probe_result_age_seconds``, read at each scrape from the last-run timestamps: an age
    changes every second, so it lives in a registry of its own that the exporter renders each time."""

    def __init__(self, metrics: ProbeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily("gpuperf_probe_result_age_seconds", "", labels=RUN_LABELS)]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpuperf_probe_result_age_seconds",
            "Age of the probe's last ok result on this GPU, seconds (absent: none yet; gpuperf_probe_due says so).",
            labels=RUN_LABELS)
        for labels, age in self.metrics.result_ages():
            family.add_metric([labels[k] for k in RUN_LABELS], age)
        yield family

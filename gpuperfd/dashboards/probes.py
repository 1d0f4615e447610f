"""Probes: throughput, energy and latency of the scheduled probe workloads over
time, run outcomes, and latency heatmaps from the probe histograms.

Probe histograms only change while a probe runs, so quantiles pool the
observations of a whole ``$window`` (default 1 h) instead of ``$__rate_interval``,
which would be empty between runs.

The dashboard is data: :data:`ROWS` of :class:`~gpuperfd.dashboards.common.Panel` specs.
"""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    AT_CAP,
    RUN,
    Panel,
    Row,
    dashboard,
    heatmap_query,
    interval_variable,
    probe_variables,
    query_variable,
)
from gpuperfd.probe_data.kinds import KINDS

TITLE = "gpuperfd / Probes"
UID = "gpuperfd-probes"
DESCRIPTION = "Scheduled probe workloads: results per cap over time, baselines and peers, run outcomes and latency histograms."

GPU_SEL = 'instance=~"$instance", gpu=~"$gpu"'
SEL = f'{GPU_SEL}, probe=~"$probe", preset=~"$preset"'

#: (title, histogram base name, probe it belongs to): each kind's latency panels, from its registry row.
HISTOGRAMS: tuple[tuple[str, str, str], ...] = tuple(
    (title, metric, kind.name) for kind in KINDS.values() for title, metric in kind.panels)


def quantiles(title: str, metric: str) -> Panel:
    """p50 and p99 of a probe histogram, pooled over ``$window``."""
    by = "le, instance, gpu, probe, preset"
    queries = tuple(
        (f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{SEL}}}[$window])))", f"{RUN} p{int(q * 100)}")
        for q in (0.5, 0.99)
    )
    return Panel(f"{title}: p50 / p99", queries, "s")


ROWS = (
    Row("Results at each cap", (
        Panel("Throughput (work units per second)",
              ((f"gpuperf_probe_work_units_per_second{{{SEL}}}", AT_CAP + " ({{unit}}/s)"),),
              description="Output tokens/s (llm), images/s (vit), iterations/s (attention), tokens/s (train)."),
        Panel("Energy per unit of work", ((f"gpuperf_probe_energy_per_unit_joules{{{SEL}}}", AT_CAP + " (J/{{unit}})"),),
              "joule"),
        Panel("Throughput vs 7-day baseline", ((
            f"gpuperf_probe_work_units_per_second{{{SEL}}}"
            f" / last_over_time(gpuperf:probe_work_units_per_second:median_7d{{{SEL}}}[1h])", AT_CAP),), "percentunit",
            description="1.0 = the GPU's own 7-day median at that cap; alert GpuProbeThroughputDrift below 0.9."),
        Panel("Throughput vs peers (same model, probe, preset, cap)", ((
            f"gpuperf_probe_work_units_per_second{{{SEL}}}"
            " * on (instance, gpu, uuid) group_left (name) gpuperf:gpu_name:info"
            " / on (name, probe, preset, power_cap) group_left () gpuperf:probe_work_units_per_second:peer_median",
            AT_CAP),), "percentunit",
            description="1.0 = the median of all GPUs of the same model; alert GpuSlowerThanPeers below 0.9 (with 4 or"
            " more GPUs)."),
        Panel("Average power during the probe", ((f"gpuperf_probe_average_power_watts{{{SEL}}}", AT_CAP),), "watt", w=8),
        Panel("GPU busy during the probe", ((f"gpuperf_probe_gpu_busy_ratio{{{SEL}}}", AT_CAP),), "percentunit", w=8),
        Panel("Peak memory of the probe", ((f"gpuperf_probe_peak_memory_bytes{{{SEL}}}", RUN),), "bytes", w=8),
        Panel("LLM prompt tokens and requests per second", (
            (f"gpuperf_probe_prompt_tokens_per_second{{{SEL}}}", AT_CAP + " prompt tokens/s"),
            (f"gpuperf_probe_requests_per_second{{{SEL}}}", AT_CAP + " requests/s"),
        ), w=24),
    )),
    Row("Runs", (
        Panel("Runs per hour by result", ((
            f"sum by (instance, gpu, probe, preset, result, reason) (increase(gpuperf_probe_runs_total{{{SEL}}}[1h]))",
            RUN + " {{result}} {{reason}}"),), w=8),
        Panel("Time since the last ok run",
              ((f"time() - max without (power_cap) (gpuperf_probe_last_run_timestamp_seconds{{{SEL}}})", RUN),), "s", w=8,
              description="Alert GpuProbeStale after 6 h."),
        Panel("Run duration (wall time of the last run)", ((f"gpuperf_probe_run_duration_seconds{{{SEL}}}", RUN),), "s",
              w=8),
        Panel("Scheduler runs missed or coalesced per hour", ((
            'increase(gpuperf_scheduler_runs_missed_total{instance=~"$instance", probe=~"$probe"}[1h])',
            "{{instance}} {{probe}}"),), w=24, h=6),
    )),
    Row("Coverage: fresh results on busy GPUs", (
        Panel("GPUs with a fresh result (share of the model's GPUs)", ((
            'gpuperf:probe_fresh_gpus:ratio_by_model{probe=~"$probe", preset=~"$preset"}',
            "{{name}} {{probe}}/{{preset}}"),), "percentunit", w=8,
            description="A result is fresh until it is older than its schedule's interval (docs/probes.md, "
            "\"Coverage\"); alert GpuProbeCoverageLow below 0.5 for 2 h, saying whether the GPUs were never free or "
            "free and not probed."),
        Panel("Age of the last result", ((f"gpuperf_probe_result_age_seconds{{{SEL}}}", RUN),), "s", w=8,
              description="Per GPU and probe; gpuperf_probe_due is 1 once it is older than the interval (or none came)."),
        Panel("Free to probe, and GPU time probes took (share of time)", (
            (f"gpuperf:probe_gpu_free:ratio_6h{{{GPU_SEL}}}", "{{instance}} gpu {{gpu}} free (6 h)"),
            (f"gpuperf:probe_gpu_time:ratio_1d{{{GPU_SEL}}}", "{{instance}} gpu {{gpu}} probes (1 d)"),
            ('max by (instance) (gpuperf_probe_gpu_time_budget_ratio{instance=~"$instance"})',
             "{{instance}} probes' share allowed"),
        ), "percentunit", w=8),
        Panel("From the GPU qualifying to the published result: p50 / p90", tuple(
            (f"histogram_quantile({q}, sum by (le, instance, probe) (rate(gpuperf_probe_qualified_to_result_seconds_bucket"
             f'{{instance=~"$instance", probe=~"$probe"}}[$window])))', f"{{{{instance}}}} {{{{probe}}}} p{int(q * 100)}")
            for q in (0.5, 0.9)), "s", w=24, h=6,
            description="Seconds from the moment a due probe's GPU qualified (free, idle for probes.idle_seconds) to its "
            "result: the probe's start-up, build and settle plus its measured window."),
    )),
    Row("Latency quantiles (pooled over $window)", tuple(quantiles(title, metric) for title, metric, _ in HISTOGRAMS)),
    Row("Latency heatmaps (observations per bucket)", tuple(
        Panel(f"{title} heatmap", (heatmap_query(f"{metric}_bucket", SEL),), kind="heatmap") for title, metric, _ in HISTOGRAMS
    )),
)


def build() -> g.Dashboard:
    return dashboard(TITLE, UID, DESCRIPTION, ROWS, [
        query_variable("instance", "Instance", "gpuperf_gpu_up", "instance"),
        query_variable("gpu", "GPU", 'gpuperf_gpu_up{instance=~"$instance"}', "gpu"),
        *probe_variables("gpuperf_probe_runs_total"),
        interval_variable("window", "Quantile window", "15m,1h,6h,1d", "1h"),
    ])

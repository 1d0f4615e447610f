"""Probes: throughput, energy and latency of the scheduled probe workloads over
time, run outcomes, and latency heatmaps from the probe histograms.

Probe histograms only change while a probe runs, so quantiles pool the
observations of a whole ``$window`` (default 1 h) instead of ``$__rate_interval``,
which would be empty between runs.
"""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    Layout,
    dashboard,
    heatmap,
    interval_variable,
    query_variable,
    targets,
    timeseries,
)

TITLE = "gpuperfd / Probes"
UID = "gpuperfd-probes"

GPU_SEL = 'instance=~"$instance", gpu=~"$gpu"'
SEL = f'{GPU_SEL}, probe=~"$probe", preset=~"$preset"'
RUN = "{{instance}} GPU {{gpu}} {{probe}}/{{preset}}"
AT_CAP = RUN + " @ {{power_cap}} W"

#: (title, histogram base name, probe it belongs to)
HISTOGRAMS = (
    ("LLM time to first token", "gpuperf_probe_ttft_seconds", "llm"),
    ("LLM time per output token", "gpuperf_probe_tpot_seconds", "llm"),
    ("LLM request latency", "gpuperf_probe_request_latency_seconds", "llm"),
    ("ViT batch latency", "gpuperf_probe_batch_latency_seconds", "vit"),
    ("Attention iteration time", "gpuperf_probe_iteration_seconds", "attention"),
    ("Training step time", "gpuperf_probe_step_seconds", "train"),
)


def _quantiles(title: str, metric: str) -> g.TimeSeries:
    by = "le, instance, gpu, probe, preset"
    queries = [
        (f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{SEL}}}[$window])))", f"{RUN} p{int(q * 100)}")
        for q in (0.5, 0.99)
    ]
    return timeseries(f"{title}: p50 / p99", targets(*queries), unit="s")


def build() -> g.Dashboard:
    lay = Layout()
    lay.row("Results at each cap")
    lay.add(
        timeseries(
            "Throughput (work units per second)",
            targets((f"gpuperf_probe_work_units_per_second{{{SEL}}}", AT_CAP + " ({{unit}}/s)")),
            description="Output tokens/s (llm), images/s (vit), iterations/s (attention), tokens/s (train).",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Energy per unit of work",
            targets((f"gpuperf_probe_energy_per_unit_joules{{{SEL}}}", AT_CAP + " (J/{{unit}})")),
            unit="joule",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Throughput vs 7-day baseline",
            targets(
                (
                    f"gpuperf_probe_work_units_per_second{{{SEL}}} / last_over_time(gpuperf:probe_work_units_per_second:median_7d{{{SEL}}}[1h])",
                    AT_CAP,
                )
            ),
            unit="percentunit",
            description="1.0 = the GPU's own 7-day median at that cap; alert GpuProbeThroughputDrift below 0.9.",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Throughput vs peers (same model, probe, preset, cap)",
            targets(
                (
                    f"gpuperf_probe_work_units_per_second{{{SEL}}}"
                    " * on (instance, gpu, uuid) group_left (name) gpuperf:gpu_name:info"
                    " / on (name, probe, preset, power_cap) group_left () gpuperf:probe_work_units_per_second:peer_median",
                    AT_CAP,
                )
            ),
            unit="percentunit",
            description="1.0 = the median of all GPUs of the same model; alert GpuSlowerThanPeers below 0.9 (with 4 or more GPUs).",
        ),
        w=12,
    )
    lay.add(
        timeseries("Average power during the probe", targets((f"gpuperf_probe_average_power_watts{{{SEL}}}", AT_CAP)), unit="watt"),
        w=8,
    )
    lay.add(
        timeseries("GPU busy during the probe", targets((f"gpuperf_probe_gpu_busy_ratio{{{SEL}}}", AT_CAP)), unit="percentunit"),
        w=8,
    )
    lay.add(
        timeseries("Peak memory of the probe", targets((f"gpuperf_probe_peak_memory_bytes{{{SEL}}}", RUN)), unit="bytes"),
        w=8,
    )
    lay.add(
        timeseries(
            "LLM prompt tokens and requests per second",
            targets(
                (f"gpuperf_probe_prompt_tokens_per_second{{{SEL}}}", AT_CAP + " prompt tokens/s"),
                (f"gpuperf_probe_requests_per_second{{{SEL}}}", AT_CAP + " requests/s"),
            ),
        ),
        w=24,
    )

    lay.row("Runs")
    lay.add(
        timeseries(
            "Runs per hour by result",
            targets(
                (
                    f"sum by (instance, gpu, probe, preset, result, reason) (increase(gpuperf_probe_runs_total{{{SEL}}}[1h]))",
                    RUN + " {{result}} {{reason}}",
                )
            ),
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Time since the last ok run",
            targets((f"time() - max without (power_cap) (gpuperf_probe_last_run_timestamp_seconds{{{SEL}}})", RUN)),
            unit="s",
            description="Alert GpuProbeStale after 6 h.",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Run duration (wall time of the last run)", targets((f"gpuperf_probe_run_duration_seconds{{{SEL}}}", RUN)), unit="s"
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Scheduler runs missed or coalesced per hour",
            targets(
                (
                    'increase(gpuperf_scheduler_runs_missed_total{instance=~"$instance", probe=~"$probe"}[1h])',
                    "{{instance}} {{probe}}",
                )
            ),
        ),
        w=24,
        h=6,
    )

    lay.row("Latency quantiles (pooled over $window)")
    for title, metric, _probe in HISTOGRAMS:
        lay.add(_quantiles(title, metric), w=12)

    lay.row("Latency heatmaps (observations per bucket)")
    for title, metric, _probe in HISTOGRAMS:
        lay.add(heatmap(f"{title} heatmap", f"{metric}_bucket", SEL), w=12)

    return dashboard(
        TITLE,
        UID,
        "Scheduled probe workloads: results per cap over time, baselines and peers, run outcomes and latency histograms.",
        lay,
        [
            query_variable("instance", "Instance", "gpuperf_gpu_up", "instance"),
            query_variable("gpu", "GPU", 'gpuperf_gpu_up{instance=~"$instance"}', "gpu"),
            query_variable("probe", "Probe", "gpuperf_probe_runs_total", "probe"),
            query_variable("preset", "Preset", 'gpuperf_probe_runs_total{probe=~"$probe"}', "preset"),
            interval_variable("window", "Quantile window", "15m,1h,6h,1d", "1h"),
        ],
    )

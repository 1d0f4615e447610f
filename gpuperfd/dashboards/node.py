"""Node / GPU detail: every telemetry series of the selected instances and GPUs,
the daemon's own health, and the power-cap state (operator's cap, sweeps)."""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    Layout,
    dashboard,
    query_variable,
    stat,
    table,
    target,
    targets,
    timeseries,
)

TITLE = "gpuperfd / Node and GPU detail"
UID = "gpuperfd-node"

SEL = 'instance=~"$instance", gpu=~"$gpu"'
GPU = "{{instance}} GPU {{gpu}}"


def _ts(title: str, metric: str, unit: str = "", legend: str = GPU, extra: str = "", **kwargs) -> g.TimeSeries:
    """A time series of one per-GPU metric with the dashboard's selection applied."""
    selector = f"{SEL}, {extra}" if extra else SEL
    return timeseries(title, targets((f"{metric}{{{selector}}}", legend)), unit=unit, **kwargs)


def build() -> g.Dashboard:
    lay = Layout()
    lay.row("Identity and state")
    lay.add(
        table(
            "GPUs",
            [target(f"gpuperf_gpu_info{{{SEL}}}", instant=True, fmt="table")],
            hide=("Value",),
            description="Identity from gpuperf_gpu_info (kept while a GPU is lost).",
        ),
        w=16,
        h=6,
    )
    lay.add(
        stat(
            "GPUs up",
            [target(f"sum(gpuperf_gpu_up{{{SEL}}})", "up"), target(f"count(gpuperf_gpu_up{{{SEL}}} == 0) or vector(0)", "lost", ref="B")],
        ),
        w=4,
        h=6,
    )
    lay.add(
        table(
            "gpuperfd build",
            [target('gpuperf_build_info{instance=~"$instance"}', instant=True, fmt="table")],
            hide=("Value",),
        ),
        w=4,
        h=6,
    )

    lay.row("Utilization and memory")
    lay.add(_ts("GPU utilization", "gpuperf_gpu_utilization_ratio", "percentunit"), w=8)
    lay.add(_ts("Memory utilization (bandwidth)", "gpuperf_memory_utilization_ratio", "percentunit"), w=8)
    lay.add(
        timeseries(
            "Memory used / total",
            targets(
                (f"gpuperf_memory_used_bytes{{{SEL}}}", f"{GPU} used"),
                (f"gpuperf_memory_total_bytes{{{SEL}}}", f"{GPU} total"),
            ),
            unit="bytes",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Compute processes",
            targets((f"gpuperf_compute_processes{{{SEL}}}", GPU)),
        ),
        w=12,
    )
    lay.add(_ts("Memory held by compute processes", "gpuperf_compute_processes_memory_bytes", "bytes"), w=12)

    lay.row("Power and energy")
    lay.add(
        timeseries(
            "Power draw and limits",
            targets(
                (f"gpuperf_power_draw_watts{{{SEL}}}", f"{GPU} draw"),
                (f"gpuperf_power_limit_watts{{{SEL}}}", f"{GPU} enforced limit"),
                (f"gpuperf_power_limit_default_watts{{{SEL}}}", f"{GPU} default limit"),
                (f"gpuperf_power_limit_min_watts{{{SEL}}}", f"{GPU} min limit"),
                (f"gpuperf_power_limit_max_watts{{{SEL}}}", f"{GPU} max limit"),
            ),
            unit="watt",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Energy rate (hardware counter)",
            targets((f"rate(gpuperf_energy_joules_total{{{SEL}}}[$__rate_interval])", GPU)),
            unit="watt",
            description="rate() of gpuperf_energy_joules_total: average power between scrapes.",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Power cap: enforced vs operator's",
            targets(
                (f"gpuperf_power_limit_watts{{{SEL}}}", f"{GPU} enforced"),
                (f"gpuperf_power_cap_original_watts{{{SEL}}}", f"{GPU} operator's cap"),
                (f"gpuperf_sweep_cap_watts{{{SEL}}}", f"{GPU} sweep holds"),
            ),
            unit="watt",
            description="During a sweep the enforced limit follows the sweep; afterwards it must return to the operator's cap (alert GpuPowerCapNotRestored).",
        ),
        w=12,
    )
    lay.add(_ts("Sweep in progress", "gpuperf_sweep_in_progress", drawStyle="bars"), w=12)

    lay.row("Thermals and clocks")
    lay.add(_ts("Temperature", "gpuperf_temperature_celsius", "celsius"), w=8)
    lay.add(
        timeseries(
            "SM clock",
            targets(
                (f"gpuperf_sm_clock_hertz{{{SEL}}}", GPU),
                (f"gpuperf_sm_clock_max_hertz{{{SEL}}}", f"{GPU} max"),
            ),
            unit="hertz",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Memory clock",
            targets(
                (f"gpuperf_memory_clock_hertz{{{SEL}}}", GPU),
                (f"gpuperf_memory_clock_max_hertz{{{SEL}}}", f"{GPU} max"),
            ),
            unit="hertz",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Active clock events (throttle reasons)",
            targets((f"gpuperf_clock_event_active{{{SEL}}} == 1", f"{GPU} {{{{reason}}}}")),
            drawStyle="bars",
            description="One bar per active reason; sw_power_cap is the cap at work, hw_* and sw_thermal_* are throttling (alert GpuThrottling).",
        ),
        w=24,
    )

    lay.row("PCIe")
    lay.add(_ts("PCIe transmit", "gpuperf_pcie_tx_bytes_per_second", "Bps"), w=12)
    lay.add(_ts("PCIe receive", "gpuperf_pcie_rx_bytes_per_second", "Bps"), w=12)

    lay.row("Errors")
    lay.add(
        timeseries(
            "ECC errors",
            targets((f"increase(gpuperf_ecc_errors_total{{{SEL}}}[$__rate_interval])", f"{GPU} {{{{type}}}}")),
            drawStyle="bars",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "XID errors by code",
            targets((f"increase(gpuperf_xid_errors_total{{{SEL}}}[$__rate_interval])", f"{GPU} XID {{{{xid}}}}")),
            drawStyle="bars",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Device read errors",
            targets(
                (
                    f"sum by (instance, gpu, collector, reason) (increase(gpuperf_device_errors_total{{{SEL}}}[$__rate_interval]))",
                    f"{GPU} {{{{collector}}}}: {{{{reason}}}}",
                )
            ),
            drawStyle="bars",
        ),
        w=8,
    )

    lay.row("GPM profiling (Hopper and newer)")
    lay.add(_ts("SM active (GPM)", "gpuperf_gpm_sm_active_ratio", "percentunit", valueMin=0, valueMax=1), w=8)
    lay.add(
        _ts("Tensor active (GPM)", "gpuperf_gpm_tensor_active_ratio", "percentunit", legend=f"{GPU} {{{{precision}}}}",
            valueMin=0, valueMax=1),
        w=8,
    )
    lay.add(
        _ts("DRAM bandwidth active (GPM)", "gpuperf_gpm_dram_bandwidth_active_ratio", "percentunit", valueMin=0, valueMax=1),
        w=8,
    )
    lay.add(_ts("SM occupancy (GPM)", "gpuperf_gpm_sm_occupancy_ratio", "percentunit", valueMin=0, valueMax=1), w=8)
    lay.add(
        _ts("FP pipes active (GPM)", "gpuperf_gpm_pipe_active_ratio", "percentunit", legend=f"{GPU} {{{{pipe}}}}",
            valueMin=0, valueMax=1),
        w=8,
    )
    lay.add(
        timeseries(
            "PCIe and NVLink bytes (GPM)",
            targets(
                (f"gpuperf_gpm_pcie_rx_bytes_per_second{{{SEL}}}", f"{GPU} PCIe rx"),
                (f"gpuperf_gpm_pcie_tx_bytes_per_second{{{SEL}}}", f"{GPU} PCIe tx"),
                (f"gpuperf_gpm_nvlink_rx_bytes_per_second{{{SEL}}}", f"{GPU} NVLink rx"),
                (f"gpuperf_gpm_nvlink_tx_bytes_per_second{{{SEL}}}", f"{GPU} NVLink tx"),
            ),
            unit="Bps",
        ),
        w=8,
    )

    lay.row("Memory health, throttling, NVLink, MIG")
    lay.add(_ts("HBM temperature", "gpuperf_memory_temperature_celsius", "celsius"), w=8)
    lay.add(
        timeseries(
            "Remapped rows",
            targets(
                (f"gpuperf_remapped_rows{{{SEL}}}", f"{GPU} {{{{cause}}}}"),
                (f"gpuperf_remapped_rows_pending{{{SEL}}}", f"{GPU} pending (reset needed)"),
                (f"gpuperf_remapped_rows_failure{{{SEL}}}", f"{GPU} failure"),
            ),
        ),
        w=8,
    )
    lay.add(
        timeseries("PCIe replays per hour", targets((f"increase(gpuperf_pcie_replays_total{{{SEL}}}[1h])", GPU))),
        w=8,
    )
    lay.add(
        timeseries(
            "Time held back, by reason",
            targets((f"rate(gpuperf_violation_seconds_total{{{SEL}}}[$__rate_interval])", f"{GPU} {{{{reason}}}}")),
            unit="percentunit",
            description="Share of time the clock was held back (violation counters; sw power cap is the cap at work).",
        ),
        w=8,
    )
    lay.add(_ts("Video encoder / decoder", "gpuperf_codec_utilization_ratio", "percentunit", legend=f"{GPU} {{{{engine}}}}"), w=8)
    lay.add(
        timeseries(
            "NVLink links up, errors",
            targets(
                (f"sum by (instance, gpu) (gpuperf_nvlink_up{{{SEL}}})", f"{GPU} links up"),
                (f"sum by (instance, gpu) (increase(gpuperf_nvlink_errors_total{{{SEL}}}[1h]))", f"{GPU} errors/h"),
            ),
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "MIG instances: memory used",
            targets((f"gpuperf_mig_memory_used_bytes{{{SEL}}}", f"{GPU} GI {{{{gpu_instance}}}} CI {{{{compute_instance}}}}")),
            unit="bytes",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "MIG instances: tensor and DRAM active (GPM)",
            targets(
                (f"gpuperf_mig_gpm_tensor_active_ratio{{{SEL}}}", f"{GPU} GI {{{{gpu_instance}}}} tensor"),
                (f"gpuperf_mig_gpm_dram_bandwidth_active_ratio{{{SEL}}}", f"{GPU} GI {{{{gpu_instance}}}} DRAM"),
            ),
            unit="percentunit",
        ),
        w=8,
    )
    lay.add(_ts("MIG mode", "gpuperf_mig_enabled", valueMin=0, valueMax=1), w=8)

    lay.row("Collectors and daemon")
    lay.add(
        _ts("Collector success", "gpuperf_collector_success", legend=f"{GPU} {{{{collector}}}}", valueMin=0, valueMax=1),
        w=8,
    )
    lay.add(_ts("Collector read duration", "gpuperf_collector_duration_seconds", "s", legend=f"{GPU} {{{{collector}}}}"), w=8)
    lay.add(_ts("Collector reading age", "gpuperf_collector_age_seconds", "s", legend=f"{GPU} {{{{collector}}}}"), w=8)
    lay.add(
        timeseries(
            "Daemon resident memory",
            targets(('process_resident_memory_bytes{job=~".*gpuperfd.*", instance=~"$instance"}', "{{instance}}")),
            unit="bytes",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Daemon CPU",
            targets(('rate(process_cpu_seconds_total{job=~".*gpuperfd.*", instance=~"$instance"}[$__rate_interval])', "{{instance}}")),
            unit="percentunit",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Scrape duration",
            targets(('scrape_duration_seconds{job=~".*gpuperfd.*", instance=~"$instance"}', "{{instance}}")),
            unit="s",
        ),
        w=8,
    )

    return dashboard(
        TITLE,
        UID,
        "Every gpuperfd telemetry series for the selected instances and GPUs.",
        lay,
        [
            query_variable("instance", "Instance", "gpuperf_gpu_up", "instance"),
            query_variable("gpu", "GPU", 'gpuperf_gpu_up{instance=~"$instance"}', "gpu"),
        ],
    )

"""Node / GPU detail: every telemetry series of the selected instances and GPUs,
the health verdict, the daemon's own health, and the power-cap state (operator's cap, sweeps).

The dashboard is data: :data:`ROWS` of :class:`~gpuperfd.dashboards.common.Panel` specs."""

from __future__ import annotations

from typing import Any

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    HEALTH_ACTIONS as ACTIONS,
    HEALTH_STATES as STATES,
    Panel,
    Row,
    dashboard,
    label_code,
    query_variable,
    value_mappings,
)

TITLE = "gpuperfd / Node and GPU detail"
UID = "gpuperfd-node"
DESCRIPTION = "Every gpuperfd telemetry series for the selected instances and GPUs."

SEL = 'instance=~"$instance", gpu=~"$gpu"'
GPU = "{{instance}} GPU {{gpu}}"
RATIO = {"valueMin": 0, "valueMax": 1}


def per_gpu(title: str, metric: str, unit: str = "", legend: str = GPU, w: int = 8, **options: Any) -> Panel:
    """A time series of one per-GPU metric with the dashboard's selection applied."""
    return Panel(title, ((f"{metric}{{{SEL}}}", legend),), unit, w=w, options=options)


def q(metric: str, legend: str, wrap: str = "{}") -> tuple[str, str]:
    """(expr, legend) of ``metric`` with the selection, optionally wrapped (``wrap`` holds one ``{}``)."""
    return wrap.format(f"{metric}{{{SEL}}}"), legend


def health_code(metric: str, label: str, names: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """The one-hot health series as a code per GPU that value mappings name (:func:`label_code`)."""
    return label_code(metric, SEL, label, names, "instance, gpu"), GPU


HEALTH = Row("GPU health verdict", (
    Panel("Health state", (health_code("gpuperf_gpu_health_state", "state", STATES),), kind="stat", w=6, h=6,
          description="Each GPU's verdict (docs/health.md): healthy, unknown, degraded or unhealthy.",
          options={"mappings": value_mappings(STATES), "colorMode": "background", "textMode": "value_and_name"}),
    Panel("Action asked for", (health_code("gpuperf_gpu_health_action", "action", ACTIONS),), kind="stat", w=6, h=6,
          description="What the verdict asks the operator to do (docs/runbook.md, alerts GpuAction*).",
          options={"mappings": value_mappings(ACTIONS), "colorMode": "background", "textMode": "value_and_name"}),
    Panel("Reasons (checks firing)",
          (q("gpuperf_gpu_health_reason_info", "", "max by (instance, gpu, check, severity, action) ({} == 1)"),),
          kind="table", w=12, h=6, options={"hide": ("Value",)},
          description="One row per check that fired for the GPU; evidence: GET /api/v1/health on the node."),
    Panel("Health state history", (health_code("gpuperf_gpu_health_state", "state", STATES),),
          kind="state-timeline", w=24, h=6, options={"mappings": value_mappings(STATES)}),
))

#: The GPU fabric's states as the fabric collector exports them, in order of readiness.
FABRIC = (("not_started", "red"), ("in_progress", "orange"), ("completed", "green"))
NODE_SEL = 'instance=~"$instance"'
PAIR = f"{GPU} -> GPU {{{{peer}}}}"
SET = "{{instance}} GPUs {{gpus}}, {{bytes}} B"

INTERCONNECT = Row("Interconnect: peer copies, all-reduce, NVLinks per pair, fabric", (
    Panel("Peer copy bandwidth per pair", (
        q("gpuperf_interconnect_peer_copy_bandwidth_bytes_per_second", PAIR),
        q("gpuperf_interconnect_peer_copy_expected_bytes_per_second", f"{PAIR} expected"),
    ), "Bps", w=8, description="Last ok interconnect run, per ordered pair, beside the figure of a healthy link "
                               "(docs/health.md, \"The interconnect\"; NVLink pairs only)."),
    Panel("All-reduce bus bandwidth", ((f"gpuperf_interconnect_allreduce_bus_bandwidth_bytes_per_second{{{NODE_SEL}}}",
                                        SET),), "Bps", w=8,
          description="NCCL all-reduce bus bandwidth (nccl-tests' busbw) per set of GPUs and size per rank."),
    Panel("All-reduce latency", ((f"gpuperf_interconnect_allreduce_latency_seconds{{{NODE_SEL}}}",
                                  SET + " p{{percentile}}"),), "s", w=8),
    Panel("NVLinks per pair: up and expected", (
        q("gpuperf_nvlink_peer_links", PAIR),
        q("gpuperf_nvlink_peer_links_expected", f"{PAIR} expected"),
    ), w=12, description="From the topology: links joining the pair (directly or through NVSwitch)."),
    Panel("GPU fabric state", ((label_code("gpuperf_fabric_state", SEL, "state", FABRIC, "instance, gpu"), GPU),),
          kind="state-timeline", w=12, options={"mappings": value_mappings(FABRIC)},
          description="NVSwitch boards only (the Fabric Manager): not started, in progress, completed."),
))

ROWS = (
    Row("Identity and state", (
        Panel("GPUs", (q("gpuperf_gpu_info", ""),), kind="table", w=16, h=6, options={"hide": ("Value",)},
              description="Identity from gpuperf_gpu_info (kept while a GPU is lost)."),
        Panel("GPUs up", (q("gpuperf_gpu_up", "up", "sum({})"), q("gpuperf_gpu_up", "lost", "count({} == 0) or vector(0)")),
              kind="stat", w=4, h=6),
        Panel("gpuperfd build", (('gpuperf_build_info{instance=~"$instance"}', ""),), kind="table", w=4, h=6,
              options={"hide": ("Value",)}),
    )),
    HEALTH,
    Row("Utilization and memory", (
        per_gpu("GPU utilization", "gpuperf_gpu_utilization_ratio", "percentunit"),
        per_gpu("Memory utilization (bandwidth)", "gpuperf_memory_utilization_ratio", "percentunit"),
        Panel("Memory used / total", (q("gpuperf_memory_used_bytes", f"{GPU} used"),
                                      q("gpuperf_memory_total_bytes", f"{GPU} total")), "bytes", w=8),
        Panel("Compute processes", (q("gpuperf_compute_processes", GPU),)),
        per_gpu("Memory held by compute processes", "gpuperf_compute_processes_memory_bytes", "bytes", w=12),
    )),
    Row("Power and energy", (
        Panel("Power draw and limits", (
            q("gpuperf_power_draw_watts", f"{GPU} draw"),
            q("gpuperf_power_limit_watts", f"{GPU} enforced limit"),
            q("gpuperf_power_limit_default_watts", f"{GPU} default limit"),
            q("gpuperf_power_limit_min_watts", f"{GPU} min limit"),
            q("gpuperf_power_limit_max_watts", f"{GPU} max limit"),
        ), "watt"),
        Panel("Energy rate (hardware counter)",
              (q("gpuperf_energy_joules_total", GPU, "rate({}[$__rate_interval])"),), "watt",
              description="rate() of gpuperf_energy_joules_total: average power between scrapes."),
        Panel("Power cap: enforced vs operator's", (
            q("gpuperf_power_limit_watts", f"{GPU} enforced"),
            q("gpuperf_power_cap_original_watts", f"{GPU} operator's cap"),
            q("gpuperf_sweep_cap_watts", f"{GPU} sweep holds"),
        ), "watt", description="During a sweep the enforced limit follows the sweep; afterwards it must return to the"
           " operator's cap (alert GpuPowerCapNotRestored)."),
        per_gpu("Sweep in progress", "gpuperf_sweep_in_progress", w=12, drawStyle="bars"),
    )),
    Row("Thermals and clocks", (
        per_gpu("Temperature", "gpuperf_temperature_celsius", "celsius"),
        Panel("SM clock", (q("gpuperf_sm_clock_hertz", GPU), q("gpuperf_sm_clock_max_hertz", f"{GPU} max")), "hertz", w=8),
        Panel("Memory clock", (q("gpuperf_memory_clock_hertz", GPU), q("gpuperf_memory_clock_max_hertz", f"{GPU} max")),
              "hertz", w=8),
        Panel("Active clock events (throttle reasons)",
              (q("gpuperf_clock_event_active", f"{GPU} {{{{reason}}}}", "{} == 1"),), w=24, options={"drawStyle": "bars"},
              description="One bar per active reason; sw_power_cap is the cap at work, hw_* and sw_thermal_* are"
              " throttling (alert GpuThrottling)."),
    )),
    Row("PCIe", (
        per_gpu("PCIe transmit", "gpuperf_pcie_tx_bytes_per_second", "Bps", w=12),
        per_gpu("PCIe receive", "gpuperf_pcie_rx_bytes_per_second", "Bps", w=12),
    )),
    Row("Errors", (
        Panel("ECC errors", (q("gpuperf_ecc_errors_total", f"{GPU} {{{{type}}}}", "increase({}[$__rate_interval])"),),
              w=8, options={"drawStyle": "bars"}),
        Panel("XID errors by code",
              (q("gpuperf_xid_errors_total", f"{GPU} XID {{{{xid}}}}", "increase({}[$__rate_interval])"),),
              w=8, options={"drawStyle": "bars"}),
        Panel("Device read errors", (q(
            "gpuperf_device_errors_total", f"{GPU} {{{{collector}}}}: {{{{reason}}}}",
            "sum by (instance, gpu, collector, reason) (increase({}[$__rate_interval]))"),), w=8,
            options={"drawStyle": "bars"}),
    )),
    Row("GPM profiling (Hopper and newer)", (
        per_gpu("SM active (GPM)", "gpuperf_gpm_sm_active_ratio", "percentunit", **RATIO),
        per_gpu("Tensor active (GPM)", "gpuperf_gpm_tensor_active_ratio", "percentunit",
                legend=f"{GPU} {{{{precision}}}}", **RATIO),
        per_gpu("DRAM bandwidth active (GPM)", "gpuperf_gpm_dram_bandwidth_active_ratio", "percentunit", **RATIO),
        per_gpu("SM occupancy (GPM)", "gpuperf_gpm_sm_occupancy_ratio", "percentunit", **RATIO),
        per_gpu("FP pipes active (GPM)", "gpuperf_gpm_pipe_active_ratio", "percentunit", legend=f"{GPU} {{{{pipe}}}}",
                **RATIO),
        Panel("PCIe and NVLink bytes (GPM)", (
            q("gpuperf_gpm_pcie_rx_bytes_per_second", f"{GPU} PCIe rx"),
            q("gpuperf_gpm_pcie_tx_bytes_per_second", f"{GPU} PCIe tx"),
            q("gpuperf_gpm_nvlink_rx_bytes_per_second", f"{GPU} NVLink rx"),
            q("gpuperf_gpm_nvlink_tx_bytes_per_second", f"{GPU} NVLink tx"),
        ), "Bps", w=8),
    )),
    Row("Memory health, throttling, NVLink, MIG", (
        per_gpu("HBM temperature", "gpuperf_memory_temperature_celsius", "celsius"),
        Panel("Remapped rows", (
            q("gpuperf_remapped_rows", f"{GPU} {{{{cause}}}}"),
            q("gpuperf_remapped_rows_pending", f"{GPU} pending (reset needed)"),
            q("gpuperf_remapped_rows_failure", f"{GPU} failure"),
        ), w=8),
        Panel("PCIe replays per hour", (q("gpuperf_pcie_replays_total", GPU, "increase({}[1h])"),), w=8),
        Panel("Time held back, by reason",
              (q("gpuperf_violation_seconds_total", f"{GPU} {{{{reason}}}}", "rate({}[$__rate_interval])"),),
              "percentunit", w=8,
              description="Share of time the clock was held back (violation counters; sw power cap is the cap at work)."),
        per_gpu("Video encoder / decoder", "gpuperf_codec_utilization_ratio", "percentunit", legend=f"{GPU} {{{{engine}}}}"),
        Panel("NVLink links up, errors", (
            q("gpuperf_nvlink_up", f"{GPU} links up", "sum by (instance, gpu) ({})"),
            q("gpuperf_nvlink_errors_total", f"{GPU} errors/h", "sum by (instance, gpu) (increase({}[1h]))"),
        ), w=8),
        Panel("MIG instances: memory used",
              (q("gpuperf_mig_memory_used_bytes", f"{GPU} GI {{{{gpu_instance}}}} CI {{{{compute_instance}}}}"),),
              "bytes", w=8),
        Panel("MIG instances: tensor and DRAM active (GPM)", (
            q("gpuperf_mig_gpm_tensor_active_ratio", f"{GPU} GI {{{{gpu_instance}}}} tensor"),
            q("gpuperf_mig_gpm_dram_bandwidth_active_ratio", f"{GPU} GI {{{{gpu_instance}}}} DRAM"),
        ), "percentunit", w=8),
        per_gpu("MIG mode", "gpuperf_mig_enabled", **RATIO),
    )),
    INTERCONNECT,
    Row("Collectors and daemon", (
        per_gpu("Collector success", "gpuperf_collector_success", legend=f"{GPU} {{{{collector}}}}", **RATIO),
        per_gpu("Collector read duration", "gpuperf_collector_duration_seconds", "s", legend=f"{GPU} {{{{collector}}}}"),
        per_gpu("Collector reading age", "gpuperf_collector_age_seconds", "s", legend=f"{GPU} {{{{collector}}}}"),
        Panel("Daemon resident memory",
              (('process_resident_memory_bytes{job=~".*gpuperfd.*", instance=~"$instance"}', "{{instance}}"),), "bytes", w=8),
        Panel("Daemon CPU", (('rate(process_cpu_seconds_total{job=~".*gpuperfd.*", instance=~"$instance"}[$__rate_interval])',
                              "{{instance}}"),), "percentunit", w=8),
        Panel("Scrape duration", (('scrape_duration_seconds{job=~".*gpuperfd.*", instance=~"$instance"}', "{{instance}}"),),
              "s", w=8),
    )),
)


def build() -> g.Dashboard:
    return dashboard(TITLE, UID, DESCRIPTION, ROWS, [
        query_variable("instance", "Instance", "gpuperf_gpu_up", "instance"),
        query_variable("gpu", "GPU", 'gpuperf_gpu_up{instance=~"$instance"}', "gpu"),
    ])

"""Fleet overview: how many GPUs answer, what they draw and do, what is firing,
whose pods and Slurm jobs used the energy, and the power-cap recommendation per GPU model."""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    Layout,
    column,
    dashboard,
    query_variable,
    stat,
    table,
    target,
    targets,
    timeseries,
)

TITLE = "gpuperfd / Fleet overview"
UID = "gpuperfd-fleet"

MODEL = 'name=~"$model"'
#: Per-GPU series joined to the GPU model (recording rule gpuperf:gpu_name:info).
BY_MODEL = f"* on (instance, gpu, uuid) group_left (name) gpuperf:gpu_name:info{{{MODEL}}}"
ALERTS = 'ALERTS{alertstate="firing", alertname=~"Gpu.*", severity!="none"}'  # none: GpuperfdSweepInProgress, an inhibition source


def build() -> g.Dashboard:
    lay = Layout()
    lay.row("Fleet")
    lay.add(stat("GPUs up", [target(f"sum(gpuperf_gpu_up {BY_MODEL})")]), w=4, h=4)
    lay.add(
        stat(
            "GPUs lost",
            [target(f"count((gpuperf_gpu_up {BY_MODEL}) == 0) or vector(0)")],
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
            colorMode="background",
        ),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "Exporters down",
            [target('count(up{job=~".*gpuperfd.*"} == 0) or vector(0)')],
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
            colorMode="background",
        ),
        w=4,
        h=4,
    )
    lay.add(stat("Power draw", [target(f"sum(gpuperf_power_draw_watts {BY_MODEL})")], unit="watt"), w=4, h=4)
    lay.add(
        stat("Mean GPU utilization", [target(f"avg(gpuperf_gpu_utilization_ratio {BY_MODEL})")], unit="percentunit"),
        w=4,
        h=4,
    )
    lay.add(
        stat(
            "Energy in range",
            [target(f"sum(increase(gpuperf_energy_joules_total[$__range]) {BY_MODEL}) / 3.6e6")],
            unit="kwatth",
            description="Hardware energy counters of all selected GPUs over the dashboard's time range.",
        ),
        w=4,
        h=4,
    )

    lay.row("By GPU model")
    lay.add(
        timeseries(
            "GPUs up by model",
            targets((f"gpuperf:gpus_up:by_model{{{MODEL}}}", "{{name}} up"), (f"gpuperf:gpus:by_model{{{MODEL}}}", "{{name}} known")),
        ),
        w=8,
    )
    lay.add(timeseries("Power draw by model", targets((f"gpuperf:power_draw_watts:by_model{{{MODEL}}}", "{{name}}")), unit="watt"), w=8)
    lay.add(
        timeseries(
            "GPU utilization by model",
            targets((f"avg by (name) (gpuperf_gpu_utilization_ratio {BY_MODEL})", "{{name}}")),
            unit="percentunit",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Temperature by model (max)",
            targets((f"max by (name) (gpuperf_temperature_celsius {BY_MODEL})", "{{name}}")),
            unit="celsius",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Energy rate by model",
            targets((f"sum by (name) (rate(gpuperf_energy_joules_total[$__rate_interval]) {BY_MODEL})", "{{name}}")),
            unit="watt",
            description="From the hardware energy counters (joules per second = watts).",
        ),
        w=8,
    )
    lay.add(
        timeseries(
            "Throttled GPUs (thermal / hardware slowdown)",
            targets(
                (
                    f'count by (name) ((gpuperf_clock_event_active{{reason=~"hw_.*|sw_thermal.*"}} == 1) {BY_MODEL})',
                    "{{name}}",
                )
            ),
        ),
        w=8,
    )

    lay.row("Alerts")
    lay.add(
        table(
            "Firing alerts",
            [target(f"sum by (alertname, severity, instance, gpu) ({ALERTS})", instant=True, fmt="table")],
            hide=("Value",),
            description="gpuperfd alerts firing now (from the ALERTS series); docs/runbook.md has one section per alert.",
        ),
        w=12,
        h=9,
    )
    lay.add(
        timeseries("Firing alerts over time", targets((f"count by (alertname) ({ALERTS})", "{{alertname}}")), drawStyle="bars"),
        w=12,
        h=9,
    )

    lay.row("Who is on the GPU")
    lay.add(
        timeseries(
            "Energy by namespace / job",
            targets(
                ("gpuperf:namespace_energy_joules:increase1h / 3.6e6", "{{namespace}}"),
                ("gpuperf:slurm_job_energy_joules:increase1h / 3.6e6", "Slurm job {{slurm_job}}"),
            ),
            unit="kwatth",
            description=(
                "Energy of the GPUs each namespace's pods (kubelet PodResources) and each Slurm job held, in the"
                " hour before each point; a GPU held by several pods (MIG devices, time-slicing) or jobs is split"
                " evenly, a GPU held by nobody is left out. All GPUs, whatever the model selection. Rules:"
                " deploy/prometheus/rules/attribution.yml; a whole run is"
                " sum_over_time(gpuperf:pod_energy_joules:increase1m[its life])."
            ),
        ),
        w=24,
    )

    lay.row("Power-cap recommendation per model")
    lay.add(
        table(
            "Recommended cap per model",
            targets(
                (f"gpuperf:power_cap_recommended_watts:by_model{{{MODEL}}}", "cap"),
                (f"gpuperf:power_cap_recommendation_agreement_ratio:by_model{{{MODEL}}}", "agreement"),
                (f"gpuperf:power_cap_energy_saving_ratio:by_model{{{MODEL}}}", "saving"),
                (f"gpuperf:power_cap_slowdown_ratio:by_model{{{MODEL}}}", "slowdown"),
                instant=True,
                fmt="table",
            ),
            description=(
                "The most common per-GPU recommended cap of each model (ties: the lower cap); agreement: share of"
                " the model's GPUs recommending it; saving and slowdown: medians of the per-GPU values at each"
                " GPU's own recommended cap. Rules: deploy/prometheus/rules/recording.yml."
            ),
            overrides=[
                column("A", "cap", "watt"),
                column("B", "agreement", "percentunit"),
                column("C", "energy saving", "percentunit"),
                column("D", "slowdown", "percentunit"),
            ],
        ),
        w=14,
        h=9,
    )
    lay.add(
        timeseries(
            "Median energy saving at the recommended cap",
            targets((f"gpuperf:power_cap_energy_saving_ratio:by_model{{{MODEL}}}", "{{name}} {{probe}}/{{preset}}")),
            unit="percentunit",
        ),
        w=10,
        h=9,
    )

    return dashboard(
        TITLE,
        UID,
        "All GPUs scraped by this Prometheus: availability, power, utilization, firing alerts, energy by namespace"
        " and Slurm job, and power-cap recommendations per model.",
        lay,
        [query_variable("model", "GPU model", "gpuperf_gpu_info", "name")],
    )

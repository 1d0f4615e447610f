"""Fleet overview: how many GPUs answer, what they draw and do, their health verdicts,
what is firing, whose pods and Slurm jobs used the energy, the power-cap recommendation
per GPU model and what it would save.

The dashboard is data: :data:`ROWS` of :class:`~gpuperfd.dashboards.common.Panel` specs."""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    HEALTH_STATES,
    Panel,
    Row,
    column,
    dashboard,
    fixed_colors,
    query_variable,
    textbox_variable,
)

TITLE = "gpuperfd / Fleet overview"
UID = "gpuperfd-fleet"
DESCRIPTION = (
    "All GPUs scraped by this Prometheus: availability, power, utilization, health verdicts, firing alerts, energy"
    " by namespace and Slurm job, power-cap recommendations per model and what they would save."
)

MODEL = 'name=~"$model"'
#: Per-GPU series joined to the GPU model (recording rule gpuperf:gpu_name:info).
BY_MODEL = f"* on (instance, gpu, uuid) group_left (name) gpuperf:gpu_name:info{{{MODEL}}}"
ALERTS = 'ALERTS{alertstate="firing", alertname=~"Gpu.*", severity!="none"}'  # none: GpuperfdSweepInProgress, an inhibition source
#: Defaults of the savings row's textbox variables (the money panel's price and the site's PUE).
PRICE_PER_KWH = "0.15"
PUE = "1"
#: Joules per kWh (the savings rules are in joules, SI).
KWH = "3.6e6"
RED_FROM_ONE = {"thresholds": [{"color": "green", "value": None}, {"color": "red", "value": 1}], "colorMode": "background"}

#: One row per GPU whose verdict is degraded or unhealthy, with the action it asks for and its model.
NEEDS_ATTENTION = (
    'max by (instance, gpu, uuid, name, state, action) ('
    '(gpuperf_gpu_health_state{state=~"degraded|unhealthy"} == 1)'
    " * on (instance, gpu, uuid) group_left (action) (gpuperf_gpu_health_action == 1)"
    f" {BY_MODEL})"
)

#: GPUs per verdict state (the stat and its history).
STATE_COUNTS = (f"count by (state) ((gpuperf_gpu_health_state == 1) {BY_MODEL})", "{{state}}")

HEALTH = Row("GPU health verdict", (
    Panel("GPUs per health state", (STATE_COUNTS,),
          kind="stat", w=6, h=6, description="Each GPU's verdict (docs/health.md) counted by state.",
          options={"overrides": fixed_colors(HEALTH_STATES), "colorMode": "background", "textMode": "value_and_name"}),
    Panel("GPUs per action", ((f"count by (action) ((gpuperf_gpu_health_action == 1) {BY_MODEL})", "{{action}}"),),
          kind="bargauge", w=6, h=6,
          description="What the verdicts ask for (none: nothing to do); docs/runbook.md, alerts GpuAction*."),
    Panel("Checks firing (top 10)",
          ((f"topk(10, count by (check) (gpuperf_gpu_health_reason_info {BY_MODEL}))", "{{check}}"),),
          kind="bargauge", w=12, h=6, description="How many GPUs each health check (docs/health.md) flags now."),
    Panel("Degraded and unhealthy GPUs", ((NEEDS_ATTENTION, ""),), kind="table", w=14, h=8, options={"hide": ("Value",)},
          description="Evidence per GPU: GET /api/v1/health on its node, or the node dashboard's health row."),
    Panel("GPUs per health state over time",
          (STATE_COUNTS,), w=10, h=8,
          options={"overrides": fixed_colors(HEALTH_STATES)}),
))

SAVINGS = Row("Power-cap savings at the recommended caps", (
    Panel("Power saved", ((f"sum by (probe, preset) (gpuperf:power_saving_watts:by_model{{{MODEL}}})", "{{probe}}/{{preset}}"),),
          "watt", kind="stat", w=8, h=5, description=(
              "Watts the selected GPUs would save at their recommended caps instead of the highest cap tested, each"
              " weighted by its busy share (idle power is the same under either cap); one figure per probe, as if the"
              " fleet ran that workload. Rules: deploy/prometheus/rules/recording.yml; docs/metrics.md, Savings.")),
    Panel("Energy saved per year",
          ((f"sum by (probe, preset) (gpuperf:energy_saving_joules_per_year:by_model{{{MODEL}}}) / {KWH}",
            "{{probe}}/{{preset}}"),), "kwatth", kind="stat", w=8, h=5),
    Panel("Money saved per year",
          ((f"sum by (probe, preset) (gpuperf:energy_saving_joules_per_year:by_model{{{MODEL}}}) / {KWH}"
            " * $price_per_kwh * $pue", "{{probe}}/{{preset}}"),), "short", kind="stat", w=8, h=5, description=(
              "Energy saved per year x the price per kWh x the PUE (the site's facility energy per IT energy), in the"
              " currency of the price; set both in the variables at the top.")),
    Panel("Throughput given up", ((f"gpuperf:throughput_loss_ratio:by_model{{{MODEL}}}", ""),), kind="table", w=8, h=9,
          description="The slowdown at the recommended caps, averaged over each model's GPUs weighted by their busy share.",
          options={"overrides": [column("A", "throughput given up", "percentunit")]}),
    Panel("Saving per model", (
        (f"gpuperf:power_saving_watts:by_model{{{MODEL}}}", ""),
        (f"gpuperf:energy_saving_joules_per_year:by_model{{{MODEL}}} / {KWH}", ""),
    ), kind="table", w=8, h=9, options={"overrides": [column("A", "power saved", "watt"),
                                                     column("B", "energy saved / year", "kwatth")]}),
    Panel("Top GPUs by power saved",
          ((f"topk(10, gpuperf:power_saving_watts:recommended {BY_MODEL})", "{{instance}} GPU {{gpu}} {{probe}}/{{preset}}"),),
          "watt", kind="bargauge", w=8, h=9),
))

ROWS = (
    Row("Fleet", (
        Panel("GPUs up", ((f"sum(gpuperf_gpu_up {BY_MODEL})", ""),), kind="stat", w=4, h=4),
        Panel("GPUs lost", ((f"count((gpuperf_gpu_up {BY_MODEL}) == 0) or vector(0)", ""),), kind="stat", w=4, h=4,
              options=RED_FROM_ONE),
        Panel("Exporters down", (('count(up{job=~".*gpuperfd.*"} == 0) or vector(0)', ""),), kind="stat", w=4, h=4,
              options=RED_FROM_ONE),
        Panel("Power draw", ((f"sum(gpuperf_power_draw_watts {BY_MODEL})", ""),), "watt", kind="stat", w=4, h=4),
        Panel("Mean GPU utilization", ((f"avg(gpuperf_gpu_utilization_ratio {BY_MODEL})", ""),), "percentunit",
              kind="stat", w=4, h=4),
        Panel("Energy in range", ((f"sum(increase(gpuperf_energy_joules_total[$__range]) {BY_MODEL}) / 3.6e6", ""),),
              "kwatth", kind="stat", w=4, h=4,
              description="Hardware energy counters of all selected GPUs over the dashboard's time range."),
    )),
    Row("By GPU model", (
        Panel("GPUs up by model", ((f"gpuperf:gpus_up:by_model{{{MODEL}}}", "{{name}} up"),
                                   (f"gpuperf:gpus:by_model{{{MODEL}}}", "{{name}} known")), w=8),
        Panel("Power draw by model", ((f"gpuperf:power_draw_watts:by_model{{{MODEL}}}", "{{name}}"),), "watt", w=8),
        Panel("GPU utilization by model", ((f"avg by (name) (gpuperf_gpu_utilization_ratio {BY_MODEL})", "{{name}}"),),
              "percentunit", w=8),
        Panel("Temperature by model (max)", ((f"max by (name) (gpuperf_temperature_celsius {BY_MODEL})", "{{name}}"),),
              "celsius", w=8),
        Panel("Energy rate by model",
              ((f"sum by (name) (rate(gpuperf_energy_joules_total[$__rate_interval]) {BY_MODEL})", "{{name}}"),), "watt",
              w=8, description="From the hardware energy counters (joules per second = watts)."),
        Panel("Throttled GPUs (thermal / hardware slowdown)", ((
            f'count by (name) ((gpuperf_clock_event_active{{reason=~"hw_.*|sw_thermal.*"}} == 1) {BY_MODEL})',
            "{{name}}"),), w=8),
    )),
    HEALTH,
    Row("Alerts", (
        Panel("Firing alerts", ((f"sum by (alertname, severity, instance, gpu) ({ALERTS})", ""),), kind="table", h=9,
              options={"hide": ("Value",)},
              description="gpuperfd alerts firing now (from the ALERTS series); docs/runbook.md has one section per alert."),
        Panel("Firing alerts over time", ((f"count by (alertname) ({ALERTS})", "{{alertname}}"),), h=9,
              options={"drawStyle": "bars"}),
    )),
    Row("Who is on the GPU", (
        Panel("Energy by namespace / job", (
            ("gpuperf:namespace_energy_joules:increase1h / 3.6e6", "{{namespace}}"),
            ("gpuperf:slurm_job_energy_joules:increase1h / 3.6e6", "Slurm job {{slurm_job}}"),
        ), "kwatth", w=24, description=(
            "Energy of the GPUs each namespace's pods (kubelet PodResources) and each Slurm job held, in the"
            " hour before each point; a GPU held by several pods (MIG devices, time-slicing) or jobs is split"
            " evenly, a GPU held by nobody is left out. All GPUs, whatever the model selection. Rules:"
            " deploy/prometheus/rules/attribution.yml; a whole run is"
            " sum_over_time(gpuperf:pod_energy_joules:increase1m[its life])."
        )),
    )),
    Row("Power-cap recommendation per model", (
        Panel("Recommended cap per model", (
            (f"gpuperf:power_cap_recommended_watts:by_model{{{MODEL}}}", "cap"),
            (f"gpuperf:power_cap_recommendation_agreement_ratio:by_model{{{MODEL}}}", "agreement"),
            (f"gpuperf:power_cap_energy_saving_ratio:by_model{{{MODEL}}}", "saving"),
            (f"gpuperf:power_cap_slowdown_ratio:by_model{{{MODEL}}}", "slowdown"),
        ), kind="table", w=14, h=9, description=(
            "The most common per-GPU recommended cap of each model (ties: the lower cap); agreement: share of"
            " the model's GPUs recommending it; saving and slowdown: medians of the per-GPU values at each"
            " GPU's own recommended cap. Rules: deploy/prometheus/rules/recording.yml."
        ), options={"overrides": [
            column("A", "cap", "watt"),
            column("B", "agreement", "percentunit"),
            column("C", "energy saving", "percentunit"),
            column("D", "slowdown", "percentunit"),
        ]}),
        Panel("Median energy saving at the recommended cap",
              ((f"gpuperf:power_cap_energy_saving_ratio:by_model{{{MODEL}}}", "{{name}} {{probe}}/{{preset}}"),),
              "percentunit", w=10, h=9),
    )),
    SAVINGS,
)


def build() -> g.Dashboard:
    return dashboard(TITLE, UID, DESCRIPTION, ROWS, [
        query_variable("model", "GPU model", "gpuperf_gpu_info", "name"),
        textbox_variable("price_per_kwh", "Price per kWh", PRICE_PER_KWH),
        textbox_variable("pue", "PUE", PUE),
    ])

"""Power-cap efficiency: throughput and energy per unit at each cap a sweep
tested, the recommended cap (lowest energy per unit within the allowed slowdown
of the highest cap; recording rules in deploy/prometheus/rules/recording.yml)
marked among them, the fleet recommendation per GPU model, and what apply mode holds and
really saved beside the estimate.

The dashboard is data: :data:`ROWS` of :class:`~gpuperfd.dashboards.common.Panel` specs."""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import AT_CAP, RUN, Panel, Row, column, dashboard, probe_variables, query_variable

TITLE = "gpuperfd / Power-cap efficiency"
UID = "gpuperfd-power-cap"
DESCRIPTION = (
    "Throughput and energy per unit at each power cap tested, the recommended cap and the fleet recommendation per GPU model."
)

SEL = 'instance=~"$instance", gpu=~"$gpu", probe=~"$probe", preset=~"$preset"'
MODEL_SEL = 'name=~"$model", probe=~"$probe", preset=~"$preset"'
#: Series of one GPU without probe labels (apply mode's caps and state).
GPU_SEL = 'instance=~"$instance", gpu=~"$gpu"'
#: The gpuperf_probe_power_cap_watts series of each GPU's recommended cap (value: the cap; label power_cap).
AT_RECOMMENDED = (
    f"gpuperf_probe_power_cap_watts{{{SEL}}}"
    " == ignoring (power_cap) group_left () gpuperf:power_cap_recommended_watts"
)
#: Columns of the per-cap table: one row per GPU, probe, preset and cap.
ROW_KEY = "instance, gpu, probe, preset, power_cap"


def by_cap(metric: str) -> tuple[tuple[str, str], ...]:
    """Each cap's value of ``metric``, and again marked ★ for the recommended cap (bar gauges)."""
    return (
        (f"{metric}{{{SEL}}}", AT_CAP),
        (f"{metric}{{{SEL}}} and ignoring (unit) ({AT_RECOMMENDED})", "★ recommended: " + AT_CAP),
    )


def cap_column(expr: str) -> tuple[str, str]:
    """One value column of the per-cap table: ``expr`` per row key (GPU, probe, preset, cap)."""
    return f"max by ({ROW_KEY}) ({expr})", ""


ROWS = (
    Row("Recommendation", (
        Panel("Recommended cap", ((f"gpuperf:power_cap_recommended_watts{{{SEL}}}", RUN),), "watt", kind="stat", w=8, h=5,
              description="Lowest energy per unit among caps within the allowed slowdown of the highest cap tested;"
              " ties: the lower cap."),
        Panel("Energy saving vs highest cap", ((f"gpuperf:power_cap_energy_saving_ratio{{{SEL}}}", RUN),), "percentunit",
              kind="stat", w=6, h=5),
        Panel("Slowdown vs highest cap", ((f"gpuperf:power_cap_slowdown_ratio{{{SEL}}}", RUN),), "percentunit",
              kind="stat", w=6, h=5),
        Panel("Allowed slowdown", (("gpuperf:power_cap_max_slowdown_ratio", ""),), "percentunit", kind="stat", w=4, h=5,
              description="The one tunable of the recommendation: first rule of deploy/prometheus/rules/recording.yml."),
    )),
    Row("Each cap tested", (
        Panel("Throughput by cap", by_cap("gpuperf_probe_work_units_per_second"), kind="bargauge", h=12),
        Panel("Energy per unit by cap", by_cap("gpuperf_probe_energy_per_unit_joules"), "joule", kind="bargauge", h=12),
        Panel("Caps tested (★ = recommended)", (
            cap_column(f"gpuperf_probe_work_units_per_second{{{SEL}}}"),
            cap_column(f"gpuperf_probe_energy_per_unit_joules{{{SEL}}}"),
            cap_column(f"gpuperf_probe_average_power_watts{{{SEL}}}"),
            (f"max by ({ROW_KEY}) (gpuperf_probe_work_units_per_second{{{SEL}}})"
             " / ignoring (power_cap) group_left () max by (instance, gpu, probe, preset)"
             f" (gpuperf:probe_work_units_per_second:max_cap{{{SEL}}})", ""),
            cap_column(f"gpuperf:probe_energy_per_unit_joules:eligible{{{SEL}}}"),
            cap_column(AT_RECOMMENDED),
        ), kind="table", w=24, h=10, description=(
            "One row per GPU, probe, preset and cap. 'vs highest cap': throughput relative to the highest cap tested;"
            " 'eligible': energy per unit of the caps within the allowed slowdown; 'recommended': set on the"
            " recommended cap's row."
        ), options={
            "overrides": [
                column("A", "throughput", "short"),
                column("B", "energy / unit", "joule"),
                column("C", "average power", "watt"),
                column("D", "vs highest cap", "percentunit"),
                column("E", "eligible (J / unit)", "joule"),
                column("F", "★ recommended (W)", "watt"),
            ],
            "sortBy": [g.TableSortByField(displayName="power_cap")],
        }),
    )),
    Row("Over time", (
        Panel("Recommended cap over time", (
            (f"gpuperf:power_cap_recommended_watts{{{SEL}}}", RUN),
            (f"gpuperf:probe_power_cap_watts:max_tested{{{SEL}}}", RUN + " highest cap tested"),
        ), "watt"),
        Panel("Throughput at the highest vs the recommended cap", (
            (f"gpuperf:probe_work_units_per_second:max_cap{{{SEL}}}", RUN + " highest cap"),
            (f"gpuperf:probe_work_units_per_second:recommended_cap{{{SEL}}}", RUN + " recommended cap"),
        )),
        Panel("Energy per unit at the highest vs the recommended cap", (
            (f"gpuperf:probe_energy_per_unit_joules:max_cap{{{SEL}}}", RUN + " highest cap"),
            (f"gpuperf:probe_energy_per_unit_joules:recommended_cap{{{SEL}}}", RUN + " recommended cap"),
        ), "joule"),
        Panel("Energy saving and slowdown at the recommended cap", (
            (f"gpuperf:power_cap_energy_saving_ratio{{{SEL}}}", RUN + " saving"),
            (f"gpuperf:power_cap_slowdown_ratio{{{SEL}}}", RUN + " slowdown"),
        ), "percentunit"),
    )),
    Row("Fleet recommendation per model", (
        Panel("GPUs recommending each cap, per model",
              ((f"gpuperf:power_cap_recommended_votes:by_model{{{MODEL_SEL}}}", ""),), kind="table", h=9,
              description="How many GPUs of each model recommend each cap; the fleet recommendation is the most common cap.",
              options={"overrides": [column("A", "GPUs", "short")]}),
        Panel("Fleet recommendation per model",
              ((f"gpuperf:power_cap_recommended_watts:by_model{{{MODEL_SEL}}}", "{{name}} {{probe}}/{{preset}}"),),
              "watt", h=9),
    )),
    Row("Applied caps (apply mode, docs/apply.md)", (
        Panel("Applied, advised and operator's cap", (
            (f"gpuperf_apply_cap_watts{{{GPU_SEL}}}", "applied: {{instance}} GPU {{gpu}}"),
            (f"gpuperf_apply_advised_cap_watts{{{GPU_SEL}}}", "advised: {{instance}} GPU {{gpu}}"),
            (f"gpuperf_apply_operator_cap_watts{{{GPU_SEL}}}", "operator: {{instance}} GPU {{gpu}}"),
        ), "watt", w=12, h=9,
              description="The cap apply mode holds, the one it would set (advise) and the operator's own, journaled before it."),
        Panel("Power saved per model: realized vs estimated", (
            (f"gpuperf:apply_power_saved_watts:by_model{{{MODEL_SEL}}}", "realized: {{name}} {{probe}}/{{preset}}"),
            (f"gpuperf:power_saving_watts:by_model{{{MODEL_SEL}}}", "estimated: {{name}} {{probe}}/{{preset}}"),
        ), "watt", w=12, h=9,
              description="Realized: measured at the applied cap against the operator's cap, busy-share weighted. "
                          "Estimated: if every GPU ran its recommended cap."),
        Panel("Realized energy saving and throughput given up", (
            (f"gpuperf_apply_realized_energy_saving_ratio{{{SEL}}}", "energy saved: {{instance}} GPU {{gpu}}"),
            (f"gpuperf_apply_realized_throughput_loss_ratio{{{SEL}}}", "throughput given up: {{instance}} GPU {{gpu}}"),
        ), "percentunit", w=12, h=9),
        Panel("Apply state and rollbacks (1 h)", (
            (f"max by (instance, gpu, reason) (gpuperf_apply_state{{{GPU_SEL}}})", ""),
            (f"sum by (instance, gpu, reason) (increase(gpuperf_apply_rollbacks_total{{{GPU_SEL}}}[1h]))", ""),
        ), kind="table", w=12, h=9,
              description="Why each GPU holds or does not hold an applied cap, and the caps given back in the last hour by reason."),
    )),
)


def build() -> g.Dashboard:
    return dashboard(TITLE, UID, DESCRIPTION, ROWS, [
        query_variable("model", "GPU model", "gpuperf_gpu_info", "name"),
        query_variable("instance", "Instance", 'gpuperf_gpu_info{name=~"$model"}', "instance"),
        query_variable("gpu", "GPU", 'gpuperf_gpu_info{name=~"$model", instance=~"$instance"}', "gpu"),
        *probe_variables("gpuperf_probe_power_cap_watts"),
    ])

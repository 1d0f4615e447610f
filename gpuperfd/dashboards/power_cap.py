"""Power-cap efficiency: throughput and energy per unit at each cap a sweep
tested, the recommended cap (lowest energy per unit within the allowed slowdown
of the highest cap; recording rules in deploy/prometheus/rules/recording.yml)
marked among them, and the fleet recommendation per GPU model."""

from __future__ import annotations

from grafanalib import core as g

from gpuperfd.dashboards.common import (
    Layout,
    bar_gauge,
    column,
    dashboard,
    query_variable,
    stat,
    table,
    target,
    targets,
    timeseries,
)

TITLE = "gpuperfd / Power-cap efficiency"
UID = "gpuperfd-power-cap"

SEL = 'instance=~"$instance", gpu=~"$gpu", probe=~"$probe", preset=~"$preset"'
RUN = "{{instance}} GPU {{gpu}} {{probe}}/{{preset}}"
#: The gpuperf_probe_power_cap_watts series of each GPU's recommended cap (value: the cap; label power_cap).
AT_RECOMMENDED = (
    f"gpuperf_probe_power_cap_watts{{{SEL}}}"
    " == ignoring (power_cap) group_left () gpuperf:power_cap_recommended_watts"
)
#: Columns of the per-cap table: one row per GPU, probe, preset and cap.
ROW_KEY = "instance, gpu, probe, preset, power_cap"


def build() -> g.Dashboard:
    lay = Layout()
    lay.row("Recommendation")
    lay.add(
        stat(
            "Recommended cap",
            [target(f"gpuperf:power_cap_recommended_watts{{{SEL}}}", RUN)],
            unit="watt",
            description="Lowest energy per unit among caps within the allowed slowdown of the highest cap tested; ties: the lower cap.",
        ),
        w=8,
        h=5,
    )
    lay.add(stat("Energy saving vs highest cap", [target(f"gpuperf:power_cap_energy_saving_ratio{{{SEL}}}", RUN)], unit="percentunit"), w=6, h=5)
    lay.add(stat("Slowdown vs highest cap", [target(f"gpuperf:power_cap_slowdown_ratio{{{SEL}}}", RUN)], unit="percentunit"), w=6, h=5)
    lay.add(
        stat(
            "Allowed slowdown",
            [target("gpuperf:power_cap_max_slowdown_ratio")],
            unit="percentunit",
            description="The one tunable of the recommendation: first rule of deploy/prometheus/rules/recording.yml.",
        ),
        w=4,
        h=5,
    )

    lay.row("Each cap tested")
    lay.add(
        bar_gauge(
            "Throughput by cap",
            targets(
                (f"gpuperf_probe_work_units_per_second{{{SEL}}}", RUN + " @ {{power_cap}} W"),
                (
                    f"gpuperf_probe_work_units_per_second{{{SEL}}} and ignoring (unit) ({AT_RECOMMENDED})",
                    "★ recommended: " + RUN + " @ {{power_cap}} W",
                ),
                instant=True,
            ),
        ),
        w=12,
        h=12,
    )
    lay.add(
        bar_gauge(
            "Energy per unit by cap",
            targets(
                (f"gpuperf_probe_energy_per_unit_joules{{{SEL}}}", RUN + " @ {{power_cap}} W"),
                (
                    f"gpuperf_probe_energy_per_unit_joules{{{SEL}}} and ignoring (unit) ({AT_RECOMMENDED})",
                    "★ recommended: " + RUN + " @ {{power_cap}} W",
                ),
                instant=True,
            ),
            unit="joule",
        ),
        w=12,
        h=12,
    )
    lay.add(
        table(
            "Caps tested (★ = recommended)",
            targets(
                (f"max by ({ROW_KEY}) (gpuperf_probe_work_units_per_second{{{SEL}}})", ""),
                (f"max by ({ROW_KEY}) (gpuperf_probe_energy_per_unit_joules{{{SEL}}})", ""),
                (f"max by ({ROW_KEY}) (gpuperf_probe_average_power_watts{{{SEL}}})", ""),
                (
                    f"max by ({ROW_KEY}) (gpuperf_probe_work_units_per_second{{{SEL}}})"
                    f" / ignoring (power_cap) group_left () max by (instance, gpu, probe, preset) (gpuperf:probe_work_units_per_second:max_cap{{{SEL}}})",
                    "",
                ),
                (f"max by ({ROW_KEY}) (gpuperf:probe_energy_per_unit_joules:eligible{{{SEL}}})", ""),
                (f"max by ({ROW_KEY}) ({AT_RECOMMENDED})", ""),
                instant=True,
                fmt="table",
            ),
            description=(
                "One row per GPU, probe, preset and cap. 'vs highest cap': throughput relative to the highest cap tested;"
                " 'eligible': energy per unit of the caps within the allowed slowdown; 'recommended': set on the"
                " recommended cap's row."
            ),
            overrides=[
                column("A", "throughput", "short"),
                column("B", "energy / unit", "joule"),
                column("C", "average power", "watt"),
                column("D", "vs highest cap", "percentunit"),
                column("E", "eligible (J / unit)", "joule"),
                column("F", "★ recommended (W)", "watt"),
            ],
            sortBy=[g.TableSortByField(displayName="power_cap")],
        ),
        w=24,
        h=10,
    )

    lay.row("Over time")
    lay.add(
        timeseries(
            "Recommended cap over time",
            targets(
                (f"gpuperf:power_cap_recommended_watts{{{SEL}}}", RUN),
                (f"gpuperf:probe_power_cap_watts:max_tested{{{SEL}}}", RUN + " highest cap tested"),
            ),
            unit="watt",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Throughput at the highest vs the recommended cap",
            targets(
                (f"gpuperf:probe_work_units_per_second:max_cap{{{SEL}}}", RUN + " highest cap"),
                (f"gpuperf:probe_work_units_per_second:recommended_cap{{{SEL}}}", RUN + " recommended cap"),
            ),
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Energy per unit at the highest vs the recommended cap",
            targets(
                (f"gpuperf:probe_energy_per_unit_joules:max_cap{{{SEL}}}", RUN + " highest cap"),
                (f"gpuperf:probe_energy_per_unit_joules:recommended_cap{{{SEL}}}", RUN + " recommended cap"),
            ),
            unit="joule",
        ),
        w=12,
    )
    lay.add(
        timeseries(
            "Energy saving and slowdown at the recommended cap",
            targets(
                (f"gpuperf:power_cap_energy_saving_ratio{{{SEL}}}", RUN + " saving"),
                (f"gpuperf:power_cap_slowdown_ratio{{{SEL}}}", RUN + " slowdown"),
            ),
            unit="percentunit",
        ),
        w=12,
    )

    lay.row("Fleet recommendation per model")
    lay.add(
        table(
            "GPUs recommending each cap, per model",
            [
                target(
                    'gpuperf:power_cap_recommended_votes:by_model{name=~"$model", probe=~"$probe", preset=~"$preset"}',
                    instant=True,
                    fmt="table",
                )
            ],
            description="How many GPUs of each model recommend each cap; the fleet recommendation is the most common cap.",
            overrides=[column("A", "GPUs", "short")],
        ),
        w=12,
        h=9,
    )
    lay.add(
        timeseries(
            "Fleet recommendation per model",
            targets(
                (
                    'gpuperf:power_cap_recommended_watts:by_model{name=~"$model", probe=~"$probe", preset=~"$preset"}',
                    "{{name}} {{probe}}/{{preset}}",
                ),
            ),
            unit="watt",
        ),
        w=12,
        h=9,
    )

    return dashboard(
        TITLE,
        UID,
        "Throughput and energy per unit at each power cap tested, the recommended cap and the fleet recommendation per GPU model.",
        lay,
        [
            query_variable("model", "GPU model", "gpuperf_gpu_info", "name"),
            query_variable("instance", "Instance", 'gpuperf_gpu_info{name=~"$model"}', "instance"),
            query_variable("gpu", "GPU", 'gpuperf_gpu_info{name=~"$model", instance=~"$instance"}', "gpu"),
            query_variable("probe", "Probe", "gpuperf_probe_power_cap_watts", "probe"),
            query_variable("preset", "Preset", 'gpuperf_probe_power_cap_watts{probe=~"$probe"}', "preset"),
        ],
    )

"""Dashboards as data (issue 29): every dashboard is rows of Panel specs built by one loop; the new
rows (health verdict, issue 30; power-cap savings, issue 35) are checked by running their queries
through promtool against series of the shape the daemon and the recording rules publish."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("grafanalib", reason="pip install 'gpuperfd[dashboards]'")

from gpuperfd.dashboards import all_panel_queries, substitute_variables  # noqa: E402
from gpuperfd.dashboards import common, fleet, node, power_cap, probes  # noqa: E402
from gpuperfd.dashboards.generate import render  # noqa: E402
from gpuperfd.dashboards.queries import iter_panels, textbox_defaults  # noqa: E402
from gpuperfd.health import verdict  # noqa: E402

MODULES = (fleet, node, power_cap, probes)


def _json(module) -> dict:
    return json.loads(render(module.build()))


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_dashboard_is_its_rows_of_panel_specs(module):
    """The JSON holds exactly the specs' rows and panels, in order, with their queries, units and sizes."""
    dash = _json(module)
    expected = []
    for row in module.ROWS:
        expected.append(("row", row.title, (), None, (24, 1)))
        for spec in row.panels:
            expected.append((spec.kind, spec.title, tuple(spec.queries), spec.unit, (spec.w, spec.h)))
    got = []
    for panel in dash["panels"]:
        queries = tuple((t["expr"], t["legendFormat"]) for t in panel.get("targets") or [])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") if panel["type"] != "row" else None
        got.append((panel["type"], panel["title"], queries, unit, (panel["gridPos"]["w"], panel["gridPos"]["h"])))
    assert [g[:3] + (g[4],) for g in got] == [e[:3] + (e[4],) for e in expected]
    for (kind, title, _q, unit, _size), (_k, _t, _q2, want, _s) in zip(got, expected):
        if want is not None and kind not in ("heatmap", "state-timeline"):
            assert unit == want, title


def test_kinds_decide_how_queries_run():
    dash = _json(fleet)
    by_title = {p["title"]: p for p in iter_panels(dash["panels"])}
    assert all(t["instant"] and t["format"] == "table" for t in by_title["Degraded and unhealthy GPUs"]["targets"])
    assert all(t["instant"] and t["format"] == "time_series" for t in by_title["GPUs per action"]["targets"])
    assert not any(t["instant"] for t in by_title["Power draw by model"]["targets"])
    assert [t["refId"] for t in by_title["Saving per model"]["targets"]] == ["A", "B"]


def test_a_panel_spec_refuses_an_unknown_kind_or_an_empty_query():
    with pytest.raises(ValueError, match="unknown kind 'graph'"):
        common.Panel("x", (("up", ""),), kind="graph")
    with pytest.raises(ValueError, match="at least one query"):
        common.Panel("x", ())
    with pytest.raises(ValueError, match="none empty"):
        common.Panel("x", (("up", ""), ("", "")))
    spec = common.Panel("x", (("up", ""),), options={"drawStyle": "bars"})
    with pytest.raises(TypeError):
        spec.options["drawStyle"] = "line"  # specs are frozen, options included


def test_health_value_mappings_follow_the_verdict_order():
    assert [name for name, _ in common.HEALTH_STATES] == list(verdict.STATES)
    assert [name for name, _ in common.HEALTH_ACTIONS] == list(verdict.ACTIONS)
    (mapping,) = common.value_mappings(common.HEALTH_STATES)
    assert {k: v["text"] for k, v in mapping["options"].items()} == {str(i): s for i, s in enumerate(verdict.STATES)}


def test_savings_row_uses_the_recording_rules_and_the_textboxes():
    dash = _json(fleet)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["price_per_kwh"]["type"] == variables["pue"]["type"] == "textbox"
    assert textbox_defaults(dash) == {"price_per_kwh": "0.15", "pue": "1"}
    for value in textbox_defaults(dash).values():
        float(value)  # a number PromQL can multiply by
    (money,) = [e for d, t, e in all_panel_queries() if t == "Money saved per year"]
    assert money.endswith("/ 3.6e6 * 0.15 * 1") and "gpuperf:energy_saving_joules_per_year:by_model" in money


def test_textbox_values_win_and_unknown_variables_still_fail():
    assert substitute_variables("x * $pue", {"pue": "1.4"}) == "x * 1.4"
    with pytest.raises(ValueError, match=r"unknown dashboard variable \$pue"):
        substitute_variables("x * $pue")


# --- the new rows' queries against series of the daemon's shape (promtool) -----------------------

LABELS = 'instance="n1:9400", job="gpuperfd"'
#: GPU 0 healthy; GPU 1 degraded, asking for check_hardware, two checks firing.
SERIES = [
    *(f'gpuperf_gpu_health_state{{{LABELS}, gpu="0", uuid="GPU-a", state="{s}"}}' + (" 1x5" if s == "healthy" else " 0x5")
      for s in verdict.STATES),
    *(f'gpuperf_gpu_health_state{{{LABELS}, gpu="1", uuid="GPU-b", state="{s}"}}' + (" 1x5" if s == "degraded" else " 0x5")
      for s in verdict.STATES),
    *(f'gpuperf_gpu_health_action{{{LABELS}, gpu="0", uuid="GPU-a", action="{a}"}}' + (" 1x5" if a == "none" else " 0x5")
      for a in verdict.ACTIONS),
    *(f'gpuperf_gpu_health_action{{{LABELS}, gpu="1", uuid="GPU-b", action="{a}"}}'
      + (" 1x5" if a == "check_hardware" else " 0x5") for a in verdict.ACTIONS),
    *(f'gpuperf_gpu_health_reason_info{{{LABELS}, gpu="1", uuid="GPU-b", check="{c}", severity="degraded",'
      ' action="check_hardware"} 1x5' for c in ("probe_drift", "slower_than_peers")),
    *(f'gpuperf:gpu_name:info{{{LABELS}, gpu="{g}", uuid="{u}", name="NVIDIA H100"}} 1x5'
      for g, u in (("0", "GPU-a"), ("1", "GPU-b"))),
    'gpuperf:power_saving_watts:by_model{name="NVIDIA H100", probe="llm", preset="small"} 100x5',
    'gpuperf:energy_saving_joules_per_year:by_model{name="NVIDIA H100", probe="llm", preset="small"} 3155760000x5',
]


def _query(dashboard: str, title: str) -> list[str]:
    return [e for d, t, e in all_panel_queries() if d == dashboard and t == title]


def _promtool_eval(cases: list[tuple[str, list[dict]]], tmp_path: Path) -> None:
    exe = shutil.which("promtool")
    assert exe, "promtool is required (apt-get install prometheus)"
    tests = [{
        "interval": "1m",
        "input_series": [{"series": s.rsplit(" ", 1)[0], "values": s.rsplit(" ", 1)[1]} for s in SERIES],
        "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": want} for expr, want in cases],
    }]
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    out = subprocess.run([exe, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.prometheus
def test_health_and_savings_queries_give_the_verdicts(tmp_path):
    node_title, fleet_title = node.TITLE, fleet.TITLE
    (state,) = _query(node_title, "Health state")
    (action,) = _query(node_title, "Action asked for")
    (reasons,) = _query(node_title, "Reasons (checks firing)")
    (per_state,) = _query(fleet_title, "GPUs per health state")
    (per_action,) = _query(fleet_title, "GPUs per action")
    (checks,) = _query(fleet_title, "Checks firing (top 10)")
    (attention,) = _query(fleet_title, "Degraded and unhealthy GPUs")
    (money,) = _query(fleet_title, "Money saved per year")
    (kwh,) = _query(fleet_title, "Energy saved per year")
    reason = {"instance": "n1:9400", "gpu": "1", "severity": "degraded", "action": "check_hardware"}
    _promtool_eval([
        (state, [{"labels": f'{{instance="n1:9400", gpu="{g}"}}', "value": v}
                 for g, v in (("0", verdict.STATES.index("healthy")), ("1", verdict.STATES.index("degraded")))]),
        (action, [{"labels": f'{{instance="n1:9400", gpu="{g}"}}', "value": v}
                  for g, v in (("0", 0), ("1", verdict.ACTIONS.index("check_hardware")))]),
        (reasons, [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in {**reason, "check": c}.items()) + "}", "value": 1}
                   for c in ("probe_drift", "slower_than_peers")]),
        (per_state, [{"labels": '{state="healthy"}', "value": 1}, {"labels": '{state="degraded"}', "value": 1}]),
        (per_action, [{"labels": '{action="none"}', "value": 1}, {"labels": '{action="check_hardware"}', "value": 1}]),
        (checks, [{"labels": '{check="probe_drift"}', "value": 1}, {"labels": '{check="slower_than_peers"}', "value": 1}]),
        (attention, [{"labels": '{instance="n1:9400", gpu="1", uuid="GPU-b", name="NVIDIA H100", state="degraded",'
                                ' action="check_hardware"}', "value": 1}]),
        (kwh, [{"labels": '{probe="llm", preset="small"}', "value": 876.6}]),  # 100 W for a year = 876.6 kWh
        (money, [{"labels": '{probe="llm", preset="small"}', "value": 131.49}]),  # x 0.15 per kWh x PUE 1
    ], tmp_path)

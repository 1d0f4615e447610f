"""Grafana dashboards: the committed JSON is what the code generates, every panel
queries something, every query parses (promtool) and names only metrics that
exist (docs/metrics.md, the collectors, the recording rules)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("grafanalib", reason="pip install 'gpuperfd[dashboards]'")

from gpuperfd.dashboards import all_panel_queries, substitute_variables  # noqa: E402
from gpuperfd.commands import dashboards as dashboards_cli  # noqa: E402
from gpuperfd.dashboards.generate import dashboards_json, render_all  # noqa: E402
from gpuperfd.dashboards.queries import iter_panels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "dashboards" / "generated"
PROVISIONING = ROOT / "dashboards" / "provisioning"
REGENERATE = "regenerate with: gpuperfd dashboards --out dashboards/generated"


def test_committed_json_is_current():
    fresh = render_all()
    committed = {path.name: path.read_text(encoding="utf-8") for path in GENERATED.glob("*.json")}
    assert sorted(committed) == sorted(fresh), REGENERATE
    for name, text in fresh.items():
        assert committed[name] == text, f"dashboards/generated/{name} is stale; {REGENERATE}"


def test_cli_writes_every_dashboard(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    dashboards_cli.register(parser.add_subparsers())
    args = parser.parse_args(["dashboards", "--out", str(tmp_path / "new")])
    assert args.func(args) == 0
    written = {path.name: path.read_text(encoding="utf-8") for path in (tmp_path / "new").iterdir()}
    assert written == render_all()
    assert capsys.readouterr().out.count(".json") == 4


def test_four_dashboards_with_unique_uids_and_titles():
    dashboards = dashboards_json()
    assert len(dashboards) == 4
    assert len({d["uid"] for d in dashboards}) == 4
    assert len({d["title"] for d in dashboards}) == 4
    for dash in dashboards:
        assert "gpuperfd" in dash["tags"]
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"


def test_node_dashboard_has_instance_and_gpu_variables():
    dash = next(d for d in dashboards_json() if d["uid"] == "gpuperfd-node")
    variables = {v["name"]: v["query"] for v in dash["templating"]["list"]}
    assert variables["instance"].startswith("label_values(") and variables["instance"].endswith(", instance)")
    assert variables["gpu"].startswith("label_values(") and variables["gpu"].endswith(", gpu)")


def test_every_panel_has_a_query_and_a_unique_title():
    for dash in dashboards_json():
        titles = []
        for panel in iter_panels(dash["panels"]):
            if panel["type"] == "row":
                continue
            titles.append(panel["title"])
            exprs = [t.get("expr", "").strip() for t in panel.get("targets", [])]
            assert any(exprs), f"{dash['title']} / {panel['title']}: no query"
            assert all(exprs), f"{dash['title']} / {panel['title']}: a target without a query"
            for tgt in panel["targets"]:
                assert tgt["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert len(titles) == len(set(titles)), f"{dash['title']}: duplicate panel titles"


def test_panels_fit_the_grid_without_overlapping():
    for dash in dashboards_json():
        cells: dict[tuple[int, int], str] = {}
        for panel in dash["panels"]:
            pos = panel["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{dash['title']}: {panel['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]


def test_all_panel_queries_lists_every_target_with_variables_substituted():
    queries = all_panel_queries()
    targets = sum(
        1
        for dash in dashboards_json()
        for panel in iter_panels(dash["panels"])
        for tgt in panel.get("targets") or []
        if tgt.get("expr")
    )
    assert len(queries) == targets > 50
    for dashboard_title, panel_title, expr in queries:
        assert dashboard_title.startswith("gpuperfd / ") and panel_title
        assert "$" not in expr, expr
    assert any('instance=~".+"' in expr for _, _, expr in queries)
    assert any("[1m]" in expr for _, _, expr in queries)


def test_substitute_variables():
    assert substitute_variables('rate(x{gpu=~"$gpu"}[$__rate_interval])') == 'rate(x{gpu=~".+"}[1m])'
    assert substitute_variables('x{instance=~"${instance}"}[$__interval]') == 'x{instance=~".+"}[1m]'
    with pytest.raises(ValueError, match="unknown dashboard variable"):
        substitute_variables('x{node=~"$node"}')


def test_label_variables_are_only_used_with_regex_matchers():
    """`gpu="$gpu"` would break with multi-value selections and with the `.+` substitution."""
    for dash in dashboards_json():
        for panel in iter_panels(dash["panels"]):
            for tgt in panel.get("targets") or []:
                assert not re.search(r'[^=!]=\s*"\$', tgt.get("expr", "")), tgt["expr"]


def _promtool_check_exprs(exprs: list[str], tmp_path: Path) -> None:
    exe = shutil.which("promtool")
    assert exe, "promtool is required (apt-get install prometheus); scripts/test.sh installs it"
    rules = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.prometheus
def test_every_panel_query_parses(tmp_path):
    _promtool_check_exprs([expr for _, _, expr in all_panel_queries()], tmp_path)


@pytest.mark.prometheus
def test_promtool_check_catches_a_bad_query(tmp_path):
    """The check above can fail: a broken query is reported."""
    with pytest.raises(AssertionError, match="dashboard_queries"):
        _promtool_check_exprs(["rate(gpuperf_energy_joules_total)"], tmp_path)


@pytest.mark.prometheus
def test_variable_queries_parse(tmp_path):
    selectors = []
    for dash in dashboards_json():
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
                assert match, var["query"]
                selectors.append(substitute_variables(match.group(1)))
    assert selectors
    _promtool_check_exprs(selectors, tmp_path)


def _known_metrics() -> set[str]:
    from gpuperfd.telemetry.collectors import COLLECTORS

    documented = set(re.findall(r"`(gpuperf_[a-z0-9_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    collected = {spec.name for cls in COLLECTORS.values() for spec in cls.metrics}
    recorded = {
        rule["record"]
        for name in ("recording.yml", "attribution.yml")
        for group in yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules" / name).read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    return documented | collected | recorded


def test_queries_name_only_existing_metrics():
    known = _known_metrics()
    used = set()
    for _, _, expr in all_panel_queries():
        used |= set(re.findall(r"\bgpuperf[_:][a-z0-9_:]+", expr))
    unknown = {name for name in used if name not in known and re.sub(r"_(bucket|sum|count)$", "", name) not in known}
    assert unknown == set()
    assert "gpuperf:power_cap_recommended_watts" in used and "gpuperf_probe_ttft_seconds_bucket" in used


def test_probe_histograms_have_quantiles_and_heatmaps():
    dash = next(d for d in dashboards_json() if d["uid"] == "gpuperfd-probes")
    panels = list(iter_panels(dash["panels"]))
    for metric in ("ttft", "tpot"):
        exprs = [t["expr"] for p in panels for t in p.get("targets", []) if f"gpuperf_probe_{metric}_seconds_bucket" in t["expr"]]
        assert any(e.startswith("histogram_quantile(0.5,") for e in exprs)
        assert any(e.startswith("histogram_quantile(0.99,") for e in exprs)
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert len(heatmaps) == 6
    assert all(p["targets"][0]["format"] == "heatmap" for p in heatmaps)


def test_fleet_dashboard_shows_firing_alerts_and_model_recommendations():
    dash = next(d for d in dashboards_json() if d["uid"] == "gpuperfd-fleet")
    exprs = " ".join(t["expr"] for p in iter_panels(dash["panels"]) for t in p.get("targets", []))
    assert 'ALERTS{alertstate="firing"' in exprs
    assert "gpuperf:power_cap_recommended_watts:by_model" in exprs


def test_fleet_dashboard_shows_energy_by_namespace_and_slurm_job():
    dash = next(d for d in dashboards_json() if d["uid"] == "gpuperfd-fleet")
    (panel,) = [p for p in iter_panels(dash["panels"]) if p["title"] == "Energy by namespace / job"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert exprs == ["gpuperf:namespace_energy_joules:increase1h / 3.6e6", "gpuperf:slurm_job_energy_joules:increase1h / 3.6e6"]
    assert [t["legendFormat"] for t in panel["targets"]] == ["{{namespace}}", "Slurm job {{slurm_job}}"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "kwatth"  # joules / 3.6e6


def test_provisioning_points_at_prometheus_and_a_dashboard_folder():
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "gpuperfd.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuperfd.yml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["folder"] == "gpuperfd"
    assert providers[0]["options"]["path"]


def test_generated_json_is_loadable():
    for path in GENERATED.glob("*.json"):
        dash = json.loads(path.read_text(encoding="utf-8"))
        assert dash["uid"] and dash["panels"]


def _run_dashboards(out: str):
    parser = argparse.ArgumentParser()
    dashboards_cli.register(parser.add_subparsers())
    args = parser.parse_args(["dashboards", "--out", out])
    return args.func(args)


def test_cli_refuses_a_file_as_out_dir_and_writes_nothing(tmp_path, capsys):
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n", encoding="utf-8")
    assert _run_dashboards(str(target)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--out {target}: is a file, not a directory" in err
    assert target.read_text(encoding="utf-8") == "root:x:0:0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


def test_cli_refuses_an_out_dir_it_cannot_create(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    assert _run_dashboards(str(blocker / "sub")) == 2
    err = capsys.readouterr().err
    assert f"its parent {blocker} is not a directory" in err and str(blocker / "sub") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_cli_creates_only_the_last_directory_and_refuses_an_empty_out(tmp_path, capsys, monkeypatch):
    """A mistyped ``--out /nonexistent/dir/x`` once grew that tree at /; ``--out ''`` wrote into the cwd."""
    deep = tmp_path / "nonexistent" / "dir" / "x"
    assert _run_dashboards(str(deep)) == 2
    err = capsys.readouterr().err
    assert f"its parent {deep.parent} does not exist" in err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.chdir(tmp_path)
    assert _run_dashboards("") == 2
    assert "--out: empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

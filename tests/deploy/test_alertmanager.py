"""deploy/alertmanager/: amtool accepts the config and its templates, routes each
severity where the file says, and every inhibition names alerts that exist.

The config runs for real behind the fleet simulation's Prometheus
(tests/fleet/test_fleet.py::test_alertmanager_notifies_the_expected_alerts_only)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
AM_DIR = ROOT / "deploy" / "alertmanager"
CONFIG = AM_DIR / "alertmanager.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "rules" / "alerts.yml"


def amtool(*args: str, cwd: Path = AM_DIR) -> subprocess.CompletedProcess:
    exe = shutil.which("amtool")
    assert exe, "amtool is required (apt-get install prometheus-alertmanager); scripts/test.sh installs it"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def alert_rules() -> dict[str, dict]:
    return {r["alert"]: r for path in sorted(ALERTS.parent.glob("*.yml"))
            for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}


def test_amtool_check_config():
    out = amtool("check-config", str(CONFIG))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "1 templates" in out.stdout, out.stdout


def test_amtool_rejects_a_broken_copy(tmp_path):
    """The check can fail: an inhibition naming a missing receiver, a bad matcher, a broken template."""
    config = yaml.safe_load(CONFIG.read_text())
    config["route"]["routes"][0]["receiver"] = "no-such-receiver"
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(config))
    out = amtool("check-config", str(tmp_path / "bad.yml"), cwd=tmp_path)
    assert out.returncode != 0 and "no-such-receiver" in out.stdout + out.stderr
    broken = dict(yaml.safe_load(CONFIG.read_text()), templates=[str(tmp_path / "t.tmpl")])
    (tmp_path / "t.tmpl").write_text('{{ define "x" }}{{ .Unclosed ')
    (tmp_path / "tmpl.yml").write_text(yaml.safe_dump(broken))
    out = amtool("check-config", str(tmp_path / "tmpl.yml"), cwd=tmp_path)
    assert out.returncode != 0, out.stdout + out.stderr


@pytest.mark.parametrize("severity, receiver", [
    ("critical", "gpuperfd-critical"),
    ("warning", "gpuperfd-warning"),
    ("info", "gpuperfd-warning"),
    ("none", "blackhole"),
    ("", "gpuperfd-warning"),  # an alert without severity still reaches someone
])
def test_routes_by_severity(severity, receiver):
    labels = ["alertname=X", "instance=n1:10187"] + ([f"severity={severity}"] if severity else [])
    out = amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receiver


@pytest.mark.parametrize("action, severity, receivers", [
    ("reset_gpu", "critical", "gpuperfd-node-actions,gpuperfd-critical"),
    ("reboot_node", "critical", "gpuperfd-node-actions,gpuperfd-critical"),
    ("check_hardware", "warning", "gpuperfd-hardware"),
    ("contact_support", "warning", "gpuperfd-hardware"),
    ("update_software", "warning", "gpuperfd-warning"),
    ("restart_app", "info", "gpuperfd-warning"),
])
def test_health_alerts_route_by_action(action, severity, receivers):
    name = "GpuAction" + "".join(part.title() for part in action.split("_"))
    rule = alert_rules()[name]
    assert rule["labels"]["severity"] == severity and f'action="{action}"' in rule["expr"]
    labels = [f"alertname={name}", "instance=n1:10187", "gpu=1", f"action={action}", f"severity={severity}"]
    out = amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receivers
    # an `action` label on some other alert is not a health verdict: severity routing only
    out = amtool("config", "routes", "test", f"--config.file={CONFIG}", "alertname=Other", f"action={action}",
                 "severity=warning")
    assert out.stdout.strip() == "gpuperfd-warning"


def test_every_alert_severity_has_a_route_and_none_is_the_sweep_source_only():
    rules = alert_rules()
    routed = {m.split("=")[1].strip('"') for r in yaml.safe_load(CONFIG.read_text())["route"]["routes"]
              for m in r["matchers"] if m.startswith("severity=")}
    assert {r["labels"]["severity"] for r in rules.values()} <= routed
    assert [n for n, r in rules.items() if r["labels"]["severity"] == "none"] == ["GpuperfdSweepInProgress"]


def test_groups_per_node_and_gpu_model():
    route = yaml.safe_load(CONFIG.read_text())["route"]
    assert route["group_by"] == ["instance", "name"]
    # `name` is the GPU model label that gpuperf:gpu_name:info joins onto the peer alert.
    assert "group_left (name)" in alert_rules()["GpuSlowerThanPeers"]["expr"]


def test_inhibitions_name_existing_alerts_and_labels_they_carry():
    rules = alert_rules()
    inhibit = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]
    sources = set()
    for rule in inhibit:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            name, op, value = re.fullmatch(r'(\w+)(=~|!=|=)"(.*)"', matcher).groups()
            assert name == "alertname"
            hits = [a for a in rules if re.fullmatch(value, a)]
            assert hits, f"{matcher} matches no alert"
        source = re.fullmatch(r'alertname="(\w+)"', rule["source_matchers"][0]).group(1)
        sources.add(source)
        # equal: labels the source alert keeps (an alert's labels are its expression's, plus labels:).
        assert set(rule["equal"]) <= {"instance", "gpu"}
        assert "sum" not in rules[source]["expr"] and " by (" not in rules[source]["expr"]
    assert sources == {"GpuperfdDown", "GpuLost", "GpuperfdSweepInProgress", "GpuEccUncorrectable"}
    sweep = next(r for r in inhibit if "GpuperfdSweepInProgress" in r["source_matchers"][0])
    # The sweep never mutes the drift and peer alerts: they are what a sweep finds.
    for name in ("GpuProbeThroughputDrift", "GpuProbeEnergyDrift", "GpuSlowerThanPeers"):
        assert not re.fullmatch(sweep["target_matchers"][0].split('"')[1], name)


def test_templates_render():
    out = amtool("template", "render", "--template.glob=templates/*.tmpl",
                 '--template.text={{ template "gpuperfd.title" . }}|{{ template "gpuperfd.text" . }}'
                 '|{{ template "gpuperfd.html" . }}')
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gpuperfd on the fleet" in out.stdout and "<ul>" in out.stdout

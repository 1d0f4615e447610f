"""Sticky verdicts, clearing, restart persistence, unknown XIDs, the API and the series."""

from __future__ import annotations

import json
import logging

from simnode import node  # noqa: F401 (the fixture)

from gpuperfd.health import xid_catalog
from gpuperfd.health.verdict import node_verdict_json


def test_xid_43_and_79_differ(node):
    node.backend.inject_xid(0, 43)
    node.backend.inject_xid(1, 79)
    verdicts = node.step()
    assert (verdicts[0].state, verdicts[0].action) == ("healthy", "none")
    assert [r.evidence["bucket"] for r in verdicts[0].reasons] == ["IGNORE"]
    assert (verdicts[1].state, verdicts[1].action) == ("unhealthy", "reboot_node")


def test_unknown_xid_is_unknown_and_logged(node, caplog):
    with caplog.at_level(logging.WARNING):
        node.backend.inject_xid(2, 999)
        v = node.step()[2]
    assert (v.state, v.action) == ("unknown", "contact_support")
    assert "XID 999" in caplog.text


def test_catalog_entry_without_bucket_is_unknown():
    catalog = {7: xid_catalog.XidEntry(7, "test entry", None)}
    assert xid_catalog.resolve(7, catalog=catalog)[:2] == ("unknown", "contact_support")


def test_workflow_48_and_45():
    assert xid_catalog.resolve(48)[:2] == ("unhealthy", "reset_gpu")
    assert xid_catalog.resolve(48, frozenset({48, 63}))[:2] == ("unhealthy", "reset_gpu")
    assert xid_catalog.resolve(45)[:2] == ("info", "restart_app")
    assert xid_catalog.resolve(45, frozenset({45, 48}))[:2] == ("info", "none")
    assert xid_catalog.resolve(74)[:2] == ("unhealthy", "reset_gpu")


def test_reset_gpu_stays_until_reset_and_a_passing_probe_and_survives_restart(node):
    node.gpus[0].inject_ecc(uncorrected=1)
    assert node.step()[0].action == "reset_gpu"
    node.run(0)  # a probe passing before any reset does not clear it
    assert node.step()[0].action == "reset_gpu"
    node.monitor = node.new_monitor()  # a daemon restart keeps it
    assert node.step()[0].action == "reset_gpu"
    node.gpus[0].reset()
    v = node.step()[0]
    assert v.action == "reset_gpu"  # reset seen, no probe since
    node.run(0)
    v = node.step()[0]
    assert (v.state, v.reasons) == ("healthy", [])


def test_new_boot_id_counts_as_reset(node):
    node.backend.inject_xid(1, 79)
    assert node.step()[1].action == "reboot_node"
    node.boot = "boot-2"
    from gpuperfd.telemetry.collectors.xid import XidCounts

    node.sampler.xid_counts = XidCounts()  # a restarted daemon counts XIDs from 0
    node.monitor = node.new_monitor()
    node.step(4000)  # past the quiet window: the sticky reason stays until a probe passes
    assert node.step()[1].action == "reboot_node"
    node.run(1)
    assert node.step()[1].state == "healthy"


def test_restart_app_xid_clears_after_quiet_window(node):
    node.backend.inject_xid(3, 13)
    assert node.step()[3].action == "restart_app"
    assert node.step(3000)[3].action == "restart_app"
    assert node.step(700)[3].reasons == []


def test_performance_reason_clears_after_passing_probes(node):
    for _ in range(3):
        node.run(2)
    node.run(2, rate=700.0)
    assert node.step()[2].state == "degraded"
    for n in range(3):
        node.run(2)
        state = node.step()[2].state
        assert state == ("degraded" if n < 2 else "healthy")


def test_node_verdict_json_and_families(node):
    node.gpus[1].inject_nvlink(down=[0])
    verdicts = node.step()
    body = node_verdict_json(verdicts.values(), "node-a")
    assert (body["state"], body["action"]) == ("degraded", "reset_gpu")
    assert [g["gpu"] for g in body["gpus"]] == [0, 1, 2, 3]
    json.dumps(body)
    text = "".join(f.name + str(f.samples if hasattr(f, "samples") else "") for f in node.monitor.families())
    assert "gpuperf_gpu_health_state" in text


def test_families_are_built_once_per_evaluation(node):
    node.step()
    first = node.monitor.families()
    assert node.monitor.families() is first  # kept: the exporter keeps its text by identity
    node.gpus[1].inject_nvlink(down=[0])
    node.step()
    second = node.monitor.families()
    assert second is not first
    assert any('action="reset_gpu"' in line for family in second for line in family.lines)

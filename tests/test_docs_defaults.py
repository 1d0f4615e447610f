"""The defaults the README and the docs state equal the code's (issue 52: docs/probes.md gave the idle
threshold as 0.1 where the config's is 0.05; docs/simulator.md a kernel cost of 4 us where the code uses
2.5). Each stated figure is read from the text and compared with the value the code holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuperfd.config import DEFAULT_CONFIG_PATH, Config, ProbesConfig, config_from_mapping
from gpuperfd.device.roofline import CARDS
from gpuperfd.probing.child.session import IDLE_WAIT_SECONDS
from gpuperfd.probing.gates.idle import DEFAULT_IDLE_THRESHOLD

ROOT = Path(__file__).resolve().parents[1]


def _text(name: str) -> str:
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())  # line breaks do not split a statement


def _stated(name: str, pattern: str) -> list[float]:
    found = [float(m) for m in re.findall(pattern, _text(name))]
    assert found, f"{name}: the statement /{pattern}/ is gone; update this test with the docs"
    return found


def test_the_configuration_reference_is_the_configs_defaults(tmp_path) -> None:
    """docs/configuration.md's "Reference (defaults shown)" block, read as the daemon reads a config file
    (``apply.mode: off`` is the word, not YAML 1.1's boolean), is Config()."""
    from gpuperfd.config import load_config

    text = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    block = text.split("## Reference (defaults shown)", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "reference.yaml").write_text(block)
    documented = load_config(tmp_path / "reference.yaml").model_dump(mode="json")
    assert documented == Config().model_dump(mode="json")


@pytest.mark.parametrize(("name", "pattern", "value"), [
    ("docs/probes.md", r"SM utilization at or under ([0-9.]+)", ProbesConfig().idle_utilization_threshold),
    ("docs/probes.md", r"ChildProcessExecutor\(timeout_seconds, idle_utilization_threshold=([0-9.]+)",
     DEFAULT_IDLE_THRESHOLD),
    ("docs/simulator.md", r"\+ kernels \* ([0-9.]+) us", CARDS["H100"].kernel_seconds * 1e6),
    ("docs/simulator.md", r"the ([0-9.]+) us per kernel", CARDS["H100"].kernel_seconds * 1e6),
    ("docs/simulator.md", r"\(peak\(dtype\) \* ([0-9.]+)\)", CARDS["H100"].compute_efficiency),
    ("docs/simulator.md", r"\(bandwidth \* ([0-9.]+)\)\)", CARDS["H100"].memory_efficiency),
    ("docs/simulator.md", r"the efficiencies \(([0-9.]+) compute", CARDS["H100"].compute_efficiency),
    ("docs/simulator.md", r"compute, ([0-9.]+) memory\)", CARDS["H100"].memory_efficiency),
    ("docs/probes.md", r"the check retries for up to ([0-9.]+) s", IDLE_WAIT_SECONDS),
    ("docs/probes.md", r"idle_wait_seconds=([0-9.]+)", IDLE_WAIT_SECONDS),
    ("README.md", r"Default listen address: `127\.0\.0\.1:(\d+)`",
     float(Config().web.listen_address.rsplit(":", 1)[1])),
])
def test_a_stated_default_is_the_codes(name: str, pattern: str, value: float) -> None:
    assert all(stated == pytest.approx(value) for stated in _stated(name, pattern)), (name, pattern, value)


def test_the_readme_names_the_default_config_path() -> None:
    assert f"default `{DEFAULT_CONFIG_PATH}`" in _text("README.md")


#: docs/simulator.md's table of what the simulated H100 gives: each row's first words -> its points.
SIMULATOR_ROWS = {
    "llm gpt2 b=1 / 4 / 32 / 128": [("llm", "gpt2", {"batch_size": b}) for b in (1, 4, 32, 128)],
    "llm gpt2-medium / large / xl, b=4": [("llm", m, {"batch_size": 4}) for m in ("gpt2-medium", "gpt2-large",
                                                                                   "gpt2-xl")],
    "llm gpt2 b=128, fp32": [("llm", "gpt2", {"batch_size": 128, "dtype": "float32"})],
    "vit-b16 b=1 / 8 / 32 / 64 / 128": [("vit", "vit-b16", {"batch_size": b}) for b in (1, 8, 32, 64, 128)],
    "attention default, n_groups 1 / 2 / 4": [("attention", "default", {"n_groups": g}) for g in (1, 2, 4)],
    "train gpt2 / medium / large / xl": [("train", m, {}) for m in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")],
}


def _numbers(cell: str, count: int) -> list[float]:
    """A cell's figures, one per point (one figure stated once stands for every point of the row)."""
    found = [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", cell)]
    return found * count if len(found) == 1 else found


@pytest.mark.parametrize("row", list(SIMULATOR_ROWS))
def test_the_simulator_table_is_what_the_simulator_gives(row: str) -> None:
    """Rates, power and peak memory of docs/simulator.md's table (the table once said vit b1 1,022 img/s
    where the simulator gave 2,162)."""
    import threading

    from gpuperfd.config import SimulationConfig
    from gpuperfd.device.simulated import SimulatedBackend
    from gpuperfd.probe_data.request import ProbeRequest
    from gpuperfd.probing.simulated.probe import simulated_executor
    from gpuperfd.probing.simulated.workload import simulated_workload

    line = next(line for line in (ROOT / "docs/simulator.md").read_text(encoding="utf-8").splitlines()
                if line.startswith(f"| {row}"))
    _, _, rates, powers, memory, _ = line.split("|")
    device = SimulatedBackend(SimulationConfig(gpus=1, model="H100", seed=3)).devices()[0]
    count = len(SIMULATOR_ROWS[row])
    for index, (probe, preset, options) in enumerate(SIMULATOR_ROWS[row]):
        result = simulated_executor(0.01, seed=1, noise=0.0).measure(
            device, ProbeRequest(probe=probe, preset=preset, options=options), threading.Event(), 0.0)
        power = device.operating_point(simulated_workload(probe, preset, options).profile).power_watts
        rate = result.units_of_work / result.measured_seconds
        assert _numbers(rates, count)[index] == pytest.approx(rate, rel=0.01), (row, index, "rate")
        assert _numbers(powers, count)[index] == pytest.approx(power, rel=0.01), (row, index, "power")
        assert _numbers(memory, count)[index] == pytest.approx(result.peak_memory_bytes / 2**20, rel=0.01), (row, index)

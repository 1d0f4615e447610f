"""The savings recording rules against the simulator's energy integral (issue 35).

One simulated H100 sweeps a probe over 700..200 W through the simulated executor
(the daemon's path); the same GPU model then runs that workload for an hour with
a 60 % duty cycle on a fake clock, once at the 700 W cap and once at the
recommended cap, and the simulator's energy counter gives the watts truly saved.
A real Prometheus (stock binary, backfilled TSDB in a temporary directory, no
scraping, so no timing luck) evaluates the recording rules over the probe series
and the utilization the GPU reported each second of that hour; the rules' saving
must match the integral within 2 %, and an idle GPU must save nothing.

The rules are evaluated as the instant-query expansion of the rule file (each
recorded name replaced by its expression), at one time inside the backfilled
hour: the same PromQL engine, without waiting for rule evaluations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from gpuperfd.config import ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend
from gpuperfd.fleet.prometheus import LOOPBACK_OPENER, free_ports
from gpuperfd.probing.executors import SIMULATED_PROFILE, simulated_executor
from child_processes import end

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "recording.yml"
CAPS = (700, 600, 500, 400, 300, 200)
DUTY = 0.6  # share of each minute the GPU runs the workload
PERIOD = 60  # seconds
HOUR = 3600
NAME = "NVIDIA H100 80GB HBM3"
LABELS = 'instance="node1:10187",job="gpuperfd"'
BINARIES = ("prometheus", "promtool")


def recording_rules() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"] if "record" in rule}


def expand(expr: str, rules: dict[str, str]) -> str:
    """``expr`` with every recorded name replaced by its (parenthesized, expanded) expression."""
    pattern = re.compile(r"gpuperf:[a-z0-9_]+(?::[a-z0-9_]+)?")
    return pattern.sub(lambda m: f"({expand(rules[m.group(0)], rules)})" if m.group(0) in rules else m.group(0), expr)


def sweep(probe: str) -> dict[int, dict[str, float]]:
    """The probe's published figures per cap, as the daemon's simulated sweep measures them."""
    gpu = SimulatedBackend(SimulationConfig(gpus=1, model="H100", seed=5)).devices()[0]
    execute = simulated_executor(0.05, seed=2, watch_interval=0.01)
    figures = {}
    for cap in CAPS:
        gpu.set_power_limit(float(cap))
        result = execute.measure(gpu, ScheduleConfig(probe=probe, interval_seconds=60), threading.Event(), 0.0)
        assert result.status == "ok"
        figures[cap] = {
            "rate": result.units_of_work / result.measured_seconds,
            "energy": result.energy_per_unit_joules,
            "power": result.average_power_watts,
            "busy": result.gpu_busy_ratio,
        }
    gpu.set_power_limit(700.0)
    return figures


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def duty_hour(probe: str, cap: float, busy: bool = True) -> tuple[float, list[float]]:
    """Mean power (W) over an hour of the workload at ``DUTY`` under ``cap``, and the utilization read each second."""
    clock = FakeClock()
    gpu = SimulatedBackend(SimulationConfig(gpus=1, model="H100", seed=9), clock=clock, sleep=lambda s: None).devices()[0]
    gpu.set_power_limit(cap)
    profile = WORKLOAD_PROFILES[SIMULATED_PROFILE[probe]]
    start = gpu.energy_joules()
    readings = []
    for second in range(HOUR):
        on = busy and second % PERIOD < DUTY * PERIOD
        if on:
            gpu.begin_load(profile)
        else:
            gpu.end_load()
        readings.append(gpu.utilization().gpu_ratio)
        clock.now += 1.0
    gpu.end_load()
    return (gpu.energy_joules() - start) / HOUR, readings


def openmetrics(figures: dict[int, dict[str, float]], probe: str, preset: str, unit: str,
                utilization: dict[str, list[float]], start: int) -> str:
    """The backfill: gpu info, per-second utilization and the probe's gauges (every 15 s) for each GPU."""
    lines = ["# TYPE gpuperf_gpu_info gauge"]
    every15 = range(start, start + HOUR + 1, 15)
    for index, uuid in enumerate(utilization):
        gpu = f'{LABELS},gpu="{index}",uuid="{uuid}"'
        lines += [f'gpuperf_gpu_info{{{gpu},name="{NAME}",driver_version="580.159.04-sim"}} 1 {t}' for t in every15]
    lines.append("# TYPE gpuperf_gpu_utilization_ratio gauge")
    for index, (uuid, readings) in enumerate(utilization.items()):
        gpu = f'{LABELS},gpu="{index}",uuid="{uuid}"'
        lines += [f"gpuperf_gpu_utilization_ratio{{{gpu}}} {value!r} {start + i + 1}" for i, value in enumerate(readings)]
    families = {
        "gpuperf_probe_power_cap_watts": (False, lambda cap, f: float(cap)),
        "gpuperf_probe_work_units_per_second": (True, lambda cap, f: f["rate"]),
        "gpuperf_probe_energy_per_unit_joules": (True, lambda cap, f: f["energy"]),
        "gpuperf_probe_average_power_watts": (False, lambda cap, f: f["power"]),
        "gpuperf_probe_gpu_busy_ratio": (False, lambda cap, f: f["busy"]),
    }
    for family, (with_unit, value) in families.items():
        lines.append(f"# TYPE {family} gauge")
        for index, uuid in enumerate(utilization):
            for cap, figure in figures.items():
                labels = f'{LABELS},gpu="{index}",uuid="{uuid}",probe="{probe}",preset="{preset}",power_cap="{cap}"'
                if with_unit:
                    labels += f',unit="{unit}"'
                lines += [f"{family}{{{labels}}} {value(cap, figure)!r} {t}" for t in every15]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture
def prometheus_with(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start a stock Prometheus over a TSDB backfilled from OpenMetrics text; yields a query function."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    assert not missing, f"{missing} required (apt-get install prometheus); scripts/test.sh installs it"
    processes: list[subprocess.Popen] = []

    def start(text: str):  # type: ignore[no-untyped-def]
        data = tmp_path / "data"
        source = tmp_path / "backfill.om"
        source.write_text(text)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                       check=True, capture_output=True, timeout=120)
        config = tmp_path / "prometheus.yml"
        config.write_text("global: {}\n")
        (port,) = free_ports(1)
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
             "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                with LOOPBACK_OPENER.open(f"{url}/-/ready", timeout=1.0) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus not ready"
            time.sleep(0.1)

        def query(expr: str, at: float) -> dict[str, float]:
            body = urllib.parse.urlencode({"query": expr, "time": str(at)}).encode()
            with LOOPBACK_OPENER.open(f"{url}/api/v1/query", data=body, timeout=30) as response:
                import json

                answer = json.load(response)
            assert answer["status"] == "success", answer
            return {item["metric"].get("uuid", ""): float(item["value"][1]) for item in answer["data"]["result"]}

        return query

    yield start
    for process in processes:
        end(process)


@pytest.mark.parametrize(("probe", "preset", "unit"), [("vit", "vit-b16", "image"), ("llm", "gpt2", "token")])
def test_saving_rule_matches_the_simulators_energy_integral(prometheus_with, probe, preset, unit) -> None:  # type: ignore[no-untyped-def]
    figures = sweep(probe)
    _, busy_readings = duty_hour(probe, 700.0)
    _, idle_readings = duty_hour(probe, 700.0, busy=False)
    start = int(time.time()) // 3600 * 3600 - 4 * 3600
    query = prometheus_with(openmetrics(figures, probe, preset, unit,
                                        {"GPU-busy": busy_readings, "GPU-idle": idle_readings}, start))
    rules = recording_rules()
    at = start + HOUR

    recommended = query(expand("gpuperf:power_cap_recommended_watts", rules), at)
    assert set(recommended) == {"GPU-busy", "GPU-idle"}
    cap = recommended["GPU-busy"]
    profile = WORKLOAD_PROFILES[SIMULATED_PROFILE[probe]]
    truth_gpu = SimulatedBackend(SimulationConfig(gpus=1, model="H100")).devices()[0]
    assert cap == truth_gpu.true_optimal_cap(profile, [float(c) for c in CAPS])
    assert cap < 700  # the recommendation does save something

    # The simulator's integral: an hour at 700 W against an hour at the recommended cap.
    at_700, _ = duty_hour(probe, 700.0)
    at_cap, _ = duty_hour(probe, cap)
    truth = at_700 - at_cap
    assert truth > 10.0

    saving = query(expand("gpuperf:power_saving_watts:recommended", rules), at)
    assert saving["GPU-busy"] == pytest.approx(truth, rel=0.02)
    assert saving["GPU-idle"] == 0.0  # an idle GPU saves nothing

    share = query(expand("gpuperf:gpu_busy_share_ratio:avg_1h", rules), at)
    assert share["GPU-busy"] == pytest.approx(DUTY, rel=0.02)

    per_model = query(expand("gpuperf:energy_saving_joules_per_year:by_model", rules), at)
    assert list(per_model.values()) == [pytest.approx(truth * 365.25 * 86400, rel=0.02)]

    given_up = query(expand("gpuperf:throughput_loss_ratio:by_model", rules), at)
    slowdown = 1 - figures[int(cap)]["rate"] / figures[700]["rate"]
    assert list(given_up.values()) == [pytest.approx(slowdown, abs=1e-9)]
    assert 0 < slowdown <= 0.10

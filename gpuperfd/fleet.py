"""A fleet of simulated gpuperfd daemons scraped by one real Prometheus (issue 5).

:class:`Fleet` starts N ``gpuperfd run`` processes on simulated GPUs (one
"node" each, on free 127.0.0.1 ports, every GPU with its own UUID through
``simulation.node``), some of them degraded on purpose, and one Prometheus
server that scrapes them and loads the repository's recording and alerting
rules. ``scripts/fleet.py`` is the demo front end; ``tests/test_fleet.py`` is the
automated check. docs/fleet-simulation.md describes both.

What makes the alerts work within minutes instead of hours:

* **A healthy past.** GpuProbeThroughputDrift compares with a 7-day median, so
  before Prometheus starts the fleet writes an OpenMetrics file with a week of
  probe results of the *healthy* version of every GPU (what the simulator's
  physics gives for that GPU without its defect, with the executor's noise),
  with exactly the label sets the live scrapes will carry (job, instance,
  gpu, uuid, probe, preset, power_cap, unit), and turns it into TSDB blocks
  with ``promtool tsdb create-blocks-from openmetrics``. The history ends
  :attr:`FleetSpec.history_gap_seconds` before the start, so no backfilled
  value ever shows up in an instant query next to a live one; its points sit
  on the 15-minute boundaries the baseline subquery ``[7d:15m]`` samples, so the
  very first evaluation of the baseline rules finds a week of data.
* **Accelerated rule timing.** With :attr:`FleetSpec.accelerated_rules` (the
  default) Prometheus loads a copy of the rule files in which every group's
  ``interval`` is :attr:`FleetSpec.rule_interval` (2 s; the baselines' is 15 min
  in the repository) and every alert's ``for`` is :attr:`FleetSpec.alert_for`
  (10 s; 1 h for the drift and peer alerts). Nothing else changes: every
  ``expr`` is byte-identical to the repository's, which :func:`accelerate_rules`
  checks. Windows inside expressions (``[7d:15m]``, ``[10m]``, ``[1h]``) keep
  their real length.

The default fleet (4 nodes x 2 H100s) has three degraded GPUs, the last GPU
of the first three nodes (see :data:`DEFECTS`): slower SM clocks, slower
memory, and a GPU that is thermally throttled whenever it is busy. Two
incidents make the telemetry panels that need an event show one: an XID on
the throttled GPU, and a few slow ECC reads on a healthy GPU of the last node.

Processes are stopped by the PIDs this module started (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuperfd.config import DegradeConfig, SimulationConfig
from gpuperfd.device.simulated import (
    GPU_MODELS,
    WORKLOAD_PROFILES,
    OperatingPoint,
    SimulatedBackend,
    SimulatedGpu,
    compute_operating_point,
    simulated_uuid,
)
from gpuperfd.probe_executors import SIMULATED_PROFILE
from gpuperfd.probe_metrics import WORK_UNIT, cap_label
from gpuperfd.probes.spec import DEFAULT_PRESET

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The rule files Prometheus loads (a timing-accelerated copy of them by default).
RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "rules"
RULE_FILES = ("recording.yml", "alerts.yml")

#: Scrape job name; it must match .*gpuperfd.* for the GpuperfdDown alert and the dashboards.
JOB = "gpuperfd"
PROBES: tuple[str, ...] = ("llm", "vit", "attention", "train")
#: 700 W down to 200 W in 50 W steps: the whole H100/H200 range (FleetSpec's default
#: for other models is their range in 10 steps as well).
DEFAULT_CAPS: tuple[int, ...] = tuple(range(700, 199, -50))
#: The recommendation's slowdown budget (gpuperf:power_cap_max_slowdown_ratio, probes.max_slowdown).
MAX_SLOWDOWN = 0.10
DAY_SECONDS = 86400
#: Relative noise of simulated probe throughput (probe_executors.simulated_executor's default).
PROBE_NOISE = 0.004

#: The defects, by name, as simulation.degrade settings.
DEFECTS: dict[str, dict[str, Any]] = {
    "slow_clock": {"sm_clock_factor": 0.8},
    "slow_memory": {"memory_bandwidth_factor": 0.7},
    "thermal_throttle": {"thermal_throttle": True},
}
#: What each defect fires on the accelerated rules (docs/fleet-simulation.md explains why).
EXPECTED_ALERTS: dict[str | None, frozenset[str]] = {
    None: frozenset(),
    "slow_clock": frozenset({"GpuProbeThroughputDrift", "GpuSlowerThanPeers"}),
    "slow_memory": frozenset({"GpuProbeThroughputDrift", "GpuSlowerThanPeers", "GpuProbeEnergyDrift"}),
    "thermal_throttle": frozenset({"GpuThrottling", "GpuProbeThroughputDrift", "GpuSlowerThanPeers"}),
}
#: Incidents (FleetGpu.incidents): "xid" (INCIDENT_XID, fires GpuXidError) on the throttled
#: GPU, "slow_reads" (no alert) on the first GPU of the last node when it is healthy.
INCIDENT_ALERTS = {"xid": "GpuXidError"}

#: The XID the throttled GPU reports (13: graphics engine exception), and when.
INCIDENT_XID = 13
#: The slow reads: for a few seconds every ECC read of one healthy GPU (a fast-lane
#: call, read every second) takes longer than that node's device.call_timeout_seconds,
#: so it counts as gpuperf_device_errors_total{reason="slow"} while the read still
#: succeeds (no collector failure, no alert).
INCIDENT_SLOW_CALL = "ecc_errors"
INCIDENT_SLOW_DELAY_SECONDS = 0.8
INCIDENT_CALL_TIMEOUT_SECONDS = 0.5


@dataclass(frozen=True)
class FleetSpec:
    """What to start. The defaults are what tests/test_fleet.py checks."""

    nodes: int = 4
    gpus_per_node: int = 2
    model: str = "H100"
    seed: int = 1
    probes: tuple[str, ...] = PROBES
    #: Caps every sweep runs, watts; () means the model's range in 10 steps (H100: 700, 650, ..., 200).
    caps: tuple[int, ...] = ()
    #: Every probe of every GPU runs a sweep over ``caps`` this often. A GPU runs
    #: one sweep at a time, so with 4 probes x 11 caps x (settle + measure) =
    #: 22 s > 20 s the GPUs are always busy probing and the scheduler reports
    #: missed runs (the "runs missed" panel has data).
    probe_interval_seconds: float = 20.0
    measure_seconds: float = 0.4
    settle_seconds: float = 0.1
    first_run_delay_seconds: float = 1.0
    scrape_interval_seconds: float = 1.0
    #: Put the degraded GPUs in (see DEFECTS and degraded_layout()).
    degrade: bool = True
    #: Make the XID and slow-read incidents happen (see the module docstring).
    incidents: bool = True
    #: Seconds after a daemon starts when the throttled GPU reports its XID (after
    #: Prometheus has scraped the counter at 0, so increase() sees the step).
    xid_after_seconds: float = 20.0
    #: Load the timing-accelerated copy of the rules (False: the repository's files as they are).
    accelerated_rules: bool = True
    rule_interval: str = "2s"
    alert_for: str = "10s"
    #: The backfilled healthy history: how far back, at which step, ending how long before now.
    history_days: float = 7.0
    history_step_seconds: int = 900
    history_gap_seconds: int = 1800

    def __post_init__(self) -> None:
        if self.model not in GPU_MODELS:
            raise ValueError(f"model {self.model!r}: one of {', '.join(GPU_MODELS)}")
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be >= 1")
        if unknown := sorted(set(self.probes) - set(PROBES)):
            raise ValueError(f"unknown probe(s) {unknown}; known: {', '.join(PROBES)}")
        if not self.caps:
            model = GPU_MODELS[self.model]
            low, high = model.min_power_watts, model.max_power_watts
            object.__setattr__(self, "caps", tuple(round(high - (high - low) * i / 10) for i in range(11)))
        if self.history_step_seconds <= 0 or self.history_step_seconds > 900 or 900 % self.history_step_seconds:
            raise ValueError("history_step_seconds must divide 900 (the baselines' subquery step)")
        if self.degrade:
            total, degraded = self.nodes * self.gpus_per_node, len(DEFECTS)
            if self.nodes < degraded:
                raise ValueError(f"a degraded fleet needs at least {degraded} nodes")
            if total - degraded <= degraded:
                # Peer medians must be a healthy GPU's result, and GpuSlowerThanPeers needs >= 4 GPUs.
                raise ValueError(
                    f"{total} GPUs with {degraded} degraded: need more healthy than degraded GPUs "
                    f"(at least {2 * degraded + 1} GPUs, e.g. --nodes 4 --gpus 2)"
                )


def degraded_layout(spec: FleetSpec) -> dict[tuple[int, int], str]:
    """(node index, GPU index) -> defect: the last GPU of the first nodes, one defect each."""
    if not spec.degrade:
        return {}
    return {(node, spec.gpus_per_node - 1): defect for node, defect in enumerate(DEFECTS)}


@dataclass(frozen=True)
class FleetGpu:
    """One simulated GPU of the fleet and its ground truth."""

    node: str
    instance: str
    index: int
    uuid: str
    model: str
    defect: str | None = None
    #: Events this GPU has on purpose (see INCIDENT_ALERTS): "xid", "slow_reads".
    incidents: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.defect is None

    @property
    def degrade(self) -> DegradeConfig | None:
        return None if self.defect is None else DegradeConfig(gpu=self.index, **DEFECTS[self.defect])

    @property
    def expected_alerts(self) -> frozenset[str]:
        return EXPECTED_ALERTS[self.defect] | {INCIDENT_ALERTS[i] for i in self.incidents if i in INCIDENT_ALERTS}

    def device(self) -> SimulatedGpu:
        """A simulated GPU with this one's physics (for ground truth; no daemon involved)."""
        config = SimulationConfig(
            gpus=self.index + 1, model=self.model, node=self.node, degrade=[self.degrade] if self.degrade else []
        )
        return SimulatedBackend(config).devices()[self.index]

    def operating_point(self, probe: str, cap: float, *, healthy: bool = False) -> OperatingPoint:
        """Noise-free result of ``probe`` at ``cap`` (``healthy``: as if it had no defect)."""
        degrade = self.degrade if not healthy and self.degrade is not None else None
        return compute_operating_point(
            GPU_MODELS[self.model],
            WORKLOAD_PROFILES[SIMULATED_PROFILE[probe]],
            cap,
            sm_clock_factor=degrade.sm_clock_factor if degrade else 1.0,
            memory_bandwidth_factor=degrade.memory_bandwidth_factor if degrade else 1.0,
            thermal_throttle=bool(degrade and degrade.thermal_throttle),
        )

    def throughput_ratio(self, probe: str, cap: float) -> float:
        """Throughput now / throughput of its healthy self (what the drift and peer alerts compare)."""
        return (
            self.operating_point(probe, cap).units_per_second
            / self.operating_point(probe, cap, healthy=True).units_per_second
        )

    def energy_ratio(self, probe: str, cap: float) -> float:
        """Energy per unit now / that of its healthy self (GpuProbeEnergyDrift)."""
        return (
            self.operating_point(probe, cap).energy_per_unit_joules
            / self.operating_point(probe, cap, healthy=True).energy_per_unit_joules
        )

    def true_optimal_cap(self, probe: str, caps: tuple[int, ...], max_slowdown: float = MAX_SLOWDOWN) -> float:
        """The cap a correct sweep recommends for ``probe`` on this GPU (SimulatedGpu.true_optimal_cap)."""
        profile = WORKLOAD_PROFILES[SIMULATED_PROFILE[probe]]
        return self.device().true_optimal_cap(profile, list(caps), max_slowdown)


@dataclass
class FleetNode:
    """One simulated node: a gpuperfd process with its own config, state and log."""

    name: str
    index: int
    port: int
    seed: int
    directory: Path
    gpus: list[FleetGpu]
    process: subprocess.Popen | None = None

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.instance}"

    @property
    def log_path(self) -> Path:
        return self.directory / "daemon.log"

    @property
    def config_path(self) -> Path:
        return self.directory / "gpuperfd.yaml"


# -- pure helpers (unit-tested without processes) ---------------------------------


def accelerate_rules(text: str, interval: str = "2s", alert_for: str = "10s", source: str = "") -> str:
    """``text`` (a rule file) with every group ``interval`` and alert ``for`` replaced.

    A textual edit, so comments and expressions stay byte-identical; the result
    is checked to differ from the original in those two keys only.
    """
    out = re.sub(r"(?m)^(\s+)interval:\s*\S+[ \t]*$", rf"\g<1>interval: {interval}", text)
    out = re.sub(r"(?m)^(\s+)for:\s*\S+[ \t]*$", rf"\g<1>for: {alert_for}", out)

    def strip(doc: dict) -> list:
        return [
            ({k: v for k, v in group.items() if k not in ("interval", "rules")},
             [{k: v for k, v in rule.items() if k != "for"} for rule in group["rules"]])
            for group in doc["groups"]
        ]

    original, edited = yaml.safe_load(text), yaml.safe_load(out)
    if strip(original) != strip(edited):
        raise ValueError(f"accelerating {source or 'the rules'} changed more than intervals and for: durations")
    for group in edited["groups"]:
        if group.get("interval") != interval or any(r.get("for", alert_for) != alert_for for r in group["rules"]):
            raise ValueError(f"accelerating {source or 'the rules'}: a group interval or for: was not rewritten")
    header = (
        f"# GENERATED by gpuperfd.fleet from {source or 'a rule file'}: every group interval -> {interval},\n"
        f"# every alert's for: -> {alert_for}. Expressions are the repository's, unchanged.\n"
    )
    return header + out


def _label_text(labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{key}="{escape(value)}"' for key, value in labels.items())


def probe_labels(gpu: FleetGpu, probe: str, cap: int) -> dict[str, str]:
    """The label set of a live gpuperf_probe_work_units_per_second / _energy_per_unit_joules series."""
    return {
        "job": JOB,
        "instance": gpu.instance,
        "gpu": str(gpu.index),
        "uuid": gpu.uuid,
        "probe": probe,
        "preset": DEFAULT_PRESET[probe],
        "power_cap": cap_label(cap),
        "unit": WORK_UNIT[probe],
    }


def history_timestamps(spec: FleetSpec, now: float) -> list[int]:
    """Unix seconds of the backfilled results: aligned to the step, ending history_gap_seconds before now."""
    step = spec.history_step_seconds
    end = int((now - spec.history_gap_seconds) // step * step)
    count = int(spec.history_days * 86400 // step)
    return [end - step * i for i in range(count - 1, -1, -1)]


def healthy_history(
    gpus: list[FleetGpu], spec: FleetSpec, now: float, start: float = -math.inf, end: float = math.inf
) -> Iterator[str]:
    """OpenMetrics lines: a week of results of each GPU's healthy self, every probe and cap.

    Throughput is the healthy operating point times the executor's noise; energy
    per unit is that point's (exact) power over the noisy throughput, as the
    simulated executor measures it. Samples are grouped by family, each series'
    samples in time order; timestamps in seconds; the text ends with ``# EOF``.
    Only samples in [start, end) are written (one chunk of the history); the
    noise is seeded per series and UTC day, so chunks split on day boundaries
    (as Fleet._backfill writes them) add up to the same whole.
    """
    times = [t for t in history_timestamps(spec, now) if start <= t < end]
    rates: dict[tuple[int, str, int], list[float]] = {}

    def noisy_rates(gpu: FleetGpu, probe: str, cap: int, rate: float) -> list[float]:
        out, day, rng = [], None, random.Random()
        for t in times:
            if t // DAY_SECONDS != day:
                day = t // DAY_SECONDS
                rng = random.Random(f"{spec.seed}:{gpu.uuid}:{probe}:{cap}:{day}")
            out.append(max(rate * (1 + rng.gauss(0.0, PROBE_NOISE)), 1e-9))
        return out

    families = (
        ("gpuperf_probe_work_units_per_second",
         "Probe throughput in its work unit per second (backfilled healthy history)."),
        ("gpuperf_probe_energy_per_unit_joules",
         "Hardware-counter energy per unit of work, joules (backfilled healthy history)."),
    )
    for family, help_text in families:
        yield f"# HELP {family} {help_text}"
        yield f"# TYPE {family} gauge"
        for number, gpu in enumerate(gpus):
            for probe in spec.probes:
                for cap in spec.caps:
                    point = gpu.operating_point(probe, cap, healthy=True)
                    key = (number, probe, cap)
                    if key not in rates:
                        rates[key] = noisy_rates(gpu, probe, cap, point.units_per_second)
                    labels = _label_text(probe_labels(gpu, probe, cap))
                    for t, rate in zip(times, rates[key]):
                        value = rate if family.endswith("second") else point.power_watts / rate
                        yield f"{family}{{{labels}}} {value!r} {t}"
    yield "# EOF"


def prometheus_config(targets: list[str], rule_files: list[Path], spec: FleetSpec) -> dict[str, Any]:
    interval = f"{spec.scrape_interval_seconds:g}s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": spec.rule_interval if spec.accelerated_rules else "1m",
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": JOB, "metrics_path": "/metrics", "static_configs": [{"targets": targets}]}
        ],
    }


def daemon_config(node: FleetNode, spec: FleetSpec) -> dict[str, Any]:
    """The gpuperfd config of one node: simulated GPUs, short probe schedules, its defects and incidents."""
    degrade = [gpu.degrade.model_dump() for gpu in node.gpus if gpu.degrade is not None]
    simulation: dict[str, Any] = {
        "gpus": len(node.gpus),
        "model": spec.model,
        "seed": node.seed,
        "node": node.name,
        "degrade": degrade,
    }
    device: dict[str, Any] = {"backend": "simulated"}
    xids = [
        {"gpu": gpu.index, "xid": INCIDENT_XID, "after_seconds": spec.xid_after_seconds}
        for gpu in node.gpus if "xid" in gpu.incidents
    ]
    faults = [
        {
            "gpu": gpu.index,
            "call": INCIDENT_SLOW_CALL,
            "kind": "slow",
            "delay_seconds": INCIDENT_SLOW_DELAY_SECONDS,
            "after_seconds": 5.0,
            "duration_seconds": 3.0,  # the fast lane reads every second: a few slow reads
        }
        for gpu in node.gpus if "slow_reads" in gpu.incidents
    ]
    if xids:
        simulation["xid_events"] = xids
    if faults:
        simulation["faults"] = faults
        device["call_timeout_seconds"] = INCIDENT_CALL_TIMEOUT_SECONDS
    schedules = [
        {
            "probe": probe,
            "interval_seconds": spec.probe_interval_seconds,
            "caps": list(spec.caps),
            "settle_seconds": spec.settle_seconds,
        }
        for probe in spec.probes
    ]
    return {
        "log_level": "info",
        "web": {"listen_address": node.instance},
        "device": device,
        "simulation": simulation,
        "probes": {
            "state_dir": str(node.directory / "state"),
            "history": {"path": str(node.directory / "history.jsonl")},
            "executor": "simulated",
            "read_only": False,  # the fleet sweeps caps on simulated GPUs
            "idle_seconds": 0,
            "jitter_seconds": 0,
            "first_run_delay_seconds": spec.first_run_delay_seconds,
            "simulated_measure_seconds": spec.measure_seconds,
            "max_slowdown": MAX_SLOWDOWN,
            "schedules": schedules,
        },
    }


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


#: Loopback HTTP without any proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get_json(url: str, params: dict[str, str] | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """GET ``url`` and parse JSON; an HTTP error with a JSON body (Prometheus' 4xx) is returned too."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return json.loads(body)
        except ValueError:
            raise error from None


# -- the fleet ----------------------------------------------------------------------


class Fleet:
    """N simulated gpuperfd daemons and one Prometheus; a context manager.

    ``workdir`` holds every config, log, state directory and the TSDB (a new
    temporary directory when None, removed by :meth:`stop` unless ``keep``).
    """

    def __init__(
        self,
        spec: FleetSpec | None = None,
        workdir: Path | str | None = None,
        *,
        rules_dir: Path = RULES_DIR,
        prometheus: str = "prometheus",
        promtool: str = "promtool",
        python: str = sys.executable,
        keep: bool = False,
    ) -> None:
        self.spec = spec or FleetSpec()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="gpuperfd-fleet-"))
        self.keep = keep or not self._own_workdir
        self.rules_dir = Path(rules_dir)
        self.prometheus_bin = prometheus
        self.promtool_bin = promtool
        self.python = python
        self.nodes: list[FleetNode] = []
        self.prometheus_port = 0
        self.prometheus_process: subprocess.Popen | None = None
        self.started_at: float | None = None
        #: Seconds each start-up phase took (backfill, promtool, daemons, prometheus).
        self.timings: dict[str, float] = {}
        self._logs: list[Any] = []

    # -- layout ---------------------------------------------------------------

    @property
    def gpus(self) -> list[FleetGpu]:
        return [gpu for node in self.nodes for gpu in node.gpus]

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "prometheus" / "data"

    def plan(self) -> None:
        """Choose ports, UUIDs and defects (idempotent; start() calls it)."""
        if self.nodes:
            return
        spec = self.spec
        ports = free_ports(spec.nodes + 1)
        self.prometheus_port = ports[-1]
        layout = degraded_layout(spec)
        for index in range(spec.nodes):
            name = f"node-{index}"
            instance = f"127.0.0.1:{ports[index]}"
            gpus = []
            for gpu in range(spec.gpus_per_node):
                defect = layout.get((index, gpu))
                incidents: tuple[str, ...] = ()
                if spec.incidents and defect == "thermal_throttle":
                    incidents = ("xid",)
                elif spec.incidents and defect is None and index == spec.nodes - 1 and gpu == 0:
                    incidents = ("slow_reads",)
                gpus.append(FleetGpu(name, instance, gpu, simulated_uuid(spec.model, gpu, name), spec.model,
                                     defect, incidents))
            self.nodes.append(
                FleetNode(name, index, ports[index], spec.seed * 1000 + index, self.workdir / name, gpus)
            )

    # -- start ------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> "Fleet":
        """Backfill, then start the daemons and Prometheus; on any failure stop what started."""
        for tool in (self.prometheus_bin, self.promtool_bin):
            if shutil.which(tool) is None:
                raise FileNotFoundError(f"{tool} not found (apt-get install prometheus)")
        self.plan()
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            rule_files = self._write_rules()
            self._backfill()
            started = time.monotonic()
            for node in self.nodes:
                self._start_daemon(node)
            for node in self.nodes:
                self._wait_daemon(node, started + timeout)
            self.timings["daemons"] = time.monotonic() - started
            self._start_prometheus(rule_files, timeout)
            self.started_at = time.time()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_rules(self) -> list[Path]:
        if not self.spec.accelerated_rules:
            return [self.rules_dir / name for name in RULE_FILES]
        target = self.workdir / "prometheus" / "rules"
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in RULE_FILES:
            source = self.rules_dir / name
            text = accelerate_rules(source.read_text(encoding="utf-8"), self.spec.rule_interval, self.spec.alert_for,
                                    source=str(source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source))
            (target / name).write_text(text, encoding="utf-8")
            paths.append(target / name)
        return paths

    def _backfill(self) -> None:
        """Write the healthy week as OpenMetrics and turn it into TSDB blocks in the data dir.

        One file per UTC day: promtool parses its whole input once per 2-hour
        block it writes, so a week in one file costs 84 passes over a week of
        samples, and a day per file 12 passes over a day (7x less work). Day
        boundaries are block boundaries, so the blocks never overlap.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        directory = self.workdir / "prometheus" / "backfill"
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        times = history_timestamps(self.spec, now)
        started = time.monotonic()
        samples = 0
        paths = []
        for day in sorted({t // DAY_SECONDS for t in times}):
            path = directory / f"healthy-{day}.om.txt"
            with path.open("w", encoding="utf-8") as out:
                for line in healthy_history(self.gpus, self.spec, now, day * DAY_SECONDS, (day + 1) * DAY_SECONDS):
                    out.write(line)
                    out.write("\n")
                    samples += not line.startswith("#")
            paths.append(path)
        self.timings["backfill_write"] = time.monotonic() - started
        log.info("backfill: %d samples of healthy history in %d file(s)", samples, len(paths))
        started = time.monotonic()
        running: list[tuple[Path, subprocess.Popen]] = []
        failures = []
        pending = list(paths)
        while pending or running:
            while pending and len(running) < max(1, os.cpu_count() or 1):
                path = pending.pop(0)
                cmd = [self.promtool_bin, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(self.data_dir)]
                running.append((path, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
            path, process = running.pop(0)
            output = process.communicate(timeout=600)[0].decode(errors="replace")
            if process.returncode != 0:
                failures.append(f"{path.name}: exit {process.returncode}: {output}")
        self.timings["promtool"] = time.monotonic() - started
        if failures:
            raise RuntimeError("promtool tsdb create-blocks-from openmetrics failed:\n" + "\n".join(failures))
        shutil.rmtree(directory)

    def _popen(self, cmd: list[str], log_path: Path, cwd: Path) -> subprocess.Popen:
        handle = log_path.open("wb")
        self._logs.append(handle)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def _start_daemon(self, node: FleetNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        node.config_path.write_text(yaml.safe_dump(daemon_config(node, self.spec), sort_keys=False), encoding="utf-8")
        node.process = self._popen(
            [self.python, "-m", "gpuperfd", "run", "--config", str(node.config_path)], node.log_path, node.directory
        )

    def _wait_daemon(self, node: FleetNode, deadline: float) -> None:
        assert node.process is not None
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited with {node.process.returncode}:\n{self.tail(node.log_path)}")
            try:
                if http_get_json(node.url + "/healthz", timeout=1.0).get("status") == "ok":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{node.name} not ready:\n{self.tail(node.log_path)}")

    def _start_prometheus(self, rule_files: list[Path], timeout: float) -> None:
        directory = self.workdir / "prometheus"
        config_path = directory / "prometheus.yml"
        config = prometheus_config([node.instance for node in self.nodes], rule_files, self.spec)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        started = time.monotonic()
        self.prometheus_process = self._popen(
            [
                self.prometheus_bin,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.data_dir}",
                # The backfilled blocks reach 7 days back; the default 15 d would keep them
                # too, but a longer retention keeps them whatever the history length.
                "--storage.tsdb.retention.time=30d",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            ],
            directory / "prometheus.log",
            directory,
        )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.prometheus_process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self.prometheus_process.returncode}:\n{self.tail(directory / 'prometheus.log')}"
                )
            try:
                with _OPENER.open(self.prometheus_url + "/-/ready", timeout=1.0) as response:
                    if response.status == 200:
                        self.timings["prometheus"] = time.monotonic() - started
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready:\n{self.tail(directory / 'prometheus.log')}")

    @staticmethod
    def tail(path: Path, lines: int = 40) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"({path}: {error})"

    # -- stop -------------------------------------------------------------------

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every process this fleet started (by PID), SIGKILL what does not exit; idempotent."""
        processes = [node.process for node in self.nodes if node.process is not None]
        if self.prometheus_process is not None:
            processes.append(self.prometheus_process)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for handle in self._logs:
            handle.close()
        self._logs.clear()
        if not self.keep and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> dict[str, bool]:
        """Which processes are still alive, by name."""
        alive = {node.name: node.process is not None and node.process.poll() is None for node in self.nodes}
        alive["prometheus"] = self.prometheus_process is not None and self.prometheus_process.poll() is None
        return alive

    # -- Prometheus API -----------------------------------------------------------

    def api(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return http_get_json(self.prometheus_url + path, params)

    def query_response(self, expr: str) -> dict[str, Any]:
        """The full /api/v1/query answer (status, data or error)."""
        return self.api("/api/v1/query", {"query": expr})

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant-vector result of ``expr`` (a scalar comes back as one sample without labels)."""
        answer = self.query_response(expr)
        if answer.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {answer.get('errorType')}: {answer.get('error')}")
        data = answer["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def alerts(self, state: str | None = "firing") -> list[dict[str, Any]]:
        """Alerts from /api/v1/alerts (only those in ``state``, or all when None)."""
        found = self.api("/api/v1/alerts")["data"]["alerts"]
        return [alert for alert in found if state is None or alert["state"] == state]

    def gpu_of(self, labels: dict[str, str]) -> FleetGpu | None:
        for gpu in self.gpus:
            if gpu.instance == labels.get("instance") and str(gpu.index) == labels.get("gpu"):
                return gpu
        return None

    # -- reporting --------------------------------------------------------------------

    def describe(self) -> str:
        """A human summary: URLs, each GPU's defect, expected alerts and true optimal caps."""
        spec = self.spec
        lines = [
            f"Prometheus: {self.prometheus_url}  (alerts: {self.prometheus_url}/alerts, "
            f"rules: {self.prometheus_url}/rules)",
            f"rule timing: {'accelerated (group interval ' + spec.rule_interval + ', for: ' + spec.alert_for + ')' if spec.accelerated_rules else 'as in the repository'}",
            f"work dir: {self.workdir}",
            "",
            f"{'node':<8} {'instance':<17} gpu {'defect':<17} true optimal cap per probe (W)   expected alerts",
        ]
        for node in self.nodes:
            for gpu in node.gpus:
                caps = " ".join(f"{p}={gpu.true_optimal_cap(p, spec.caps):.0f}" for p in spec.probes)
                alerts = ", ".join(sorted(gpu.expected_alerts)) or "-"
                lines.append(f"{node.name:<8} {node.instance:<17} {gpu.index:>3} {gpu.defect or 'healthy':<17} {caps:<32} {alerts}")
        lines.append("")
        for gpu in self.gpus:
            if "xid" in gpu.incidents:
                lines.append(f"incident: XID {INCIDENT_XID} on {gpu.node} GPU {gpu.index} {self.spec.xid_after_seconds:g} s after the start")
            if "slow_reads" in gpu.incidents:
                lines.append(f"incident: slow {INCIDENT_SLOW_CALL} reads on {gpu.node} GPU {gpu.index} at 5-8 s "
                             "(gpuperf_device_errors_total{reason=\"slow\"}, no alert)")
        lines.append("")
        lines.extend(f"{node.name}: {node.url}/metrics  (log: {node.log_path})" for node in self.nodes)
        return "\n".join(lines)


def finite(sample: dict[str, Any]) -> bool:
    """True if an API sample's value is a finite number."""
    try:
        return math.isfinite(float(sample["value"][1]))
    except (KeyError, IndexError, TypeError, ValueError):
        return False

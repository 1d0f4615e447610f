"""What a simulated fleet is: nodes, GPUs, defects, incidents, and each daemon's config."""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuperfd.config import DegradeConfig, SimulationConfig
from gpuperfd.device.simulated import (
    GPU_MODELS,
    WORKLOAD_PROFILES,
    OperatingPoint,
    SimulatedBackend,
    SimulatedGpu,
    compute_operating_point,
    simulated_mig_uuid,
    simulated_uuid,
)
from gpuperfd.probe_data.kinds import node_kind_names, probe_kind
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PROBES
from gpuperfd.probing.metrics import cap_label
from gpuperfd.probing.simulated.probe import SIMULATED_PROFILE

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The rule files Prometheus loads (a timing-accelerated copy of them by default).
RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "rules"
RULE_FILES = ("recording.yml", "alerts.yml", "attribution.yml")
#: The global tier's rules (a two-tier fleet, FleetSpec.shards).
GLOBAL_RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "global"
GLOBAL_RULE_FILES = ("recording.yml",)

#: Scrape job name; it must match .*gpuperfd.* for the GpuperfdDown alert and the dashboards.
JOB = "gpuperfd"
#: 700 W down to 200 W in 50 W steps: the whole H100/H200 range (FleetSpec's default
#: for other models is their range in 10 steps as well).
DEFAULT_CAPS: tuple[int, ...] = tuple(range(700, 199, -50))
#: The recommendation's slowdown budget (gpuperf:power_cap_max_slowdown_ratio, probes.max_slowdown).
MAX_SLOWDOWN = 0.10
DAY_SECONDS = 86400
#: Relative noise of simulated probe throughput (probing.simulated.probe.simulated_executor's default).
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

#: The node whose GPU 0 runs apply mode (canary): a healthy GPU, no MIG, no incident.
APPLY_NODE = 1
#: The last node's GPU 0 runs MIG with this many instances (the MIG panels need one; two pods share it).
MIG_INSTANCES = 2
#: Namespaces of the fleet's pods (FleetSpec.pods, pod_layout()).
POD_NAMESPACES: tuple[str, ...] = ("team-a", "team-b")
#: The Slurm job whose processes run on the Slurm node's GPUs (slurm_node()).
SLURM_JOB = "4242"
#: The resource name of the pods' MIG devices (a 2-instance H100 split: 3g.40gb each).
MIG_RESOURCE = "nvidia.com/mig-3g.40gb"

#: The XID the throttled GPU reports (13: graphics engine exception), and when.
INCIDENT_XID = 13
#: The slow reads: for a few seconds every ECC read of one healthy GPU (a fast-lane
#: call, read every second) takes longer than that node's device.call_timeout_seconds,
#: so it counts as gpuperf_device_errors_total{reason="slow"} while the read still
#: succeeds (no collector failure, no alert).
INCIDENT_SLOW_CALL = "ecc_errors"
#: The daemons' health.interval_seconds in the fleet.
HEALTH_INTERVAL_SECONDS = 2.0
#: What each defect's GPU must show in its daemon's verdict (GET /api/v1/health): state, action,
#: and checks that must be among its reasons (docs/health.md). Without a defect: healthy, none, no reasons.
EXPECTED_VERDICTS: dict[str | None, tuple[str, str, frozenset[str]]] = {
    None: ("healthy", "none", frozenset()),
    "slow_clock": ("degraded", "check_hardware", frozenset({"probe_throughput_baseline"})),
    "slow_memory": ("degraded", "check_hardware", frozenset({"probe_throughput_baseline"})),
    "thermal_throttle": ("degraded", "check_hardware", frozenset({"probe_throughput_baseline"})),
}
INCIDENT_SLOW_DELAY_SECONDS = 0.8
INCIDENT_CALL_TIMEOUT_SECONDS = 0.5


@dataclass(frozen=True)
class FleetSpec:
    """What to start. The defaults are what tests/fleet/test_fleet.py checks."""

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
    #: Run deploy/alertmanager/alertmanager.yml (short timings, receivers -> a loopback
    #: webhook, gpuperfd.fleet.alerting) behind the Prometheus.
    alertmanager: bool = True
    #: The Prometheus external label the alerts build their runbook_url from.
    runbook_base_url: str = "https://runbook.example/gpuperfd/runbook"
    #: 0: one Prometheus. N >= 2: also N shard servers (hashmod on the target address)
    #: and a global one that federates their by-model series (gpuperfd.fleet.tiers).
    shards: int = 0
    #: Give GPUs owners (pod_layout(), slurm_node()): a fake kubelet per Kubernetes node
    #: (gpuperfd.fleet.kubelet; needs grpcio and grpcio-tools, the ``test`` extra) and one
    #: node whose processes belong to a Slurm job.
    pods: bool = True
    #: Seconds between the daemons' energy counter reads (sampler.collectors.energy; the
    #: daemon's default is 5 s). One fresh reading per 1-s scrape keeps the counter a
    #: smooth integral in Prometheus rather than a 5-s staircase, which the energy checks
    #: of the attribution rules need (tests/fleet/test_fleet.py).
    energy_interval_seconds: float = 1.0

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
        if self.shards and not 2 <= self.shards <= self.nodes:
            raise ValueError(f"shards must be 0 or 2..nodes ({self.nodes}), not {self.shards}")
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


@dataclass(frozen=True)
class FleetPod:
    """A pod a node's fake kubelet lists: whole GPUs of that node, or one MIG device of its GPU."""

    namespace: str
    name: str
    node: int
    gpus: tuple[int, ...]
    #: The MIG device (slot) of ``gpus[0]`` the pod holds; None: the whole GPUs.
    mig_slot: int | None = None

    @property
    def resource(self) -> str:
        return "nvidia.com/gpu" if self.mig_slot is None else MIG_RESOURCE

    def device_ids(self, model: str) -> list[str]:
        """What the device plugin hands the kubelet: GPU UUIDs, or the MIG device's UUID."""
        node = f"node-{self.node}"
        uuids = [simulated_uuid(model, gpu, node) for gpu in self.gpus]
        return uuids if self.mig_slot is None else [simulated_mig_uuid(uuids[0], self.mig_slot)]


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
    #: This node's fake kubelet socket (Fleet starts one for a node with pods); None: bare metal.
    kubelet_socket: Path | None = None

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

    @property
    def proc_root(self) -> Path:
        """The /proc the daemon names its GPU processes from (attribution.processes.proc_root):
        a fixture tree, so the host's own cgroups (a CI job under Slurm) never leak in."""
        return self.directory / "proc"


# -- pure helpers (unit-tested without processes) ---------------------------------


def pod_layout(spec: FleetSpec) -> list[FleetPod]:
    """Who holds which GPU (FleetSpec.pods), on the nodes the spec has.

    node-0: team-a/train-0 holds GPU 0; node-1: team-a/train-1 holds every GPU;
    node-2 is the Slurm node (slurm_node(), no kubelet); the last node's GPU 0 runs
    MIG and its two devices are held by team-b/infer-0 and team-a/notebook, one GPU
    shared by two pods. The other GPUs are nobody's.
    """
    if not spec.pods:
        return []
    last = spec.nodes - 1
    pods = []
    if last > 0:
        pods.append(FleetPod("team-a", "train-0", 0, (0,)))
    if last > 1:
        pods.append(FleetPod("team-a", "train-1", 1, tuple(range(spec.gpus_per_node))))
    pods += [FleetPod("team-b", "infer-0", last, (0,), mig_slot=0), FleetPod("team-a", "notebook", last, (0,), mig_slot=1)]
    return pods


def slurm_node(spec: FleetSpec) -> int | None:
    """The node whose GPU processes run in Slurm job SLURM_JOB (node-2 of a fleet of 4 or more)."""
    return 2 if spec.pods and spec.nodes >= 4 else None


def slurm_cgroup(job: str) -> str:
    """A /proc/PID/cgroup of a process slurmstepd started (cgroup v2), as gpuperfd.attribution.procinfo reads it."""
    return f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"


def pod_shares(pods: list[FleetPod]) -> dict[tuple[str, str], dict[tuple[int, int], float]]:
    """(namespace, pod) -> {(node, GPU): share}: a GPU held by n allocations is 1/n each's,
    the split gpuperf:gpu_allocation_share:ratio makes (deploy/prometheus/rules/attribution.yml)."""
    holders: dict[tuple[int, int], int] = {}
    for pod in pods:
        for gpu in pod.gpus:
            holders[(pod.node, gpu)] = holders.get((pod.node, gpu), 0) + 1
    return {
        (pod.namespace, pod.name): {(pod.node, gpu): 1 / holders[(pod.node, gpu)] for gpu in pod.gpus}
        for pod in pods
    }


def kubelet_pods(pods: list[FleetPod], node: int, model: str) -> list[tuple[str, str, list]]:
    """The pods of ``node`` in gpuperfd.fleet.kubelet's format: one container each, holding its devices."""
    return [(pod.namespace, pod.name, [("main", [(pod.resource, pod.device_ids(model))])])
            for pod in pods if pod.node == node]


def label_text(labels: dict[str, str]) -> str:
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
        "unit": probe_kind(probe).work_unit,
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
    if node.index == spec.nodes - 1:
        simulation["mig"] = [{"gpu": 0, "instances": MIG_INSTANCES}]
    if node.index == 0 and len(node.gpus) >= 2:
        simulation["topology"] = "hgx"  # one NVSwitch node: its fabric state is on the node dashboard
    if xids:
        simulation["xid_events"] = xids
    if faults:
        simulation["faults"] = faults
        device["call_timeout_seconds"] = INCIDENT_CALL_TIMEOUT_SECONDS
    schedules = _schedules(node, spec)
    # A node without a kubelet points at a socket that never exists: bare metal, nothing reported.
    kubelet = node.kubelet_socket or node.directory / "no-kubelet.sock"
    config: dict[str, Any] = {
        "log_level": "info",
        "web": {"listen_address": node.instance},
        "device": device,
        "simulation": simulation,
        "sampler": {"collectors": {"energy": {"interval_seconds": spec.energy_interval_seconds}}},
        "attribution": {
            "kubernetes": {"socket": str(kubelet)},
            "processes": {"proc_root": str(node.proc_root)},
        },
        "probes": {
            "state_dir": str(node.directory / "state"),
            "history": {"path": str(node.directory / "history.jsonl")},
            "executor": "simulated",
            "read_only": False,  # the fleet sweeps caps on simulated GPUs
            "stop_early": False,  # every cap of every sweep: the curves the tests compare with the physics
            "allow_mig": True,  # the last node's first GPU runs MIG (the MIG panels need one); probe it all the same
            "idle_seconds": 0,
            "jitter_seconds": 0,
            "first_run_delay_seconds": spec.first_run_delay_seconds,
            "simulated_measure_seconds": spec.measure_seconds,
            "max_slowdown": MAX_SLOWDOWN,
            # Every fleet GPU sweeps all the time (the probe checks need every GPU's curves), so the
            # pods' GPUs are declared ours to probe: the gate lets the sweeps run, and the pods' energy
            # is the sweeps' energy, a draw that changes every half second.
            "ours": {"namespaces": list(POD_NAMESPACES)},
            "schedules": schedules,
        },
        # Verdicts every 2 s: a defect must show within one probe interval (tests/fleet/test_fleet.py).
        "health": {"interval_seconds": HEALTH_INTERVAL_SECONDS},
    }
    if node.index == APPLY_NODE and spec.nodes > APPLY_NODE:
        # Apply mode on one healthy GPU of one node (its power-cap dashboard row and savings need one):
        # the recommended cap of the first probe, within the rules' slowdown, between its sweeps.
        config["apply"] = {"mode": "canary", "canary_gpus": [0], "workload": spec.probes[0],
                           "budget_ratio": MAX_SLOWDOWN, "interval_seconds": 1.0}
    return config


def _schedules(node: FleetNode, spec: FleetSpec) -> list[dict[str, Any]]:
    """Every probe swept over the fleet's caps; on a node of two or more GPUs, the interconnect too."""
    schedules: list[dict[str, Any]] = [
        {
            "probe": probe,
            "interval_seconds": spec.probe_interval_seconds,
            "caps": list(spec.caps),
            "settle_seconds": spec.settle_seconds,
        }
        for probe in spec.probes
    ]
    if len(node.gpus) >= 2:  # the node probe across its GPUs: the dashboard's interconnect panels and verdicts
        schedules += [{"probe": name, "interval_seconds": spec.probe_interval_seconds} for name in node_kind_names()]
    return schedules



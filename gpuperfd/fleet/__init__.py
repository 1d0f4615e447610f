"""A fleet of simulated gpuperfd daemons scraped by one real Prometheus .

:class:`Fleet` starts N ``gpuperfd run`` processes on simulated GPUs (one
"node" each, on free 127.0.0.1 ports, every GPU with its own UUID through
``simulation.node``), some of them degraded on purpose, and one Prometheus
server that scrapes them and loads the repository's recording and alerting
rules. ``scripts/fleet.py`` is the demo front end; ``tests/fleet/test_fleet.py`` is the
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

GPUs have owners (:attr:`FleetSpec.pods`, :func:`pod_layout`): a fake kubelet
(:mod:`gpuperfd.fleet.kubelet`, a real gRPC PodResources server) on three nodes
lists pods in two namespaces holding whole GPUs and the two MIG devices of the
last node's GPU 0, and node-2's probe processes belong to a Slurm job (a
fixture /proc), so the attribution rules and the "Energy by namespace / job"
panel have data that the tests compare with the simulator's energy counters.

Processes are stopped by the PIDs this module started (SIGTERM, then SIGKILL).
"""


from gpuperfd.fleet.backfill import healthy_history, history_timestamps
from gpuperfd.fleet.fleet import Fleet
from gpuperfd.fleet.prometheus import (
    accelerate_rules,
    finite,
    free_ports,
    http_get_json,
    prometheus_config,
)
from gpuperfd.fleet.spec import (
    DEFAULT_CAPS,
    DEFECTS,
    EXPECTED_ALERTS,
    JOB,
    POD_NAMESPACES,
    PROBES,
    RULE_FILES,
    RULES_DIR,
    SLURM_JOB,
    FleetGpu,
    FleetNode,
    FleetPod,
    FleetSpec,
    daemon_config,
    degraded_layout,
    pod_layout,
    pod_shares,
    probe_labels,
    slurm_node,
)

__all__ = [
    "DEFAULT_CAPS",
    "DEFECTS",
    "EXPECTED_ALERTS",
    "JOB",
    "POD_NAMESPACES",
    "PROBES",
    "RULES_DIR",
    "RULE_FILES",
    "SLURM_JOB",
    "Fleet",
    "FleetGpu",
    "FleetNode",
    "FleetPod",
    "FleetSpec",
    "accelerate_rules",
    "daemon_config",
    "degraded_layout",
    "finite",
    "free_ports",
    "healthy_history",
    "history_timestamps",
    "http_get_json",
    "pod_layout",
    "pod_shares",
    "probe_labels",
    "prometheus_config",
    "slurm_node",
]

"""The health checks, as one table of plain data (docs/health.md is generated from it).

Each row names the signal it reads, the evaluator *kind* that reads it (one generic
function per kind in :mod:`gpuperfd.health.evaluate`; no check has code of its own), its
threshold as a config key with a default (``health.thresholds.<key>`` overrides it), the
severity and action of its reason, how the reason clears, and the source it follows.

Clearing (``clears``):
- ``condition``: the reason goes when the check no longer fires.
- ``quiet_window``: goes ``health.quiet_window_seconds`` after the check last fired (events).
- ``reset_and_probe``: stays until a GPU reset is seen (a driver counter went back, or a new
  boot id) and a probe passed after it. Every reset_gpu / reboot_node row clears this way.
- ``passing_probes``: goes after ``clear_passing_probes`` ok probe runs of the same key.
- ``probe_passed``: goes after one ok probe run.
- ``per action``: rows whose action varies (XID, recovery action) clear by ACTION_CLEARS.

The drift thresholds (throughput_drift_ratio, energy_drift_ratio, peer_ratio, peer_min_count)
are those of the drift alerts in deploy/prometheus/rules/alerts.yml; a test holds the rules'
numbers equal to these defaults, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Threshold:
    key: str
    default: float
    unit: str
    help: str


@dataclass(frozen=True)
class Check:
    id: str
    kind: str
    signal: str
    severity: str
    action: str
    clears: str
    source: str
    summary: str
    threshold: Threshold | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Second series a ``busy_share`` condition compares against (value < reference).
    reference: str | None = None
    #: ``enum`` kind: value -> (severity, action, meaning).
    mapping: Mapping[int, tuple[str, str, str]] = field(default_factory=dict)
    #: ``baseline``/``peers`` kind: the run-record field compared, and which side is bad.
    field: str = ""
    bad: str = "below"


#: Settings every row may read (not tied to one row).
GLOBAL_SETTINGS: tuple[Threshold, ...] = (
    Threshold("quiet_window_seconds", 3600.0, "s", "an event reason (XID) goes this long after its last event"),
    Threshold("busy_window_seconds", 600.0, "s", "window of busy samples a busy_share check looks at"),
    Threshold("busy_min_samples", 12.0, "samples", "busy samples needed before a busy_share check may fire"),
    Threshold("busy_utilization_ratio", 0.5, "ratio", "GPU utilization at or above which a sample counts as busy (with only the values read since the busy streak began)"),
    Threshold("rate_window_seconds", 600.0, "s", "window over which a counter's rate is taken"),
    Threshold("baseline_days", 7.0, "d", "how far back the own-baseline median looks (as the 7-day rules)"),
    Threshold("baseline_min_runs", 3.0, "runs", "ok runs of a key needed before its baseline is used"),
    Threshold("clear_passing_probes", 3.0, "runs", "ok runs that clear a performance reason"),
    Threshold("topology_interval_seconds", 60.0, "s", "how often the sampler reads the GPU topology (NVLinks per pair) for the monitor"),
)

#: Silent data corruption (issue 31): NVIDIA's RMA process names nvidia-bug-report.sh and the field
#: diagnostic as what to run, and the field diagnostic decides whether the GPU is replaced.
_SDC_ACTION = ("NVIDIA RMA process (https://docs.nvidia.com/deploy/rma-process/index.html): bug report + "
               "field diagnostic, RMA when it fails; DCGM diagnostics (dcgmi diag -r 3)")
_NVML_ECC = "NVIDIA GPU Memory Error Management (volatile DBE: reset the GPU)"
_NVML_REMAP = "NVIDIA GPU Memory Error Management, row remapping (pending: reset; failure: RMA)"

#: The fabric checks' source (NVSentinel #883: the Fabric Manager down 20 days, every GPU called healthy).
_FABRIC_SOURCE = ("NVML nvmlDeviceGetGpuFabricInfoV (state, status); NVIDIA Fabric Manager user guide; "
                  "NVSentinel #883")

CHECKS: tuple[Check, ...] = (
    # -- passive: events -------------------------------------------------------------
    Check("xid", "xid", "gpuperf_xid_errors_total{xid}", "per catalog", "per catalog", "per action",
          "NVIDIA XID catalog, Resolution Bucket (Immediate Action); see the XID table below",
          "XID {xid} ({name}): catalog bucket {bucket}"),
    Check("gpu_recovery_action", "enum", "gpuperf_gpu_recovery_action", "per value", "per value", "per action",
          "NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (id 230), nvmlGpuRecoveryAction_t (5, RECOVER_IMEX_DOMAIN, is left unknown)",
          "the driver asks for recovery: {meaning}",
          mapping={1: ("unhealthy", "reset_gpu", "GPU reset required"),
                   2: ("unhealthy", "reboot_node", "node reboot required"),
                   3: ("degraded", "restart_app", "drain peer-to-peer traffic"),
                   4: ("unhealthy", "reset_gpu", "drain and reset"),
                   6: ("unhealthy", "reset_gpu", "reset the GPU's PCIe bus"),
                   7: ("unhealthy", "reboot_node", "reboot the system")}),
    # -- passive: memory ---------------------------------------------------------------
    Check("ecc_uncorrectable_volatile", "at_least", "gpuperf_ecc_errors_total{type=\"uncorrected\"}",
          "unhealthy", "reset_gpu", "reset_and_probe", _NVML_ECC,
          "{value:.0f} uncorrectable ECC error(s) since the driver loaded",
          Threshold("ecc_uncorrectable", 1.0, "errors", "volatile uncorrectable ECC errors that make a GPU unhealthy"),
          labels={"type": "uncorrected"}),
    Check("row_remap_pending", "at_least", "gpuperf_remapped_rows_pending", "degraded", "reset_gpu",
          "reset_and_probe", _NVML_REMAP, "a row remap waits for a GPU reset to take effect",
          Threshold("remap_pending", 1.0, "flag", "1: a remap is pending")),
    Check("row_remap_failed", "at_least", "gpuperf_remapped_rows_failure", "unhealthy", "contact_support",
          "condition", _NVML_REMAP, "a row remap failed: the GPU has no spare rows left",
          Threshold("remap_failure", 1.0, "flag", "1: a remap failed")),
    Check("retired_pages", "at_least", "gpuperf_retired_pages{cause=\"double_bit_ecc\"}", "unhealthy",
          "contact_support", "condition", "NVIDIA Dynamic Page Retirement (pre-Ampere): RMA threshold",
          "{value:.0f} pages retired for double-bit errors",
          Threshold("retired_pages_dbe", 60.0, "pages", "pages retired for double-bit ECC that make a GPU unhealthy"),
          labels={"cause": "double_bit_ecc"}),
    # -- passive: links -----------------------------------------------------------------
    Check("pcie_generation_below_max", "busy_share", "gpuperf_pcie_link_generation", "degraded", "check_hardware",
          "condition", "PCIe link training (nvmlDeviceGetCurrPcieLinkGeneration vs GetMaxPcieLinkGeneration)",
          "PCIe link at gen {value:.0f} of {reference:.0f} in {share:.0%} of busy samples",
          Threshold("pcie_below_max_share", 0.5, "ratio", "share of busy samples with the link below its maximum"),
          reference="gpuperf_pcie_link_max_generation"),
    Check("pcie_width_below_max", "busy_share", "gpuperf_pcie_link_width", "degraded", "check_hardware",
          "condition", "PCIe link training (nvmlDeviceGetCurrPcieLinkWidth vs GetMaxPcieLinkWidth)",
          "PCIe link at x{value:.0f} of x{reference:.0f} in {share:.0%} of busy samples",
          Threshold("pcie_below_max_share", 0.5, "ratio", "share of busy samples with the link below its maximum"),
          reference="gpuperf_pcie_link_max_width"),
    Check("pcie_replay_rate", "rate_above", "gpuperf_pcie_replays_total", "degraded", "check_hardware", "condition",
          "PCIe replay counter (nvmlDeviceGetPcieReplayCounter); gpud's pcie replay check",
          "{value:.1f} PCIe replays per minute",
          Threshold("pcie_replays_per_minute", 10.0, "1/min", "PCIe replays per minute that mark a marginal link")),
    Check("nvlink_link_down", "at_most", "gpuperf_nvlink_up{link}", "degraded", "reset_gpu", "reset_and_probe",
          "NVIDIA XID catalog WORKFLOW_NVLINK_ERR; nvmlDeviceGetNvLinkState",
          "NVLink link {link} is down",
          Threshold("nvlink_up", 0.0, "flag", "a link whose state is at most this is down")),
    # -- passive: the GPU fabric (NVSwitch boards only: absent elsewhere, so never judged) --------
    Check("fabric_not_started", "at_least", "gpuperf_fabric_state{state=\"not_started\"}", "degraded",
          "restart_fabric_manager", "condition", _FABRIC_SOURCE,
          "the GPU fabric has not started: restart the Fabric Manager (systemctl restart nvidia-fabricmanager); "
          "NVLink traffic through the NVSwitches fails until it completes",
          Threshold("fabric_state_flag", 1.0, "flag", "1: the fabric is in the row's state"),
          labels={"state": "not_started"}),
    Check("fabric_in_progress", "at_least", "gpuperf_fabric_state{state=\"in_progress\"}", "degraded", "none",
          "condition", _FABRIC_SOURCE,
          "the GPU fabric is still being set up: wait; if it stays in progress, restart the Fabric Manager",
          Threshold("fabric_state_flag", 1.0, "flag", "1: the fabric is in the row's state"),
          labels={"state": "in_progress"}),
    Check("fabric_failed", "at_most", "gpuperf_fabric_status_ok", "unhealthy", "restart_fabric_manager",
          "condition", _FABRIC_SOURCE,
          "the GPU fabric completed with an error: restart the Fabric Manager, then reset the GPU if it stays",
          Threshold("fabric_status_ok", 0.0, "flag", "a completed fabric whose status flag is at most this failed")),
    # -- active: the interconnect probe and the topology (NVLink pairs only) -----------------------
    Check("nvlink_links_below_topology", "interconnect_links", "NVLinks up per pair (topology) vs the board's",
          "degraded", "reset_gpu", "condition", "nvmlDeviceGetNvLinkRemotePciInfo per link; NVSentinel #890 "
          "(a link that trains down raises no event)",
          "{value:.0f} of {expected:.0f} NVLinks up to GPU {peer}: reset the GPU; if they stay down, check the hardware",
          Threshold("nvlink_links_ratio", 1.0, "ratio", "links up below this share of the board's fire")),
    Check("interconnect_below_expected", "interconnect_expected",
          "interconnect probe peer copy bandwidth vs the expected figure of the link", "degraded", "check_hardware",
          "condition", "gpuperfd/device/interconnect_figures.py (reference 2x H200 NV18 node; others estimates)",
          "peer copy GPU {src} -> GPU {dst}: {ratio:.0%} of the expected {expected_gbps:.0f} GB/s: reset the GPU; "
          "if it stays, check the hardware (NVLink cables, bridges, baseboard)",
          Threshold("interconnect_expected_ratio", 0.85, "ratio", "peer copy below this share of the expected fires")),
    # -- passive: clocks ----------------------------------------------------------------
    *(
        Check(f"clock_{reason}", "busy_share", "gpuperf_clock_event_active{reason=\"" + reason + "\"}", "degraded",
              "check_hardware", "condition", "NVML clock event reasons; the GpuThrottling alert (10 % of 10 min)",
              "clock event " + reason + " active in {share:.0%} of busy samples",
              Threshold("clock_event_share", 0.10, "ratio", "share of busy samples with a slowdown active"),
              labels={"reason": reason})
        for reason in ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
    ),
    # -- passive: presence --------------------------------------------------------------
    Check("gpu_lost", "flag", "gpu_lost (sampler: NVML_ERROR_GPU_IS_LOST)", "unhealthy", "reboot_node",
          "reset_and_probe", "NVIDIA XID catalog XID 79 (RESTART_BM); NVML_ERROR_GPU_IS_LOST",
          "the GPU does not answer (lost or fallen off the bus)"),
    Check("gpu_missing", "gpu_count", "GPUs present vs the first start (state file)", "unhealthy", "reboot_node",
          "condition", "gpud's GPU count check; Meta GCM nvidia-smi GPU count",
          "GPU {uuid} was present at the first start on this node and is missing now"),
    # -- active: probes -----------------------------------------------------------------
    Check("probe_throughput_baseline", "baseline", "probe units_per_second vs own median", "degraded",
          "check_hardware", "passing_probes", "deploy/prometheus/rules/alerts.yml GpuProbeThroughputDrift",
          "{probe}/{preset} at {cap} W: {ratio:.0%} of this GPU's baseline throughput",
          Threshold("throughput_drift_ratio", 0.90, "ratio", "throughput below this share of the baseline fires"),
          field="units_per_second", bad="below"),
    Check("probe_energy_baseline", "baseline", "probe energy_per_unit_joules vs own median", "degraded",
          "check_hardware", "passing_probes", "deploy/prometheus/rules/alerts.yml GpuProbeEnergyDrift",
          "{probe}/{preset} at {cap} W: {ratio:.0%} of this GPU's baseline energy per unit",
          Threshold("energy_drift_ratio", 1.10, "ratio", "energy per unit above this share of the baseline fires"),
          field="energy_per_unit_joules", bad="above"),
    Check("probe_slower_than_peers", "peers", "probe units_per_second vs node peers of the same model", "degraded",
          "check_hardware", "passing_probes", "deploy/prometheus/rules/alerts.yml GpuSlowerThanPeers",
          "{probe}/{preset} at {cap} W: {ratio:.0%} of the median of {peers} {name} GPUs",
          Threshold("peer_ratio", 0.90, "ratio", "throughput below this share of the peer median fires"),
          field="units_per_second", bad="below"),
    Check("probe_failures", "consecutive_failures", "probe runs (status, failure_reason)", "degraded", "reset_gpu",
          "reset_and_probe", "gpud / NVIDIA Health Validation: a check that cannot run is not a pass",
          "{count} probe runs in a row failed ({reasons})",
          Threshold("probe_failures", 3.0, "runs", "consecutive failed or timed-out runs that fire")),
    Check("probe_wrong_result", "failure_reason", "probe runs (status failed, failure_reason wrong_result)",
          "unhealthy", "contact_support", "reset_and_probe", _SDC_ACTION,
          "{probe}/{preset}{at_cap} computed wrong numbers ({failed_checks}): drain the GPU, collect "
          "nvidia-bug-report.sh, run the field diagnostic (dcgmi diag -r 3); replace the GPU if it fails",
          field="wrong_result"),
    Check("probe_answers_differ_from_peers", "peer_fingerprint",
          "probe answer fingerprints vs node peers of the same model, driver and software", "unhealthy",
          "contact_support", "reset_and_probe", _SDC_ACTION,
          "{probe}/{variant}/{preset}: its own repeats agree but its answers differ from the majority of "
          "{peers} peers of the same model, driver and software"),
    # -- the daemon's own memory ------------------------------------------------------------
    Check("health_state_unreadable", "store", "the saved verdict file (state directory)", "unknown", "none",
          "probe_passed", "this daemon: a lost memory of sticky verdicts is not a clean bill of health",
          "the saved verdicts could not be read ({error}); unknown until a probe passes"),
)


def _against_reference(id: str, field: str, bad: str, summary: str, threshold: Threshold) -> Check:
    """A row of kind ``expected``: the check's probe ``field`` against the shipped figure of the GPU's model,
    ``bad`` when it is below (or above) the threshold's share of it."""
    return Check(id, "expected", f"the check's probe {field} vs the shipped figure of the model", "degraded",
                 "check_hardware", "condition",
                 "gpuperfd/device/reference_figures.py (our H100/H200 measurements at 700 W)",
                 summary, threshold, field=field, bad=bad)


#: The one-shot ``gpuperfd check``'s active rows (docs/health.md, "gpuperfd check"): they judge the
#: short probe it runs on each idle GPU, with the passive rows above and ``probe_slower_than_peers``
#: (the same peer rule as the daemon's). The daemon does not evaluate them: its probes are judged
#: by the baseline, peer and failure rows over its history.
ACTIVE_CHECKS: tuple[Check, ...] = (
    Check("check_probe_failed", "probe_outcome", "the check's probe (status, failure_reason)", "per outcome",
          "per outcome", "condition", "gpud / NVIDIA Health Validation: a check that cannot run is not a pass",
          "{probe}/{preset} did not pass: {failure_reason} ({error})"),
    Check("check_correctness", "correctness", "the check's probe: correctness status vs a reference computation",
          "unhealthy", "contact_support", "condition", _SDC_ACTION,
          "{probe}/{preset}: results differ from the reference (max abs error {max_abs_error}, "
          "max rel error {max_rel_error})"),
    _against_reference(
        "check_below_expected", "units_per_second", "below",
        "{probe}/{preset}: {ratio:.0%} of the expected {expected:,.0f} {unit}/s of an {model} at {power_limit:.0f} W",
        Threshold("expected_ratio", 0.85, "ratio", "throughput below this share of the expected figure fires")),
    _against_reference(
        "check_energy_above_expected", "energy_per_unit_joules", "above",
        "{probe}/{preset}: {ratio:.0%} of the expected energy per {unit} of an {model} at {power_limit:.0f} W",
        Threshold("expected_energy_ratio", 1.15, "ratio", "energy per unit above this share of the expected fires")),
    Check("interconnect_wrong_unattributed", "failure_reason",
          "the check's interconnect probe (failure_reason wrong_result) beside each GPU's own probe", "unknown", "none",
          "condition", "this command: a wrong sum is charged to the GPU whose own probe gave wrong answers "
          "(health/interconnect.py); with none named, no GPU is condemned on another's fault",
          "{probe}/{preset}: wrong answers across GPUs {set} ({failed_checks}) that no GPU's own probe explains: "
          "not charged to this GPU; measure again (gpuperfd check, then each GPU alone: gpuperfd check --gpus N)",
          field="wrong_result_unattributed"),
    Check("check_not_probed", "not_probed", "the GPU lock, the busy check, MIG mode, --quick", "info", "none",
          "condition", "this command: a GPU it could not probe is said so, never a silent pass",
          "{why}",
          Threshold("require_probe", 0.0, "flag", "1: a GPU that was not probed is unknown (burn-in), not info")),
    Check("check_probe_measured", "measured", "the check's probe result", "info", "none", "condition",
          "this command: what the probe measured, beside what was expected",
          "{probe}/{preset}: {measured}"),
)

#: ``probe_outcome``: the check probe's failure reason -> (severity, action). A probe that did not
#: finish in time, or could not run for a reason that says nothing about the GPU, is unknown (never
#: healthy); a crash or a CUDA error is the GPU's (DCGM's diag fails a GPU on either).
PROBE_OUTCOMES: Mapping[str, tuple[str, str]] = {
    "timeout": ("unknown", "none"),
    "aborted": ("unknown", "none"),
    "gpu_busy": ("unknown", "none"),
    "host_oom": ("unknown", "none"),  # the host's memory limit killed the child: not the GPU
    "preempted": ("unknown", "none"),  # gave way to a user's job (status skipped): could not check
    "exception": ("unknown", "contact_support"),
    "oom": ("degraded", "reset_gpu"),
    "crash": ("unhealthy", "reset_gpu"),
    "cuda_error": ("unhealthy", "reset_gpu"),
}

#: How a reason of a row whose action varies (``clears == "per action"``) clears: drastic
#: actions stay until a reset and a passing probe, the others after a quiet window.
ACTION_CLEARS: Mapping[str, str] = {
    "none": "quiet_window", "restart_app": "quiet_window", "update_software": "quiet_window",
    "restart_fabric_manager": "quiet_window",
    "reset_gpu": "reset_and_probe", "reboot_node": "reset_and_probe", "check_hardware": "reset_and_probe",
    "contact_support": "reset_and_probe",
}

#: Extra settings of some kinds, not thresholds of one row.
PEER_MIN_COUNT = Threshold("peer_min_count", 4.0, "GPUs", "GPUs of one model (itself included) a peer check needs")

#: Failure reasons that say nothing about the GPU (skipped by probe_failures). ``preempted`` runs are
#: status skipped (they gave way to a user's job) and never counted; it is listed for a record that says otherwise.
NON_GPU_FAILURES: frozenset[str] = frozenset({"gpu_busy", "aborted", "early_stop", "host_oom", "preempted"})


def defaults() -> dict[str, float]:
    """Every threshold key with its default (one value per key)."""
    values: dict[str, float] = {t.key: t.default for t in GLOBAL_SETTINGS}
    values[PEER_MIN_COUNT.key] = PEER_MIN_COUNT.default
    for check in (*CHECKS, *ACTIVE_CHECKS):
        if check.threshold is not None:
            values[check.threshold.key] = check.threshold.default
    return values


def by_id() -> dict[str, Check]:
    return {check.id: check for check in CHECKS}

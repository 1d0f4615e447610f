"""The daemon's configuration: one YAML file, validated on load (:mod:`gpuperfd.config.schema`).

An invalid file raises :class:`ConfigError` whose message names the file, the
field (as a dotted path) and what is wrong; the CLI turns that into exit code 2.
With no file at all the defaults apply. Unknown keys are errors, so a typo is
never silently ignored.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from gpuperfd.config.strict_yaml import MAX_FILE_BYTES, DuplicateKeyError, safe_load_strict
from gpuperfd.config.schema import (
    BaseModel,
    ConfigDict,
    Field,
    OneOf,
    ValidationError,
    field_problem,
    field_validator,
    model_validator,
)

DEFAULT_CONFIG_PATH = Path("/etc/gpuperfd/gpuperfd.yaml")
#: 9100-9999 is fully allocated on the Prometheus default-port list; see docs/configuration.md.
DEFAULT_PORT = 10187
DEFAULT_LISTEN_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"

DeviceCall = Literal[
    "*",
    "info",
    "mig_uuids",
    "utilization",
    "memory",
    "temperature_celsius",
    "power_watts",
    "energy_joules",
    "power_limits",
    "set_power_limit",
    "clocks",
    "clock_events",
    "pcie_throughput",
    "ecc_errors",
    "compute_processes",
    "gpm_activity",  # simulated GPUs only: the noise-carrying activity behind gpm_metrics
    "gpm_metrics",
    "memory_temperature_celsius",
    "remapped_rows",
    "retired_pages",
    "violation_seconds",
    "pcie_replays",
    "pcie_link",
    "gpu_recovery_action",
    "codec_utilization",
    "nvlink",
    "fabric_state",
    "mig_enabled",
    "mig_instances",
]
FaultKind = Literal["not_supported", "no_permission", "gpu_lost", "timeout", "unknown", "slow"]


class ConfigError(Exception):
    """A configuration that cannot be used; str() is the full, user-facing message."""


@dataclass(frozen=True)
class Vocabulary:
    """The names a configuration may use that other packages own: the configuration imports none of
    them (it is a leaf: docs/architecture.md), so the entry point hands them in (:func:`use_vocabulary`,
    done by :mod:`gpuperfd.cli` when it is imported). Only a config that sets these fields needs it.

    A file or mapping (:func:`config_from_mapping`, so :func:`load_config` and :func:`config_with_flags`)
    that needs it and finds none is a wiring bug: RuntimeError, never a silently skipped check. A model
    built directly in code (``ScheduleConfig(probe=..., options=...)`` in a script) is checked when a
    vocabulary was handed in and otherwise not here (the run's ``ProbeSpec`` checks probe, preset and
    fields again when it is built)."""

    #: ``(probe, options, preset)`` -> None, or ValueError whose text is the user-facing message.
    check_probe_options: Callable[[str, dict[str, Any], str | None], None]
    #: ``sampler.collectors`` keys: the telemetry collectors' names.
    collector_names: tuple[str, ...]
    #: ``health.thresholds`` keys: the health checks' threshold and setting keys.
    health_threshold_keys: tuple[str, ...]
    #: ``(probe, options, preset)`` -> the measured seconds of one point in a probe child (its
    #: warmup and windows: what no faster start-up removes); None: not known, not checked.
    point_window_seconds: Callable[[str, dict[str, Any], str | None], float] | None = None
    #: Each probe's default preset (what a schedule without ``preset`` runs): ``apply.workload`` checks.
    default_presets: dict[str, str] = field(default_factory=dict)
    #: The probe kinds a schedule may name, and those among them run across a node's GPUs (no preset,
    #: no cap sweep, options of their own): the registry's rows (``probe_data/kinds.py``).
    probe_names: tuple[str, ...] = ()
    node_probes: tuple[str, ...] = ()


_vocabulary_source: Callable[[], Vocabulary] | None = None
_vocabulary: Vocabulary | None = None
#: True while config_from_mapping validates: a needed vocabulary must then be there.
_vocabulary_required: ContextVar[bool] = ContextVar("gpuperfd_config_vocabulary_required", default=False)


def use_vocabulary(source: Callable[[], Vocabulary] | None) -> None:
    """Hand in where the outside names come from (None forgets it). ``source`` is called the first
    time a configuration needs them, so a command that never reads a schedule's options, a collector
    setting or a health threshold never imports their owners."""
    global _vocabulary_source, _vocabulary
    _vocabulary_source, _vocabulary = source, None


def vocabulary() -> Vocabulary | None:
    """The outside names; None where none was handed in (RuntimeError inside config_from_mapping)."""
    global _vocabulary
    if _vocabulary is None and _vocabulary_source is not None:
        _vocabulary = _vocabulary_source()
    if _vocabulary is None and _vocabulary_required.get():
        raise RuntimeError("gpuperfd.config: no vocabulary handed in (probe options, collector names, "
                           "health thresholds); import gpuperfd.cli or call use_vocabulary() first")
    return _vocabulary


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_listen_address(value: str) -> tuple[str, int]:
    """Split 'HOST:PORT', '[::1]:PORT' or ':PORT' into (host, port); ValueError if malformed."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"listen address {value!r} must be HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"listen address {value!r}: port must be a number from 0 to 65535")
    return host, int(port_text)


class WebConfig(_Strict):
    listen_address: str = DEFAULT_LISTEN_ADDRESS
    telemetry_path: str = "/metrics"
    #: exporter-toolkit compatible web config (TLS, basic auth); None serves plain HTTP.
    config_file: Path | None = None
    #: open connections at most (lowered to the open-files limit); at the cap the longest-waiting
    #: connection without a request in progress is closed to make room.
    max_connections: Annotated[int, Field(ge=1, le=1_000_000)] = 512
    #: requests being served or waiting for a worker at most (node_exporter's --web.max-requests); more get 503.
    max_requests: Annotated[int, Field(ge=1, le=100_000)] = 256
    #: request worker threads (fixed; scrapes hold the GIL, so a few are enough).
    workers: Annotated[int, Field(ge=1, le=256)] = 4
    #: seconds for a whole request head (and small body) from its first byte (slowloris bound).
    header_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    #: seconds for a TLS handshake from the client's first byte.
    tls_handshake_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    #: seconds a keep-alive connection may wait for its next request (and a new one for its first byte).
    idle_timeout_seconds: Annotated[float, Field(gt=0, le=86400)] = 120.0

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value

    @field_validator("telemetry_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/") or value == "/":
            raise ValueError("must start with '/' and not be '/' itself (the landing page)")
        return value


class FaultConfig(_Strict):
    """A fault injected into a simulated GPU."""

    gpu: int | Literal["*"] = "*"
    call: DeviceCall = "*"
    kind: FaultKind
    #: Seconds after start when the fault begins, and how long it lasts (None: forever).
    after_seconds: Annotated[float, Field(ge=0)] = 0.0
    duration_seconds: Annotated[float, Field(gt=0)] | None = None
    #: For kind 'slow' and 'timeout': how long the call takes.
    delay_seconds: Annotated[float, Field(ge=0, le=600)] = 2.0


class XidConfig(_Strict):
    gpu: Annotated[int, Field(ge=0)]
    xid: Annotated[int, Field(ge=1, le=1000)]
    after_seconds: Annotated[float, Field(ge=0)] = 0.0
    repeat: Annotated[int, Field(ge=1, le=1000)] = 1


class EccInjectConfig(_Strict):
    gpu: Annotated[int, Field(ge=0)]
    corrected: Annotated[int, Field(ge=0)] = 0
    uncorrected: Annotated[int, Field(ge=0)] = 0
    after_seconds: Annotated[float, Field(ge=0)] = 0.0


class DegradeConfig(_Strict):
    """Make one simulated GPU worse than its peers (for drift and peer alerts)."""

    gpu: Annotated[int, Field(ge=0)]
    #: Multiplies the maximum SM clock (e.g. 0.85: a part that clocks 15% lower).
    sm_clock_factor: Annotated[float, Field(gt=0, le=1)] = 1.0
    #: Multiplies memory bandwidth.
    memory_bandwidth_factor: Annotated[float, Field(gt=0, le=1)] = 1.0
    #: Keep this GPU thermally throttled while it is busy.
    thermal_throttle: bool = False
    #: Train this GPU's PCIe link below its maximum generation / width (None: at the maximum).
    pcie_generation: Annotated[int, Field(ge=1, le=6)] | None = None
    pcie_width: Annotated[int, Field(ge=1, le=32)] | None = None
    #: Silent data corruption: this GPU's probe answers are wrong (their correctness checks report a
    #: mismatch, the run fails with reason wrong_result), while its telemetry looks normal.
    wrong_results: bool = False


class MigConfig(_Strict):
    """Put one simulated GPU in MIG mode with ``instances`` equal GPU instances (one compute instance each)."""

    gpu: Annotated[int, Field(ge=0)]
    instances: Annotated[int, Field(ge=1, le=7)] = 7


class InterconnectFaultConfig(_Strict):
    """A fault of the simulated node's interconnect (issue 44); see docs/simulator.md.

    ``link_down``: ``links`` NVLinks of GPU ``gpu`` go down (on a direct pair, the peer's ends too), and
    every pair of that GPU loses bandwidth in proportion; ``half_bandwidth``: the pair ``gpu``-``peer``
    copies at half speed with every link up and no event (a link that lost lanes); ``slow_pair``: the
    same at ``factor`` of its speed (0 < factor < 1); ``fabric``: GPU ``gpu``'s fabric state is
    ``fabric_state`` with ``fabric_status`` (an NVML error text; None: success)."""

    kind: Literal["link_down", "half_bandwidth", "slow_pair", "fabric"]
    gpu: Annotated[int, Field(ge=0)] | Literal["*"] = 0
    peer: Annotated[int, Field(ge=0)] | None = None
    links: Annotated[int, Field(ge=1, le=18)] = 1
    fabric_state: Literal["not_started", "in_progress", "completed"] = "not_started"
    fabric_status: Annotated[str, Field(max_length=200)] | None = None
    factor: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.5

    @model_validator(mode="after")
    def _check_kind(self) -> InterconnectFaultConfig:
        if self.kind in ("half_bandwidth", "slow_pair") and (self.peer is None or self.gpu == "*" or self.peer == self.gpu):
            raise ValueError(f"{self.kind} needs a gpu and a different peer (the pair that copies slowly)")
        if self.kind == "link_down" and self.gpu == "*":
            raise ValueError("link_down needs one gpu (the GPU whose links go down)")
        return self


class SimulationConfig(_Strict):
    gpus: Annotated[int, Field(ge=1, le=64)] = 2
    model: Literal["H100", "H200", "A100"] = "H100"
    #: Seed of the noise in simulated readings and probe results (None: random).
    seed: int | None = None
    #: Name of the simulated node, mixed into each GPU's UUID and serial so that several
    #: simulated daemons (a fleet, see docs/fleet-simulation.md) have distinct GPUs.
    #: "" (the default) keeps the UUIDs of a single simulated node.
    node: Annotated[str, Field(max_length=128)] = ""
    faults: list[FaultConfig] = []
    xid_events: list[XidConfig] = []
    ecc_errors: list[EccInjectConfig] = []
    degrade: list[DegradeConfig] = []
    #: NVLink links per simulated GPU (None: the model's SXM count, 18 on H100/H200, 12 on A100;
    #: 0: no NVLink, as on a PCIe card or a VM).
    nvlink_links: Annotated[int, Field(ge=0, le=18)] | None = None
    #: How the simulated GPUs are linked (issue 44): "nvlink-pair" (two GPUs joined by all their
    #: NVLinks, NV18 as an H200 NVL pair), "hgx" (every GPU's links into NVSwitches, fabric manager),
    #: "pcie" (no NVLink), "none" (one GPU). "auto": none for 1 GPU, nvlink-pair for 2, hgx for more,
    #: pcie whenever nvlink_links is 0.
    topology: Literal["auto", "none", "nvlink-pair", "hgx", "pcie"] = "auto"
    #: Interconnect faults (a link down, a pair at half bandwidth, the fabric not ready).
    interconnect_faults: list[InterconnectFaultConfig] = []
    #: Simulated GPUs in MIG mode.
    mig: list[MigConfig] = []
    #: Power limits the simulated GPUs start with (watts, by index), e.g. an operator's own cap.
    initial_power_limits: dict[int, Annotated[float, Field(gt=0)]] = {}
    #: A file that keeps the simulated power limits across daemon restarts, as a real board
    #: keeps its limit when the daemon dies (None: limits live and die with the process).
    state_file: Path | None = None
    #: How much of a real probe child's costs a simulated probe charges (its spawn and imports, the
    #: build, each point's overheads: ``probing/simulated/costs.py``, measured on an H200): 1 as
    #: measured, 0 none. None (the default): as much as ``probes.simulated_measure_seconds`` compresses
    #: the real windows (3 s: 1, the real costs; 0.3 s: a tenth), so a test that shortens the window
    #: shortens the costs alike (``probing/simulated/costs.py:cost_scale_for``).
    cost_scale: Annotated[float, Field(ge=0, le=10)] | None = None


class DeviceConfig(_Strict):
    backend: Literal["nvml", "simulated"] = "nvml"
    #: Only these GPU indices (None: all).
    gpus: list[Annotated[int, Field(ge=0)]] | None = None
    #: At start, keep retrying for this long when the NVIDIA driver is not loaded yet (0: fail at once).
    driver_wait_seconds: Annotated[float, Field(ge=0, le=86400)] = 0.0
    #: Per-call timeout: a device call slower than this is reported as a timeout.
    call_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0

    @field_validator("gpus")
    @classmethod
    def _each_gpu_once(cls, gpus: list[int] | None) -> list[int] | None:
        if gpus is not None and len(set(gpus)) != len(gpus):  # [0, 0] once read GPU 0 twice per scrape
            raise ValueError(f"a GPU is named twice in {gpus}")
        return gpus


class CollectorToggle(_Strict):
    enabled: bool = True
    #: Seconds between background reads (None: the sampler's interval).
    interval_seconds: Annotated[float, Field(ge=0.05, le=3600)] | None = None


class SamplerConfig(_Strict):
    #: Seconds between reads of the cheap fields.
    interval_seconds: Annotated[float, Field(ge=0.05, le=300)] = 1.0
    #: Per-collector settings by collector name (see `gpuperfd collectors`).
    collectors: dict[str, CollectorToggle] = {}


class KubernetesAttributionConfig(_Strict):
    """The kubelet PodResources API: which pod holds which GPU."""

    #: The kubelet's PodResources socket; a node where it never exists reports nothing (bare metal).
    socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    #: Seconds between List calls (on the daemon's own thread, never during a scrape).
    interval_seconds: Annotated[float, Field(ge=1, le=3600)] = 10.0
    #: One List call's deadline.
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 2.0
    #: Resources that are GPUs or MIG devices (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...).
    resource_prefixes: list[str] = ["nvidia.com/"]
    #: Probe only where the kubelet has answered: without its answer a GPU counts as allocated (probing a
    #: GPU a pod holds is worse than not probing). "auto": required inside a Kubernetes pod
    #: (KUBERNETES_SERVICE_HOST set), not on bare metal; true/false force it.
    required: bool | Literal["auto"] = "auto"


class ProcessAttributionConfig(_Strict):
    """Per-process series of the processes collector."""

    #: Processes published per GPU (those holding the most memory); 0: none, only the totals.
    top_n: Annotated[int, Field(ge=0, le=64)] = 5
    #: Publish process name, user and systemd unit; off by default (operators may consider them private).
    expose_names: bool = False
    #: Where process identities are read (a fixture tree in tests).
    proc_root: Path = Path("/proc")


class AttributionConfig(_Strict):
    kubernetes: KubernetesAttributionConfig = KubernetesAttributionConfig()
    processes: ProcessAttributionConfig = ProcessAttributionConfig()


class OursConfig(_Strict):
    """Pods whose GPUs are ours to probe even though the kubelet lists them as allocated."""

    #: Namespaces whose pods hold GPUs for gpuperfd (e.g. a placeholder pod that reserves the GPU).
    namespaces: list[str] = []
    #: Pod name patterns (shell-style, e.g. "gpuperfd-probe-*"); the kubelet lists no pod labels.
    pods: list[str] = []


def _probe_names() -> tuple[str, ...] | None:
    """The probe kinds handed in; None where no vocabulary was (a model built in code: unchecked here)."""
    names = vocabulary()
    return names.probe_names if names is not None else None


def _is_node_probe(probe: str) -> bool:
    """Whether ``probe`` runs across a node's GPUs (the interconnect probe), as the vocabulary says."""
    names = vocabulary()
    return names is not None and probe in names.node_probes


#: A schedule's probe: one of the kinds the vocabulary hands in, checked as a Literal of them would be.
ProbeName = Annotated[Any, OneOf(_probe_names)]
#: The interconnect probe's options (issue 44: InterconnectRequest's fields); sizes in bytes.
INTERCONNECT_OPTIONS = {"copy_bytes": int, "allreduce_bytes": list, "repeats": int, "warmup": int, "dtype": str,
                        "timeout_seconds": float}
CapEntry = Annotated[float, Field(gt=0)] | Literal["min", "max", "default", "current"]


def _check_interconnect(schedule: "ScheduleConfig") -> None:
    """An interconnect schedule: a node probe over a set of GPUs at the operator's caps (no preset,
    no cap sweep), its options InterconnectRequest's; the set's GPUs are checked against the node
    when it runs."""
    if schedule.preset is not None:
        raise ValueError("interconnect: takes no preset")
    if list(schedule.caps) != ["current"]:
        raise ValueError("interconnect: runs at the operator's caps only; leave caps out (or [current])")
    if schedule.gpus is not None:
        if len(schedule.gpus) < 2:
            raise ValueError(f"gpus: the interconnect probe needs at least two GPUs, got {schedule.gpus}")
        if len(set(schedule.gpus)) != len(schedule.gpus):
            raise ValueError(f"gpus: a GPU is named twice in {schedule.gpus}")
    for name, value in schedule.options.items():
        kind = INTERCONNECT_OPTIONS.get(name)
        if kind is None:
            raise ValueError(f"options: {name!r} is not an interconnect option ({', '.join(INTERCONNECT_OPTIONS)})")
        values = value if kind is list else [value]
        if kind is list and (not isinstance(value, list) or not value):
            raise ValueError(f"options.{name}: give a list of sizes in bytes, got {value!r}")
        if name == "dtype":
            if value not in ("bfloat16", "float16", "float32"):
                raise ValueError(f"options.dtype: bfloat16, float16 or float32, got {value!r}")
            continue
        low = 0 if name == "warmup" else 1
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < low for v in values):
            raise ValueError(f"options.{name}: must be a number >= {low}, got {value!r}")


class ScheduleConfig(_Strict):
    """One scheduled probe: what to run, when, and at which caps."""

    probe: ProbeName
    #: Model preset (e.g. gpt2, gpt2-medium, vit-b16); None: the probe's default.
    preset: str | None = None
    #: How old the result may get, seconds: once older (or with none yet) it is due, and runs at the
    #: first moment the GPU qualifies (docs/configuration.md, "When probes run"). Or ``cron``
    #: (5 fields): each cron time opens a window in which the run takes the GPU's first qualifying
    #: moment. Exactly one of the two.
    interval_seconds: Annotated[float, Field(ge=10)] | None = None
    cron: str | None = None
    #: A cron schedule's window, seconds: how long after its cron time the run may still start
    #: (None: until the next cron time). Not for interval schedules.
    window_seconds: Annotated[float, Field(gt=0)] | None = None
    #: Caps to sweep: watts (> 1), fractions of the maximum (<= 1) or min/max/default/current.
    #: ["current"] (the default) runs at the operator's cap only and changes nothing.
    caps: Annotated[list[CapEntry], Field(min_length=1)] = ["current"]
    #: Seconds to wait after each cap change before measuring.
    settle_seconds: Annotated[float, Field(ge=0, le=600)] = 5.0
    #: Probe options passed to the workload (batch_size, prompt_tokens, output_tokens, dtype, ...).
    options: dict[str, Any] = {}
    #: Only these GPU indices (None: every GPU).
    gpus: list[Annotated[int, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _valid_probe_options(self) -> "ScheduleConfig":
        if _is_node_probe(self.probe):
            _check_interconnect(self)
            return self
        if self.options or self.preset is not None:  # the defaults need no outside knowledge
            names = vocabulary()
            if names is not None:
                names.check_probe_options(self.probe, self.options, self.preset)
        return self

    @model_validator(mode="after")
    def _one_trigger(self) -> "ScheduleConfig":
        if (self.interval_seconds is None) == (self.cron is None):
            raise ValueError("give exactly one of interval_seconds or cron")
        if self.window_seconds is not None and self.cron is None:
            raise ValueError("window_seconds: only a cron schedule has a window (an interval schedule's "
                             "result is due once older than interval_seconds, and runs at the first gap)")
        if self.cron is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(self.cron)
            except ValueError as exc:
                raise ValueError(f"cron {self.cron!r}: {exc}") from None
        return self


class HistoryConfig(_Strict):
    #: JSON-lines file every probe result is appended to (None: no history). Left out: history.jsonl in
    #: probes.state_dir (ProbesConfig.history_path), the default below with the default state_dir.
    path: Path | None = Path("/var/lib/gpuperfd/history.jsonl")
    max_bytes: Annotated[int, Field(ge=4096)] = 16 * 1024 * 1024
    backups: Annotated[int, Field(ge=0, le=100)] = 3


class ProbesConfig(_Strict):
    enabled: bool = True
    #: Never change power caps: sweeps run at the current cap only. True unless set to false
    #: explicitly, so a truncated or half-written config file can never start real cap sweeps.
    read_only: bool = True
    #: Where the power-cap journal lives (systemd's StateDirectory).
    state_dir: Path = Path("/var/lib/gpuperfd")
    #: A GPU qualifies for a probe once it has been idle (no foreign process, utilization below the
    #: threshold, not allocated) this long; a due probe starts at that moment.
    idle_seconds: Annotated[float, Field(ge=0)] = 300.0
    idle_utilization_threshold: Annotated[float, Field(ge=0, le=1)] = 0.05
    #: A due probe starts a random 0..jitter_seconds after its GPU's qualifying moment, so the GPUs of
    #: a node (or a fleet) freed together are not probed in lockstep.
    jitter_seconds: Annotated[float, Field(ge=0)] = 60.0
    #: The largest share of each GPU's time probes may take, over a rolling day (0.01: 864 s a day);
    #: a due probe that would pass it waits.
    max_gpu_time_ratio: Annotated[float, Field(gt=0, le=1)] = 0.01
    #: Run probes on a GPU in MIG mode (off: such runs are skipped with reason "mig").
    allow_mig: bool = False
    #: No probe starts sooner than this after the daemon starts (a due run then takes the GPU's first
    #: qualifying moment: a delay below idle_seconds loses nothing).
    first_run_delay_seconds: Annotated[float, Field(ge=0)] = 60.0
    #: Probe different GPUs of the node at the same time.
    parallel_gpus: bool = True
    #: How long a run waits for another run on the same GPU to end before it is skipped.
    queue_seconds: Annotated[float, Field(ge=0)] = 900.0
    #: One probe child per GPU per round: when a schedule's run starts on a GPU, the other schedules
    #: of that GPU due within this many seconds (and at most a tenth of their own interval, or a
    #: child's start where that is longer: ProbeScheduler.claim) run in
    #: the same child right after it, and runs that queue on the GPU meanwhile join; 0: every run
    #: its own child (docs/configuration.md, "Probe rounds").
    round_window_seconds: Annotated[float, Field(ge=0, le=86400)] = 300.0
    #: Hard limit for one probe run (one cap), seconds.
    timeout_seconds: Annotated[float, Field(gt=0, le=7200)] = 600.0
    #: Recommendation rule: lowest energy among caps within this slowdown of the highest cap.
    max_slowdown: Annotated[float, Field(ge=0, lt=1)] = 0.10
    #: Skip a sweep's lower caps once one is clearly slower than max_slowdown allows (they
    #: cannot be recommended: throughput does not rise as the cap falls); reported as skipped.
    stop_early: bool = True
    #: How probes run: "child" (torch in a child process), "simulated" (the simulator's physics),
    #: or "auto" (simulated on the simulated backend, child on NVML).
    executor: Literal["auto", "child", "simulated"] = "auto"
    #: Where child probes run their tensors: "cuda" (the GPU probed) or "cpu" (tests, demos).
    torch_device: Literal["cuda", "cpu"] = "cuda"
    #: Measured seconds of a simulated probe (simulated backend only).
    simulated_measure_seconds: Annotated[float, Field(gt=0, le=600)] = 3.0
    #: Host memory the probe children may use together, bytes or a Kubernetes quantity ("2560Mi",
    #: "4Gi"); the smaller of it and the cgroup's memory limit wins. None: the cgroup's limit only
    #: (docs/operations.md, "Memory: how many probe children at once").
    memory_budget: int | str | None = None
    history: HistoryConfig = HistoryConfig()
    #: A GPU allocated to a pod is never probed, unless every pod holding it matches this.
    ours: OursConfig = OursConfig()
    schedules: list[ScheduleConfig] = []

    @property
    def history_path(self) -> Path | None:
        """Where the probe history goes: ``history.path`` when the config sets it (null: none), else
        ``history.jsonl`` in ``state_dir`` (``/var/lib/gpuperfd/history.jsonl`` by default). A daemon
        given its own state directory (a second daemon, a demo, a test) once still wrote the node's
        /var/lib/gpuperfd/history.jsonl."""
        if "history" in self.model_fields_set and "path" in self.history.model_fields_set:
            return self.history.path
        return self.state_dir / "history.jsonl"

    @field_validator("memory_budget")
    @classmethod
    def _budget_bytes(cls, value: int | str | None) -> int | None:
        if value is None:
            return None
        size = value if isinstance(value, int) else parse_quantity(value)
        if size <= 0:
            raise ValueError("must be a positive size (bytes, or a quantity such as 2560Mi or 4Gi)")
        return size


#: Kubernetes memory quantity suffixes, in bytes.
QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_quantity(text: str) -> int:
    """A memory size as Kubernetes writes it ("2560Mi", "4Gi", "500M", "1073741824") in bytes;
    ValueError with the accepted forms otherwise."""
    text = text.strip()
    for suffix, factor in QUANTITY_UNITS.items():
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(suffix)]) * factor)
    if text.isdigit():
        return int(text)
    raise ValueError(f"{text!r} is not a memory size: bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T "
                     "(e.g. 2560Mi, 4Gi)")


class HealthConfig(_Strict):
    """The per-GPU verdict (docs/health.md)."""

    enabled: bool = True
    #: Seconds between evaluations of the checks (reads cached readings only).
    interval_seconds: Annotated[float, Field(ge=0.5, le=300)] = 5.0
    #: Overrides of the checks' thresholds and settings, by key (docs/health.md lists them).
    thresholds: dict[str, Annotated[float, Field(ge=0)]] = {}
    #: node-feature-discovery local feature file the daemon keeps current with the verdict
    #: (e.g. /etc/kubernetes/node-feature-discovery/features.d/gpuperfd); None: not written.
    nfd_features_file: Path | None = None

    @model_validator(mode="after")
    def _known_keys(self) -> "HealthConfig":
        names = vocabulary() if self.thresholds else None
        if names is None:
            return self
        known = names.health_threshold_keys
        unknown = sorted(set(self.thresholds) - set(known))
        if unknown:
            raise ValueError(f"health.thresholds: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        return self


ApplyMode = Literal["off", "advise", "canary", "on"]


class ApplyConfig(_Strict):
    """Applying the recommended power cap (docs/apply.md): opt-in, off by default."""

    #: off: nothing; advise: publish what it would set and why, change nothing; canary: a share of
    #: each model's GPUs (``canary_share``, by a stable hash of the UUID) or ``canary_gpus``; on: every GPU.
    mode: ApplyMode = "off"
    #: The workload this node serves: a probe name, or probe/preset (e.g. "llm/gpt2-medium").
    workload: str | None = None
    #: The largest throughput loss allowed at the applied cap, against the operator's cap.
    budget_ratio: Annotated[float, Field(gt=0, le=0.5)] = 0.05
    #: canary: the share of each model's GPUs that apply (the same GPUs on every start and node).
    canary_share: Annotated[float, Field(gt=0, le=1)] = 0.1
    #: canary: these GPU indices instead of the share (None: the share decides).
    canary_gpus: list[Annotated[int, Field(ge=0)]] | None = None
    #: Apply while the GPU is busy too (off: only when idle, as a probe is).
    allow_busy: bool = False
    #: A recommendation older than this (its oldest point) is not applied.
    max_age_seconds: Annotated[float, Field(gt=0)] = 86400.0
    #: Seconds between the controller's passes (apply, check, roll back).
    interval_seconds: Annotated[float, Field(ge=1, le=3600)] = 30.0

    @model_validator(mode="after")
    def _workload_named(self) -> "ApplyConfig":
        if self.mode != "off" and not self.workload:
            raise ValueError(f"mode {self.mode} needs workload: the probe (or probe/preset) this node serves")
        if self.workload:
            probe = self.workload.split("/", 1)[0]
            known = _probe_names()
            if known is not None and probe not in known:
                raise ValueError(f"workload {self.workload!r}: unknown probe {probe!r}; "
                                 f"known: {', '.join(known)}")
        return self


#: The rolling window ``probes.max_gpu_time_ratio`` is a share of, seconds (a day).
GPU_TIME_WINDOW_SECONDS = 86400.0


def run_floor_seconds(config: "Config", schedule: ScheduleConfig) -> tuple[float, str] | None:
    """The least one run of a per-GPU ``schedule`` takes, seconds, and how that was reckoned: its
    points (one on a read-only node, else one per cap) times one point's measured windows, which no
    faster start-up or settle removes. None where not known (the interconnect probe; a probe child
    with no vocabulary handed in)."""
    if _is_node_probe(schedule.probe):
        return None
    probes = config.probes
    points = 1 if probes.read_only else max(1, len({str(c) for c in schedule.caps}))
    simulated = probes.executor == "simulated" or (probes.executor == "auto" and config.device.backend == "simulated")
    if simulated:
        repeats = schedule.options.get("repeats", 1)
        repeats = repeats if isinstance(repeats, int) and not isinstance(repeats, bool) and repeats > 0 else 1
        point = probes.simulated_measure_seconds * repeats
    else:
        names = vocabulary() if _vocabulary is not None or _vocabulary_source is not None else None
        if names is None or names.point_window_seconds is None:  # a check we may skip, never a wiring bug
            return None
        try:
            point = names.point_window_seconds(schedule.probe, dict(schedule.options), schedule.preset)
        except ValueError:  # bad options: the schedule's own check names them
            return None
    return points * point, f"{points} point(s) x {point:g} s measured"


class Config(_Strict):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    web: WebConfig = WebConfig()
    device: DeviceConfig = DeviceConfig()
    simulation: SimulationConfig = SimulationConfig()
    sampler: SamplerConfig = SamplerConfig()
    attribution: AttributionConfig = AttributionConfig()
    probes: ProbesConfig = ProbesConfig()
    health: HealthConfig = HealthConfig()
    apply: ApplyConfig = ApplyConfig()

    @model_validator(mode="after")
    def _apply_is_measured(self) -> "Config":
        """A mode that changes caps needs cap sweeps of its workload: nothing else recommends or checks it."""
        apply = self.apply
        if apply.mode in ("canary", "on"):
            if self.probes.read_only:
                raise ValueError(f"apply.mode {apply.mode} changes power caps, but probes.read_only is true; "
                                 "use mode advise on a read-only node, or set probes.read_only: false")
        if apply.mode != "off" and apply.workload:
            probe, _, preset = apply.workload.partition("/")
            names = vocabulary() if preset else None
            DEFAULT_PRESET = names.default_presets if names is not None else {}  # noqa: N806
            # A schedule without a preset runs the probe's default preset, not any preset (issue 51).
            if not any(s.probe == probe and (not preset or (s.preset or DEFAULT_PRESET.get(probe, preset)) == preset)
                       for s in self.probes.schedules):
                runs = sorted({f"{s.probe}/{s.preset or DEFAULT_PRESET.get(s.probe, 'default')}"
                               for s in self.probes.schedules if s.probe == probe})
                raise ValueError(f"apply.workload {apply.workload!r}: no probes.schedules entry runs it, "
                                 "so nothing recommends or checks a cap for it"
                                 + (f" (the schedules run {', '.join(runs)})" if runs else ""))
        gpus = self.simulation.gpus if self.device.backend == "simulated" else None
        if apply.canary_gpus is not None and gpus is not None and (missing := [
                i for i in apply.canary_gpus if i >= gpus]):
            raise ValueError(f"apply.canary_gpus: GPU {', '.join(map(str, missing))} does not exist "
                             f"(this node has {gpus} GPUs, indices 0-{gpus - 1})")
        return self

    @model_validator(mode="after")
    def _schedules_fit_their_time(self) -> "Config":
        """Each schedule's interval (or cron window) must hold one of its runs, and one run must fit the
        GPU-time share: else it could never complete in time, or never start."""
        problems: list[Exception] = []
        budget = self.probes.max_gpu_time_ratio * GPU_TIME_WINDOW_SECONDS
        for number, schedule in enumerate(self.probes.schedules):
            floor = run_floor_seconds(self, schedule)
            if floor is None:
                continue
            need, how = floor
            where = ("probes", "schedules", number)
            for name in ("interval_seconds", "window_seconds"):
                value = getattr(schedule, name)
                if value is not None and value < need:
                    problems.append(field_problem(where + (name,), (
                        f"{value:g} s is shorter than one run of this {schedule.probe} schedule takes (at least "
                        f"{need:g} s: {how}); give at least {need:g} s, or fewer caps or repeats"), value))
            if need > budget:
                problems.append(field_problem(("probes", "max_gpu_time_ratio"), (
                    f"{self.probes.max_gpu_time_ratio:g} of a day is {budget:g} s, less than one run of schedule "
                    f"{number} ({schedule.probe}) takes (at least {need:g} s): it could never run"),
                    self.probes.max_gpu_time_ratio))
        if problems:
            raise type(problems[0])([p for exc in problems for p in exc.problems])  # type: ignore[attr-defined]
        return self

    @model_validator(mode="after")
    def _check_collectors(self) -> "Config":
        names = vocabulary() if self.sampler.collectors else None
        if names is None:
            return self
        known = names.collector_names
        unknown = sorted(set(self.sampler.collectors) - set(known))
        if unknown:
            raise ValueError(
                f"sampler.collectors: unknown collector(s) {', '.join(unknown)}; "
                f"known: {', '.join(known)}"
            )
        return self


#: The most problems one error lists, and the longest "got ..." value shown: a file of thousands of bad
#: values (or one huge one) gets a message a terminal can show, not megabytes (issue 61).
MAX_PROBLEMS_SHOWN = 20
MAX_VALUE_CHARS = 200


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxstring = 2, 4, 4, 4, 60


def _shown(value: Any) -> str:
    """A bad value's repr, bounded: nested lists print a level or two, then at most MAX_VALUE_CHARS."""
    text = _SHORT.repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _format_validation_error(source: str, error: ValidationError) -> str:
    lines = [f"{source}: invalid configuration ({error.error_count()} problem(s)):"]
    for item in error.errors()[:MAX_PROBLEMS_SHOWN]:
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see docs/configuration.md)"
        value = item.get("input")
        # a section's own check gets the whole section (a model or a mapping): its repr says nothing
        # ("got ApplyConfig(m..._seconds=30.0)"); the message names what is wrong
        got = "" if isinstance(value, (BaseModel, dict)) else f" (got {_shown(value)})"
        lines.append(f"  - {where[:MAX_VALUE_CHARS]}: {message[:4 * MAX_VALUE_CHARS]}{got}")
    if error.error_count() > MAX_PROBLEMS_SHOWN:
        lines.append(f"  - ... and {error.error_count() - MAX_PROBLEMS_SHOWN} more")
    return "\n".join(lines)


#: Settings read once at start: a reload that changes one warns and keeps the running value.
#: (dotted path, why). docs/configuration.md lists the same table; tests/test_reload.py checks both.
RESTART_ONLY: tuple[tuple[str, str], ...] = (
    ("web.listen_address", "the HTTP socket is bound at start"),
    ("web.telemetry_path", "the routes are built at start"),
    ("web.config_file", "the file named at start is watched (its contents do reload)"),
    ("device", "the GPU backend is opened at start"),
    ("simulation", "the simulated GPUs are built at start"),
    ("sampler", "the sampling lanes start with the daemon"),
    ("probes.state_dir", "the power-cap journal, GPU locks and child records live there"),
    ("probes.executor", "the probe executor is built at start"),
    ("probes.timeout_seconds", "the probe executor is built at start"),
    ("probes.torch_device", "the probe executor is built at start"),
    ("probes.simulated_measure_seconds", "the probe executor is built at start"),
    ("probes.history", "the history file is opened at start"),
    ("health", "the health monitor (its thresholds and interval) is built at start"),
)


def _get(config: BaseModel, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _with(config: BaseModel, dotted: str, value: Any) -> Any:
    head, _, rest = dotted.partition(".")
    if not rest:
        return config.model_copy(update={head: value})
    return config.model_copy(update={head: _with(getattr(config, head), rest, value)})


def restart_only_changes(running: Config, new: Config) -> list[str]:
    """The restart-only settings (dotted paths) whose values differ between two configs."""
    return [path for path, _ in RESTART_ONLY if _get(running, path) != _get(new, path)]


def keep_restart_only(running: Config, new: Config) -> Config:
    """``new`` with every restart-only setting put back to the running value."""
    for path in restart_only_changes(running, new):
        new = _with(new, path, _get(running, path))
    return new


def config_from_mapping(data: Any, source: str = "<config>") -> Config:
    """Validate an already-parsed mapping; ConfigError names the source and fields."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    required = _vocabulary_required.set(True)
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(source, error)) from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid configuration: nested too deeply") from None
    except ValueError as error:  # raised by model validators outside the schema's wrapping
        raise ConfigError(f"{source}: invalid configuration: {error}") from None
    finally:
        _vocabulary_required.reset(required)


#: The largest config file read (a real one is a few KiB; a fleet's with many schedules tens).
MAX_CONFIG_BYTES = MAX_FILE_BYTES


def load_config(path: Path | str | None, *, required: bool = False) -> Config:
    """Read and validate a YAML config file.

    ``path=None`` uses the default path if it exists, else defaults. ``required``
    makes a missing file an error (used for an explicit ``--config``).
    """
    if path is None:
        path = DEFAULT_CONFIG_PATH
        if not path.exists():
            return Config()
    path = Path(path)
    try:
        size = path.stat().st_size if path.is_file() else 0
        if size > MAX_CONFIG_BYTES:  # refused before it is read: a 60 MB file once parsed 20 s in silence
            raise ConfigError(f"{path}: {size / 2**20:.0f} MiB is not a gpuperfd config (one is a few KiB; the "
                              f"most read is {MAX_CONFIG_BYTES // 2**20} MiB): is this the right file?")
        with path.open("rb") as handle:  # bounded: /dev/zero or an endless pipe is refused, not read forever
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES // 2**20} MiB is not a gpuperfd config "
                              "(one is a few KiB): is this the right file?")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: config file not found") from None
        return Config()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read config file: {error}") from None
    try:
        data = safe_load_strict(text)
        _apply_mode_as_written(text, data)
    except DuplicateKeyError as error:
        raise ConfigError(f"{path}: {error.problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    return config_from_mapping(data, source=str(path))


def _apply_mode_as_written(text: str, data: Any) -> None:
    """``apply.mode`` as the file spells it. YAML 1.1 reads a bare on/off, but also yes/no/true/false/y/n,
    as a boolean: ``mode: yes`` must not mean ``on`` (the mode that changes every cap; issue 51). So a
    boolean there is replaced by the word written, which only on and off of the four modes pass."""
    apply = data.get("apply") if isinstance(data, dict) else None
    if not isinstance(apply, dict) or not isinstance(apply.get("mode"), bool):
        return
    root = yaml.compose(text)
    for key, value in getattr(root, "value", []):
        if getattr(key, "value", None) == "apply" and isinstance(value, yaml.MappingNode):
            for sub_key, sub_value in value.value:
                if getattr(sub_key, "value", None) == "mode" and isinstance(sub_value, yaml.ScalarNode):
                    word = sub_value.value
                    apply["mode"] = word.lower() if word.lower() in ("on", "off") else word


def config_with_flags(
    path: Path | str | None, flags: dict[str, Any], simulate: int | None = None
) -> Config:
    """A config file (validated alone first, so errors name its own fields) with command-line
    flags applied and the result validated as one.

    ``flags`` maps dotted keys (``"web.listen_address"``) to values; None values are skipped.
    ``simulate`` switches to that many simulated GPUs.
    """
    if simulate is not None and not 1 <= simulate <= 64:  # named as typed, not as simulation.gpus
        raise ConfigError(f"--simulate {simulate}: give 1 to 64 simulated GPUs")
    data: dict[str, Any] = {}
    if path is not None:
        data = load_config(path, required=True).model_dump(mode="json", exclude_unset=True)
    if simulate is not None:
        flags = {**flags, "device.backend": "simulated", "simulation.gpus": simulate}
    for dotted, value in flags.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return config_from_mapping(data, source=f"{path or 'defaults'} (with command-line flags)")


def env_config_path() -> str | None:
    """The config path from GPUPERFD_CONFIG, for systemd/k8s environments."""
    return os.environ.get("GPUPERFD_CONFIG") or None

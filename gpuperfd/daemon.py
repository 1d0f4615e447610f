"""Wiring of the long-running daemon: config -> backend -> sampler -> registry -> HTTP.

Start-up order matters: the backend opens (a missing driver fails here, with a
hint to use --simulate), one synchronous sample fills the store so the first
scrape has data, then the background lanes and the HTTP server start. SIGTERM
and SIGINT stop everything in reverse order.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry

from gpuperfd.apply.controller import ApplyController
from gpuperfd.apply.metrics import ApplyMetrics
from gpuperfd.apply.policy import ApplySettings
from gpuperfd.attribution.allocations import PodResourcesWatcher, kubelet_required
from gpuperfd.caps.holds import NoSuchGpu, ReleaseError
from gpuperfd.caps.journal import CapJournal, journals_for, restore_all
from gpuperfd.config import (
    RESTART_ONLY,
    Config,
    ConfigError,
    ProbesConfig,
    WebConfig,
    keep_restart_only,
    parse_listen_address,
    restart_only_changes,
)
from gpuperfd.device.base import Backend, Device
from gpuperfd.device.errors import DeviceError, DriverNotFound
from gpuperfd.device.factory import open_backend, selected_devices
from gpuperfd.health.monitor import HealthMonitor
from gpuperfd.health.verdict import node_verdict_json
from gpuperfd.probe_data.interconnect import InterconnectResult
from gpuperfd.probing.child.standby import StandbyChildren
from gpuperfd.probing.gates.admission import Admission, memory_limit
from gpuperfd.probing.gates.turns import GpuTurns
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.interconnect.metrics import InterconnectMetrics, result_publisher
from gpuperfd.probing.interconnect.service import InterconnectService
from gpuperfd.probing.metrics import ProbeMetrics, ResultAgeCollector
from gpuperfd.probing.scheduling.scheduler import ProbeScheduler
from gpuperfd.probing.scheduling.service import ProbeService
from gpuperfd.system import sdnotify
from gpuperfd.system.memory import release_free_memory
from gpuperfd.telemetry.collectors import CollectorSet, build_collectors
from gpuperfd.telemetry.exporter import Exporter, process_registry, process_version
from gpuperfd.telemetry.sampler import Sampler
from gpuperfd.web.connections import Limits, raise_fd_limit
from gpuperfd.web.landing import landing_page
from gpuperfd.web.server import Response, Route, WebServer, metrics_route
from gpuperfd.web.status import gpu_status

if TYPE_CHECKING:
    from gpuperfd.probing.executors import Executor
    from gpuperfd.web.watcher import WebConfigWatcher

log = logging.getLogger(__name__)


def web_config_watcher(config: Config) -> WebConfigWatcher | None:
    """The web config's watcher when one is configured. TLS and basic auth code (ssl contexts,
    bcrypt) is imported only then: an unconfigured daemon's footprint does not carry it."""
    if not config.web.config_file:
        return None
    from gpuperfd.web.watcher import WebConfigWatcher

    return WebConfigWatcher(config.web.config_file)


def health_state_dir(config: Config) -> Path | None:
    """Where the verdicts are kept across restarts; None keeps them in memory only.

    Simulated GPUs with neither a ``simulation.state_file`` nor a state directory of their own
    have no identity beyond the process: kept in the node's default directory, their verdicts and
    first-start GPU list would leak into every later, unrelated simulated run on the machine
    (a run with fewer GPUs would see "GPU missing").
    """
    if (config.device.backend == "simulated" and config.simulation.state_file is None
            and config.probes.state_dir == ProbesConfig().state_dir):
        return None
    return config.probes.state_dir


def node_uuids(backend: Backend) -> list[str]:
    """The UUID of every GPU the driver lists now (lost or unreadable ones are left out)."""
    uuids = []
    for device in backend.devices():
        try:
            uuids.append(device.info().uuid)
        except DeviceError as exc:
            log.warning("gpu %d: cannot read its identity: %s", device.index, exc)
    return uuids


def probe_executor(config: Config, backend_name: str, metrics: ProbeMetrics) -> tuple[Executor, Admission | None]:
    """The probe executor and the host-memory admission of its children (docs/operations.md), the
    admission's state on the probe series; no admission where the executor starts no child (the simulator)."""
    from gpuperfd.probing.executors import choose_executor, starts_children

    if not starts_children(config, backend_name):
        return choose_executor(config, backend_name), None
    admission = Admission(*memory_limit(config.probes.memory_budget))
    admission.listeners.append(metrics.set_admission)
    admission.peaks.listeners.append(lambda _probe, _peak: metrics.set_admission(admission.state()))
    metrics.set_admission(admission.state())
    if config.probes.enabled:
        log.info(admission.describe())
    return choose_executor(config, backend_name, on_peak=admission.peaks.record), admission


def open_backend_waiting(config: Config, sleep: Callable[[float], None] = time.sleep) -> Backend:
    """Open the backend; while the driver is missing, retry for ``device.driver_wait_seconds``.

    A node that boots the daemon before the NVIDIA driver is loaded then starts
    cleanly once it appears, instead of crash-looping. DriverNotFound propagates
    when the wait is 0 or runs out.
    """
    deadline = time.monotonic() + config.device.driver_wait_seconds
    delay = 1.0
    while True:
        try:
            backend = open_backend(config)
            backend.devices()  # NVML initializes here
            return backend
        except DriverNotFound as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s; retrying in %.0f s (device.driver_wait_seconds)", exc, delay)
            sleep(delay)
            delay = min(delay * 2, 30.0)


#: The sampler's clock; the idle tracker reads readings' times on the same one.
SAMPLER_CLOCK: Callable[[], float] = time.monotonic


def build_sampler(config: Config, backend: Backend, devices: list[Device], collectors: CollectorSet,
                  tracker: IdleTracker) -> Sampler:
    """The background sampler of the enabled collectors; every reading also goes to the idle tracker."""
    return Sampler(
        backend,
        devices,
        collectors.collectors,  # event-driven xid is fed by the watcher, not read
        interval_seconds=config.sampler.interval_seconds,
        intervals=collectors.intervals,
        call_timeout_seconds=config.device.call_timeout_seconds,
        xid_enabled=collectors.xid_enabled,
        clock=SAMPLER_CLOCK,
        listeners=[tracker.observe],
    )


def build_interconnect(config: Config, backend: Backend, service: ProbeService,
                       publish: Callable[[InterconnectResult], None] | None = None) -> InterconnectService:
    """The interconnect schedules' runner beside the probe service; its executor (workers per GPU, or
    the simulated node's) is built at its first run. ``publish``: the interconnect series of a run."""
    from gpuperfd.probing.executors import choose_interconnect_executor

    return InterconnectService(service, lambda: choose_interconnect_executor(config, backend)[0], publish)


def build_probe_service(
    config: Config, backend_name: str, devices: list[Device], sampler: Sampler, tracker: IdleTracker,
    metrics: ProbeMetrics, pod_resources: PodResourcesWatcher | None,
) -> ProbeService:
    """The probe service: its executor and host-memory admission, history file, allocation gate,
    and the sampler re-reading a GPU's cap after each change."""
    executor, admission = probe_executor(config, backend_name, metrics)
    # who holds each GPU, and the host memory of its child: the rounds', standby children's and
    # (through the service) interconnect runs' and apply mode's one owner of GPU turns
    turns = GpuTurns([device.index for device in devices], admission)
    history = config.probes.history
    kubernetes = config.attribution.kubernetes
    service = ProbeService(
        config.probes,
        devices,
        executor,
        metrics,
        tracker,
        HistoryWriter(config.probes.history_path, history.max_bytes, history.backups)
        if config.probes.history_path is not None else None,
        on_cap_change=sampler.cap_changed,
        allocations=pod_resources.state if pod_resources is not None else None,
        kubelet_socket=kubernetes.socket if kubelet_required(kubernetes.required) else None,
        admission=admission,
        # Every journal write first records its directory in the node's registry (fixed, not a
        # setting), so a later start finds it whatever probes.state_dir then says.
        journal=CapJournal.for_config(config),
        standby=standby_children(executor, turns),
        turns=turns,
    )
    return service


def standby_children(executor: Executor, turns: GpuTurns) -> StandbyChildren | None:
    """Children started before their GPU qualifies, where probes run in children (issue 50: the spawn
    and imports, most of a probe's time from the qualifying moment, are then paid before it), and where
    the simulator charges a child's imports (issue 60: it saves them as the real one does)."""
    from gpuperfd.probing.child.session import ChildProcessExecutor
    from gpuperfd.probing.simulated.probe import SimulatedExecutor

    if isinstance(executor, SimulatedExecutor) and executor.cost_scale <= 0:
        return None  # nothing to save
    if not isinstance(executor, (ChildProcessExecutor, SimulatedExecutor)):
        return None
    executor.standby = StandbyChildren(executor.new_child, executor.timeout_seconds, turns)
    return executor.standby


def build_health(config: Config, sampler: Sampler, backend: Backend) -> HealthMonitor | None:
    """The per-GPU verdicts (None when ``health.enabled`` is off), and the NFD feature file it rewrites."""
    if not config.health.enabled:
        return None
    listeners = []
    if config.health.nfd_features_file is not None:
        from gpuperfd.health.nfd import NfdFeatureFile

        listeners.append(NfdFeatureFile(config.health.nfd_features_file))
    return HealthMonitor(
        sampler, health_state_dir(config), config.probes.history_path,
        node_uuids=node_uuids(backend),
        thresholds=config.health.thresholds, interval_seconds=config.health.interval_seconds,
        listeners=listeners,
    )


def build_apply(config: Config, devices: list[Device], probes: ProbeService, health: HealthMonitor | None,
                tracker: IdleTracker, sampler: Sampler) -> ApplyController:
    """Apply mode (docs/apply.md): the controller reads the probe service's points and the verdicts,
    shares the service's journal and GPU turns (its changes wait in line with the rounds), and tells the
    sampler and the service about the caps it holds."""
    idle_seconds = config.probes.idle_seconds
    controller = ApplyController(
        ApplySettings.from_config(config.apply), devices, probes.journal,
        verdicts=health.verdicts if health is not None else None,
        idle=lambda index: tracker.idle_for(index) >= idle_seconds,
        metrics=ApplyMetrics(), held_caps=probes.held_caps, on_cap_change=sampler.cap_changed,
        busy_now=probes.gate.claimed_now, turns=probes.turns)
    probes.point_listeners.append(controller.observe)
    probes.turns.listeners.append(controller.gpu_released)
    if problems := controller.refusals(controller.settings):
        raise ConfigError("; ".join(problems))
    if (note := controller.canary_note()) is not None:
        log.warning("%s", note)
    return controller


def build_exporter(sampler: Sampler, backend_name: str, probe_registry: CollectorRegistry, probe_metrics: ProbeMetrics,
                   auth_registry: CollectorRegistry | None, health: HealthMonitor | None,
                   interconnect: tuple[CollectorRegistry, Callable[[], int]] | None = None,
                   apply_registry: tuple[CollectorRegistry, Callable[[], int]] | None = None) -> Exporter:
    """/metrics: the readings, the probe and interconnect series, process_*, the web auth counter, apply
    mode and the verdicts."""
    ages = CollectorRegistry(auto_describe=False)
    ages.register(ResultAgeCollector(probe_metrics))  # an age changes every second: rendered each scrape
    registries: list[tuple[CollectorRegistry, Callable[[], int] | None]] = [
        (probe_registry, probe_metrics.version), (ages, None), (process_registry(), process_version)]
    if interconnect is not None:
        registries.append(interconnect)
    if apply_registry is not None:
        registries.append(apply_registry)
    if auth_registry is not None:
        registries.append((auth_registry, None))
    return Exporter(sampler, backend_name, registries, extra_families=[health.families] if health is not None else [])


def build_web_server(web: WebConfig, routes: dict[str, Route], watcher: WebConfigWatcher | None = None,
                     auth_registry: CollectorRegistry | None = None,
                     post_routes: dict[str, Route] | None = None) -> WebServer:
    """The HTTP server on ``web.listen_address`` with its connection limits (not started); with a web
    config, its TLS and basic auth, the auth gate counting its refusals in ``auth_registry``
    (gpuperf_web_auth_refused_total, on /metrics)."""
    host, port = parse_listen_address(web.listen_address)
    raise_fd_limit()  # connections are capped below the open-files limit; take what the hard limit allows
    server = WebServer(host, port, routes, limits=Limits(
        max_connections=web.max_connections,
        max_requests=web.max_requests,
        workers=web.workers,
        header_timeout=web.header_timeout_seconds,
        tls_handshake_timeout=web.tls_handshake_timeout_seconds,
        idle_timeout=web.idle_timeout_seconds,
    ), inline_paths=frozenset({web.telemetry_path, "/healthz"}),  # both answer from cached state
        post_routes=post_routes)
    if watcher is not None and auth_registry is not None:
        from gpuperfd.web.security import secure_web_server

        auth_registry.register(secure_web_server(server, watcher))
    return server


def _json(status: int, body: object) -> Response:
    """A JSON answer of the API (values JSON cannot hold, such as a path, as their text)."""
    return Response(status, (json.dumps(body, default=str) + "\n").encode(), "application/json")


def free_gpus(words: str, node: list[int]) -> list[int]:
    """The GPUs a ``POST /api/v1/free?gpus=`` names, each once, in order (none named: every GPU of the
    node). ValueError naming the bad word or a GPU this node lacks: nothing is handed over then (issue 61:
    ``gpus=7`` answered 200 with an empty list, ``gpus=0,0,1`` handed GPU 0 over twice)."""
    words = words.replace(" ", "")
    if not words:
        return list(node)
    try:
        gpus = list(dict.fromkeys(int(word) for word in words.split(",") if word))
    except ValueError:
        raise ValueError(f"gpus: GPU indices separated by commas (e.g. gpus=0,1), got {words[:100]!r}") from None
    if missing := [gpu for gpu in gpus if gpu not in node]:
        raise ValueError(f"gpus: GPU {', '.join(map(str, missing))} is not on this node (its GPUs: "
                         f"{', '.join(map(str, node)) or 'none'}); nothing handed over")
    return gpus


class Daemon:
    """One running gpuperfd: start(), then wait() until a signal, then stop().

    Built in one pass, each part from what the parts before it returned: the web config (first,
    so a bad TLS or auth file fails before anything else), the GPUs, telemetry (collectors and
    their sampler), probing (idle tracker, service, scheduler), the health verdicts, and the
    exporter with the HTTP server that serves them all.
    """

    def __init__(
        self,
        config: Config,
        backend: Backend | None = None,
        reload_config: Callable[[], Config] | None = None,
    ) -> None:
        self.config = config
        # The web config first: a bad TLS/auth file exits 2 even on a node without GPUs.
        self.web_config = web_config_watcher(config)
        #: Re-reads the config (file plus command-line flags) on SIGHUP; None: reload unsupported.
        self.reload_config = reload_config
        self._reload_requested = threading.Event()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.backend = backend if backend is not None else open_backend_waiting(config)
        self.devices = selected_devices(self.backend, config)
        self.tracker = IdleTracker(config.probes.idle_utilization_threshold, clock=SAMPLER_CLOCK)
        collectors = build_collectors(config)
        #: Polls the kubelet's PodResources API on its own thread (None when the allocation collector is off).
        self.pod_resources = collectors.pod_resources
        self.sampler = build_sampler(config, self.backend, self.devices, collectors, self.tracker)
        self.probe_registry = CollectorRegistry(auto_describe=True)
        self.probe_metrics = ProbeMetrics(self.probe_registry)
        self.probes = build_probe_service(config, self.backend.name, self.devices, self.sampler, self.tracker,
                                          self.probe_metrics, self.pod_resources)
        #: The per-GPU verdict (docs/health.md): evaluated on its own thread from cached readings.
        self.health = build_health(config, self.sampler, self.backend)
        # The interconnect (node) probe: its series in a registry of their own; each run is heard by the verdicts.
        interconnect_registry = CollectorRegistry(auto_describe=True)
        interconnect_metrics = InterconnectMetrics(interconnect_registry)
        publish = result_publisher(interconnect_metrics, self.backend, self.devices,
                                   [self.health.interconnect_seen] if self.health is not None else [])
        self.scheduler = ProbeScheduler(self.probes, [d.index for d in self.devices],
                                        interconnect=build_interconnect(config, self.backend, self.probes, publish))
        #: Apply mode: holds the recommended cap where the operator opted in (off by default).
        self.apply = build_apply(config, self.devices, self.probes, self.health, self.tracker, self.sampler)
        #: The web config's refusal counter (gpuperf_web_auth_refused_total) on /metrics, when one is configured.
        auth_registry = CollectorRegistry(auto_describe=True) if self.web_config is not None else None
        self.exporter = build_exporter(self.sampler, self.backend.name, self.probe_registry, self.probe_metrics,
                                       auth_registry, self.health, (interconnect_registry, interconnect_metrics.version),
                                       (self.apply.metrics.registry, self.apply.metrics.version)
                                       if self.apply.metrics is not None else None)
        self.web = build_web_server(config.web, self._routes(), self.web_config, auth_registry,
                                    {"/api/v1/free": self._free_api, "/api/v1/apply/release": self._release_api})
        self._watchdog = sdnotify.WatchdogPinger(self.sampler.healthy)

    def restore_caps(self) -> list[str]:
        """Put back any power cap a crashed run left changed (before anything else runs).

        Every state directory an earlier instance may have journaled in is searched (the
        configured one and every one in the node's registry), so a state_dir changed by a
        reload or an edited config hides nothing. Entries a live process owns (a CLI sweep,
        another daemon) are left to that owner.
        """
        return restore_all(journals_for(self.config), self.devices)

    def end_leftover_children(self) -> list[int]:
        """End probe children a SIGKILLed earlier instance left running (before any probe)."""
        from gpuperfd.probing.child.runner import end_leftover_children

        return end_leftover_children(self.config.probes.state_dir)

    def _routes(self) -> dict:
        telemetry_path = self.config.web.telemetry_path
        return {
            telemetry_path: metrics_route(self.exporter.render),
            "/healthz": self._healthz,
            "/api/v1/health": self._health_api,
            "/api/v1/gpus": self._gpus_api,
            "/api/v1/apply": self._apply_api,
            "/": lambda _h: Response(
                200,
                landing_page(
                    self.sampler, self.backend.name, telemetry_path, self.probes.latest(), self.config.probes.max_slowdown,
                    self.health.verdicts() if self.health is not None else None, self.probes.sweeps(),
                    self.scheduler.coverage(), self.scheduler.gap_states(),
                ),
                "text/html; charset=utf-8",
            ),
        }

    def _health_api(self, _handler: object) -> Response:
        """Every GPU's verdict and the node's (its worst GPU's); same gate (TLS, auth) as /metrics."""
        if self.health is None:
            body = {"error": "health verdicts are off (health.enabled: false)"}
            return _json(404, body)
        body = node_verdict_json(self.health.verdicts(), self.health.node)
        return _json(200, body)

    def _gpus_api(self, _handler: object) -> Response:
        """Each GPU's state now (web/status.py; what ``gpuperfd top`` draws); same gate as /metrics."""
        body = gpu_status(self.sampler.store.snapshot(), self.sampler.interval_seconds, self.backend.name,
                          self.probes.latest(), self.health.verdicts() if self.health is not None else None,
                          self.probes.sweeps(), self.config.probes.max_slowdown,
                          coverage=self.scheduler.coverage(),
                          applied={s["gpu"]: s for s in self.apply.status()}, gaps=self.scheduler.gap_states())
        return _json(200, body)

    def _free_api(self, handler: object) -> Response:
        """POST /api/v1/free[?gpus=0,1]: the scheduler (Slurm's epilog, deploy/slurm/) hands GPUs it just freed
        to the probes, which then need not wait out probes.idle_seconds (every other check stands). A write:
        refused unless basic auth is on (web.config_file), and then behind it like every request."""
        if (refused := self._write_refused("handing GPUs over")) is not None:
            return refused
        query = parse_qs(urlsplit(getattr(handler, "path", "")).query)
        try:
            gpus = free_gpus(",".join(query.get("gpus", [])), [d.index for d in self.devices])
        except ValueError as exc:
            return _json(400, {"error": str(exc)})
        handed = self.scheduler.hand_off(gpus)
        log.info("GPU(s) %s handed over as free by the scheduler", handed or "none of this node's")
        return _json(200, {"handed_over": handed})

    def _write_refused(self, what: str) -> Response | None:
        """A write (POST) is refused (403) unless basic auth is on (web.config_file); then it passes the
        same gate as every request. None: allowed."""
        if self.web_config is not None and self.web_config.current().auth_required:
            return None
        return _json(403, {"error": f"{what} needs basic auth: set web.config_file with basic_auth_users"})

    def _release_api(self, handler: object) -> Response:
        """POST /api/v1/apply/release?gpu=N: the operator gives GPU N, whose cap they set by hand, back to
        apply mode (docs/apply.md; the same as ``gpuperfd apply --release N``). A write: basic auth only."""
        if (refused := self._write_refused("giving a GPU back to apply mode")) is not None:
            return refused
        words = parse_qs(urlsplit(getattr(handler, "path", "")).query).get("gpu", [])
        if len(words) != 1 or not words[0].strip().isdigit():
            return _json(400, {"error": f"gpu: one GPU index (e.g. gpu=1), got {','.join(words) or 'none'!r}"})
        try:
            hold = self.apply.release(int(words[0]))
        except ReleaseError as exc:
            return _json(404 if isinstance(exc, NoSuchGpu) else 409, {"error": str(exc)})
        return _json(200, {"released": int(words[0]), "operator_watts": hold.watts, "held_since": hold.since})

    def _apply_api(self, _handler: object) -> Response:
        """Apply mode per GPU: the cap held or advised and why, every rollback in words (docs/apply.md)."""
        settings = self.apply.settings
        body = {"mode": settings.mode, "workload": settings.probe + (f"/{settings.preset}" if settings.preset else ""),
                "budget_ratio": settings.budget_ratio, "gpus": self.apply.status()}
        return _json(200, body)

    def _healthz(self, _handler: object) -> Response:
        lost_now = self.sampler.lost()  # one store snapshot, not one per GPU: /healthz is served on the loop
        lost = [d.index for d in self.devices if d.index in lost_now]
        body = {"status": "ok", "gpus": len(self.devices), "gpus_lost": lost}
        return _json(200, body)

    @property
    def port(self) -> int:
        return self.web.port

    def start(self) -> None:
        log.info("backend %s: %d GPU(s): %s", self.backend.name, len(self.devices), [d.index for d in self.devices])
        self.end_leftover_children()
        restored = self.restore_caps()
        if restored:
            log.warning("restored power caps left by an earlier run: %s", "; ".join(restored))
        self.probes.publish_original_caps()
        if self.pod_resources is not None:
            self.pod_resources.poll_once()  # the first scrape and probe gate see the allocations
            self.pod_resources.start()
        self.sampler.sample_once()
        self.sampler.start()
        if self.health is not None:
            self.health.evaluate_once()  # the first scrape and request see a verdict
            self.health.start()
        self.web.start()
        self.scheduler.apply(self.config.probes)
        self.scheduler.start()
        self.apply.start(self.config.apply.interval_seconds)
        release_free_memory()  # start-up's garbage: the idle daemon keeps only what it uses
        sdnotify.ready(f"{len(self.devices)} GPU(s), listening on {self.config.web.listen_address}")
        self._watchdog.start()
        log.info("listening on %s (metrics at %s)", self.config.web.listen_address, self.config.web.telemetry_path)

    def stop(self) -> None:
        log.info("stopping")
        sdnotify.stopping()
        self._watchdog.stop()
        self.scheduler.stop()
        self.probes.stop()
        reverted = self.apply.stop()  # every applied cap back to the operator's, read back
        if reverted:
            log.warning("apply: %s", "; ".join(reverted))
        self.restore_caps()  # a sweep that could not restore in time is restored here
        self.web.stop()
        if self.health is not None:
            self.health.stop()
        self.sampler.stop()
        if self.pod_resources is not None:
            self.pod_resources.stop()
        self.backend.close()
        log.info("stopped")

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if signum is not None:
            log.info("received %s", signal.Signals(signum).name)
        self._stopping.set()
        self._wake.set()

    def request_reload(self, _signum: int | None = None, _frame: FrameType | None = None) -> None:
        self._reload_requested.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

    def reload(self) -> bool:
        """Apply a re-read config; an invalid one is logged and the running one kept."""
        if self.reload_config is None:
            log.warning("reload requested but this daemon was started without a config loader")
            return False
        sdnotify.reloading()
        try:
            new = self.reload_config()
        except ConfigError as exc:
            log.error("reload rejected, keeping the running configuration: %s", exc)
            sdnotify.ready()
            return False
        if problems := self.apply.refusals(ApplySettings.from_config(new.apply)):
            log.error("reload rejected, keeping the running configuration: %s", "; ".join(problems))
            sdnotify.ready()
            return False
        if self.web_config is not None:
            self.web_config.reload()
        why = dict(RESTART_ONLY)
        for path in restart_only_changes(self.config, new):
            log.warning("reload: %s changed; it takes effect after a restart (%s); keeping the running value",
                        path, why[path])
        new = keep_restart_only(self.config, new)
        logging.getLogger().setLevel(new.log_level.upper())
        self.tracker.utilization_threshold = new.probes.idle_utilization_threshold
        self.scheduler.apply(new.probes)
        reverted = self.apply.configure(ApplySettings.from_config(new.apply))
        self.apply.interval_seconds = new.apply.interval_seconds
        if reverted:
            log.warning("reload: apply: %s", "; ".join(reverted))
        self.config = new
        log.info("configuration reloaded: %d probe schedule(s)", len(new.probes.schedules))
        sdnotify.ready()
        return True

    def wait(self) -> None:
        """Block until SIGTERM/SIGINT; handle SIGHUP reloads in this (main) thread."""
        while not self._stopping.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._reload_requested.is_set() and not self._stopping.is_set():
                self._reload_requested.clear()
                log.info("received SIGHUP: reloading configuration")
                self.reload()

"""The :class:`Fleet` orchestrator: starts the daemons and Prometheus, backfills, stops them."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpuperfd.device.simulated import (
    simulated_uuid,
)
from gpuperfd.fleet.alerting import (
    ALERTMANAGER_DIR,
    WebhookRecorder,
    alertmanager_test_config,
)
from gpuperfd.fleet.backfill import healthy_history, healthy_run_records, history_timestamps
from gpuperfd.fleet.prometheus import (
    LOOPBACK_OPENER,
    accelerate_rules,
    free_ports,
    http_get_json,
    prometheus_config,
)
from gpuperfd.fleet.spec import (
    DAY_SECONDS,
    GLOBAL_RULE_FILES,
    GLOBAL_RULES_DIR,
    INCIDENT_SLOW_CALL,
    INCIDENT_XID,
    REPO_ROOT,
    RULE_FILES,
    RULES_DIR,
    SLURM_JOB,
    FleetGpu,
    FleetNode,
    FleetPod,
    FleetSpec,
    daemon_config,
    degraded_layout,
    kubelet_pods,
    pod_layout,
    slurm_cgroup,
    slurm_node,
)
from gpuperfd.fleet.tiers import global_config, hashmod, shard_config

log = logging.getLogger(__name__)


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
        alertmanager: str = "prometheus-alertmanager",
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
        # Debian names the binary prometheus-alertmanager; upstream's tarball, alertmanager.
        self.alertmanager_bin = alertmanager if shutil.which(alertmanager) or alertmanager != "prometheus-alertmanager" \
            else "alertmanager"
        self.alertmanager_port = 0
        self.alertmanager_process: subprocess.Popen | None = None
        #: What Alertmanager sent (FleetSpec.alertmanager), None before start().
        self.webhook: WebhookRecorder | None = None
        #: Shard servers by index and the global one (FleetSpec.shards): (port, process).
        self.shard_servers: dict[int, tuple[int, subprocess.Popen | None]] = {}
        self.global_server: tuple[int, subprocess.Popen | None] | None = None
        self.python = python
        self.nodes: list[FleetNode] = []
        #: Who holds which GPU (FleetSpec.pods), set by plan().
        self.pods: list[FleetPod] = []
        #: The fake kubelets (gpuperfd.fleet.kubelet.FakeKubelet) by node index, and their socket folder.
        self.kubelets: dict[int, Any] = {}
        self._socket_dir: Path | None = None
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

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def shard_url(self, shard: int) -> str:
        return f"http://127.0.0.1:{self.shard_servers[shard][0]}"

    @property
    def global_url(self) -> str:
        assert self.global_server is not None, "not a two-tier fleet (FleetSpec.shards)"
        return f"http://127.0.0.1:{self.global_server[0]}"

    def shard_of(self, instance: str) -> int:
        """The shard whose hashmod keeps ``instance`` (FleetSpec.shards)."""
        return hashmod(instance, self.spec.shards)

    def plan(self) -> None:
        """Choose ports, UUIDs and defects (idempotent; start() calls it)."""
        if self.nodes:
            return
        spec = self.spec
        ports = free_ports(spec.nodes + 1)
        # A two-tier fleet needs every shard to hold a node: pick ports until hashmod spreads them.
        for _ in range(200):
            if not spec.shards or len({hashmod(f"127.0.0.1:{port}", spec.shards) for port in ports[:-1]}) == spec.shards:
                break
            ports = free_ports(spec.nodes + 1)
        else:
            raise RuntimeError(f"no ports that spread {spec.nodes} nodes over {spec.shards} shards")
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
        self.pods = pod_layout(spec)

    # -- start ------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> "Fleet":
        """Backfill, then start the daemons and Prometheus; on any failure stop what started."""
        for tool in (self.prometheus_bin, self.promtool_bin):
            if shutil.which(tool) is None:
                raise FileNotFoundError(f"{tool} not found (apt-get install prometheus)")
        if self.spec.alertmanager and shutil.which(self.alertmanager_bin) is None:
            raise FileNotFoundError(f"{self.alertmanager_bin} not found (apt-get install prometheus-alertmanager)")
        self.plan()
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            rule_files = self._write_rules()
            self._backfill()
            self._start_kubelets()
            started = time.monotonic()
            for node in self.nodes:
                self._start_daemon(node)
            for node in self.nodes:
                self._wait_daemon(node, started + timeout)
            self.timings["daemons"] = time.monotonic() - started
            if self.spec.alertmanager:
                self._start_alertmanager(timeout)
            self._start_prometheus(rule_files, timeout)
            if self.spec.shards:
                self._start_tiers(rule_files, timeout)
            self.started_at = time.time()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_rules(self, rules_dir: Path | None = None, names: tuple[str, ...] = RULE_FILES,
                     subdir: str = "rules") -> list[Path]:
        rules_dir = rules_dir or self.rules_dir
        if not self.spec.accelerated_rules:
            return [rules_dir / name for name in names]
        target = self.workdir / "prometheus" / subdir
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in names:
            source = rules_dir / name
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

    def _start_kubelets(self) -> None:
        """One fake kubelet per node with pods, before the daemons, so their first List finds it.

        The sockets sit in a short folder under /tmp: a unix socket path must stay under
        108 bytes, which a deep workdir would not.
        """
        nodes = sorted({pod.node for pod in self.pods})
        if not nodes:
            return
        try:
            from gpuperfd.fleet.kubelet import FakeKubelet
        except ImportError as exc:
            raise RuntimeError(f"a fleet with pods needs grpcio and grpcio-tools (pip install 'gpuperfd[test]'): {exc}") \
                from exc
        self._socket_dir = Path(tempfile.mkdtemp(prefix="gpuperfd-kl-", dir="/tmp"))
        for index in nodes:
            node = self.nodes[index]
            node.kubelet_socket = self._socket_dir / f"{node.name}.sock"
            self.kubelets[index] = FakeKubelet(node.kubelet_socket, kubelet_pods(self.pods, index, self.spec.model)).start()

    def _popen(self, cmd: list[str], log_path: Path, cwd: Path) -> subprocess.Popen:
        handle = log_path.open("wb")
        self._logs.append(handle)
        # The daemons run the gpuperfd this module belongs to (a worktree's, say), not whichever
        # one the interpreter would find from their working directory.
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)
        return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def _start_daemon(self, node: FleetNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        node.config_path.write_text(yaml.safe_dump(daemon_config(node, self.spec), sort_keys=False), encoding="utf-8")
        # The daemon's own past (its health checks' baselines): the same healthy points Prometheus got.
        now = time.time()
        with (node.directory / "history.jsonl").open("w", encoding="utf-8") as history:
            for gpu in node.gpus:
                history.writelines(line + "\n" for line in healthy_run_records(gpu, self.spec, now))
        node.proc_root.mkdir(parents=True, exist_ok=True)
        node.process = self._popen(
            [self.python, "-m", "gpuperfd", "run", "--config", str(node.config_path)], node.log_path, node.directory
        )
        if node.index == slurm_node(self.spec):
            # The daemon's probe processes (its own PID, the simulated executor) then belong to a
            # Slurm job. Written as soon as the PID exists, long before the first probe
            # (first_run_delay_seconds after the daemon is up), so no identity is read without it.
            (node.proc_root / str(node.process.pid)).mkdir()
            (node.proc_root / str(node.process.pid) / "cgroup").write_text(slurm_cgroup(SLURM_JOB), encoding="utf-8")

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
        config = prometheus_config([node.instance for node in self.nodes], rule_files, self.spec)
        config["global"]["external_labels"] = {"runbook_base_url": self.spec.runbook_base_url}
        if self.spec.alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]}
        self.prometheus_process = self._launch_prometheus("prometheus", config, self.prometheus_port, timeout)

    def _launch_prometheus(self, name: str, config: dict[str, Any], port: int, timeout: float) -> subprocess.Popen:
        """Start one Prometheus server from ``config`` under workdir/``name`` and wait until it is ready."""
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=True)
        config_path = directory / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        started = time.monotonic()
        process = self._popen(
            [
                self.prometheus_bin,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={directory / 'data'}",
                # The backfilled blocks reach 7 days back; the default 15 d would keep them
                # too, but a longer retention keeps them whatever the history length.
                "--storage.tsdb.retention.time=30d",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            directory / "prometheus.log",
            directory,
        )
        try:
            self._wait_ready(name, process, f"http://127.0.0.1:{port}/-/ready", directory / "prometheus.log", timeout)
        except BaseException:
            process.kill()  # not yet known to stop(): end it here
            process.wait()
            raise
        self.timings[name] = time.monotonic() - started
        return process

    def _wait_ready(self, name: str, process: subprocess.Popen, url: str, log_path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.tail(log_path)}")
            try:
                with LOOPBACK_OPENER.open(url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name} not ready:\n{self.tail(log_path)}")

    def _start_alertmanager(self, timeout: float) -> None:
        """The webhook recorder, then Alertmanager with the repository's config pointed at it."""
        self.webhook = WebhookRecorder().start()
        directory = self.workdir / "alertmanager"
        directory.mkdir(parents=True, exist_ok=True)
        source = ALERTMANAGER_DIR / "alertmanager.yml"
        config = alertmanager_test_config(source.read_text(encoding="utf-8"), self.webhook.url)
        config_path = directory / "alertmanager.yml"
        config_path.write_text(
            f"# GENERATED by gpuperfd.fleet from {source.relative_to(REPO_ROOT)}: short timings, "
            "receivers -> the fleet's webhook.\n" + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        self.alertmanager_port = free_ports(1)[0]
        started = time.monotonic()
        self.alertmanager_process = self._popen(
            [
                self.alertmanager_bin,
                f"--config.file={config_path}",
                f"--storage.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                "--cluster.listen-address=",  # one instance: no gossip port
            ],
            directory / "alertmanager.log",
            directory,
        )
        self._wait_ready("alertmanager", self.alertmanager_process, self.alertmanager_url + "/-/ready",
                         directory / "alertmanager.log", timeout)
        self.timings["alertmanager"] = time.monotonic() - started

    def _start_tiers(self, rule_files: list[Path], timeout: float) -> None:
        """FleetSpec.shards shard servers (the same rules, hashmod share of the targets) and a global one."""
        spec = self.spec
        targets = [node.instance for node in self.nodes]
        evaluation = spec.rule_interval if spec.accelerated_rules else "1m"
        ports = free_ports(spec.shards + 1)
        for shard in range(spec.shards):
            config = shard_config(shard, spec.shards, targets, rule_files, spec, evaluation)
            self.shard_servers[shard] = (ports[shard], None)
            self.shard_servers[shard] = (ports[shard], self._launch_prometheus(f"shard-{shard}", config, ports[shard], timeout))
        global_rules = self._write_rules(GLOBAL_RULES_DIR, GLOBAL_RULE_FILES, "global-rules")
        config = global_config([f"127.0.0.1:{ports[s]}" for s in range(spec.shards)], global_rules,
                               f"{spec.scrape_interval_seconds:g}s", evaluation)
        self.global_server = (ports[-1], None)
        self.global_server = (ports[-1], self._launch_prometheus("global", config, ports[-1], timeout))

    @staticmethod
    def tail(path: Path, lines: int = 40) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"({path}: {error})"

    # -- stop -------------------------------------------------------------------

    def _servers(self) -> dict[str, subprocess.Popen | None]:
        """Every non-daemon process by name (Prometheus, Alertmanager, shards, global)."""
        servers: dict[str, subprocess.Popen | None] = {"prometheus": self.prometheus_process}
        if self.spec.alertmanager:
            servers["alertmanager"] = self.alertmanager_process
        servers.update({f"shard-{s}": process for s, (_, process) in self.shard_servers.items()})
        if self.global_server is not None:
            servers["global"] = self.global_server[1]
        return servers

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every process this fleet started (by PID), SIGKILL what does not exit; idempotent."""
        processes = [node.process for node in self.nodes if node.process is not None]
        processes += [process for process in self._servers().values() if process is not None]
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
        if self.webhook is not None:
            self.webhook.stop()
        for kubelet in self.kubelets.values():
            kubelet.stop()
        self.kubelets.clear()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        for handle in self._logs:
            handle.close()
        self._logs.clear()
        if not self.keep and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def pause_probes(self) -> None:
        """Push every daemon's next sweep a day away (same schedules and caps, then SIGHUP).

        A sweep already running finishes; the probe gauges keep their last results
        (the schedules still run those caps, so a reload withdraws none of them), and
        every Prometheus tier converges on the same, no longer moving, inputs.
        """
        for node in self.nodes:
            config = yaml.safe_load(node.config_path.read_text(encoding="utf-8"))
            config["probes"]["first_run_delay_seconds"] = 86400
            for schedule in config["probes"]["schedules"]:
                schedule["interval_seconds"] = 86400  # a changed trigger: next run after the delay
            node.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            assert node.process is not None and node.process.poll() is None, f"{node.name} is not running"
            node.process.send_signal(signal.SIGHUP)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> dict[str, bool]:
        """Which processes are still alive, by name."""
        alive = {node.name: node.process is not None and node.process.poll() is None for node in self.nodes}
        alive.update({name: process is not None and process.poll() is None for name, process in self._servers().items()})
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
        ]
        if spec.alertmanager:
            lines.append(f"Alertmanager: {self.alertmanager_url}  (notifications -> {self.webhook.url if self.webhook else '-'};"
                         f" runbook links from {spec.runbook_base_url})")
        for shard, (port, _) in self.shard_servers.items():
            nodes = " ".join(n.name for n in self.nodes if self.shard_of(n.instance) == shard)
            lines.append(f"shard {shard}: http://127.0.0.1:{port}  ({nodes})")
        if self.global_server is not None:
            lines.append(f"global: {self.global_url}  (federates {{__name__=~\"gpuperf:.*:by_model\"}} from the shards)")
        lines += [
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
        for pod in self.pods:
            held = f"MIG device {pod.mig_slot} of GPU {pod.gpus[0]}" if pod.mig_slot is not None \
                else "GPU " + ", ".join(map(str, pod.gpus))
            lines.append(f"pod {pod.namespace}/{pod.name} on node-{pod.node}: {held} ({pod.resource})")
        if (slurm := slurm_node(spec)) is not None:
            lines.append(f"Slurm job {SLURM_JOB}: node-{slurm}'s probe processes, on every GPU of the node")
        lines.append("")
        lines.extend(f"{node.name}: {node.url}/metrics  (log: {node.log_path})" for node in self.nodes)
        return "\n".join(lines)



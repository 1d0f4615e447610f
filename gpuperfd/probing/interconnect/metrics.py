"""Prometheus series of the interconnect probe and the node's topology (issue 44).

:meth:`InterconnectMetrics.publish` is what the daemon (and any caller with a registry) calls when an
interconnect run ends; :meth:`InterconnectMetrics.publish_topology` when it has read the topology.
Per ordered pair the series carry the source GPU's ``gpu``/``uuid`` (so they count in that GPU's
series budget and join its other series) and the peer's ``peer``/``peer_uuid``; the all-reduce and
run series are per set of GPUs (``gpus``: "0,1"), node-level. Bounded: GPUs - 1 peers per GPU, the
configured sets and sizes. See docs/metrics.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuperfd.device.base import Backend, Device, GpuInfo, PeerLink
from gpuperfd.device.errors import DeviceError
from gpuperfd.device.interconnect_figures import expected_copy_bandwidth, expected_pair_links
from gpuperfd.health.interconnect import interconnect_inputs, read_topology
from gpuperfd.probe_data.interconnect import InterconnectResult

log = logging.getLogger(__name__)

PAIR_LABELS = ("gpu", "uuid", "peer", "peer_uuid")
SET_LABELS = ("gpus",)


def set_label(gpus: Sequence[int]) -> str:
    """The ``gpus`` label of a set: its indices in order, comma-separated ("0,1")."""
    return ",".join(str(gpu) for gpu in sorted(gpus))


class InterconnectMetrics:
    """The interconnect series, in the daemon's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.copy = gauge("gpuperf_interconnect_peer_copy_bandwidth_bytes_per_second",
                          "Peer copy bandwidth from this GPU to the peer (median of the last ok run), bytes/s.",
                          PAIR_LABELS)
        self.copy_expected = gauge(
            "gpuperf_interconnect_peer_copy_expected_bytes_per_second",
            "The figure this pair's copies are held to (docs/health.md: a healthy link's, or the node's own "
            "pairs of that kind after a run), bytes/s; NVLink pairs only.",
            PAIR_LABELS)
        self.links = gauge("gpuperf_nvlink_peer_links", "NVLinks up joining this GPU to the peer (directly or "
                           "through NVSwitch), from the topology; NVLink pairs only.", PAIR_LABELS)
        self.links_expected = gauge("gpuperf_nvlink_peer_links_expected",
                                    "NVLinks the board should have joining this GPU to the peer; NVLink pairs only.",
                                    PAIR_LABELS)
        self.bus = gauge("gpuperf_interconnect_allreduce_bus_bandwidth_bytes_per_second",
                         "All-reduce bus bandwidth (nccl-tests' busbw) of the last ok run, by size per rank, bytes/s.",
                         (*SET_LABELS, "bytes"))
        self.latency = gauge("gpuperf_interconnect_allreduce_latency_seconds",
                             "All-reduce latency of the last ok run, by size per rank and percentile (50, 99), seconds.",
                             (*SET_LABELS, "bytes", "percentile"))
        self.energy = gauge("gpuperf_interconnect_energy_joules",
                            "Energy of the set's GPUs over the last ok run, joules.", SET_LABELS)
        self.last_run = gauge("gpuperf_interconnect_last_run_timestamp_seconds",
                              "Unix time the set's last ok interconnect run started.", SET_LABELS)
        self.duration = gauge("gpuperf_interconnect_run_duration_seconds",
                              "Wall time of the set's last interconnect run, seconds.", SET_LABELS)
        self.runs = Counter("gpuperf_interconnect_runs", "Interconnect runs by result (ok, failed, skipped) and reason.",
                            (*SET_LABELS, "result", "reason"), registry=registry)
        self._version = 0

    def version(self) -> int:
        """Changes whenever a series changes (one writer: the interconnect service's thread), so the
        scrape path re-renders this registry only after a run."""
        return self._version

    def publish(self, result: InterconnectResult, infos: Mapping[int, GpuInfo],
                topology: Sequence[PeerLink] = (), links_per_gpu: Mapping[int, int] | None = None) -> None:
        """Count the run; on an ok run set the bandwidth, latency and energy series. ``infos``: the
        GPUs of the node by index (uuids); ``topology`` and ``links_per_gpu``: see :meth:`publish_topology`."""
        try:
            self._publish(result, infos, topology, links_per_gpu)
        finally:  # after the change: a scrape in between never caches the old text under the new version
            self._version += 1

    def _publish(self, result: InterconnectResult, infos: Mapping[int, GpuInfo], topology: Sequence[PeerLink],
                 links_per_gpu: Mapping[int, int] | None) -> None:
        label = set_label(result.gpus)
        self.runs.labels(label, result.status, result.failure_reason or "").inc()
        if result.wall_seconds is not None:
            self.duration.labels(label).set(result.wall_seconds)
        if not result.ok:
            return
        for copy in result.copies:
            self.copy.labels(*_pair(infos, copy.src, copy.dst)).set(copy.bandwidth_bytes_per_second)
        for reduction in result.allreduce:
            size = str(reduction.bytes)
            self.bus.labels(label, size).set(reduction.bus_bandwidth_bytes_per_second)
            self.latency.labels(label, size, "50").set(reduction.latency_p50_seconds)
            self.latency.labels(label, size, "99").set(reduction.latency_p99_seconds)
        if result.energy_joules is not None:
            self.energy.labels(label).set(result.energy_joules)
        if result.started_at is not None:
            self.last_run.labels(label).set(result.started_at)
        if topology:
            self.publish_topology(topology, infos, links_per_gpu)
            # the figure the verdict held each pair to (the node's own pairs), so the alert judges alike
            for (src, dst), (_, figure) in interconnect_inputs(result, topology, links_per_gpu or {})["copies"].items():
                if src in infos and dst in infos:
                    self.copy_expected.labels(*_pair(infos, src, dst)).set(figure)

    def publish_topology(self, topology: Sequence[PeerLink], infos: Mapping[int, GpuInfo],
                         expected_links: Mapping[int, int] | None = None) -> None:
        """Links up and expected per ordered NVLink pair, and each pair's expected copy figure.
        ``expected_links``: NVLinks per GPU on a healthy board (see ``device.interconnect_figures.expected_pair_links``)."""
        wanted = expected_pair_links(topology, expected_links or {})
        for link in topology:
            if link.path != "nvlink" or link.gpu_a not in infos or link.gpu_b not in infos:
                continue
            for src, dst in ((link.gpu_a, link.gpu_b), (link.gpu_b, link.gpu_a)):
                labels = _pair(infos, src, dst)
                self.links.labels(*labels).set(link.nvlink_links)
                want = wanted.get((link.gpu_a, link.gpu_b))
                if want is not None:
                    self.links_expected.labels(*labels).set(want)
                    healthy = PeerLink(link.gpu_a, link.gpu_b, "nvlink", want, link.via_nvswitch, link.p2p)
                    self.copy_expected.labels(*labels).set(expected_copy_bandwidth(healthy))
        self._version += 1


#: Called after the series with the run, the topology and each GPU's NVLink count, e.g. the health
#: monitor's ``interconnect_seen`` (the verdicts read the same run).
Listener = Callable[[InterconnectResult, list[PeerLink], dict[int, int]], None]


def result_publisher(metrics: InterconnectMetrics, backend: Backend, devices: Sequence[Device],
                     listeners: Sequence[Listener] = ()) -> Callable[[InterconnectResult], None]:
    """What the daemon hands the interconnect service as ``publish``: per run, the node's identities and
    topology are read once (a backend that cannot tell: no topology series, a warning), then the
    series are set and every listener hears the run."""
    def publish(result: InterconnectResult) -> None:
        infos = {}
        for device in devices:
            try:
                infos[device.index] = device.info()
            except DeviceError as exc:
                log.warning("interconnect series: GPU %d has no identity now (%s)", device.index, exc)
        try:
            topology, links = read_topology(backend, devices)
        except DeviceError as exc:
            log.warning("interconnect series: the GPU topology could not be read (%s)", exc)
            topology, links = [], {}
        metrics.publish(result, infos, topology, links)
        for listener in listeners:
            listener(result, topology, links)

    return publish


def _pair(infos: Mapping[int, GpuInfo], src: int, dst: int) -> tuple[str, str, str, str]:
    return str(src), infos[src].uuid if src in infos else "", str(dst), infos[dst].uuid if dst in infos else ""

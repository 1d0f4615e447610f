"""Background sampler: every device read happens here, never during a scrape.

For each GPU two threads ("lanes") run the collectors: the fast lane reads the
cheap fields every ``sampler.interval_seconds``; the slow lane reads the energy
counter (~3 ms on NVML) and PCIe throughput (~21 ms per direction) on their own
intervals, so a slow or hung call on one GPU delays neither the cheap fields nor
another GPU. A watcher thread blocks on the backend's XID event set. The node's topology (NVLinks
per GPU pair) is read here too, on its own thread, once a reader asks for it (:meth:`Sampler.want_topology`:
the health monitor): one owner of the NVML reads, the others take its last reading.

The latest :class:`Reading` of every (GPU, collector) sits in a
:class:`ReadingStore`; the exporter turns it into metric families at scrape time
and treats a reading older than its staleness bound as failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuperfd.device.base import Backend, Device, PeerLink
from gpuperfd.device.errors import DeviceError, GpuLost, NotSupported
from gpuperfd.telemetry.collectors.base import Collector, Point
from gpuperfd.telemetry.collectors.xid import XidCounts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """The outcome of one collector's read of one GPU."""

    points: tuple[Point, ...]
    ok: bool
    error: str | None
    duration_seconds: float
    timestamp: float  # monotonic clock at the end of the read


@dataclass(frozen=True)
class TopologyReading:
    """The node's last topology read: its pairs, or the error that stopped it (``links`` empty)."""

    links: tuple[PeerLink, ...]
    error: DeviceError | None
    #: Counts the reads: a reader takes a reading once (a new one has a higher number).
    number: int


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str

    @property
    def label_values(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)


def lost_gpus(readings: dict[tuple[int, str], Reading], interval_seconds: float) -> set[int]:
    """GPUs with a GpuLost reading no older than one sampling interval before their newest good one.

    A GPU that came back is up again one interval after its first good reads,
    not only once its slowest collector (PCIe, every 30 s) has read it again;
    a GpuLost from any call within the same sampling round keeps it down.
    """
    newest_ok: dict[int, float] = {}
    for (gpu, name), reading in readings.items():
        if name != "xid" and reading.ok:
            newest_ok[gpu] = max(newest_ok.get(gpu, reading.timestamp), reading.timestamp)
    return {
        gpu
        for (gpu, _), reading in readings.items()
        if reading.error == GpuLost.reason and reading.timestamp >= newest_ok.get(gpu, -1e18) - interval_seconds
    }


@dataclass(frozen=True)
class StoreSnapshot:
    """The store at one moment: what the exporter, the landing page and the verdicts read."""

    #: The store's version when it was taken (the exporter keeps its text while it stays the same).
    version: int
    #: The latest reading of every (GPU, collector).
    readings: dict[tuple[int, str], Reading]
    #: Each GPU's last good ``info`` points (its identity labels while it is lost).
    last_good_info: dict[int, tuple[Point, ...]]
    identities: dict[int, GpuIdentity]
    #: Error counts by (GPU, collector, reason).
    errors: dict[tuple[int, str, str], int]


class ReadingStore:
    """Latest readings and error counts; every method is thread-safe and cheap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[tuple[int, str], Reading] = {}
        self._last_good_info: dict[int, tuple[Point, ...]] = {}
        self._identities: dict[int, GpuIdentity] = {}
        self._errors: Counter[tuple[int, str, str]] = Counter()
        #: Bumped by every change: the exporter keeps its formatted text while it stays the same.
        self.version = 0

    def put(self, gpu: int, collector: str, reading: Reading) -> None:
        with self._lock:
            self.version += 1
            self._readings[(gpu, collector)] = reading
            if collector == "info" and reading.ok and reading.points:
                self._last_good_info[gpu] = reading.points
            if reading.error is not None:
                self._errors[(gpu, collector, reading.error)] += 1

    def count_error(self, gpu: int, collector: str, reason: str) -> None:
        with self._lock:
            self.version += 1
            self._errors[(gpu, collector, reason)] += 1

    def set_identity(self, identity: GpuIdentity) -> None:
        with self._lock:
            self.version += 1
            self._identities[identity.index] = identity

    def snapshot(self) -> StoreSnapshot:
        """Copies of everything, taken under one lock (they agree with each other and the version)."""
        with self._lock:
            return StoreSnapshot(self.version, dict(self._readings), dict(self._last_good_info),
                                 dict(self._identities), dict(self._errors))


class Sampler:
    """Runs collectors against devices on background threads."""

    def __init__(
        self,
        backend: Backend,
        devices: list[Device],
        collectors: Iterable[Collector],
        *,
        interval_seconds: float = 1.0,
        intervals: dict[str, float] | None = None,
        call_timeout_seconds: float = 5.0,
        xid_enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        listeners: Iterable[Callable[[int, str, Reading], None]] = (),
    ) -> None:
        self.backend = backend
        self.devices = devices
        self.collectors = [c for c in collectors if not c.event_driven]
        self.interval_seconds = interval_seconds
        self.intervals = {
            c.name: (intervals or {}).get(c.name) or c.default_interval_seconds or interval_seconds for c in self.collectors
        }
        self.call_timeout_seconds = call_timeout_seconds
        self.xid_enabled = xid_enabled
        self.clock = clock
        self.store = ReadingStore()
        self.xid_counts = XidCounts()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Called with (gpu index, collector name, reading) after every read.
        self.listeners: list[Callable[[int, str, Reading], None]] = list(listeners)
        #: How often the topology is read (None: nobody asked, it is not read).
        self.topology_interval_seconds: float | None = None
        self._topology: TopologyReading | None = None
        self._topology_lock = threading.Lock()

    # -- staleness ---------------------------------------------------------

    def stale_after(self, collector: str) -> float:
        """Age past which a reading is treated as failed (a hung or dead lane)."""
        interval = self.intervals.get(collector, self.interval_seconds)
        return max(3 * interval, interval + self.call_timeout_seconds)

    # -- reading -----------------------------------------------------------

    def _identify(self, device: Device) -> GpuIdentity | None:
        try:
            info = device.info()
        except DeviceError:
            return None
        identity = GpuIdentity(device.index, info.uuid)
        self.store.set_identity(identity)
        return identity

    def read_one(self, device: Device, collector: Collector) -> Reading:
        """Run one collector on one device and store the reading."""
        start = time.perf_counter()
        points: tuple[Point, ...] = ()
        error: str | None = None
        try:
            points = tuple(collector.read(device))
        except NotSupported:
            pass  # nothing to report is not a failure
        except DeviceError as exc:
            error = exc.reason
            log.debug("gpu %d collector %s: %s", device.index, collector.name, exc)
        except Exception:  # a bug in a collector must not stop the lane
            error = "unknown"
            log.exception("gpu %d collector %s failed", device.index, collector.name)
        duration = time.perf_counter() - start
        if error is None and duration > self.call_timeout_seconds:
            self.store.count_error(device.index, collector.name, "slow")
            log.warning("gpu %d collector %s took %.1f s", device.index, collector.name, duration)
        reading = Reading(points, error is None, error, duration, self.clock())
        self.store.put(device.index, collector.name, reading)
        for listener in self.listeners:
            listener(device.index, collector.name, reading)
        if error is None and collector.name == "info" and points:
            self._identify(device)
        return reading

    def refresh(self, gpu: int, collector_name: str) -> None:
        """Read one collector of one GPU now (e.g. power right after a cap change), so the
        served limit never lags what the sweep published."""
        for device in self.devices:
            if device.index == gpu:
                for collector in self.collectors:
                    if collector.name == collector_name:
                        self.read_one(device, collector)

    def cap_changed(self, gpu: int) -> None:
        """A GPU's power cap changed: read the collectors that publish it (``reads_power_cap``) now."""
        for collector in self.collectors:
            if collector.reads_power_cap:
                self.refresh(gpu, collector.name)

    def sample_once(self) -> None:
        """Read every collector of every device (and the topology, when wanted) once, in this thread
        (start-up, tests)."""
        for device in self.devices:
            self._identify(device)
            for collector in self.collectors:
                self.read_one(device, collector)
        self._publish_xid()
        if self.topology_interval_seconds is not None:
            self.read_topology()

    # -- the node's topology -------------------------------------------------

    def want_topology(self, interval_seconds: float) -> None:
        """Read the node's topology every ``interval_seconds`` (the shortest asked for) from now on,
        on the sampler's topology thread (started with the sampler)."""
        with self._topology_lock:
            current = self.topology_interval_seconds
            self.topology_interval_seconds = interval_seconds if current is None else min(current, interval_seconds)

    def read_topology(self) -> TopologyReading:
        """Read the node's topology now (``backend.topology()``) and keep it as the last reading."""
        try:
            links, error = tuple(self.backend.topology()), None
        except DeviceError as exc:
            links, error = (), exc
        with self._topology_lock:
            number = 1 if self._topology is None else self._topology.number + 1
            self._topology = TopologyReading(links, error, number)
            return self._topology

    def topology(self) -> TopologyReading | None:
        """The last topology reading (None before the first): no device call."""
        with self._topology_lock:
            return self._topology

    def _run_topology(self) -> None:
        while not self._stop.is_set():
            interval = self.topology_interval_seconds
            if interval is None:
                return
            if self._stop.wait(interval):
                return
            try:
                self.read_topology()
            except Exception:  # a bug must not stop the thread
                log.exception("reading the GPU topology failed")

    # -- threads -----------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        for device in self.devices:
            for lane, slow in (("fast", False), ("slow", True)):
                lane_collectors = [c for c in self.collectors if c.slow == slow]
                if lane_collectors:
                    thread = threading.Thread(
                        target=self._run_lane,
                        args=(device, lane_collectors),
                        name=f"sampler-gpu{device.index}-{lane}",
                        daemon=True,
                    )
                    self._threads.append(thread)
        if self.xid_enabled:
            self._threads.append(threading.Thread(target=self._watch_xid, name="xid-watcher", daemon=True))
        if self.topology_interval_seconds is not None:
            self._threads.append(threading.Thread(target=self._run_topology, name="sampler-topology", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask every lane to stop; a lane stuck in a device call is left (daemon thread)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def _run_lane(self, device: Device, collectors: list[Collector]) -> None:
        next_due = {c.name: 0.0 for c in collectors}
        while not self._stop.is_set():
            now = self.clock()
            for collector in collectors:
                if now >= next_due[collector.name]:
                    self.read_one(device, collector)
                    next_due[collector.name] = now + self.intervals[collector.name]
            wait = min(next_due.values()) - self.clock()
            if wait > 0:
                self._stop.wait(wait)

    def _watch_xid(self) -> None:
        unsupported_logged = False
        while not self._stop.is_set():
            try:
                events = self.backend.wait_xid_events(timeout_seconds=1.0)
            except NotSupported:
                if not unsupported_logged:
                    log.info("XID events are not supported on this node; xid counters stay at 0")
                    unsupported_logged = True
                self._publish_xid()
                self._stop.wait(30)
                continue
            except DeviceError as exc:
                for device in self.devices:
                    self.store.count_error(device.index, "xid", exc.reason)
                self._stop.wait(1.0)
                continue
            except Exception:
                log.exception("XID watcher failed; retrying")
                self._stop.wait(1.0)
                continue
            for event in events:
                log.warning("XID %d on gpu %d", event.xid, event.gpu_index)
                self.xid_counts.add(event)
            self._publish_xid()

    def _publish_xid(self) -> None:
        now = self.clock()
        for device in self.devices:
            points = tuple(self.xid_counts.points(device.index))
            self.store.put(device.index, "xid", Reading(points, True, None, 0.0, now))

    def healthy(self) -> bool:
        """True while the lanes keep producing readings (for the systemd watchdog)."""
        if not self.devices:
            return True
        readings = self.store.snapshot().readings
        now = self.clock()
        return any(now - r.timestamp <= self.stale_after(name) for (_, name), r in readings.items() if name != "xid")

    def lost(self) -> set[int]:
        """The GPUs whose newest reading (of any collector) says they are lost (one store snapshot)."""
        return lost_gpus(self.store.snapshot().readings, self.interval_seconds)

    def gpu_lost(self, gpu: int) -> bool:
        """True if this GPU's newest reading (of any collector) says it is lost."""
        return gpu in self.lost()

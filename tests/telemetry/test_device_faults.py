"""Device faults on simulated GPUs (every device call a collector uses x every fault kind) and probe faults.

The in-process matrix drives a Sampler and an Exporter on a fake clock (faults
sleep for real, a few milliseconds, so "slow" is measured as the sampler
measures it). The real-daemon test checks the same promises end to end: a call
that hangs for seconds does not slow scrapes, its collector goes stale, a lost
GPU is reported down and comes back, other GPUs never notice. The probe test
runs real child processes (tiny preset, CPU) that run out of memory, segfault,
hit a CUDA error or hang: each is counted with its reason, the daemon keeps
serving, the next probe runs, and no child is left behind.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.attribution.allocations import PodResourcesWatcher
from gpuperfd.attribution.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
)
from gpuperfd.config import FaultConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler

from child_processes import alive

#: Every device call a collector makes, and the collector that makes it.
CALLS = {
    "info": "info",
    "utilization": "utilization",
    "memory": "memory",
    "temperature_celsius": "temperature",
    "power_watts": "power",
    "energy_joules": "energy",
    "power_limits": "power",
    "clocks": "clocks",
    "clock_events": "clock_events",
    "pcie_throughput": "pcie",
    "ecc_errors": "ecc",
    "compute_processes": "processes",
    "mig_uuids": "allocation",
    "gpm_metrics": "gpm",
    "memory_temperature_celsius": "health",
    "remapped_rows": "health",
    "retired_pages": "health",
    "pcie_replays": "health",
    "gpu_recovery_action": "health",
    "pcie_link": "pcie_link",
    "violation_seconds": "violations",
    "codec_utilization": "codec",
    "nvlink": "nvlink",
    "mig_enabled": "mig",
    "mig_instances": "mig",
    "fabric_state": "fabric",
}
#: Where a collector makes several calls, the series each call feeds.
SERIES_OF_CALL = {
    "mig_uuids": set(),  # no MIG: the whole GPU's allocation is still listed
    "power_watts": {"gpuperf_power_draw_watts"},
    "power_limits": {
        "gpuperf_power_limit_watts",
        "gpuperf_power_limit_default_watts",
        "gpuperf_power_limit_min_watts",
        "gpuperf_power_limit_max_watts",
    },
    "memory_temperature_celsius": {"gpuperf_memory_temperature_celsius"},
    "remapped_rows": {"gpuperf_remapped_rows", "gpuperf_remapped_rows_pending", "gpuperf_remapped_rows_failure"},
    "retired_pages": {"gpuperf_retired_pages"},
    "gpu_recovery_action": {"gpuperf_gpu_recovery_action"},
    "pcie_replays": {"gpuperf_pcie_replays_total"},
    "mig_instances": {
        "gpuperf_mig_memory_used_bytes",
        "gpuperf_mig_memory_total_bytes",
        "gpuperf_mig_gpm_sm_active_ratio",
        "gpuperf_mig_gpm_tensor_active_ratio",
        "gpuperf_mig_gpm_dram_bandwidth_active_ratio",
    },
}
#: Series the simulated H100 never has (it remaps rows instead of retiring pages).
NEVER_ON_SIMULATED_H100 = {"gpuperf_retired_pages"}
KINDS = ("not_supported", "no_permission", "gpu_lost", "timeout", "unknown", "slow")
SELF_SERIES = {
    "gpuperf_gpu_up",
    "gpuperf_gpu_info",
    "gpuperf_collector_success",
    "gpuperf_collector_duration_seconds",
    "gpuperf_collector_age_seconds",
    "gpuperf_device_errors_total",
    "gpuperf_build_info",
    # xid counts come from the event watcher, not from a device getter
    "gpuperf_xid_errors_total",
    "gpuperf_xid_events_total",
}
CALL_TIMEOUT = 0.5  # seconds; a "slow" fault sleeps DELAY, which is longer. A healthy simulated read takes
# microseconds, but a loaded 2-core CI machine stalled one past 50 ms and later past 200 ms (0.6 s, a
# healthy GPU's "health" read beside a pcie_replays timeout on another: no path between them, the sim's
# fault sleeps outside every lock): the healthy GPUs then showed a spurious "slow" error. The reads
# under test also run with the garbage collector paused (a full collection of the test process's heap
# is such a stall); what they test is isolation between GPUs, not the machine's scheduling.
DELAY = 0.8
FAULTY_GPU = 1


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection inside (see CALL_TIMEOUT): a read's duration is the read's own."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def collector_series(collector: str) -> set[str]:
    return {spec.name for spec in COLLECTORS[collector].metrics}


def affected_series(call: str, kind: str) -> set[str]:
    """Series that must disappear from the faulty GPU for this fault."""
    collector = CALLS[call]
    if call == "info":
        return set()  # identity survives every fault (last good read)
    if kind == "not_supported":
        return SERIES_OF_CALL.get(call, collector_series(collector))
    return collector_series(collector)


class Scrape:
    """One parsed scrape: samples by (name, gpu) and a lookup helper."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, gpu: int | None = None, **labels: str) -> float | None:
        for sample in self.samples:
            if sample.name != name:
                continue
            if gpu is not None and sample.labels.get("gpu") != str(gpu):
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
        return None

    def names(self, gpu: int) -> set[str]:
        return {s.name for s in self.samples if s.labels.get("gpu") == str(gpu)}

    def keys(self, gpu: int) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        """Series identities (name and labels, no value) of one GPU."""
        return {(s.name, tuple(sorted(s.labels.items()))) for s in self.samples if s.labels.get("gpu") == str(gpu)}

    def errors(self, gpu: int) -> dict[tuple[str, str], float]:
        return {
            (s.labels["collector"], s.labels["reason"]): s.value
            for s in self.samples
            if s.name == "gpuperf_device_errors_total" and s.labels.get("gpu") == str(gpu)
        }


def make(clock, gpus: int = 3):
    # MIG on (2 instances each) so that every MIG call is made and its faults are seen
    mig = [{"gpu": gpu, "instances": 2} for gpu in range(gpus)]
    # An NVSwitch board, so the fabric collector has a state to read (and to lose)
    backend = SimulatedBackend(SimulationConfig(gpus=gpus, seed=7, mig=mig, topology="hgx"), clock=clock,
                               sleep=time.sleep)
    # Every GPU runs a process held by a pod, so the processes and allocation collectors have series to lose.
    for d in backend.devices():
        d.add_foreign_process(pid=4000 + d.index, memory_bytes=1 << 30)
    watcher = PodResourcesWatcher("/nonexistent/kubelet.sock", clock=clock)
    watcher.apply([
        PodResources(f"job-{d.index}", "team", (ContainerResources("main", (ContainerDevices("nvidia.com/gpu", (d.info().uuid,)),)),))
        for d in backend.devices()
    ])
    collectors = [
        cls(watcher) if name == "allocation" else cls() for name, cls in sorted(COLLECTORS.items()) if name != "xid"
    ]
    sampler = Sampler(
        backend, backend.devices(), collectors, interval_seconds=1.0, call_timeout_seconds=CALL_TIMEOUT, clock=clock
    )
    return backend, sampler, Exporter(sampler, backend.name)


def scrape(exporter: Exporter) -> Scrape:
    return Scrape(exporter.render().decode())


def test_matrix_covers_every_device_call_of_every_collector():
    """The matrix must grow with the collectors: every getter a collector calls is listed."""
    from gpuperfd.device.base import Device

    getters = {name for name in vars(Device) if not name.startswith("_")} - {"set_power_limit", "index"}
    assert set(CALLS) == getters
    assert set(CALLS.values()) == set(COLLECTORS) - {"xid"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_fault_on_one_call_of_one_gpu(clock, call, kind):
    backend, sampler, exporter = make(clock)
    gc.collect()
    with gc_paused():
        sampler.sample_once()
    before = scrape(exporter)
    collector = CALLS[call]
    assert before.value("gpuperf_collector_success", FAULTY_GPU, collector=collector) == 1.0

    backend.inject(FaultConfig(gpu=FAULTY_GPU, call=call, kind=kind, delay_seconds=DELAY))
    clock.advance(1.0)
    with gc_paused():
        sampler.sample_once()
    after = scrape(exporter)  # the exporter keeps rendering, and Prometheus can parse it

    # Other GPUs are undisturbed: same series, every collector fresh, no errors.
    for gpu in (0, 2):
        assert after.keys(gpu) == before.keys(gpu), f"gpu {gpu} series changed"
        for name in COLLECTORS:
            if name != "xid":
                assert after.value("gpuperf_collector_success", gpu, collector=name) == 1.0, (gpu, name)
        assert after.errors(gpu) == {}

    # The faulty GPU keeps its identity.
    uuid = backend.devices()[FAULTY_GPU]._info.uuid
    assert after.value("gpuperf_gpu_info", FAULTY_GPU, uuid=uuid) == 1.0

    gone = affected_series(call, kind)
    present = after.names(FAULTY_GPU)
    errors = after.errors(FAULTY_GPU)
    others = [c for c in COLLECTORS if c not in ("xid", collector)]
    if kind == "gpu_lost":
        assert after.value("gpuperf_gpu_up", FAULTY_GPU) == 0.0
        assert sampler.gpu_lost(FAULTY_GPU)  # /healthz lists it
        # docs/runbook.md#gpulost: identity, gpu_up and event counters only; no telemetry, no collector status
        assert present <= SELF_SERIES, present - SELF_SERIES
        for name in COLLECTORS:
            assert after.value("gpuperf_collector_success", FAULTY_GPU, collector=name) is None, name
        assert errors == {(collector, "gpu_lost"): 1.0}
    else:
        assert after.value("gpuperf_gpu_up", FAULTY_GPU) == 1.0
        if kind != "slow":
            assert not present & gone, present & gone
        for name in others:  # the GPU's other collectors still report
            assert after.value("gpuperf_collector_success", FAULTY_GPU, collector=name) == 1.0, name
            assert collector_series(name) & present or name == "info", name
        if kind == "not_supported":
            # Documented: a field the GPU lacks is left out; it is not a failure and not counted.
            assert after.value("gpuperf_collector_success", FAULTY_GPU, collector=collector) == 1.0
            assert errors == {}
            kept = collector_series(collector) - gone - NEVER_ON_SIMULATED_H100
            assert kept <= present  # power: draw unsupported leaves the limits (and the reverse)
        elif kind == "slow":
            # The read succeeds late: its values are served, and the lateness is counted.
            assert after.value("gpuperf_collector_success", FAULTY_GPU, collector=collector) == 1.0
            expected = collector_series(collector) - NEVER_ON_SIMULATED_H100
            assert expected <= present | ({"gpuperf_gpu_info"} if call == "info" else set())
            assert errors == {(collector, "slow"): 1.0}
            assert after.value("gpuperf_collector_duration_seconds", FAULTY_GPU, collector=collector) >= DELAY
        else:
            assert after.value("gpuperf_collector_success", FAULTY_GPU, collector=collector) == 0.0
            assert errors == {(collector, kind): 1.0}

    # The fault clears: the GPU is reported in full again.
    backend.clear_faults()
    clock.advance(1.0)
    sampler.sample_once()
    healed = scrape(exporter)
    assert healed.value("gpuperf_gpu_up", FAULTY_GPU) == 1.0
    assert healed.keys(FAULTY_GPU) - {k for k in healed.keys(FAULTY_GPU) if k[0] == "gpuperf_device_errors_total"} == (
        before.keys(FAULTY_GPU)
    )
    for name in COLLECTORS:
        if name != "xid":
            assert healed.value("gpuperf_collector_success", FAULTY_GPU, collector=name) == 1.0, name


@pytest.mark.parametrize("kind", ["gpu_lost", "no_permission", "timeout"])
def test_gpu_failing_from_the_first_read_is_still_listed(clock, kind):
    """A GPU whose identity could never be read still shows up (uuid ""), so alerts see it."""
    backend = SimulatedBackend(
        SimulationConfig(gpus=2, seed=1, faults=[FaultConfig(gpu=1, call="*", kind=kind, delay_seconds=0.0)]),
        clock=clock,
        sleep=time.sleep,
    )
    collectors = [cls() for name, cls in sorted(COLLECTORS.items()) if name != "xid"]
    sampler = Sampler(backend, backend.devices(), collectors, interval_seconds=1.0, clock=clock)
    sampler.sample_once()
    result = scrape(Exporter(sampler, backend.name))
    assert result.value("gpuperf_gpu_up", 0) == 1.0
    assert result.value("gpuperf_gpu_up", 1, uuid="") == (0.0 if kind == "gpu_lost" else 1.0)
    # A lost GPU has no collector status (gpu_up 0 says it); a failing one reports success 0.
    assert result.value("gpuperf_collector_success", 1, collector="power", uuid="") == (None if kind == "gpu_lost" else 0.0)
    assert result.errors(1)[("power", kind)] == 1.0


def test_lost_gpu_comes_back_after_its_fault_window(clock):
    """A fault with duration_seconds: down inside the window, reported again after it."""
    backend, sampler, exporter = make(clock, gpus=2)
    backend.inject(FaultConfig(gpu=1, call="*", kind="gpu_lost", after_seconds=5.0, duration_seconds=10.0))
    seen = []
    for _ in range(20):
        sampler.sample_once()
        result = scrape(exporter)
        seen.append((result.value("gpuperf_gpu_up", 1), result.value("gpuperf_power_draw_watts", 1) is not None))
        assert result.value("gpuperf_gpu_up", 0) == 1.0
        clock.advance(1.0)
    # t = 0..19 s: up for 0-4, lost for 5-14, up again from 15 with its series back.
    assert seen[:5] == [(1.0, True)] * 5
    assert seen[5:15] == [(0.0, False)] * 10
    assert seen[15:] == [(1.0, True)] * 5


def test_collector_that_raises_a_non_device_exception_is_contained(clock):
    """A bug in a collector (not a DeviceError) counts as unknown and stops nothing."""
    backend, sampler, exporter = make(clock, gpus=1)
    broken = next(c for c in sampler.collectors if c.name == "clocks")
    broken.read = lambda device: 1 / 0  # type: ignore[method-assign]
    sampler.sample_once()
    result = scrape(exporter)
    assert result.value("gpuperf_collector_success", 0, collector="clocks") == 0.0
    assert result.errors(0) == {("clocks", "unknown"): 1.0}
    assert result.value("gpuperf_collector_success", 0, collector="power") == 1.0


# --- the real daemon ---------------------------------------------------------------------

HANG_SECONDS = 3.0
DAEMON_CONFIG = f"""
device: {{backend: simulated, call_timeout_seconds: 0.3}}
sampler:
  interval_seconds: 0.2
  collectors: {{pcie: {{interval_seconds: 0.5}}, energy: {{interval_seconds: 0.5}}}}
simulation:
  gpus: 3
  seed: 3
  faults:
    # gpu 0: temperature hangs {HANG_SECONDS:g} s per call from t=2 s for 2 s; its ECC read always fails
    - {{gpu: 0, call: temperature_celsius, kind: slow, delay_seconds: {HANG_SECONDS}, after_seconds: 2, duration_seconds: 2}}
    - {{gpu: 0, call: ecc_errors, kind: unknown}}
    # gpu 1: lost from t=2 s to t=5 s, then back
    - {{gpu: 1, call: "*", kind: gpu_lost, after_seconds: 2, duration_seconds: 3}}
probes: {{state_dir: {{state}}, history: {{path: null}}}}
"""


class Scraper(threading.Thread):
    """Scrapes /metrics in a loop over one keep-alive connection; keeps (time, latency, Scrape)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.results: list[tuple[float, float, Scrape]] = []
        self.failures: list[str] = []

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                conn.request("GET", "/metrics")
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    self.failures.append(f"status {response.status}")
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                continue
            elapsed = time.monotonic() - start
            self.results.append((start, elapsed, Scrape(body.decode())))
            self.stop.wait(0.05)
        conn.close()


def test_real_daemon_hung_call_lost_gpu_and_recovery(start_daemon, tmp_path):
    spawned = time.monotonic()
    daemon = start_daemon(config_text=DAEMON_CONFIG.replace("{state}", str(tmp_path / "state")))
    scraper = Scraper(daemon.port)
    scraper.start()
    time.sleep(max(0.0, 2.0 + 2.0 + HANG_SECONDS + 1.5 - (time.monotonic() - spawned)))
    scraper.stop.set()
    scraper.join(15)
    assert not scraper.failures, scraper.failures[:5]
    results = scraper.results
    assert len(results) > 50

    hanging = [r for r in results if r[2].value("gpuperf_collector_success", 0, collector="temperature") == 0.0]
    lost = [r for r in results if r[2].value("gpuperf_gpu_up", 1) == 0.0]
    assert hanging, "the hung temperature read never went stale"
    assert lost, "gpu 1 was never reported lost"

    # Scrapes while the call hangs are as fast as the others: the scrape never waits on a device.
    hang_latencies = sorted(r[1] for r in hanging)
    other_latencies = sorted(r[1] for r in results if r not in hanging)
    print(f"\nscrapes: {len(results)}; while the call hung: {len(hang_latencies)}, median "
          f"{1000 * statistics.median(hang_latencies):.1f} ms, max {1000 * max(hang_latencies):.1f} ms; "
          f"otherwise median {1000 * statistics.median(other_latencies):.1f} ms, max {1000 * max(other_latencies):.1f} ms; "
          f"gpu 1 down in {len(lost)} scrapes")
    assert len(hang_latencies) >= 10
    assert max(hang_latencies) < 0.5, hang_latencies[-5:]  # the call itself takes 3 s
    assert statistics.median(hang_latencies) < 0.05, statistics.median(hang_latencies)

    for _, _, s in hanging:
        assert s.value("gpuperf_temperature_celsius", 0) is None  # stale reading not served
        # One caller in the library at a time (device/serial.py): the hung GPU's other calls are
        # refused, not queued behind it, and every other GPU keeps reading (asserted below).
        assert s.value("gpuperf_collector_success", 0, collector="energy") in (0.0, 1.0)
        assert s.value("gpuperf_collector_success", 2, collector="temperature") == 1.0  # other GPU unaffected
    for _, _, s in lost:
        assert s.value("gpuperf_gpu_info", 1) == 1.0  # identity kept
        assert s.value("gpuperf_power_draw_watts", 1) is None
        assert s.value("gpuperf_collector_success", 2, collector="power") == 1.0
    # gpu 2 saw nothing but, at most once per hung call, a read that waited behind it in the one-caller
    # gate (device/serial.py) for up to the call timeout and so counted "slow": never a failed read
    for _, _, s in results:
        assert s.value("gpuperf_gpu_up", 2) == 1.0
        errors = s.errors(2)
        assert {reason for _, reason in errors} <= {"slow"} and all(n <= 2 for n in errors.values()), errors
        for name in COLLECTORS:
            if name != "xid":
                assert s.value("gpuperf_collector_success", 2, collector=name) == 1.0, name

    final = results[-1][2]
    assert final.value("gpuperf_gpu_up", 1) == 1.0  # back after its window
    assert final.value("gpuperf_power_draw_watts", 1) is not None
    assert final.value("gpuperf_collector_success", 0, collector="temperature") == 1.0
    assert final.value("gpuperf_temperature_celsius", 0) is not None
    errors0, errors1 = final.errors(0), final.errors(1)
    assert errors0.get(("temperature", "slow"), 0) >= 1
    assert errors0.get(("energy", "timeout"), 0) >= 1  # refused while GPU 0's call hung (every 0.5 s)
    assert final.value("gpuperf_collector_success", 0, collector="energy") == 1.0  # and back after it
    assert errors0.get(("ecc", "unknown"), 0) >= 10  # every ECC read fails, counted each time
    assert final.value("gpuperf_collector_success", 0, collector="ecc") == 0.0
    assert errors1.get(("power", "gpu_lost"), 0) >= 1
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.log()


# --- probe faults in the daemon: real child processes running the tiny preset on the CPU ----

PROBE_CONFIG = """
device: {{backend: simulated}}
sampler: {{interval_seconds: 0.5}}
simulation: {{gpus: 2, seed: 1}}
probes:
  state_dir: {state}
  history: {{path: {state}/history.jsonl}}
  executor: child
  torch_device: cpu
  timeout_seconds: {timeout}
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0.5
  schedules:
    - {{probe: attention, preset: tiny, interval_seconds: 3600, gpus: [0], options: {{inject_fault: oom}}}}
    - {{probe: attention, preset: tiny, interval_seconds: 3600, gpus: [0], options: {{inject_fault: crash}}}}
    - {{probe: attention, preset: tiny, interval_seconds: 3600, gpus: [0], options: {{inject_fault: cuda_error}}}}
    - {{probe: attention, preset: tiny, interval_seconds: 3600, gpus: [1], options: {{inject_fault: hang}}}}
    - {{probe: attention, preset: tiny, interval_seconds: 10}}
"""
PROBE_TIMEOUT = 20.0  # a tiny child imports torch first: generous on a loaded 2-core machine
EXPECTED_FAILURES = {"0": {"oom", "crash", "cuda_error"}, "1": {"timeout"}}


def children_of(pid: int) -> dict[int, str]:
    """Live child processes of ``pid`` (pid -> command line), zombies included."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found[int(entry)] = f"[{fields[0]}] {cmdline}"
    return found


def probe_runs(text: str) -> dict[tuple[str, str, str], float]:
    """gpuperf_probe_runs_total by (gpu, result, reason)."""
    runs: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpuperf_probe_runs_total":
                key = (s.labels["gpu"], s.labels["result"], s.labels["reason"])
                runs[key] = runs.get(key, 0.0) + s.value
    return runs


def test_probe_oom_crash_cuda_error_and_hang_fail_cleanly_and_the_next_probe_runs(start_daemon, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("GPUPERFD_TEST_FAULTS", "1")  # the schedules' inject_fault needs the test-only switch
    import gpuperfd.probing.child.runner  # noqa: F401  (the probe package must import for this test)

    daemon = start_daemon(config_text=PROBE_CONFIG.format(state=tmp_path / "state", timeout=PROBE_TIMEOUT))
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    spawned: dict[int, str] = {}  # every probe child seen, and when faults were all counted
    faults_done_at: dict[str, dict[tuple[str, str, str], float]] = {}
    ok_after: dict[str, bool] = {"0": False, "1": False}
    scrape_latencies = []
    deadline = time.monotonic() + 150
    runs: dict[tuple[str, str, str], float] = {}
    while not all(ok_after.values()):
        assert time.monotonic() < deadline, f"timed out; runs so far: {runs}\n{daemon.log()[-3000:]}"
        assert daemon.proc.poll() is None, daemon.log()
        for pid, cmd in children_of(daemon.proc.pid).items():
            if "resource_tracker" not in cmd:  # multiprocessing's tracker lives as long as the daemon
                spawned.setdefault(pid, cmd)
        start = time.monotonic()
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        scrape_latencies.append(time.monotonic() - start)
        assert response.status == 200
        runs = probe_runs(text)
        for gpu, reasons in EXPECTED_FAILURES.items():
            failed = {reason for (g, result, reason), n in runs.items() if g == gpu and result == "failed" and n}
            if gpu not in faults_done_at and failed >= reasons:
                faults_done_at[gpu] = dict(runs)
            if gpu in faults_done_at:
                before = faults_done_at[gpu].get((gpu, "ok", ""), 0.0)
                ok_after[gpu] = runs.get((gpu, "ok", ""), 0.0) > before
        time.sleep(0.2)
    conn.close()

    print(f"\nprobe runs: {runs}; probe children seen: {len(spawned)}; max scrape {1000 * max(scrape_latencies):.0f} ms")
    # Every failure counted once, with its reason; nothing else failed or aborted.
    failures = {(g, reason): n for (g, result, reason), n in runs.items() if result != "ok"}
    assert failures == {(g, r): 1.0 for g, reasons in EXPECTED_FAILURES.items() for r in reasons}, runs
    assert len(spawned) >= 5, spawned  # 4 faults + at least 1 ok run, each in its own child
    # Wait for a moment with no probe running (the ok schedule repeats every 10 s), then every
    # child ever seen must be gone: none left running, orphaned or unreaped.
    quiet_deadline = time.monotonic() + 20
    while [c for c in children_of(daemon.proc.pid).values() if "resource_tracker" not in c]:
        assert time.monotonic() < quiet_deadline, children_of(daemon.proc.pid)
        time.sleep(0.1)
    assert not [pid for pid in spawned if alive(pid)], {pid: spawned[pid] for pid in spawned if alive(pid)}
    assert max(scrape_latencies) < 1.0, max(scrape_latencies)
    assert daemon.stop(signal.SIGTERM) == 0
    log = daemon.log()
    assert not [pid for pid in spawned if alive(pid)], "probe children outlived the daemon"
    assert "Traceback" not in log


def test_scheduled_probe_on_a_lost_gpu_is_counted_not_raised(tmp_path):
    from prometheus_client import CollectorRegistry

    from gpuperfd.config import ProbesConfig, ScheduleConfig
    from gpuperfd.probing.executors import simulated_executor
    from gpuperfd.probing.gates.idle import IdleTracker
    from gpuperfd.probing.metrics import ProbeMetrics
    from gpuperfd.probing.scheduling.service import ProbeService
    from gpuperfd.telemetry.collectors.base import Point
    from gpuperfd.telemetry.sampler import Reading

    backend = SimulatedBackend(SimulationConfig(gpus=1, seed=1))
    tracker = IdleTracker(0.05)
    tracker.observe(0, "utilization", Reading((Point("gpuperf_gpu_utilization_ratio", 0.0),), True, None, 0, 0))
    registry = CollectorRegistry()
    service = ProbeService(ProbesConfig(state_dir=tmp_path, idle_seconds=0), backend.devices(),
                           simulated_executor(0.01, seed=1), ProbeMetrics(registry), tracker)
    backend.inject(FaultConfig(gpu=0, call="*", kind="gpu_lost"))
    outcome = service.run(ScheduleConfig(probe="llm", interval_seconds=60), 0)
    assert outcome.result in ("skipped", "failed") and outcome.reason == "gpu_lost"

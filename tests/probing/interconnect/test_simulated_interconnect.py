"""The simulated interconnect probe: the reference node's figures, faults, aborts and bad sets."""

from __future__ import annotations

import threading

import pytest

from gpuperfd.config import DegradeConfig, InterconnectFaultConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor

GB = 1e9


def run(request: InterconnectRequest | None = None, abort: threading.Event | None = None,
        **config: object) -> InterconnectResult:
    node = SimulatedBackend(SimulationConfig(seed=3, **config))
    executor = SimulatedInterconnectExecutor(node.interconnect, seed=3)
    return executor.run(node.devices(), request or InterconnectRequest(allreduce_bytes=(1 << 20, 256 << 20, 1 << 30)),
                        abort or threading.Event())


def test_h200_pair_matches_the_reference_node() -> None:
    result = run(gpus=2, model="H200")
    assert result.ok and result.backend == "simulated"
    copies = {(c.src, c.dst): c.bandwidth_bytes_per_second for c in result.copies}
    assert set(copies) == {(0, 1), (1, 0)}
    assert all(370 * GB < bw < 385 * GB for bw in copies.values())
    bus = {r.bytes: r.bus_bandwidth_bytes_per_second for r in result.allreduce}
    assert 265 * GB < bus[256 << 20] < 277 * GB
    assert 309 * GB < bus[1 << 30] < 322 * GB
    small = next(r for r in result.allreduce if r.bytes == 1 << 20)
    assert 10e-6 < small.latency_p50_seconds < 40e-6 and small.latency_p99_seconds >= small.latency_p50_seconds
    assert all(r.sum_ok and r.ranks == 2 for r in result.allreduce)
    assert result.energy_joules and result.energy_joules > 0


def test_every_ordered_pair_of_a_chosen_set() -> None:
    result = run(InterconnectRequest(gpus=(1, 4, 6)), gpus=8)
    assert result.gpus == (1, 4, 6)
    assert sorted((c.src, c.dst) for c in result.copies) == [(1, 4), (1, 6), (4, 1), (4, 6), (6, 1), (6, 4)]
    assert all(r.ranks == 3 for r in result.allreduce)


def test_link_down_lowers_the_pair_in_proportion() -> None:
    result = run(gpus=2, interconnect_faults=[InterconnectFaultConfig(kind="link_down", gpu=0, links=9)])
    assert all(180 * GB < c.bandwidth_bytes_per_second < 200 * GB for c in result.copies)


def test_half_bandwidth_pair_slows_the_ring() -> None:
    healthy = run(gpus=4)
    slow = run(gpus=4, interconnect_faults=[InterconnectFaultConfig(kind="half_bandwidth", gpu=2, peer=3)])
    copies = {(c.src, c.dst): c.bandwidth_bytes_per_second for c in slow.copies}
    assert copies[(3, 2)] < 0.55 * copies[(0, 1)]
    big = lambda r: r.allreduce[-1].bus_bandwidth_bytes_per_second  # noqa: E731
    assert big(slow) < 0.6 * big(healthy)


def test_pcie_board_copies_at_pcie_speed() -> None:
    result = run(gpus=2, topology="pcie")
    assert all(40 * GB < c.bandwidth_bytes_per_second < 55 * GB for c in result.copies)


def test_wrong_answers_fail_the_sums() -> None:
    result = run(gpus=2, degrade=[DegradeConfig(gpu=1, wrong_results=True)])
    assert result.status == "failed" and result.failure_reason == "wrong_result"
    assert not any(r.sum_ok for r in result.allreduce)


def test_abort_stops_the_run() -> None:
    abort = threading.Event()
    abort.set()
    result = run(abort=abort, gpus=2)
    assert result.status == "skipped" and result.failure_reason == "preempted" and not result.copies


@pytest.mark.parametrize(("gpus", "match"), [((0, 7), "no GPU 7 on this node"), ((1,), "at least two"),
                                             ((0, 0), "named twice")])
def test_bad_sets_are_refused_by_name(gpus: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(InterconnectRequest(gpus=gpus), gpus=2)


def test_one_gpu_node_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two"):
        run(gpus=1)

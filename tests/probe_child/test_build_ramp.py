"""The load queued beside a compiled build (issue 60): its size on a board, and that only a compiled
GPU build queues it (the CPU path queues nothing and says so)."""

from __future__ import annotations

from gpuperfd.probe_child import harness
from gpuperfd.probe_child.build_ramp import MAX_LAUNCHES, MAX_SIDE, MIN_SIDE, ramp_count, ramp_side
from gpuperfd.probe_data.spec import ProbeSpec

GIB = 1 << 30


def test_the_side_is_the_largest_that_a_quarter_of_the_room_holds() -> None:
    assert ramp_side(140 * GIB, 2) == MAX_SIDE  # an idle H200: three 16384^2 bf16 matrices are 1.5 GiB
    assert ramp_side(4 * GIB, 2) == 8192  # a quarter is 1 GiB: 16384 (1.5 GiB) does not fit, 8192 does
    assert ramp_side(4 * GIB, 4) == 8192  # fp32: 0.75 GiB
    assert ramp_side(2 * GIB, 4) == 4096
    assert ramp_side(3 * MIN_SIDE * MIN_SIDE * 2 * 4, 2) == MIN_SIDE
    assert ramp_side(3 * MIN_SIDE * MIN_SIDE * 2 * 4 - 1, 2) is None  # no room worth ramping for


def test_the_count_fills_the_seconds_within_the_launch_bound() -> None:
    assert ramp_count(1.5, 0.013) == 115  # 16384^2 products on an H200
    assert ramp_count(1.5, 0.0017) == MAX_LAUNCHES  # 8192^2 products: the queue would block the CPU
    assert ramp_count(1.5, 3.0) == 1  # a slow board: one product, never none
    assert ramp_count(1.5, 0.0) == MAX_LAUNCHES


def test_a_cpu_build_queues_no_ramp_and_its_result_says_so() -> None:
    spec = ProbeSpec("vit", preset="tiny", device="cpu", repeats=1, measure_seconds=0.05,
                     warmup_seconds=0.0, busy_profile_seconds=0.0)
    prepared = harness.prepare(spec)
    assert prepared.ramp_products == 0
    result = harness.measure(prepared)
    assert result.status == "ok"
    assert result.extra["ramp_products"] == 0

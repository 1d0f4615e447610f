"""Settling by measurement (gpuperfd.probe_data.settle): steady slices, a controller's clock cycle, a bound."""

from __future__ import annotations

from gpuperfd.probe_data.settle import wait_steady


class _Load:
    """Slices of load on a fake clock: each returns the next (power W, SM clock) reading."""

    def __init__(self, readings: list[tuple[float | None, float | None]]) -> None:
        self.readings = list(readings)
        self.now = 0.0
        self.slices = 0

    def sample(self, seconds: float) -> tuple[float | None, float | None]:
        self.now += seconds
        reading = self.readings[min(self.slices, len(self.readings) - 1)]
        self.slices += 1
        return reading


def test_two_agreeing_slices_settle_at_once() -> None:
    load = _Load([(300.0, 1.98e9), (301.0, 1.98e9)])
    waited, steady = wait_steady(load.sample, 5.0, slice_seconds=0.25, clock=lambda: load.now)
    assert steady is True and load.slices == 2 and waited == 0.5


def test_a_clock_cycling_under_a_cap_settles_a_cycle_later_not_at_the_bound() -> None:
    """H100 under its cap: the SM clock swings 1,440-1,500 MHz once a second, so no two consecutive
    quarter-second slices agree within 1 %; a slice and the one a cycle before it do."""
    cycle = [(700.0, 1.44e9), (700.0, 1.47e9), (700.0, 1.50e9), (700.0, 1.47e9)]
    load = _Load(cycle * 10)
    waited, steady = wait_steady(load.sample, 5.0, slice_seconds=0.25, clock=lambda: load.now, cycle_seconds=1.0)
    assert steady is True and load.slices == 5 and waited == 1.25


def test_a_cycle_with_jitter_settles_on_the_means_of_two_cycles() -> None:
    """The same swing, but no phase repeats exactly: the means of the last two cycles agree."""
    clocks = [1.44, 1.47, 1.50, 1.47, 1.50, 1.455, 1.482, 1.44, 1.50, 1.47, 1.50, 1.44]
    load = _Load([(700.0, c * 1e9) for c in clocks])
    waited, steady = wait_steady(load.sample, 5.0, slice_seconds=0.25, clock=lambda: load.now, cycle_seconds=1.0)
    assert steady is True and load.slices == 8 and waited == 2.0


def test_a_ramp_does_not_settle_on_its_cycle_means() -> None:
    """Power still falling after a cap change: the last cycle's mean differs from the one before it."""
    ramp = [(700.0 - 20.0 * i, 1.98e9 - 0.03e9 * i) for i in range(40)]
    load = _Load(ramp)
    waited, steady = wait_steady(load.sample, 3.0, slice_seconds=0.25, clock=lambda: load.now, cycle_seconds=1.0)
    assert steady is False and waited >= 3.0


def test_no_telemetry_ends_the_wait_at_once() -> None:
    load = _Load([(None, None)])
    assert wait_steady(load.sample, 5.0, clock=lambda: load.now) == (0.25, None)


def test_slices_at_the_maximum_clock_are_steady_whatever_their_power() -> None:
    """An LLM at 450 W under a 700 W cap: its clock sits at the board's maximum while prefill and
    decode move each quarter-second's power by 8 %; no cap holds it, so nothing is settling."""
    top = 1.98e9
    load = _Load([(430.0, top), (468.0, top), (441.0, top), (475.0, top)])
    waited, steady = wait_steady(load.sample, 5.0, slice_seconds=0.25, clock=lambda: load.now, max_clock=top)
    assert steady is True and load.slices == 2
    below = _Load([(430.0, 1.90e9), (468.0, 1.90e9)] * 20)  # held below the maximum: power must agree
    waited, steady = wait_steady(below.sample, 1.0, slice_seconds=0.25, clock=lambda: below.now, max_clock=top)
    assert steady is False

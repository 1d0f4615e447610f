"""A GPU point's settle is judged from its own windows' power and clock trace (issue 60):
windows are set aside until two agree, so a point steady from its warm-up on pays no settle at all."""

from __future__ import annotations

import math
import time

import pytest

pytest.importorskip("torch")

from gpuperfd.config import SimulationConfig  # noqa: E402
from gpuperfd.device.simulated import WORKLOAD_PROFILES, SimulatedBackend  # noqa: E402
from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_child.context import Telemetry  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402

MAX_CLOCK = 1980e6


def _window(power: float | None, clock: float | None, seconds: float = 1.0) -> harness._Window:
    telemetry = Telemetry()
    if power is not None:
        telemetry.power.append(power)
    if clock is not None:
        telemetry.sm_clock.append(clock)
    return harness._Window(seconds, telemetry, stats=None, energy=None, iterations=1)


def _judge(settle: harness._Settle, windows: list[harness._Window]) -> list[list[harness._Window]]:
    held, decisions = None, []
    for window in windows:
        kept = settle.judge(held, window)
        held = None if kept else window
        decisions.append(kept)
    return decisions


def test_two_agreeing_windows_are_both_kept_and_cost_no_settle() -> None:
    settle = harness._Settle(bound=5.0, max_clock=MAX_CLOCK)
    a, b, c = _window(500.0, 1.5e9), _window(505.0, 1.505e9), _window(501.0, 1.5e9)
    assert _judge(settle, [a, b, c]) == [[], [a, b], [c]]
    assert (settle.seconds, settle.steady) == (0.0, True)


def test_a_ramp_is_set_aside_until_two_windows_agree() -> None:
    settle = harness._Settle(bound=5.0, max_clock=MAX_CLOCK)
    ramp = [_window(300.0, 1.2e9, 0.9), _window(450.0, 1.4e9, 1.1), _window(498.0, 1.5e9), _window(500.0, 1.5e9)]
    decisions = _judge(settle, ramp)
    assert decisions == [[], [], [], [ramp[2], ramp[3]]]
    assert settle.seconds == pytest.approx(2.0) and settle.steady is True  # the two set aside


def test_windows_at_the_boards_maximum_clock_are_steady_whatever_their_power() -> None:
    settle = harness._Settle(bound=5.0, max_clock=MAX_CLOCK)
    a, b = _window(400.0, MAX_CLOCK), _window(440.0, MAX_CLOCK)  # power 10 % apart (prefill and decode)
    assert _judge(settle, [a, b]) == [[], [a, b]] and settle.steady is True
    not_max = harness._Settle(bound=5.0, max_clock=None)
    assert _judge(not_max, [a, b]) == [[], []]


def test_the_bound_keeps_windows_unsettled_and_counts_only_what_was_set_aside() -> None:
    settle = harness._Settle(bound=2.5, max_clock=MAX_CLOCK)
    swinging = [_window(300.0 + 100 * i, 1.0e9 + 1e8 * i) for i in range(5)]
    decisions = _judge(settle, swinging)
    assert decisions[:2] == [[], []] and decisions[2] == [swinging[2]] and decisions[3] == [swinging[3]]
    assert settle.steady is False and settle.seconds == pytest.approx(2.0)


def test_windows_without_telemetry_are_kept_at_once() -> None:
    settle = harness._Settle(bound=5.0, max_clock=None)
    w = _window(None, None)
    assert settle.judge(None, w) == [w] and settle.steady is None and settle.seconds == 0.0


class _RampingGpu:
    """A simulated GPU whose power reading climbs toward its load's level with a time constant, as a
    board's does after a cap change or from idle; the rest of the device is the simulator's."""

    def __init__(self, tau_seconds: float) -> None:
        backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5), sleep=time.sleep)
        self._gpu = backend.devices()[0]
        self._gpu.begin_load(WORKLOAD_PROFILES["attention/default"])
        self._tau = tau_seconds
        self._start = time.monotonic()

    def power_watts(self) -> float:
        target = self._gpu.power_watts()
        if self._tau <= 0:
            return target
        return target * (1 - 0.5 * math.exp(-(time.monotonic() - self._start) / self._tau))

    def __getattr__(self, name: str):  # noqa: ANN204 - the simulated device's other calls
        return getattr(self._gpu, name)


@pytest.mark.parametrize("tau", [0.0, 0.4])
def test_a_point_settles_on_its_own_windows(tau: float) -> None:
    """Through the harness: a steady board costs no settle (its first two windows are kept); a ramping
    one has its first windows set aside, and only the kept windows make the point's figures."""
    spec = ProbeSpec("attention", preset="tiny", device="cpu", repeats=4, measure_seconds=0.5,
                     warmup_seconds=0.0, busy_profile_seconds=0.0, sample_interval=0.02)
    prepared = harness.prepare(spec)
    prepared.ctx.nvml = _RampingGpu(tau)
    result = harness.measure(prepared, settle_seconds=5.0)
    extra = result.extra
    assert extra["settle_steady"] is True
    assert result.repeats and [r.index for r in result.repeats] == list(range(len(result.repeats)))
    if tau == 0:
        assert extra["settle_seconds"] == 0.0
    else:  # 50 % below at the start: the first 1 s window (18 % low) cannot agree with the next
        assert extra["settle_seconds"] >= 0.3
    assert extra["windows_measured"] == len(result.repeats) == 2  # 4 x 0.5 s as whole 1 s controller cycles
    assert extra["phase_seconds"]["settle"] == pytest.approx(extra["settle_seconds"])

"""The apply rules as pure functions: which cap a GPU may hold, and when it must give it back.

No device, no journal, no clock of its own: the controller (:mod:`gpuperfd.apply.controller`) reads
the GPU, the verdict and the workload's latest sweep points and hands them in as :class:`GpuFacts`,
so every guard is a table of inputs and answers in tests. The cap itself comes from the one
recommendation rule (:func:`gpuperfd.probe_data.recommend.recommend`) with the operator's budget as
its allowed slowdown.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuperfd.config import ApplyConfig
from gpuperfd.device.base import PowerLimits
from gpuperfd.probe_data.recommend import SweepPoint, candidates, rate_noise, recommend, work_rate
from gpuperfd.probe_data.result import ProbeResult, describe

MODES: tuple[str, ...] = ("off", "advise", "canary", "on")
#: Why a GPU holds no applied cap now (``gpuperf_apply_state``'s ``reason``; bounded, documented).
HOLD_REASONS: tuple[str, ...] = (
    "off", "not_canary", "not_supported", "verdict", "no_recommendation", "stale", "unsettled", "incorrect",
    "no_saving", "below_minimum", "over_budget", "busy", "advise", "applied", "overridden", "rolled_back",
    "held_elsewhere",
)
#: Why an applied cap was given back (``gpuperf_apply_rollbacks_total``'s ``reason``; bounded).
ROLLBACK_REASONS: tuple[str, ...] = (
    "verdict", "drift", "probe_failed", "over_budget", "unconfirmed", "mode", "stopped", "failed_to_apply",
    "sweep_unrestored", "busy",
)
#: Failures that say nothing about the GPU at its cap (the host's memory, a user's job arriving): no rollback.
NOT_THE_CAP: frozenset[str] = frozenset({"host_oom", "gpu_busy", "aborted", "preempted"})
#: How many standard deviations of two points' combined noise a saving must clear to be applied, and a
#: loss over the budget to roll an applied cap back (the band between is the hysteresis: issue 51).
NOISE_SIGMAS = 2.0
#: The relative noise of a point's energy per unit measured in fewer than two windows.
DEFAULT_ENERGY_NOISE = 0.01
#: Verdict checks that are the drift alerts' twins (deploy/prometheus/rules/alerts.yml).
DRIFT_CHECKS: frozenset[str] = frozenset({"probe_throughput_baseline", "probe_energy_baseline",
                                          "probe_slower_than_peers"})


@dataclass(frozen=True)
class ApplySettings:
    """What the operator asked for, from the ``apply:`` section (docs/apply.md)."""

    mode: str = "off"
    probe: str = ""
    preset: str | None = None
    budget_ratio: float = 0.05
    canary_share: float = 0.1
    canary_gpus: tuple[int, ...] | None = None
    allow_busy: bool = False
    max_age_seconds: float = 86400.0

    @classmethod
    def from_config(cls, config: ApplyConfig) -> ApplySettings:
        probe, _, preset = (config.workload or "").partition("/")
        return cls(config.mode, probe, preset or None, config.budget_ratio, config.canary_share,
                   None if config.canary_gpus is None else tuple(config.canary_gpus), config.allow_busy,
                   config.max_age_seconds)

    def wants(self, probe: str, preset: str) -> bool:
        """True for the workload's points (any preset when the operator named none)."""
        return probe == self.probe and (self.preset is None or preset == self.preset)


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as the controller read it, under the GPU's cap lock."""

    index: int
    uuid: str
    #: None: the board does not support power caps (or cannot read them).
    limits: PowerLimits | None
    #: The operator's cap: the journal's while a cap is applied, the enforced one otherwise.
    operator_watts: float
    #: The workload's latest point per cap (failed ones too), any order.
    points: Sequence[SweepPoint]
    verdict_state: str = "healthy"
    verdict_checks: tuple[str, ...] = ()
    idle: bool = True
    now: float = 0.0


@dataclass(frozen=True)
class Decision:
    """The cap a GPU would hold (None: none) and why; ``apply`` says whether to set it now."""

    cap_watts: float | None
    reason: str
    detail: str = ""

    @property
    def apply(self) -> bool:
        return self.reason == "applied"


@dataclass(frozen=True)
class Realized:
    """What the applied cap really saved, from the same probe at both caps (one GPU, while busy)."""

    power_saved_watts: float
    energy_saving_ratio: float
    throughput_loss_ratio: float


def in_canary(index: int, uuid: str, settings: ApplySettings) -> bool:
    """Canary membership: the listed GPUs, else a stable hash of the UUID below the share, so the same
    share of each model's GPUs applies on every node and every start."""
    if settings.canary_gpus is not None:
        return index in settings.canary_gpus
    bucket = int.from_bytes(hashlib.sha256(uuid.encode()).digest()[:4], "big") / 2**32
    return bucket < settings.canary_share


def _at(points: Sequence[SweepPoint], watts: float) -> SweepPoint | None:
    return next((p for p in points if round(p.cap_watts) == round(watts)), None)


def loss_against(point: SweepPoint, reference: SweepPoint | None) -> float | None:
    """Throughput given up at ``point`` against ``reference`` (a ratio; None when either has no rate)."""
    if reference is None:
        return None
    rate, base = work_rate(point.result), work_rate(reference.result)
    if rate is None or not base:
        return None
    return 1.0 - rate / base


def energy_noise(result: ProbeResult) -> float:
    """Relative spread (CV) of energy per unit over the result's measured windows (the sweep's own noise)."""
    stats = describe([r.energy_per_unit_joules for r in result.repeats if r.energy_per_unit_joules])
    if stats is None or stats.n < 2 or stats.cv is None:
        return DEFAULT_ENERGY_NOISE
    return stats.cv


def _reference(ok: Sequence[SweepPoint], operator_watts: float) -> SweepPoint | None:
    """The point savings and losses are measured against: the operator's cap, else the highest cap measured."""
    there = _at(ok, operator_watts)
    return there if there is not None else max(ok, key=lambda p: p.cap_watts, default=None)


def measured_gain(point: SweepPoint, reference: SweepPoint) -> tuple[str, str] | None:
    """Why ``point``'s cap is no measured gain over ``reference`` (as a no_saving reason), or None: the cap
    must bind (the probe drew more than it at the reference) and its energy saving must clear the two
    points' noise (a lower confidence bound above zero, not a point estimate)."""
    drawn = reference.result.average_power_watts
    if drawn is not None and drawn <= point.cap_watts:
        return "no_saving", (f"the probe draws {drawn:.0f} W at {reference.cap_watts:.0f} W: a cap of "
                             f"{point.cap_watts:.0f} W does not bind")
    here, there = point.result.energy_per_unit_joules, reference.result.energy_per_unit_joules
    if not here or not there:
        return "no_saving", f"no energy data at {point.cap_watts:.0f} W"
    saving = 1.0 - here / there
    noise = NOISE_SIGMAS * math.hypot(energy_noise(point.result), energy_noise(reference.result))
    if saving - noise <= 0:
        return "no_saving", (f"{point.cap_watts:.0f} W saves {100 * saving:.1f}% energy per unit, within the "
                             f"sweep's own noise (±{100 * noise:.1f}%)")
    return None


def _evidence_problem(settings: ApplySettings, facts: GpuFacts) -> tuple[str, str] | None:
    """Why the workload's points cannot carry a recommendation: none, stale, unsettled, incorrect."""
    wrong = [p for p in facts.points if p.result.failure_reason == "wrong_result"
             or p.result.correctness.get("status") == "mismatch"]
    if wrong:
        return "incorrect", f"wrong answers at {wrong[0].cap_watts:.0f} W: no cap of this GPU is trusted"
    ok = [p for p in facts.points if p.result.status == "ok"]
    if len(ok) < 2:
        return "no_recommendation", f"{len(ok)} measured cap(s) of {settings.probe}; a sweep of two or more is needed"
    oldest = min(p.result.started_at for p in ok)
    if facts.now - oldest > settings.max_age_seconds:
        return "stale", f"its oldest point is {facts.now - oldest:.0f} s old (max_age_seconds {settings.max_age_seconds:.0f})"
    unsettled = [p for p in ok if p.result.extra.get("settle_steady") is False]
    if unsettled:
        return "unsettled", f"{unsettled[0].cap_watts:.0f} W never settled under load"
    return None


def decide(settings: ApplySettings, facts: GpuFacts) -> Decision:
    """The cap this GPU may hold now, or why none, in the order of the guards of docs/apply.md."""
    if settings.mode == "off":
        return Decision(None, "off")
    if settings.mode == "canary" and not in_canary(facts.index, facts.uuid, settings):
        return Decision(None, "not_canary")
    if facts.limits is None:
        return Decision(None, "not_supported", "the board does not support power caps")
    if facts.verdict_state != "healthy":
        return Decision(None, "verdict", f"verdict {facts.verdict_state} ({', '.join(facts.verdict_checks)})")
    if (problem := _evidence_problem(settings, facts)) is not None:
        return Decision(None, *problem)
    ok = candidates(facts.points)  # the one rule's input: the latest point per cap, none while cut short
    reference = _reference(ok, facts.operator_watts)
    # Only caps that bind and save beyond the sweep's noise compete (issue 51: caps above the probe's
    # draw, and savings of -0.2 W, were once applied); the one recommendation rule picks among them.
    gains = {round(p.cap_watts): measured_gain(p, reference) for p in ok
             if reference is not None and p.cap_watts < reference.cap_watts}
    eligible = [p for p in ok if reference is not None and (p.cap_watts >= reference.cap_watts
                                                            or gains[round(p.cap_watts)] is None)]
    best = recommend(eligible, settings.budget_ratio)
    if best is None:
        return Decision(None, "no_recommendation", "no point has energy data, or its sweep was cut short")
    cap = best.cap_watts
    if round(cap) >= round(facts.operator_watts) and (why := next((g for g in gains.values() if g), None)):
        return Decision(None, *why)
    if round(cap) >= round(facts.operator_watts):
        return Decision(None, "no_saving", f"recommended {cap:.0f} W is not below the operator's {facts.operator_watts:.0f} W")
    if cap < facts.limits.min_watts:
        return Decision(None, "below_minimum", f"{cap:.0f} W is below the board's minimum {facts.limits.min_watts:.0f} W")
    chosen = _at(ok, cap)
    loss = loss_against(chosen, _at(ok, facts.operator_watts)) if chosen is not None else None
    if loss is not None and loss > settings.budget_ratio:
        return Decision(None, "over_budget", f"{100 * loss:.1f}% slower than at the operator's cap")
    words = f"{100 * best.energy_saving_ratio:.1f}% less energy per unit, {100 * best.slowdown_ratio:.1f}% slower"
    if settings.mode == "advise":
        return Decision(cap, "advise", f"would set {cap:.0f} W: {words}")
    if not facts.idle and not settings.allow_busy:
        return Decision(cap, "busy", "the GPU is busy; applied once idle (allow_busy: false)")
    return Decision(cap, "applied", words)


def check_applied(settings: ApplySettings, facts: GpuFacts, applied_watts: float, applied_at: float,
                  enforced_watts: float, sweep_unrestored: bool = False) -> tuple[str, str] | None:
    """Why an applied cap must go now, as (reason, words), or None while it holds.

    ``overridden`` (someone else set another cap) is never rolled back over: the caller leaves the
    new cap alone. A cap a sweep left (``sweep_unrestored``: it could not put the applied cap back)
    is nobody's choice: ``sweep_unrestored`` rolls back to the operator's. Points count only if
    measured after the cap was applied.
    """
    if round(enforced_watts) != round(applied_watts):
        if sweep_unrestored:
            return "sweep_unrestored", (f"a sweep could not put the applied {applied_watts:.0f} W back "
                                        f"(the cap reads {enforced_watts:.0f} W)")
        return "overridden", f"the cap reads {enforced_watts:.0f} W, not the applied {applied_watts:.0f} W"
    if facts.verdict_state != "healthy":
        drift = [c for c in facts.verdict_checks if c in DRIFT_CHECKS]
        return ("drift" if drift else "verdict",
                f"verdict {facts.verdict_state} ({', '.join(drift or facts.verdict_checks)})")
    here = _at(facts.points, applied_watts)
    confirmed = here.result.started_at if here is not None and here.result.started_at >= applied_at else applied_at
    if facts.now - confirmed > settings.max_age_seconds:  # the probes stopped confirming it
        return "unconfirmed", (f"no probe at {applied_watts:.0f} W for {facts.now - confirmed:.0f} s "
                               f"(max_age_seconds {settings.max_age_seconds:.0f})")
    failed = [p for p in facts.points if p.result.status == "failed" and p.result.started_at >= applied_at
              and p.result.failure_reason not in NOT_THE_CAP]
    last_ok = here.result.started_at if here is not None and here.result.status == "ok" else applied_at
    if failed and max(p.result.started_at for p in failed) >= last_ok and (here is None or here not in failed):
        # a sweep on the applied GPU failed before it could confirm the cap: not kept unconfirmed for
        # max_age_seconds (issue 51: six failed sweeps in 70 s once left it standing)
        first = max(failed, key=lambda p: p.result.started_at)
        return "probe_failed", (f"the probe failed at {first.cap_watts:.0f} W ({first.result.failure_reason}) "
                                f"since {applied_watts:.0f} W was applied, and has not run ok at it since")
    if here is None or here.result.started_at < applied_at:
        return None
    if here.result.status == "failed" and here.result.failure_reason not in NOT_THE_CAP:
        return "probe_failed", f"the probe failed at {applied_watts:.0f} W ({here.result.failure_reason})"
    reference = _at(facts.points, facts.operator_watts)
    if reference is None or reference.result.status != "ok":  # unmeasured: the highest cap, a stricter bar
        reference = max((p for p in facts.points if p.result.status == "ok"), key=lambda p: p.cap_watts, default=None)
    loss = loss_against(here, reference)
    if loss is not None and reference is not None:
        # hysteresis: applied at a loss within the budget, rolled back only past it by more than the noise
        noise = NOISE_SIGMAS * math.hypot(rate_noise(here.result), rate_noise(reference.result))
        if loss - noise > settings.budget_ratio:
            return "over_budget", (f"{100 * loss:.1f}% slower than at {reference.cap_watts:.0f} W, beyond the "
                                   f"budget {100 * settings.budget_ratio:.1f}% by more than the noise "
                                   f"(±{100 * noise:.1f}%)")
    return None


def realized(points: Sequence[SweepPoint], applied_watts: float, operator_watts: float,
             applied_at: float) -> Realized | None:
    """Measured savings: the probe at the applied cap (after it was applied) against the same probe at
    the operator's cap. None until both are measured ok."""
    here, there = _at(points, applied_watts), _at(points, operator_watts)
    if here is None or there is None or here.result.started_at < applied_at:
        return None
    if here.result.status != "ok" or there.result.status != "ok":
        return None
    loss = loss_against(here, there)
    p_here, p_there = here.result.average_power_watts, there.result.average_power_watts
    e_here, e_there = here.result.energy_per_unit_joules, there.result.energy_per_unit_joules
    if loss is None or p_here is None or p_there is None or not e_here or not e_there:
        return None
    return Realized(p_there - p_here, 1.0 - e_here / e_there, loss)

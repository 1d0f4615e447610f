"""Speculative decoding's tokens/s at a given acceptance rate, from measured step times (pure Python).

Why computed, not measured: the probe's models have random weights, so how many of the draft's
proposals the target accepts says nothing about any real pair of models. What the hardware decides
is measured (the draft's round of k steps, the target's verify step over k + 1 tokens, a plain
target decode step); the tokens a round yields at acceptance rate a is the standard expectation for
independent acceptances (Leviathan, Kalman and Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023): E = (1 - a^(k+1)) / (1 - a), k + 1 at a = 1. Used by the probe
child and by ``gpuperfd probe``/``report`` to redraw the curve from a record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RANDOM_WEIGHTS_NOTE", "CURVE_RATES", "expected_tokens", "speculative_summary"]

RANDOM_WEIGHTS_NOTE = ("random weights: the acceptance rate is not measured (it would mean nothing); tokens/s are "
                       "computed at the named rates from the measured draft round and verify step")
#: The curve's acceptance rates.
CURVE_RATES: tuple[float, ...] = tuple(i / 10 for i in range(11))


def expected_tokens(rate: float, k: int) -> float:
    """Tokens one round yields (accepted proposals plus the target's own) at acceptance rate ``rate``."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"acceptance_rates: {rate} is outside [0, 1]")
    if k < 1:
        raise ValueError(f"speculative_tokens: must be >= 1, got {k}")
    if rate >= 1.0:
        return float(k + 1)
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def _point(rate: float, k: int, round_seconds: float, baseline: float | None, batch: int) -> dict[str, Any]:
    tokens = expected_tokens(rate, k)
    rate_out = batch * tokens / round_seconds if round_seconds > 0 else None
    return {"acceptance_rate": rate, "expected_tokens_per_round": tokens, "tokens_per_second": rate_out,
            "speedup": rate_out / baseline if rate_out and baseline else None}


def speculative_summary(k: int, rates: Sequence[float], draft_round_seconds: float, verify_seconds: float,
                        target_decode_seconds: float | None, batch: int = 1,
                        round_seconds: float | None = None) -> dict[str, Any]:
    """The speculative figures of one window (or a pooled point): step times, tokens/s and speedup over
    plain decode at each named rate and on :data:`CURVE_RATES`, and the break-even acceptance rate.

    ``round_seconds``: the measured time of a round (the window's seconds over its rounds, the copy
    and the loop between the steps included), the one the headline tokens/s divides by, so the
    headline and the table's figure at the first named rate are one number (issue 61: they differed,
    5,760 against 5,808); None: the draft round plus the verify step."""
    round_seconds = draft_round_seconds + verify_seconds if round_seconds is None else round_seconds
    baseline = batch / target_decode_seconds if target_decode_seconds else None
    curve = [_point(rate, k, round_seconds, baseline, batch) for rate in CURVE_RATES]
    break_even = None
    if baseline and round_seconds > 0:
        fine = [i / 1000 for i in range(1001)]
        break_even = next((a for a in fine if _point(a, k, round_seconds, baseline, batch)["speedup"] >= 1.0), None)
    return {
        "speculative_tokens": k, "draft_round_seconds": draft_round_seconds,
        "draft_step_seconds": draft_round_seconds / k, "verify_seconds": verify_seconds,
        "round_seconds": round_seconds, "target_decode_step_seconds": target_decode_seconds,
        "baseline_tokens_per_second": baseline,
        "at_rates": [_point(rate, k, round_seconds, baseline, batch) for rate in (rates or (0.0,))],
        "curve": curve, "break_even_acceptance_rate": break_even, "note": RANDOM_WEIGHTS_NOTE,
    }

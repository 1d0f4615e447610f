"""Issue 34, item 7: the words a user reads about a sweep, a skip and a recommendation say what happened."""

from __future__ import annotations

from gpuperfd.probing.gates.idle import not_idle_text
from gpuperfd.probe_data.recommend import Recommendation, comparison_words, read_only_note


def _rec(cap: float, base: float, saving: float, slowdown: float) -> Recommendation:
    return Recommendation(cap_watts=cap, baseline_cap_watts=base, energy_saving_ratio=saving, slowdown_ratio=slowdown,
                          max_slowdown=0.1)


def test_comparison_words() -> None:
    assert comparison_words(_rec(500, 700, 0.25, 0.05), "token") == "25.0% less energy per token, 5.0% slower than 700 W"
    itself = comparison_words(_rec(700, 700, 0.0, 0.0), "token")
    assert "0.0%" not in itself and "highest cap tested" in itself
    faster = comparison_words(_rec(600, 700, 0.1, -0.009), "image")
    assert faster == "10.0% less energy per image, 0.9% faster than 700 W" and "-" not in faster
    assert "as fast as 700 W" in comparison_words(_rec(600, 700, 0.1, 0.0001))


def test_read_only_note_names_what_was_not_measured() -> None:
    assert read_only_note([700.0], 700.0) == "one cap, the current 700 W: measured without changing the cap"
    note = read_only_note([700.0, 450.0], 450.0)
    assert note.startswith("read-only: measured the current cap 450 W only; 700 W not measured")


def test_not_idle_text_never_reads_5_s_below_5_s() -> None:
    assert not_idle_text(4.96, 5) == "idle for 4.96 s, needs 5 s"
    assert not_idle_text(4.6, 5) == "idle for 4.6 s, needs 5 s"
    assert not_idle_text(1.0, 30) == "idle for 1 s, needs 30 s"

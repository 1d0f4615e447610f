"""ProbeResult serialization and the statistics over repeats."""

from __future__ import annotations

import json
import math

import pytest

from gpuperfd.probe_data.result import (
    ProbeResult,
    RepeatResult,
    describe,
    percentile,
    summarize,
)


def _result() -> ProbeResult:
    reps = [
        RepeatResult(index=i, measured_seconds=2.0, units_of_work=u, throughput={"images_per_second": u / 2.0},
                     energy_joules=e, energy_per_unit_joules=e / u, average_power_watts=e / 2.0)
        for i, (u, e) in enumerate([(100.0, 50.0), (110.0, 52.0), (90.0, 48.0)])
    ]
    return ProbeResult(
        probe="vit", variant="eager", preset="tiny", params={"batch_size": 4}, device="cpu",
        measured_seconds=6.0, work_unit="image", units_of_work=300.0,
        throughput={"images_per_second": 50.0},
        latencies={"batch_seconds": [0.01 * i for i in range(1, 101)]},
        repeats=reps, extra={"note": "x"},
    )


def test_round_trip_is_json_serializable() -> None:
    result = _result()
    text = json.dumps(result.to_dict())
    again = ProbeResult.from_dict(json.loads(text))
    assert again == result
    assert isinstance(again.repeats[0], RepeatResult)


def test_from_dict_ignores_unknown_keys() -> None:
    data = _result().to_dict()
    data["added_in_a_later_version"] = 1
    assert ProbeResult.from_dict(data).probe == "vit"


def test_invalid_status_and_reason_are_rejected() -> None:
    with pytest.raises(ValueError, match="status"):
        ProbeResult(probe="llm", variant="graph", preset="tiny", status="fine")
    with pytest.raises(ValueError, match="failure_reason"):
        ProbeResult.failure("llm", "graph", "tiny", reason="gremlins", message="?")


def test_describe() -> None:
    stats = describe([48.0, 50.0, 52.0])
    assert stats is not None
    assert stats.mean == 50.0 and stats.median == 50.0
    assert stats.stdev == pytest.approx(2.0)
    assert stats.cv == pytest.approx(0.04)
    assert describe([]) is None
    single = describe([3.0])
    assert single is not None and single.stdev == 0.0 and single.cv == 0.0


def test_percentile_matches_linear_interpolation() -> None:
    values = list(range(1, 11))  # 1..10
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile(values, 0) == 1 and percentile(values, 100) == 10
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summarize_over_repeats() -> None:
    summary = summarize(_result())
    ips = summary["throughput"]["images_per_second"]
    assert ips["n"] == 3
    assert ips["mean"] == pytest.approx(50.0)
    assert ips["cv"] == pytest.approx(ips["stdev"] / ips["mean"])
    assert ips["stdev"] == pytest.approx(5.0)
    energy = summary["energy_per_unit_joules"]
    assert energy["n"] == 3 and energy["mean"] == pytest.approx((0.5 + 52 / 110 + 48 / 90) / 3)
    lat = summary["latencies"]["batch_seconds"]
    assert lat["n"] == 100
    assert lat["p50"] == pytest.approx(0.505)
    assert lat["p99"] == pytest.approx(0.9901)
    assert math.isclose(lat["mean"], 0.505)


def test_label() -> None:
    assert _result().label == "vit/eager tiny b=4"

"""A week of healthy probe history, written as OpenMetrics for promtool's backfill.

The drift alerts compare with a 7-day median; these points give Prometheus that past
(see the package docstring for why they sit on 15-minute boundaries and end before the start).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from gpuperfd.fleet.spec import (
    DAY_SECONDS,
    PROBE_NOISE,
    FleetGpu,
    FleetSpec,
    label_text,
    probe_labels,
)


def history_timestamps(spec: FleetSpec, now: float) -> list[int]:
    """Unix seconds of the backfilled results: aligned to the step, ending history_gap_seconds before now."""
    step = spec.history_step_seconds
    end = int((now - spec.history_gap_seconds) // step * step)
    count = int(spec.history_days * 86400 // step)
    return [end - step * i for i in range(count - 1, -1, -1)]


def healthy_history(
    gpus: list[FleetGpu], spec: FleetSpec, now: float, start: float = -math.inf, end: float = math.inf
) -> Iterator[str]:
    """OpenMetrics lines: a week of results of each GPU's healthy self, every probe and cap.

    Throughput is the healthy operating point times the executor's noise; energy
    per unit is that point's (exact) power over the noisy throughput, as the
    simulated executor measures it. Samples are grouped by family, each series'
    samples in time order; timestamps in seconds; the text ends with ``# EOF``.
    Only samples in [start, end) are written (one chunk of the history); the
    noise is seeded per series and UTC day, so chunks split on day boundaries
    (as Fleet._backfill writes them) add up to the same whole.
    """
    times = [t for t in history_timestamps(spec, now) if start <= t < end]
    rates: dict[tuple[int, str, int], list[float]] = {}

    def noisy_rates(gpu: FleetGpu, probe: str, cap: int, rate: float) -> list[float]:
        out, day, rng = [], None, random.Random()
        for t in times:
            if t // DAY_SECONDS != day:
                day = t // DAY_SECONDS
                rng = random.Random(f"{spec.seed}:{gpu.uuid}:{probe}:{cap}:{day}")
            out.append(max(rate * (1 + rng.gauss(0.0, PROBE_NOISE)), 1e-9))
        return out

    families = (
        ("gpuperf_probe_work_units_per_second",
         "Probe throughput in its work unit per second (backfilled healthy history)."),
        ("gpuperf_probe_energy_per_unit_joules",
         "Hardware-counter energy per unit of work, joules (backfilled healthy history)."),
    )
    for family, help_text in families:
        yield f"# HELP {family} {help_text}"
        yield f"# TYPE {family} gauge"
        for number, gpu in enumerate(gpus):
            for probe in spec.probes:
                for cap in spec.caps:
                    point = gpu.operating_point(probe, cap, healthy=True)
                    key = (number, probe, cap)
                    if key not in rates:
                        rates[key] = noisy_rates(gpu, probe, cap, point.units_per_second)
                    labels = label_text(probe_labels(gpu, probe, cap))
                    for t, rate in zip(times, rates[key]):
                        value = rate if family.endswith("second") else point.power_watts / rate
                        yield f"{family}{{{labels}}} {value!r} {t}"
    yield "# EOF"




def healthy_run_records(gpu: FleetGpu, spec: FleetSpec, now: float, per_key: int = 24) -> Iterator[str]:
    """JSON lines of the daemon's probe history (gpuperfd.run/1): the last ``per_key`` backfilled
    results of each probe and cap of ``gpu``'s healthy self, the same points Prometheus gets.

    The daemon's own health checks (probe_throughput_baseline, probe_energy_baseline) compare a
    run with the median of this GPU's earlier runs; this is the past they compare with. Only the
    most recent points: the checks need a few (baseline_min_runs), and a week of every cap would
    be ~30,000 lines per GPU.
    """
    import json

    from gpuperfd.probe_data.record import build_record
    from gpuperfd.probe_data.result import ProbeResult
    from gpuperfd.probe_data.spec import DEFAULT_PRESET

    times = history_timestamps(spec, now)[-per_key:]
    for probe in spec.probes:
        for cap in spec.caps:
            point = gpu.operating_point(probe, cap, healthy=True)
            for t in times:
                rng = random.Random(f"{spec.seed}:{gpu.uuid}:{probe}:{cap}:{t}:run")
                rate = max(point.units_per_second * (1 + rng.gauss(0.0, PROBE_NOISE)), 1e-9)
                result = ProbeResult(
                    probe=probe, variant="simulated", preset=DEFAULT_PRESET[probe], status="ok",
                    device=f"sim:{gpu.index}", gpu_uuid=gpu.uuid, started_at=float(t), wall_seconds=1.0,
                    measured_seconds=1.0, units_of_work=rate, energy_per_unit_joules=point.power_watts / rate,
                    power_limit_watts=float(cap),
                )
                record = build_record(result, "daemon", gpu={"index": gpu.index, "uuid": gpu.uuid,
                                                             "backend": "simulated"},
                                      host=gpu.node, power_cap_watts=float(cap))
                yield json.dumps(record, separators=(",", ":"))

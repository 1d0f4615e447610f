"""The outlier rule (documented in docs/reports.md).

Runs are grouped by what they measure: (GPU, probe, preset, batch size, power
cap). In a group of at least :data:`MIN_GROUP` ok runs, a run is dropped when
its throughput or its energy per unit lies further from the group's median than
both :data:`THRESHOLD` scaled median absolute deviations and
:data:`MIN_RELATIVE` of the median:

    |x - median(x)| > max(3 * 1.4826 * median(|x - median(x)|), 0.05 * |median(x)|)

1.4826 makes the MAD estimate the standard deviation of normally distributed
data, so the first bound is "3 sigma", but the median and MAD are not pulled by
the outliers themselves (unlike mean and stdev). The second bound keeps ordinary
run-to-run noise: with three runs the MAD is the smaller of two deviations and
can be tiny, so the MAD bound alone would drop a run that is 1% off. A group of
one or two runs drops nothing. Failed runs are never outliers: the report lists
them apart.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpuperfd.report.records import Run

THRESHOLD = 3.0
MAD_SCALE = 1.4826
MIN_RELATIVE = 0.05
MIN_GROUP = 3
RULE = (
    f"per (GPU, probe, preset, batch size, power cap) group of at least {MIN_GROUP} runs, drop a run whose "
    f"throughput or energy per unit is outside median \u00b1 max({THRESHOLD:g}\u00b7{MAD_SCALE}\u00b7MAD, "
    f"{MIN_RELATIVE:.0%} of the median)"
)


@dataclass(frozen=True)
class Dropped:
    run: Run
    metric: str
    value: float
    median: float
    bound: float

    @property
    def reason(self) -> str:
        return f"{self.metric} {self.value:.6g} outside {self.median:.6g} \u00b1 {self.bound:.3g}"


def _bounds(values: list[float]) -> tuple[float, float] | None:
    """(median, allowed distance) or None when the group is too small to judge."""
    if len(values) < MIN_GROUP:
        return None
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, max(THRESHOLD * MAD_SCALE * mad, MIN_RELATIVE * abs(median))


def split_outliers(runs: Iterable[Run]) -> tuple[list[Run], list[Dropped]]:
    """(kept runs, dropped runs); only ok runs are judged, every other run is kept as is."""
    runs = list(runs)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "ok" and run.rate is not None:
            groups[run.group].append(run)
    dropped: dict[int, Dropped] = {}
    for members in groups.values():
        for metric, attribute in (("throughput", "rate"), ("energy per unit", "energy_per_unit")):
            values = [getattr(r, attribute) for r in members if getattr(r, attribute) is not None]
            bounds = _bounds(values)
            if bounds is None:
                continue
            median, bound = bounds
            for run in members:
                value = getattr(run, attribute)
                if value is not None and abs(value - median) > bound and id(run) not in dropped:
                    dropped[id(run)] = Dropped(run, metric, value, median, bound)
    kept = [r for r in runs if id(r) not in dropped]
    return kept, sorted(dropped.values(), key=lambda d: d.run.time)

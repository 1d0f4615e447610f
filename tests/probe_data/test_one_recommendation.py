"""One recommendation wherever you look (issue 52): the landing page, ``/api/v1/gpus`` and ``top``,
``gpuperfd report`` and apply mode, fed one history through the daemon's own paths (its observer, its
history file, its point listeners), name the same cap, or none.

After the demo's 8 sweeps the landing page and ``top`` said 200 W while ``report`` (every sweep pooled)
said 300 W, and ``report`` recommended from an interrupted sweep where the CLI that ran it said "no
recommendation". The rule now lives once (:func:`gpuperfd.probe_data.recommend.candidates`): the latest
point at each cap, nothing pooled across sweeps, none while a sweep cut short holds one of them."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from gpuperfd.apply.controller import PointBook
from gpuperfd.apply.policy import ApplySettings, GpuFacts, decide
from gpuperfd.config import ProbesConfig, ScheduleConfig, SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probing.history import HistoryWriter
from gpuperfd.probing.gates.idle import IdleTracker
from gpuperfd.probing.metrics import ProbeMetrics
from gpuperfd.probing.scheduling.service import ProbeService, ServiceObserver
from gpuperfd.top.frame import render
from gpuperfd.web.landing import _probe_row
from gpuperfd.web.status import probe_summary

pytest.importorskip("matplotlib")

MAX_SLOWDOWN = 0.10
#: (rate, energy per token, power) at 700 / 500 / 300 W of two complete sweeps. The latest sweep alone
#: allows 300 W (9 % slower); pooled with the first (12 % slower there) 300 W is 10.5 % slower, so a
#: pooled mean would say 500 W: the surfaces must not differ on that.
#: The probe draws 560 W at 700 W, so both lower caps bind (apply mode applies only a cap that binds).
FIRST = {700: (100.0, 1.00, 560.0), 500: (95.0, 0.80, 480.0), 300: (88.0, 0.70, 290.0)}
SECOND = {700: (100.0, 1.00, 560.0), 500: (96.0, 0.82, 485.0), 300: (91.0, 0.72, 292.0)}


def _result(cap: int, started: float, values: tuple[float, float, float] | None, status: str = "ok",
            reason: str | None = None) -> ProbeResult:
    if values is None:
        return ProbeResult.failure("llm", "graph", "gpt2", reason or "exception", "made to fail", status=status,
                                   started_at=started)
    rate, energy, power = values
    return ProbeResult(probe="llm", variant="graph", preset="gpt2", started_at=started, measured_seconds=1.0,
                       wall_seconds=1.0, units_of_work=rate, work_unit="token", energy_per_unit_joules=energy,
                       average_power_watts=power, energy_joules=energy * rate, power_limit_watts=float(cap))


class Node:
    """A daemon's probing side on one simulated GPU, points fed through its observer by hand."""

    def __init__(self, tmp_path) -> None:
        backend = SimulatedBackend(SimulationConfig(gpus=1, seed=5))
        self.device = backend.devices()[0]
        self.info = self.device.info()
        self.history = tmp_path / "history.jsonl"
        self.service = ProbeService(ProbesConfig(state_dir=tmp_path / "state", max_slowdown=MAX_SLOWDOWN),
                                    [self.device], None, ProbeMetrics(CollectorRegistry()), IdleTracker(0.05),
                                    HistoryWriter(self.history))
        self.book = PointBook()
        self.service.point_listeners.append(lambda gpu, _probe, _preset, point: self.book.observe(gpu, point))
        self.clock = 1_800_000_000.0

    def sweep(self, points: list[tuple[int, tuple | None, str, str | None]]) -> None:
        """One sweep: (cap, values or None, status, failure reason) in order."""
        schedule = ScheduleConfig(probe="llm", preset="gpt2", caps=[700, 500, 300], interval_seconds=3600)
        observer = ServiceObserver(self.service, self.device, self.info, schedule, 700.0, [700, 500, 300])
        for cap, values, status, reason in points:
            self.clock += 10.0
            observer.on_point(SweepPoint(float(cap), _result(cap, self.clock, values, status, reason)))

    def complete(self, table: dict[int, tuple]) -> None:
        self.sweep([(cap, values, "ok", None) for cap, values in table.items()])

    def answers(self) -> dict[str, float | None]:
        """The recommended cap on every surface (None: no recommendation)."""
        from gpuperfd.report import build_report, load_history

        latest = self.service.latest()[(0, "llm", "gpt2")]
        row = _probe_row("llm", "gpt2", latest, MAX_SLOWDOWN)
        landing = re.search(r"<b>(\d+) W</b>", row)
        summary = probe_summary("llm", "gpt2", latest, MAX_SLOWDOWN, self.info.name)
        api = summary["recommendation"]["cap_watts"] if summary["recommendation"] else None
        frame = "\n".join(render({"gpus": [{"gpu": 0, "name": self.info.name, "up": True, "probes": [summary]}]},
                                 "test", 200))
        top = re.search(r"recommended (\d+) W", frame)
        report = build_report(load_history([self.history]), max_slowdown=MAX_SLOWDOWN, remove_outliers=False)
        rec = report.series[0].recommendation
        settings = ApplySettings(mode="advise", probe="llm", preset="gpt2", budget_ratio=MAX_SLOWDOWN,
                                 max_age_seconds=1e9)
        facts = GpuFacts(index=0, uuid=self.info.uuid, limits=self.device.power_limits(), operator_watts=700.0,
                         points=self.book.of(0), now=self.clock)
        applied = decide(settings, facts).cap_watts
        return {"landing": float(landing.group(1)) if landing else None, "api": api,
                "top": float(top.group(1)) if top else None, "report": rec.cap_watts if rec else None,
                "apply": applied}


def test_the_latest_complete_sweep_is_the_answer_everywhere_never_a_pooled_mean(tmp_path) -> None:
    node = Node(tmp_path)
    node.complete(FIRST)
    assert set(node.answers().values()) == {500.0}
    node.complete(SECOND)
    assert node.answers() == dict.fromkeys(("landing", "api", "top", "report", "apply"), 300.0)


def test_a_sweep_cut_short_gives_no_recommendation_anywhere_until_a_complete_one(tmp_path) -> None:
    node = Node(tmp_path)
    node.complete(FIRST)
    node.sweep([(700, SECOND[700], "ok", None), (500, None, "skipped", "preempted")])  # a user's job came
    assert node.answers() == dict.fromkeys(("landing", "api", "top", "report", "apply"), None)
    row = _probe_row("llm", "gpt2", node.service.latest()[(0, "llm", "gpt2")], MAX_SLOWDOWN)
    assert "sweep cut short: no recommendation until a complete sweep" in row  # the page says why
    node.complete(SECOND)
    assert set(node.answers().values()) == {300.0}
    node.sweep([(700, SECOND[700], "ok", None), (500, None, "aborted", "aborted")])  # a shutdown mid-sweep
    assert set(node.answers().values()) == {None}


def test_a_failed_point_withdraws_its_cap_on_every_surface(tmp_path) -> None:
    node = Node(tmp_path)
    node.complete(FIRST)
    node.sweep([(700, SECOND[700], "ok", None), (500, None, "failed", "exception"), (300, SECOND[300], "ok", None)])
    assert set(node.answers().values()) == {300.0}  # 500 W's earlier point no longer counts

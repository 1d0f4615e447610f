"""``gpuperfd check`` runs its probe children under the daemon's host-memory admission: beyond
what fits they queue within the deadline, and a GPU that got no room in time is not probed, saying why."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gpuperfd.probing.check.flow as check_mod
from gpuperfd.config import config_from_mapping
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probing.gates.admission import MIB, Admission, PeakBook
from gpuperfd.probing.check.flow import CheckRequest, run_check
from gpuperfd.probing.executors import PerPointExecutor, measure_once

CHILD = 100 * MIB


def _check(tmp_path: Path, monkeypatch, limit: int, seconds: float, timeout: float, gpus: int = 4):  # type: ignore[no-untyped-def]
    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {"gpus": gpus, "seed": 1},
                                  "probes": {"state_dir": str(tmp_path / "state")}})
    monkeypatch.setattr(check_mod, "check_admission", lambda _c, _n: Admission(
        limit, "cgroup memory limit", PeakBook(CHILD), daemon_rss=lambda: 0, headroom_bytes=0))
    real = check_mod.choose_executor
    counts = {"running": 0, "peak": 0, "calls": 0}
    lock = threading.Lock()

    def slow(cfg, name, **kw):  # type: ignore[no-untyped-def]
        executor = real(cfg, name, **kw)

        def run(device, schedule, abort):  # type: ignore[no-untyped-def]
            with lock:
                counts["running"] += 1
                counts["calls"] += 1
                counts["peak"] = max(counts["peak"], counts["running"])
            try:
                time.sleep(seconds)
                return measure_once(executor, device, schedule, abort)
            finally:
                with lock:
                    counts["running"] -= 1
        return PerPointExecutor(run)

    monkeypatch.setattr(check_mod, "choose_executor", slow)
    backend = SimulatedBackend(config.simulation)
    outcome = run_check(config, CheckRequest(timeout_seconds=timeout), opener=lambda _c: backend)
    return outcome, counts


def test_children_beyond_the_budget_queue_and_all_are_probed(tmp_path: Path, monkeypatch) -> None:
    outcome, counts = _check(tmp_path, monkeypatch, 2 * CHILD, seconds=0.3, timeout=30)
    assert sorted(outcome.probed) == [0, 1, 2, 3] and outcome.not_probed == {}
    assert counts["peak"] == 2 and counts["calls"] == 4


def test_a_gpu_without_room_before_the_deadline_is_not_probed_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    outcome, counts = _check(tmp_path, monkeypatch, CHILD, seconds=2.5, timeout=6)
    assert counts["peak"] == 1
    assert 1 <= len(outcome.probed) < 4
    waiting = set(range(4)) - set(outcome.probed)
    assert set(outcome.not_probed) == waiting
    for text in outcome.not_probed.values():
        assert "no host memory for its probe child" in text and "before the deadline" in text
    verdicts = {v.gpu: v for v in outcome.verdicts}
    assert all(verdicts[i].state != "unhealthy" for i in waiting)


def test_a_budget_too_small_for_one_child_probes_nothing(tmp_path: Path, monkeypatch) -> None:
    outcome, counts = _check(tmp_path, monkeypatch, CHILD // 2, seconds=0.1, timeout=20, gpus=2)
    assert counts["calls"] == 0 and outcome.probed == []
    assert all("host memory too small for one probe child" in t for t in outcome.not_probed.values())

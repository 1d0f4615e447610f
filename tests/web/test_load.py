"""Load and soak, through the benchmark scripts (each starts its own real daemon).

Default run: 50 scrapers for 5 s with zero errors; a 45 s soak with sweeps every
10 s on 4 GPUs and no thread or fd growth. ``-m slow``: 200 scrapers for 60 s on
8 GPUs, as fast as they can and at one scrape a second each, and a 10-minute soak
(RSS growth <= 5 MB as well).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, args: list[str], out: Path, timeout: float) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(f"\n{script} {' '.join(args)}:\n{json.dumps(result, indent=1)}")
    return proc.returncode, result


def check_load(code: int, result: dict, clients: int) -> None:
    assert result["errors"] == 0, result["errors_by_kind"]
    assert code == 0
    assert result["clients"] == clients and result["connections_opened"] >= clients
    assert result["requests_ok"] >= 10 * clients
    assert result["daemon"]["alive_after_load"] and result["daemon"]["exit_code"] == 0
    p99 = result["latency_ms"]["p99"]
    assert math.isfinite(p99) and 0 < p99 < 5000


def test_50_concurrent_scrapers_for_5_seconds_without_errors(tmp_path):
    code, result = run_benchmark("load.py", ["--clients", "50", "--duration", "5", "--simulate", "8"],
                                 tmp_path / "load.json", timeout=120)
    check_load(code, result, 50)


@pytest.mark.slow
def test_200_concurrent_scrapers_for_60_seconds_without_errors(tmp_path):
    code, result = run_benchmark("load.py", ["--clients", "200", "--duration", "60", "--simulate", "8"],
                                 tmp_path / "load.json", timeout=300)
    check_load(code, result, 200)


@pytest.mark.slow
def test_200_scrapers_at_one_scrape_a_second_each_keep_scrapes_fast(tmp_path):
    """200 Prometheus-like scrapers (one scrape a second each): latency is the scrape's cost, not a queue."""
    code, result = run_benchmark("load.py", ["--clients", "200", "--duration", "60", "--rate", "1", "--simulate", "8"],
                                 tmp_path / "load.json", timeout=300)
    check_load(code, result, 200)
    assert result["latency_ms"]["p99"] < 100, result["latency_ms"]


def check_soak(code: int, result: dict, check_rss: bool) -> None:
    assert result["daemon_alive_until_stop"] and result["exit_code"] == 0
    assert result["scrape_errors"] == 0, result["scrape_error_examples"]
    assert result["tracebacks_in_log"] == 0
    assert result["probe_runs"].get("ok", 0) >= 20 and set(result["probe_runs"]) == {"ok"}, result["probe_runs"]
    targets = result["targets_met"]
    assert targets["threads"] and targets["fds"], result["growth"]
    if check_rss:
        assert targets["rss"], result["growth"]
        assert code == 0 and result["ok"]


def test_45_second_soak_has_no_thread_or_fd_growth(tmp_path):
    # Sampled every 0.5 s: each half holds many moments between sweeps, where the floor is read.
    code, result = run_benchmark(
        "soak.py", ["--duration", "45", "--warmup", "15", "--sample-interval", "0.5"], tmp_path / "soak.json", timeout=180
    )
    check_soak(code, result, check_rss=False)


def _samples(fds: list[int], threads: int = 20) -> list[dict[str, float]]:
    return [{"fds": n, "threads": threads, "rss_bytes": 50 * 2**20} for n in fds]


def test_leak_rule_tells_growth_from_noise():
    """The soak's rule (benchmarks/soak.py:leak_targets) on the series that once failed by chance
    (medians 8 then 9, range 7-12, probe children coming and going) and on a real leak of one fd
    per 10 s sweep round: the first passes whatever the order of its transients, the second fails."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from soak import leak_targets
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import random

    rng = random.Random(29)
    for _ in range(200):  # transient fds (lock files, a history append, a scrape socket) on a floor of 7
        noisy = [7 + rng.choice([0, 0, 1, 1, 2, 3, 5]) for _ in range(60)]
        noisy[rng.randrange(30)] = noisy[30 + rng.randrange(30)] = 7  # each half has quiet moments
        assert leak_targets(_samples(noisy[:30]), _samples(noisy[30:]), 5.0)["fds"], noisy
    # one fd more per 10 s round (20 samples at 0.5 s): every later sample, the quiet ones too
    leaking = [7 + i // 20 + rng.choice([0, 0, 1, 2]) for i in range(60)]
    assert not leak_targets(_samples(leaking[:30]), _samples(leaking[30:]), 5.0)["fds"], leaking
    growing_threads = _samples([7] * 30, threads=20) , _samples([7] * 30, threads=21)
    assert not leak_targets(*growing_threads, 5.0)["threads"]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # pyproject's 600 s default is shorter than the soak itself
def test_10_minute_soak_meets_the_leak_targets(tmp_path):
    code, result = run_benchmark(
        "soak.py", ["--duration", "600", "--warmup", "60", "--sample-interval", "5"], tmp_path / "soak.json", timeout=900
    )
    check_soak(code, result, check_rss=True)

"""No false drains (issue 55): the interconnect verdict comes only from a measurement that can carry one.

A healthy 4x H100 node's 64 MiB copies scattered 311-365 GB/s between runs and once read 145 GB/s;
a check beside a probing daemon read 134 GB/s. So: the check copies 1 GiB, a pair judged slow is
measured again and only a slowness that reproduces counts, the figure follows the node's own pairs,
and a run with other work on a GPU of the set is no verdict. A real slow pair (50 %, 80 %) is still
found every time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from gpuperfd.config import config_from_mapping
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.health.interconnect import NODE_FLOOR_RATIO, held_to_node, interconnect_inputs, slow_pairs
from gpuperfd.probe_data.interconnect import InterconnectResult, PeerCopy
from gpuperfd.probing.check.flow import CheckRequest, run_check
from gpuperfd.commands.check import render_table
from gpuperfd.probing.executors import choose_interconnect_executor, slow_pairs_on
from gpuperfd.probing.interconnect.executor import RetestingExecutor
from gpuperfd.probing.interconnect.runner import ProcessInterconnectExecutor
from gpuperfd.probing.interconnect.simulated import SimulatedInterconnectExecutor


def _config(tmp_path: Path, gpus: int = 4, seed: int = 1, faults: list[dict] | None = None):
    return config_from_mapping({
        "device": {"backend": "simulated"},
        "simulation": {"gpus": gpus, "seed": seed, "topology": "hgx", "interconnect_faults": faults or []},
        "probes": {"state_dir": str(tmp_path / "state")}})


def _copy_reasons(outcome) -> dict[int, list[str]]:
    return {v.gpu: sorted(r.evidence["src"].__str__() + "->" + str(r.evidence["dst"]) for r in v.reasons
                          if r.check == "interconnect_below_expected") for v in outcome.verdicts}


class Disturbed:
    """The simulated node's executor whose first ``runs`` runs are disturbed as the real node's were:
    one pair reads ``factor`` of its speed (the 4x H100's 145 GB/s copy), or the run gives way to a
    process that appeared (``preempt``)."""

    def __init__(self, inner, pair=(0, 3), factor=0.38, runs=1, preempt=False, preempt_retest=False) -> None:
        self.inner, self.pair, self.factor, self.left = inner, pair, factor, runs
        self.preempt, self.preempt_retest = preempt, preempt_retest
        self.requests = []

    def run(self, devices, request, abort):
        self.requests.append(request)
        if self.preempt_retest and request.pairs is not None:
            return InterconnectResult(gpus=tuple(d.index for d in devices), status="skipped",
                                      failure_reason="preempted", error_message="another compute process appeared "
                                      "on GPU 3 (pid 4242); probe gave way", backend="simulated")
        if self.left <= 0:
            return self.inner.run(devices, request, abort)
        self.left -= 1
        if self.preempt:
            return InterconnectResult(gpus=tuple(d.index for d in devices), status="skipped",
                                      failure_reason="preempted", error_message="another compute process appeared "
                                      "on GPU 1 (pid 4242); probe gave way", backend="simulated")
        result = self.inner.run(devices, request, abort)
        copies = tuple(dataclasses.replace(c, bandwidth_bytes_per_second=c.bandwidth_bytes_per_second * self.factor)
                       if (c.src, c.dst) == self.pair else c for c in result.copies)
        return dataclasses.replace(result, copies=copies)


def _check_with(tmp_path: Path, wrap, gpus: int = 4, faults=None, timeout: float = 30):
    config = _config(tmp_path, gpus, faults=faults)
    backend = SimulatedBackend(config.simulation)
    inner = wrap(SimulatedInterconnectExecutor(backend.interconnect, seed=1))
    executor = RetestingExecutor(inner, slow_pairs_on(backend, 0.85), pause_seconds=0.05)
    outcome = run_check(config, CheckRequest(timeout_seconds=timeout), opener=lambda _c: backend,
                        interconnect=(executor, "simulated"))
    return outcome, inner


def test_a_node_with_one_pair_at_half_and_one_at_80_percent_is_degraded_every_time(tmp_path: Path) -> None:
    faults = [{"kind": "slow_pair", "gpu": 0, "peer": 1, "factor": 0.5},
              {"kind": "slow_pair", "gpu": 2, "peer": 3, "factor": 0.8}]
    for seed in range(8):
        config = _config(tmp_path, seed=seed, faults=faults)
        backend = SimulatedBackend(config.simulation)
        outcome = run_check(config, CheckRequest(timeout_seconds=30), opener=lambda _c: backend)
        assert {v.gpu: v.state for v in outcome.verdicts} == dict.fromkeys(range(4), "degraded"), seed
        assert _copy_reasons(outcome) == {0: ["0->1", "1->0"], 1: ["0->1", "1->0"],
                                          2: ["2->3", "3->2"], 3: ["2->3", "3->2"]}, seed
        retests = outcome.summary()["interconnect"]["extra"]["retests"]
        assert retests[0]["pairs"] == ["0->1", "1->0", "2->3", "3->2"]  # measured again before the verdict
        assert retests[-1].get("confirmed") is True


def test_one_pair_at_80_percent_on_a_two_gpu_node_is_held_to_the_reference(tmp_path: Path) -> None:
    outcome, _ = _check_with(tmp_path, lambda inner: inner, gpus=2,
                             faults=[{"kind": "slow_pair", "gpu": 0, "peer": 1, "factor": 0.8}])
    assert {v.state for v in outcome.verdicts} == {"degraded"}


def test_a_disturbed_copy_that_does_not_reproduce_is_no_verdict(tmp_path: Path) -> None:
    outcome, inner = _check_with(tmp_path, lambda e: Disturbed(e, pair=(0, 3), factor=0.38))
    assert {v.state for v in outcome.verdicts} == {"healthy"}, _copy_reasons(outcome)
    ic = outcome.summary()["interconnect"]
    assert [r.pairs for r in inner.requests] == [None, ((0, 3),)]  # the slow pair alone, measured again
    assert inner.requests[1].allreduce_bytes == ()
    (retest,) = ic["extra"]["retests"]
    assert retest["pairs"] == ["0->3"] and retest["before"]["0->3"] < 150 < 360 < retest["after"]["0->3"]
    copy = next(c for c in ic["copies"] if (c["src"], c["dst"]) == (0, 3))
    assert copy["bandwidth_bytes_per_second"] > 360e9  # the faster of the two runs
    line = render_table(outcome.verdicts, "node", outcome.summary())
    assert "measured again 0->3" in line


def test_a_run_disturbed_by_another_process_is_run_again_and_not_judged_meanwhile(tmp_path: Path) -> None:
    outcome, inner = _check_with(tmp_path, lambda e: Disturbed(e, runs=1, preempt=True))
    ic = outcome.summary()["interconnect"]
    assert ic["status"] == "ok" and len(inner.requests) == 2
    assert "pid 4242" in ic["extra"]["disturbed_attempts"][0]
    assert {v.state for v in outcome.verdicts} == {"healthy"}


def test_a_run_disturbed_every_time_is_unknown_never_degraded(tmp_path: Path) -> None:
    outcome, inner = _check_with(tmp_path, lambda e: Disturbed(e, runs=1000, preempt=True), timeout=20)
    ic = outcome.summary()["interconnect"]
    assert (ic["status"], ic["failure_reason"]) == ("skipped", "preempted") and len(inner.requests) >= 2
    assert ic["error_message"].startswith("not judged: every run was disturbed")
    assert not any(r.check == "interconnect_below_expected" for v in outcome.verdicts for r in v.reasons)
    assert {v.state for v in outcome.verdicts} == {"healthy"}


def test_a_slow_pair_whose_retest_was_disturbed_is_unconfirmed_not_degraded(tmp_path: Path) -> None:
    outcome, _ = _check_with(tmp_path, lambda e: Disturbed(e, pair=(1, 2), factor=0.5, preempt_retest=True))
    ic = outcome.summary()["interconnect"]
    assert "1->2" in ic["extra"]["unconfirmed"] and "pid 4242" in ic["extra"]["unconfirmed"]["1->2"]
    assert (1, 2) not in {(c["src"], c["dst"]) for c in ic["copies"]}
    assert {v.state for v in outcome.verdicts} == {"healthy"}
    assert "1->2 not judged (unknown)" in render_table(outcome.verdicts, "node", outcome.summary())


def test_a_process_that_comes_and_goes_between_two_looks_makes_the_run_give_way(tmp_path: Path) -> None:
    """The workers' own run (gloo on the CPU, watched on simulated GPUs): a foreign process appears after
    the first look and the watch never looks again mid-run; the look at the end still sees it."""
    backend = SimulatedBackend(_config(tmp_path, gpus=2).simulation)
    devices = backend.devices()
    executor = ProcessInterconnectExecutor("cpu", watch_interval=1000.0, idle_wait_seconds=0)
    from gpuperfd.probe_data.interconnect import InterconnectRequest

    threading.Timer(0.3, lambda: devices[1].add_foreign_process(4343, 1 << 30)).start()
    result = executor.run(devices, InterconnectRequest(copy_bytes=1 << 16, allreduce_bytes=(1 << 12,), repeats=2,
                                                       warmup=1, timeout_seconds=60), threading.Event())
    assert (result.status, result.failure_reason) == ("skipped", "preempted"), result
    assert "4343" in (result.error_message or "")


def test_the_figure_follows_the_nodes_own_pairs_but_not_below_its_floor() -> None:
    kind = ("nvlink", 18, True)
    reference = 378e9
    node = {(a, b): (345e9, reference, kind) for a in range(4) for b in range(4) if a != b}
    node[(1, 3)] = (311e9, reference, kind)  # the slowest healthy 64 MiB copy of the real node
    held = held_to_node(node)
    assert held[(0, 1)] == (345e9, 345e9)
    assert not slow_pairs(held, 0.85)  # 311 / 345 = 0.90
    assert slow_pairs(held_to_node({**node, (0, 2): (0.8 * 345e9, reference, kind)}), 0.85) == {(0, 2)}
    slow_node = {pair: (0.7 * reference, reference, kind) for pair in node}  # every link slow: still judged
    assert held_to_node(slow_node)[(0, 1)][1] == NODE_FLOOR_RATIO * reference
    assert slow_pairs(held_to_node(slow_node), 0.85) == set(slow_node)
    two = {(0, 1): (0.9 * reference, reference, kind), (1, 0): (0.9 * reference, reference, kind)}
    assert held_to_node(two)[(0, 1)][1] == reference  # one pair: the reference alone


def test_the_daemons_executor_retests_as_the_checks_does(tmp_path: Path) -> None:
    config = _config(tmp_path, faults=[{"kind": "slow_pair", "gpu": 1, "peer": 2, "factor": 0.6}])
    backend = SimulatedBackend(config.simulation)
    executor, kind = choose_interconnect_executor(config, backend)
    assert isinstance(executor, RetestingExecutor) and kind == "simulated"
    from gpuperfd.probe_data.interconnect import InterconnectRequest

    t0 = time.monotonic()
    result = executor.run(backend.devices(), InterconnectRequest(), threading.Event())
    assert result.ok and result.extra["retests"][0]["pairs"] == ["1->2", "2->1"]
    topology = backend.topology()
    links = {d.index: len(d.nvlink().links) for d in backend.devices()}
    assert slow_pairs(interconnect_inputs(result, topology, links)["copies"], 0.85) == {(1, 2), (2, 1)}
    assert time.monotonic() - t0 < 30
    assert all(isinstance(c, PeerCopy) for c in result.copies)


# -- the healthy spread measured on a real node --------------------------------------------------

def _real_node():
    import json

    data = json.loads((Path(__file__).resolve().parents[2] / "data" / "h100x4-interconnect-spread.json").read_text())
    config = config_from_mapping({"device": {"backend": "simulated"}, "simulation": {
        "gpus": 4, "model": "H100", "topology": "hgx"}})
    backend = SimulatedBackend(config.simulation)  # the real node's board: 4 GPUs, 18 NVLinks each, NVSwitch
    links = {d.index: len(d.nvlink().links) for d in backend.devices()}
    return data, backend.topology(), links


def _result(copies: dict[str, float]) -> InterconnectResult:
    rows = tuple(PeerCopy(int(p.split("->")[0]), int(p.split("->")[1]), 1 << 30, gbps * 1e9, 10)
                 for p, gbps in sorted(copies.items()))
    return InterconnectResult(gpus=(0, 1, 2, 3), status="ok", backend="nccl", copies=rows)


def _judged(copies: dict[str, float], topology, links):
    from gpuperfd.health.evaluate import GpuInputs
    from gpuperfd.health.judge import judge

    inputs = [GpuInputs(gpu=g, uuid=f"GPU-{g}") for g in range(4)]
    verdicts = judge(inputs, None, 0.0, interconnect_inputs(_result(copies), topology, links))
    return [r.message for v in verdicts for r in v.reasons if r.check == "interconnect_below_expected"]


def test_the_checks_judgement_over_the_real_nodes_healthy_spread_gives_no_false_verdict() -> None:
    """Every round of the real node's copies at the check's setting (1 GiB, median of 10), and every
    full check run there, judged as the check judges: no pair is even a suspect."""
    data, topology, links = _real_node()
    rounds = data["rounds"]["1GiB x10"]
    assert len(rounds) == 20 and len(data["checks"]) >= 13
    for copies in [*rounds.values(), *data["checks"]]:
        assert len(copies) == 12
        assert not slow_pairs(interconnect_inputs(_result(copies), topology, links)["copies"], 0.85), copies
        assert _judged(copies, topology, links) == []


def test_at_smaller_copies_the_real_node_scatters_and_only_the_retest_keeps_it_healthy() -> None:
    """At 256 MiB and 64 MiB (median of 10) the same healthy node had rounds with a pair below 85 % of
    its figure (as the 3-in-9 false verdicts); measured again (the next round stands for the retest,
    each pair keeping its faster run) none stays slow. This is why the check copies 1 GiB and retests."""
    data, topology, links = _real_node()
    for setting in ("256MiB x10", "64MiB x10"):
        rounds = [data["rounds"][setting][str(r)] for r in range(20)]
        suspects = [slow_pairs(interconnect_inputs(_result(c), topology, links)["copies"], 0.85) for c in rounds]
        assert any(suspects), setting  # the noise is real: a single measurement would have judged a pair
        for i, first in enumerate(rounds):
            again = rounds[(i + 1) % len(rounds)]
            kept = {p: max(v, again[p]) for p, v in first.items()}
            assert _judged(kept, topology, links) == [], (setting, i)


def test_the_simulated_node_probe_takes_its_fabric_from_the_simulated_backend_alone(tmp_path: Path) -> None:
    """The simulated interconnect executor is handed the simulated backend's declared ``interconnect``
    (a typed attribute, issue 54); another backend, whatever attributes it carries, gets a clear refusal
    naming the setting, not a fabric found by ``getattr``."""
    from gpuperfd.device.base import Backend

    simulated = SimulatedBackend(_config(tmp_path).simulation)

    class OtherNode(Backend):  # e.g. NVML with probes.executor: simulated
        name = "nvml"
        interconnect = simulated.interconnect  # an attribute the type does not declare

        def devices(self):  # type: ignore[no-untyped-def]
            return simulated.devices()

        def driver_version(self) -> str:
            return "580"

        def wait_xid_events(self, timeout_seconds: float):  # type: ignore[no-untyped-def]
            return []

    config = _config(tmp_path)
    config = config.model_copy(update={"probes": config.probes.model_copy(update={"executor": "simulated"})})
    try:
        choose_interconnect_executor(config, OtherNode())
    except ValueError as exc:
        assert "probes.executor: simulated" in str(exc) and "nvml" in str(exc)
    else:
        raise AssertionError("a non-simulated backend was handed to the simulated node probe")
    assert choose_interconnect_executor(config, simulated)[1] == "simulated"

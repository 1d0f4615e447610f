"""Interconnect runs in the history: their own file and schema, read back whole."""

from __future__ import annotations

import threading

import pytest

from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probing.history import (
    INTERCONNECT_SCHEMA,
    HistoryWriter,
    interconnect_history_path,
    interconnect_record,
    read_history,
)
from gpuperfd.probing.simulated_interconnect import SimulatedInterconnectExecutor


def test_a_run_is_written_beside_the_history_and_read_back(tmp_path) -> None:
    node = SimulatedBackend(SimulationConfig(gpus=2, seed=5))
    result = SimulatedInterconnectExecutor(node.interconnect, seed=5).run(
        node.devices(), InterconnectRequest(), threading.Event())
    infos = {d.index: d.info() for d in node.devices()}
    path = interconnect_history_path(tmp_path / "history.jsonl")
    assert path.name == "history.interconnect.jsonl"
    HistoryWriter(path).append_record(interconnect_record(result, infos, "node-a"))
    [record] = list(read_history(path))
    assert record["schema"] == INTERCONNECT_SCHEMA and record["host"] == "node-a"
    assert [g["uuid"] for g in record["gpus"]] == [infos[0].uuid, infos[1].uuid]
    assert InterconnectResult.from_dict(record["result"]) == result
    assert not (tmp_path / "history.jsonl").exists()  # the per-GPU history is untouched


def test_a_gpu_without_identity_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="GPU 0, 3"):
        interconnect_record(InterconnectResult((0, 3), "failed", "timeout"), {}, "node-a")

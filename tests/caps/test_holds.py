"""caps/holds.py: the operator's hold on disk (issue 61): written atomically, read from every state
directory, kept when unreadable, and ended only by a release that names what was wrong."""

from __future__ import annotations

import pytest

from gpuperfd.caps.holds import (SUFFIX, NoSuchGpu, NotHeld, OperatorHold, hold_of, holds_in, release_hold,
                                  write_hold)
from gpuperfd.config import SimulationConfig
from gpuperfd.device.simulated import SimulatedBackend


def test_a_hold_is_kept_in_its_state_directory_and_found_from_any_of_the_nodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    devices = SimulatedBackend(SimulationConfig(gpus=2, seed=3)).devices()
    uuid = devices[1].info().uuid
    old, new = tmp_path / "old", tmp_path / "new"
    assert write_hold(old, OperatorHold(uuid, 1, 600.0, 1_800_000_000.0, "overridden: by hand"))
    assert [p.name.endswith(SUFFIX) for p in old.iterdir()] == [True]  # no temp file left beside it
    assert hold_of([new, old], uuid) == OperatorHold(uuid, 1, 600.0, 1_800_000_000.0, "overridden: by hand")
    assert holds_in([new, old])[0].since_text() == "2027-01-15 08:00:00 UTC"
    with pytest.raises(NoSuchGpu, match=r"GPU 5 does not exist on this node \(its GPUs: 0, 1\)"):
        release_hold([new, old], devices, 5)
    with pytest.raises(NotHeld, match="GPU 0 is not held by an operator"):
        release_hold([new, old], devices, 0)
    assert release_hold([new, old], devices, 1).watts == 600.0 and holds_in([new, old]) == []


def test_an_unreadable_hold_keeps_its_gpu_held(tmp_path) -> None:  # type: ignore[no-untyped-def]
    devices = SimulatedBackend(SimulationConfig(gpus=1, seed=3)).devices()
    uuid = devices[0].info().uuid
    write_hold(tmp_path, OperatorHold(uuid, 0, 600.0, 1.0))
    (path,) = tmp_path.glob("*" + SUFFIX)
    path.write_text("{not json")
    assert hold_of([tmp_path], uuid) is not None  # never freed by a file it cannot read
    assert release_hold([tmp_path], devices, 0) and not path.exists()

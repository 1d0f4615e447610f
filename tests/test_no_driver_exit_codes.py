"""No NVIDIA driver exits 3 from every command that needs the GPUs (README: "3 no usable GPU backend"),
with the same message; this test machine has no driver, so each command meets the real absence."""

from __future__ import annotations

import pytest

from gpuperfd.cli import main


@pytest.mark.parametrize("argv", [
    ["probe", "llm", "--preset", "tiny", "--device", "cuda", "--no-progress"],
    ["probe", "interconnect"],
    ["probe", "interconnect", "--gpus", "0,1"],
    ["sweep", "--probe", "llm", "--preset", "tiny", "--caps", "200,300"],
    ["top", "--local", "--once"],
])
def test_no_driver_exits_3_with_the_driver_message(argv: list[str], tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPERFD_CONFIG", raising=False)
    if argv[0] == "sweep":
        argv = [*argv, "--state-dir", str(tmp_path / "state")]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "no NVIDIA driver found" in err and "Traceback" not in err
    assert "--simulate N" in err  # the way on without a GPU

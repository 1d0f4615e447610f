"""What ``gpuperfd check`` prints on examples/interconnect-faults.yaml (simulated 8 GPUs with link and
fabric faults): the interconnect line is not "ok" beside a GPU degraded for its interconnect, and one
fault is one line per GPU, not one per peer."""

from __future__ import annotations

from pathlib import Path

from gpuperfd.cli import main

EXAMPLE = Path(__file__).parents[3] / "examples" / "interconnect-faults.yaml"


def test_the_interconnect_line_and_the_reasons_say_what_the_verdicts_say(capsys) -> None:
    main(["check", "--config", str(EXAMPLE)])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("interconnect GPUs"))
    assert ": ok," not in line and "below expected on GPU(s) 5,6,7" in line, line
    gpu5 = [line for line in out.splitlines() if line.startswith("  gpu 5: [")]
    assert len(gpu5) == 2, gpu5  # link 0 and 1 down; the NVLinks below topology to each of 7 peers
    assert any("nvlink_links_below_topology" in line and "(and 6 more alike: 1-5, 2-5" in line for line in gpu5)

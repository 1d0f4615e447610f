"""``gpuperfd probe llm`` on the Llama presets: seed 004's table and the speculative curve in the
output, the speculative options, 'both'/'all' per model family, and bad input (exit 2, field named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuperfd.probe_data.workload_cost import SPECULATIVE_NOT_SIMULATED
from gpuperfd.commands import probe as cli
from gpuperfd.probing import matrix
from probe_cli_args import options, parse

FAST = ["--repeats", "2", "--measure-seconds", "0.1", "--no-progress"]


def test_both_and_all_expand_per_model_family() -> None:
    gpt2 = matrix.build_specs(options(["llm", "--preset", "tiny", "--variant", "both"]))
    assert [s.variant for s in gpt2] == ["graph", "eager"]
    assert [s.variant for s in matrix.build_specs(options(["llm", "--preset", "tiny", "--variant", "all"]))] == [
        "graph", "eager"]  # compiled and speculative are the Llama family's
    llama = matrix.build_specs(options(["llm", "--preset", "llama-tiny", "--variant", "all", "--speculative-tokens", "3"]))
    assert [s.variant for s in llama] == ["graph", "eager", "compiled", "fused", "speculative"]
    assert [s.speculative_tokens for s in llama] == [None, None, None, None, 3]


def test_speculative_options_reach_the_speculative_points_only() -> None:
    specs = matrix.build_specs(options(["llm", "--preset", "llama-tiny", "llama-tiny-spec", "--acceptance-rates", "0.6",
                                   "0.8"]))
    assert [(s.variant, s.acceptance_rates) for s in specs] == [("graph", None), ("speculative", (0.6, 0.8))]


def test_config_file_holds_seed_004s_keys(tmp_path: Path) -> None:
    config = tmp_path / "seed004.json"
    config.write_text(json.dumps({"probe": "llm", "preset": "llama-tiny-spec", "speculative_tokens": 2,
                                  "acceptance_rates": [0.25, 0.75]}))
    (spec,) = matrix.build_specs(options(["--config", str(config)]))
    assert (spec.variant, spec.speculative_tokens, spec.acceptance_rates) == ("speculative", 2, (0.25, 0.75))


@pytest.mark.parametrize(("argv", "field"), [
    (["--preset", "llama-tiny-spec", "--acceptance-rates", "1.5"], "acceptance_rates"),
    (["--preset", "llama-tiny-spec", "--speculative-tokens", "0"], "speculative_tokens"),
    (["--preset", "llama-tiny-spec", "--speculative-tokens", "99"], "speculative_tokens"),
    (["--preset", "llama-tiny", "--acceptance-rates", "0.5"], "acceptance_rates"),
    (["--preset", "llama-tiny-spec", "--draft-model", "gpt2"], "draft_model"),
    (["--preset", "llama-tiny", "--variant", "speculative", "--draft-model", "llama-3.2-1b"], "draft_model"),
])
def test_bad_speculative_input_exits_2_naming_the_field(argv: list[str], field: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never.jsonl"
    assert cli.main(parse(["llm", *argv, *FAST, "--output", str(out)])) == 2
    assert f"{field}: " in capsys.readouterr().err
    assert not out.exists()  # nothing ran, nothing written


def test_probe_prints_seed_004s_table_and_the_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "llama.jsonl"
    code = cli.main(parse(["llm", "--preset", "llama-tiny", "llama-tiny-spec", "--acceptance-rates", "0.5", "0.9",
                           *FAST, "--output", str(out)]))
    text = capsys.readouterr().out
    assert code == 0, text
    assert "TTFT ms" in text and "TPOT ms" in text
    table = text[text.index("model "):]
    assert "llama-tiny" in table and "speculative" in table and "graph" in table
    assert "random weights: the acceptance rate is not measured" in text
    assert "at the named rates:" in text and "curve:" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["result"]["variant"] for r in records] == ["graph", "speculative"]
    spec = records[1]["result"]["extra"]["speculative"]
    assert [p["acceptance_rate"] for p in spec["at_rates"]] == [0.5, 0.9]


def test_seed_004_table_puts_the_roofline_beside_the_decode_figure() -> None:
    from gpuperfd.probe_data.result import ProbeResult
    from gpuperfd.probing.llm_tables import seed004_table

    result = ProbeResult(probe="llm", variant="graph", preset="llama-3.1-8b", status="ok",
                         params={"model": "llama-3.1-8b", "batch_size": 1, "prompt_tokens": 128, "output_tokens": 128},
                         throughput={"decode_tokens_per_second": 170.0, "output_tokens_per_second": 160.0},
                         latencies={"ttft_seconds": [0.03], "tpot_seconds": [0.0059]},
                         extra={"roofline": {"tokens_per_second": 212.5, "share": 0.8}})
    gpt2 = ProbeResult(probe="llm", variant="graph", preset="gpt2", status="ok", params={"model": "gpt2"})
    table = seed004_table([result, gpt2])
    assert table is not None and "gpt2" not in table
    row = table.splitlines()[-1]
    assert "llama-3.1-8b" in row and "212.5" in row and "80.00" in row and "5.900" in row
    assert "HBM roofline tok/s" in table and "of roofline %" in table


def _gpuperfd(*argv: str, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    """The real ``gpuperfd`` command, as an operator runs it."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gpuperfd", *argv], capture_output=True, text=True, timeout=timeout)


def test_a_simulated_card_without_room_skips_the_point_as_the_docs_promise() -> None:
    """Issue 61: a simulated H100 ended a Llama batch that cannot fit ``failed (oom)``; docs/probes.md
    promises ``skipped``/``no_room`` with the need and the card's free memory named (the real child's words)."""
    out = _gpuperfd("probe", "llm", "--preset", "llama-3.1-8b", "--batch-size", "256", "--prompt-tokens", "2048",
                    "--simulate", "1", "--no-progress")
    assert "skipped:no_room" in out.stdout and "oom" not in out.stdout.replace("no_room", ""), out.stdout
    assert ("preset: llama-3.1-8b (llama-3.1-8b, batch 256) needs about 157.2 GiB of GPU memory; "
            "NVIDIA H100 80GB HBM3 has 79.5 GiB free of 80.0 GiB: not run (use a smaller preset or --batch-size)"
            in out.stderr), out.stderr
    assert out.returncode == 1  # not every point is ok (docs/probes.md, exit codes)


def test_a_simulated_speculative_point_says_it_is_not_speculation() -> None:
    """Issue 61: ``llama-3.1-8b-spec --simulate 1`` printed plain decode figures and no curve, silently."""
    out = _gpuperfd("probe", "llm", "--preset", "llama-3.1-8b-spec", "--simulate", "1", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert SPECULATIVE_NOT_SIMULATED in out.stdout
    plain = _gpuperfd("probe", "llm", "--preset", "llama-3.1-8b", "--simulate", "1", "--no-progress")
    assert "speculative" not in plain.stdout


def test_a_daemon_scheduling_a_speculative_preset_on_simulated_gpus_says_it_is_not_simulated(start_daemon) -> None:
    """The daemon's schedule of the speculative preset publishes plain decode figures: its log says so, once."""
    import time

    daemon = start_daemon([], """
device: {backend: simulated}
simulation: {gpus: 1}
probes:
  state_dir: state
  idle_seconds: 0
  jitter_seconds: 0
  first_run_delay_seconds: 0
  simulated_measure_seconds: 0.2
  schedules:
    - {probe: llm, preset: llama-3.1-8b-spec, interval_seconds: 3600, settle_seconds: 0}
""")
    deadline = time.monotonic() + 60
    while SPECULATIVE_NOT_SIMULATED not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert daemon.log().count(SPECULATIVE_NOT_SIMULATED) == 1, daemon.log()[-2000:]
    assert "preset llama-3.1-8b-spec: simulated: speculative decoding is not simulated" in daemon.log()


def test_a_cpu_without_the_host_memory_for_the_model_refuses_before_building_it() -> None:
    """Issue 61: on a CPU ``--preset llama-3.1-8b`` started allocating 32 GB with no look at the host's
    memory (killed after 38 s under a 10 GiB limit). The child compares the need with the host's
    available memory and the cgroup's limit first, and names both sides."""
    from gpuperfd.probe_data.workload_cost import llama_room_bytes
    from gpuperfd.system.cgroup_memory import memory_available

    argv = ["--preset", "llama-3.1-8b", "--device", "cpu", "--batch-size", "64", "--prompt-tokens", "4096"]
    need = llama_room_bytes({"model": "llama-3.1-8b", "batch_size": 64, "prompt_tokens": 4096, "output_tokens": 128,
                             "dtype": "float32"}, margin=False)
    room = min(memory_available(), default=None)
    if room is None or room[0] >= need:
        pytest.skip(f"this host has room for {need / 2**30:.0f} GiB")
    started = __import__("time").monotonic()
    out = _gpuperfd("probe", "llm", *argv, "--no-progress")
    assert __import__("time").monotonic() - started < 60
    assert "skipped:no_room" in out.stdout, out.stdout + out.stderr
    assert f"needs about {need / 2**30:.1f} GiB of host memory (float32 on a CPU); " in out.stderr, out.stderr
    assert ("GiB available: not run" in out.stderr or "cgroup's memory limit" in out.stderr), out.stderr


def test_a_sweep_stopped_for_no_room_says_so_not_interrupted(tmp_path: Path) -> None:
    """A careless operator's sweep of a batch the simulated card cannot hold said "interrupted after 1
    of 2 points" (nothing interrupted it); it names the reason, with the child's words in the log."""
    out = _gpuperfd("sweep", "--simulate", "1", "--probe", "llm", "--preset", "llama-3.1-8b", "--option",
                    "batch_size=256", "--option", "prompt_tokens=2048", "--caps", "max,500", "--settle", "0",
                    "--no-progress", "--state-dir", str(tmp_path))
    assert "skipped (no_room)" in out.stdout and "interrupted" not in out.stdout, out.stdout
    assert ("sweep stopped at 700 W after 1 of 2 points: the point has no room on this card (skipped, no_room): "
            "no recommendation") in out.stdout
    assert "needs about 157.2 GiB of GPU memory" in out.stderr

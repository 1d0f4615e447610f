"""Issue 61: a YAML bomb's error (billion laughs) printed 2 MB; the error is short and still names the
file and what was wrong, through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _laughs(levels: int) -> str:
    """A billion-laughs document: each level's list holds the previous level nine times."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _gpuperfd(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuperfd", *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [["check-config"], ["run", "--config"]])
def test_a_billion_laughs_file_is_refused_in_one_short_line_naming_the_file(tmp_path: Path, command: list[str]) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs(9))  # 9**9 = 387 million strings once expanded
    done = _gpuperfd(*command, str(bomb))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr) < 400, f"{len(done.stderr)} bytes"
    assert done.stderr.startswith(f"gpuperfd: {bomb}: not valid YAML: its aliases (*name) expand it to ")
    assert "a 'billion laughs' document?" in done.stderr and "Traceback" not in done.stderr


def test_a_file_of_many_large_bad_values_gets_a_bounded_error(tmp_path: Path) -> None:
    """Below the alias limit (9**5 values) every layer's 'got' value was printed: hundreds of KiB."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(_laughs(5) + "".join(f"typo{i}: {i}\n" for i in range(50)))
    done = _gpuperfd("check-config", str(bad))
    assert done.returncode == 2
    assert len(done.stderr) < 6000, f"{len(done.stderr)} bytes"
    assert f"gpuperfd: {bad}: invalid configuration (55 problem(s)):" in done.stderr
    assert "  - l4: unknown field" in done.stderr and "  - ... and 35 more" in done.stderr

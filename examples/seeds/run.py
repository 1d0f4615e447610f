"""Run one seed's worked example end to end: its runs, then its report.

    python examples/seeds/run.py 000 [--out DIR]

Each ``seed-NNN.yaml`` here holds the seed's question, the gpuperfd command lines that answer
it (tiny presets on the CPU, simulated GPUs where the seed needs GPU columns; each under two
minutes), the report command, and the columns the seed names (checked filled by
tests/report/test_seed_examples.py). Commands run in-process, in DIR, as a newcomer would type
them (labels as ``--label KEY=VALUE`` on the command line).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load(seed: str) -> dict[str, Any]:
    import yaml

    path = HERE / f"seed-{seed}.yaml"
    if not path.exists():
        known = ", ".join(p.stem[5:] for p in sorted(HERE.glob("seed-*.yaml")))
        raise SystemExit(f"no example for seed {seed!r}; there are: {known}")
    return yaml.safe_load(path.read_text())


def run(seed: str, workdir: Path) -> Path:
    """Run the example's commands in ``workdir``; returns the report folder."""
    from gpuperfd.cli import main

    spec = load(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    for folder in spec.get("folders") or []:
        (workdir / folder).mkdir(parents=True, exist_ok=True)
    for name, text in (spec.get("files") or {}).items():
        (workdir / name).write_text(text)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        for step in spec["runs"]:
            argv = [str(a) for a in step["argv"]]
            for _ in range(int(step.get("times", 1))):
                code = main(argv)
                if code != 0:
                    raise RuntimeError(f"seed {seed}: gpuperfd {' '.join(argv)} exited {code}")
        report = [str(a) for a in spec["report"]]
        if main(report) != 0:
            raise RuntimeError(f"seed {seed}: gpuperfd {' '.join(report)} failed")
        return workdir / report[report.index("--out") + 1]
    finally:
        os.chdir(cwd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seed", help="000 ... 004")
    parser.add_argument("--out", default=None, help="working folder (default: seed-NNN-example)")
    args = parser.parse_args(argv)
    out = run(args.seed, Path(args.out or f"seed-{args.seed}-example").resolve())
    print(f"report: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

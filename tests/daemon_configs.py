"""The ``probes:`` section the tests' real daemons start from, written once.

Every test daemon keeps its probe state (and history) in the test's own directory and runs a due
schedule without jitter; most also skip the wait for an idle GPU. The tests add their own keys
(first run delay, measure time, schedules) after it, indented two spaces.
"""

from __future__ import annotations

from pathlib import Path


def probes_section(state: Path | str, *, writable: bool = False, history: bool = True,
                   idle_seconds: float = 0) -> str:
    """``probes:`` with ``state_dir`` at ``state``, the history in ``state/history.jsonl`` (none when
    ``history`` is False), ``idle_seconds`` and no jitter; ``writable`` lets the probes change caps
    (``read_only: false``)."""
    lines = ["probes:"]
    if writable:
        lines.append("  read_only: false")
    lines += [
        f"  state_dir: {state}",
        f"  history: {{path: {f'{state}/history.jsonl' if history else 'null'}}}",
        f"  idle_seconds: {idle_seconds:g}",
        "  jitter_seconds: 0",
    ]
    return "\n".join(lines) + "\n"


def simulated_daemon(state: Path | str, *, gpus: int, seed: int, writable: bool = False, history: bool = True,
                     idle_seconds: float = 0) -> str:
    """A daemon's config on ``gpus`` simulated GPUs (``seed``) up to its :func:`probes_section`."""
    return (f"device: {{backend: simulated}}\nsimulation: {{gpus: {gpus}, seed: {seed}}}\n"
            + probes_section(state, writable=writable, history=history, idle_seconds=idle_seconds))

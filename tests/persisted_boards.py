"""Two simulated GPUs whose power limits outlive the daemon, as a real board keeps its limit.

``simulation.state_file`` holds the boards' limits across daemon processes: a daemon SIGKILLed with a
cap changed leaves it changed for the next one to find. Used by the tests that kill, stop and reload
real daemons mid-sweep or while apply mode holds a cap.
"""

from __future__ import annotations

import json
from pathlib import Path

from daemon_configs import probes_section

#: The operator's caps the boards start at (GPU index -> watts, as the state file keys them).
ORIGINAL = {"0": 650.0, "1": 640.0}


def boards(state: Path) -> str:
    """The config's ``device`` and ``simulation`` sections: the two boards, their limits in STATE/sim-limits.json."""
    return ("device: {backend: simulated}\n"
            "simulation:\n"
            "  gpus: 2\n"
            "  seed: 1\n"
            "  initial_power_limits: {0: 650, 1: 640}\n"
            f"  state_file: {state}/sim-limits.json\n")


def board_limits(state: Path) -> dict[str, float]:
    """The boards' limits now; the file appears at the first change (before it: ORIGINAL)."""
    path = state / "sim-limits.json"
    return json.loads(path.read_text()) if path.exists() else dict(ORIGINAL)


def operator_sets(state: Path, gpu: int, watts: float) -> None:
    """The operator's hand change (``nvidia-smi -i GPU -pl WATTS``): a process of its own, on the shared
    board, that journals nothing."""
    from gpuperfd.config import SimulationConfig
    from gpuperfd.device.simulated import SimulatedBackend

    board = SimulatedBackend(SimulationConfig(gpus=2, seed=1, initial_power_limits={0: 650, 1: 640},
                                              state_file=state / "sim-limits.json"))
    board.devices()[gpu].set_power_limit(watts)


#: A daemon in apply mode on the two boards: one llm schedule (a sweep of five caps), apply every second.
APPLY_CONFIG = """
log_level: info
sampler: {{interval_seconds: 0.2}}
{boards}health: {{interval_seconds: 0.5}}
{probes}  first_run_delay_seconds: {first_run}
  simulated_measure_seconds: {measure}
  schedules:
    - probe: llm
      interval_seconds: {interval}
      caps: [max, current, 500, 400, 300]
      settle_seconds: 0
apply: {{mode: {mode}, workload: llm, budget_ratio: 0.1, interval_seconds: 1}}
"""


def apply_config(state: Path, mode: str = "on", first_run: float = 0.1, interval: float = 3600,
                 measure: float = 0.05) -> str:
    """The config text of a daemon in apply ``mode`` on the two boards, its state in ``state``."""
    return APPLY_CONFIG.format(boards=boards(state), probes=probes_section(state, writable=True), mode=mode,
                               first_run=first_run, interval=interval, measure=measure)

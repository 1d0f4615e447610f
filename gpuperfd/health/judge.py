"""Judge ``gpuperfd check``'s one-shot inputs: passive readings plus the short probe's result.

Pure: the one-shot flow (:mod:`gpuperfd.probing.check.flow`) gathers each GPU's
:class:`~gpuperfd.health.evaluate.GpuInputs` from one synchronous sampler read
(:func:`gpuperfd.health.monitor.snapshot_inputs`), adds the check probe's run and the
expected figures, and this module runs the same evaluators the daemon runs (every row of
``CHECKS``) plus the one-shot rows (``ACTIVE_CHECKS``). No second copy of any check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuperfd.device.reference_figures import MEASURED_POWER_LIMIT_WATTS, REAL_PROBE_FIGURES
from gpuperfd.health.checks import ACTIVE_CHECKS, CHECKS, defaults
from gpuperfd.health.evaluate import GpuInputs, evaluate_gpu
from gpuperfd.health.verdict import Verdict

#: NVML product names whose boards the shipped figures were measured on (the SXM parts at 700 W);
#: an H100 PCIe or H200 NVL is another board (other limits, other clocks): peers only.
MODEL_NAMES: Mapping[str, str] = {
    "NVIDIA H100 80GB HBM3": "H100",
    "NVIDIA H200": "H200",
}

#: Within this many watts of the figures' 700 W, a GPU's enforced limit counts as the same.
LIMIT_TOLERANCE_WATTS = 1.0


def expected_figure(gpu_name: str, probe: str, preset: str,
                    power_limit_watts: float | None) -> tuple[dict[str, Any] | None, str]:
    """The shipped figure for this GPU model, probe and preset at its power limit, or None and why not."""
    model = MODEL_NAMES.get(gpu_name)
    if model is None:
        return None, f"no expected figure for {gpu_name or 'this model'}: peers only"
    row = REAL_PROBE_FIGURES.get(model, {}).get(f"{probe}/{preset}")
    if row is None:
        return None, f"no expected figure for {model} {probe}/{preset}: peers only"
    if power_limit_watts is None or abs(power_limit_watts - MEASURED_POWER_LIMIT_WATTS) > LIMIT_TOLERANCE_WATTS:
        limit = "unknown" if power_limit_watts is None else f"{power_limit_watts:.0f} W"
        return None, (f"the expected figures are for {MEASURED_POWER_LIMIT_WATTS:.0f} W and this GPU's limit is "
                      f"{limit}: peers only")
    rate = float(row["units_per_second"])  # type: ignore[arg-type]
    power = float(row["average_power_watts"])  # type: ignore[arg-type]
    return {"model": model, "unit": row["unit"], "units_per_second": rate, "energy_per_unit_joules": power / rate,
            "power_limit": MEASURED_POWER_LIMIT_WATTS,
            "source": "gpuperfd/device/reference_figures.py"}, ""


def run_row(result: Mapping[str, Any], power_limit_watts: float | None, time: float) -> dict[str, Any]:
    """The flat run the evaluators read, from a ProbeResult's dict. ``correctness`` and
    ``fingerprint`` are read defensively (top level or ``extra``) until every probe has them."""
    extra = result.get("extra") or {}
    measured = result.get("measured_seconds")
    units = result.get("units_of_work")
    ok = result.get("status") == "ok"
    rate = units / measured if ok and isinstance(units, (int, float)) and measured else None
    error = str(result.get("error_message") or "").splitlines()
    return {
        "time": time, "status": result.get("status"), "failure_reason": result.get("failure_reason"),
        "error": error[0] if error else None, "probe": result.get("probe"), "preset": result.get("preset"),
        "power_cap_watts": power_limit_watts if power_limit_watts is not None else result.get("power_limit_watts"),
        "units_per_second": rate, "energy_per_unit_joules": result.get("energy_per_unit_joules") if ok else None,
        "work_unit": result.get("work_unit"), "wall_seconds": result.get("wall_seconds"),
        "correctness": result.get("correctness") or extra.get("correctness"),
        "fingerprint": result.get("fingerprint") or extra.get("fingerprint"),
    }


def judge(inputs: Sequence[GpuInputs], thresholds: Mapping[str, float] | None, now: float,
          interconnect: Mapping[str, Any] | None = None) -> list[Verdict]:
    """One verdict per GPU: every row of the daemon's table, then the one-shot rows. ``interconnect``:
    the check's interconnect run and the topology as :func:`gpuperfd.health.interconnect.interconnect_inputs`
    gives them (None: the pair rows judge nothing)."""
    settings = {**defaults(), **(thresholds or {})}
    verdicts = []
    for gpu in inputs:
        if interconnect is not None:
            gpu.interconnect = dict(interconnect)
        reasons = evaluate_gpu(gpu, inputs, settings, now, CHECKS)
        if not gpu.missing and not gpu.lost:
            reasons += evaluate_gpu(gpu, inputs, settings, now, ACTIVE_CHECKS)
        verdicts.append(Verdict(gpu.gpu, gpu.uuid, reasons, evaluated_at=now))
    return verdicts

"""What a probe run is asked to do: plain data, built once from a schedule or from CLI flags.

The YAML schedule (``ScheduleConfig``) stays in ``config/``; the code that runs probes (executors,
sessions, the simulated probe) takes a :class:`ProbeRequest`, so it reads no configuration model
and a caller without a schedule (a CLI, a test) builds one in a line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuperfd.probe_data.spec import ProbeSpec


@dataclass(frozen=True)
class ProbeRequest:
    """One probe to run at whatever cap the GPU holds when a point is measured."""

    #: Probe name (attention, llm, vit, train).
    probe: str
    #: Model preset; None: the probe's default.
    preset: str | None = None
    #: Workload options on top of the preset (batch_size, dtype, repeats, ...).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Upper bound, seconds, on waiting for power and clocks to settle before a point is measured.
    settle_seconds: float = 5.0
    #: Hard limit of one point, seconds (a build included); None: the executor's own.
    timeout_seconds: float | None = None

    @classmethod
    def from_spec(cls, spec: ProbeSpec, timeout_seconds: float | None = None) -> ProbeRequest:
        """Every field of a built spec, its torch device included (``gpuperfd probe``'s points: the
        child runs exactly the spec the flags made), read-only and unsettled as a one-shot point is."""
        fields = {k: v for k, v in spec.to_dict().items() if k not in ("probe", "preset")}
        return cls(spec.probe, spec.preset, fields, settle_seconds=0.0, timeout_seconds=timeout_seconds)

"""Verdict types and the one JSON shape of a node's health.

A GPU's verdict is the most severe of its reasons: ``state`` says whether work can run
there, ``action`` what to do. ``node_verdict_json`` is the only serializer: the daemon's
``GET /api/v1/health`` and a one-shot ``gpuperfd check --json`` answer in this shape
(``schema: gpuperfd.health/1``). Plain data, standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "gpuperfd.health/1"

#: Verdict states, least severe first. ``unknown``: the verdict could not be established
#: (an XID code the catalog does not list, a lost state file); it ranks above healthy and
#: below degraded, so a known problem is never hidden behind "we don't know".
STATES: tuple[str, ...] = ("healthy", "unknown", "degraded", "unhealthy")

#: Reason severities, in the same order: each names the state it implies (info -> healthy).
SEVERITIES: tuple[str, ...] = ("info", "unknown", "degraded", "unhealthy")
SEVERITY_STATE: Mapping[str, str] = dict(zip(SEVERITIES, STATES))

#: Actions, least drastic first; between reasons of equal severity the more drastic wins.
ACTIONS: tuple[str, ...] = (
    "none",
    "restart_app",
    "update_software",
    "restart_fabric_manager",
    "reset_gpu",
    "reboot_node",
    "check_hardware",
    "contact_support",
)


@dataclass
class Reason:
    """Why a GPU is not simply healthy: one check that fired.

    ``key`` tells instances of one check apart (an XID code, a probe/preset/cap);
    ``since`` is when it first fired and ``last_seen`` when it last did (wall-clock
    seconds); ``evidence`` holds the values the check read.
    """

    check: str
    severity: str
    action: str
    message: str
    since: float
    evidence: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    last_seen: float = 0.0

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"reason {self.check}: severity {self.severity!r} is not one of {SEVERITIES}")
        if self.action not in ACTIONS:
            raise ValueError(f"reason {self.check}: action {self.action!r} is not one of {ACTIONS}")
        if not self.last_seen:
            self.last_seen = self.since

    @property
    def ident(self) -> tuple[str, str]:
        return (self.check, self.key)

    def rank(self) -> tuple[int, int]:
        return (SEVERITIES.index(self.severity), ACTIONS.index(self.action))

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check, "key": self.key, "severity": self.severity, "action": self.action,
            "message": self.message, "since": self.since, "last_seen": self.last_seen, "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reason:
        """Raises KeyError, TypeError or ValueError on a malformed entry."""
        return cls(
            check=str(data["check"]), severity=str(data["severity"]), action=str(data["action"]),
            message=str(data["message"]), since=float(data["since"]), evidence=dict(data.get("evidence") or {}),
            key=str(data.get("key", "")), last_seen=float(data.get("last_seen") or data["since"]),
        )


@dataclass
class Verdict:
    """One GPU's verdict. ``gpu`` is None for a GPU seen at the first start and missing now."""

    gpu: int | None
    uuid: str
    reasons: list[Reason] = field(default_factory=list)
    evaluated_at: float = field(default_factory=time.time)

    def _worst(self) -> Reason | None:
        return max(self.reasons, key=Reason.rank, default=None)

    @property
    def state(self) -> str:
        worst = self._worst()
        return "healthy" if worst is None else SEVERITY_STATE[worst.severity]

    @property
    def action(self) -> str:
        worst = self._worst()
        return "none" if worst is None else worst.action

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "uuid": self.uuid, "state": self.state, "action": self.action,
            "evaluated_at": self.evaluated_at,
            "reasons": [r.to_dict() for r in sorted(self.reasons, key=Reason.rank, reverse=True)],
        }


def worst(verdicts: Iterable[Verdict]) -> tuple[str, str]:
    """The node's (state, action): those of its worst GPU (healthy/none for no GPUs)."""
    best: tuple[tuple[int, int], str, str] = ((0, 0), "healthy", "none")
    for verdict in verdicts:
        rank = (STATES.index(verdict.state), ACTIONS.index(verdict.action))
        if rank > best[0]:
            best = (rank, verdict.state, verdict.action)
    return best[1], best[2]


def node_verdict_json(verdicts: Iterable[Verdict], node: str = "", **extra: Any) -> dict[str, Any]:
    """The one JSON shape of a node's health: node verdict (its worst GPU's) plus every GPU's."""
    verdicts = list(verdicts)
    state, action = worst(verdicts)
    body: dict[str, Any] = {"schema": SCHEMA, "node": node, "state": state, "action": action}
    body.update(extra)
    body["gpus"] = [v.to_dict() for v in sorted(verdicts, key=lambda v: (v.gpu is None, v.gpu or 0, v.uuid))]
    return body

"""The saved verdicts: what the monitor must not forget across a daemon restart.

One JSON file in the state directory (``health.json``), written atomically (temp file,
fsync, rename). It holds the boot id, the GPUs seen at the first start on this node, each
GPU's sticky reasons and its last seen reset. An unreadable or corrupt file is logged, kept
aside as ``health.json.corrupt`` for inspection, and reported: every GPU then gets the
``health_state_unreadable`` reason (verdict ``unknown`` until a probe passes), never a
silent ``healthy`` (docs/health.md).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuperfd.health.verdict import Reason
from gpuperfd.system.files import replace_file

log = logging.getLogger(__name__)

SCHEMA = "gpuperfd.health-state/1"
FILE_NAME = "health.json"
MAX_BYTES = 4 * 1024 * 1024


@dataclass
class SavedState:
    boot_id: str = ""
    first_gpus: list[str] = field(default_factory=list)
    reasons: dict[str, list[Reason]] = field(default_factory=dict)
    resets: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "boot_id": self.boot_id, "first_gpus": self.first_gpus,
            "reasons": {uuid: [r.to_dict() for r in rs] for uuid, rs in self.reasons.items()},
            "resets": self.resets,
        }

    @classmethod
    def from_json(cls, data: Any) -> SavedState:
        """Raises ValueError (or KeyError/TypeError) naming what is wrong."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document")
        first = data.get("first_gpus", [])
        if not isinstance(first, list) or not all(isinstance(u, str) for u in first):
            raise ValueError("first_gpus is not a list of UUIDs")
        reasons = {str(uuid): [Reason.from_dict(r) for r in rs] for uuid, rs in dict(data.get("reasons", {})).items()}
        resets = {str(uuid): float(t) for uuid, t in dict(data.get("resets", {})).items()}
        return cls(str(data.get("boot_id", "")), list(first), reasons, resets)


class HealthStore:
    """Load and save :class:`SavedState` in ``state_dir``."""

    def __init__(self, state_dir: Path | str | None) -> None:
        #: None: kept in memory only (simulated GPUs without an identity of their own; see the daemon).
        self.path = Path(state_dir) / FILE_NAME if state_dir is not None else None

    def load(self) -> tuple[SavedState | None, str | None]:
        """(state, None); (None, None) when there is no file yet; (None, error) when it is unreadable."""
        if self.path is None:
            return None, None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return self._bad(f"cannot open: {exc.strerror or exc}")
        try:
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            return SavedState.from_json(json.loads(raw.decode("utf-8"))), None
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return self._bad(str(exc) or type(exc).__name__)

    def _bad(self, error: str) -> tuple[None, str]:
        log.error("health state %s is unreadable (%s): verdicts are unknown until a probe passes; "
                  "the file is kept as %s.corrupt", self.path, error, self.path.name)
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".corrupt"))
        except OSError as exc:
            log.error("cannot move %s aside: %s", self.path, exc)
        return None, error

    def save(self, state: SavedState) -> None:
        """Atomic replace; an error is logged (the verdicts in memory stay right)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(self.path, json.dumps(state.to_json(), separators=(",", ":"), default=str).encode())
        except OSError as exc:
            log.error("cannot save health state %s: %s", self.path, exc)

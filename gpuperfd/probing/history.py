"""Local probe history: every result appended to a JSON-lines file, with rotation.

A node keeps its own record without Prometheus; `gpuperfd report` reads these
files. Each line is one probe run at one cap, a ``gpuperfd.run/1`` record
(:func:`gpuperfd.probe_data.record.build_record`, the same format ``probe --output`` and
``sweep --output`` write).
Rotation renames history.jsonl -> history.jsonl.1 -> ... up to ``backups``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuperfd.device.base import GpuInfo
from gpuperfd.probe_data.record import build_record

log = logging.getLogger(__name__)


class HistoryWriter:
    """Thread-safe appender with size-based rotation."""

    def __init__(self, path: Path | str, max_bytes: int = 16 * 1024 * 1024, backups: int = 3) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self.node = socket.gethostname()

    def _rotate(self) -> None:
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def append(
        self,
        gpu: GpuInfo,
        result: dict[str, Any],
        power_cap_watts: float | None,
        original_cap_watts: float | None = None,
        sweep_id: str | None = None,
        sweep_points: int | None = None,
    ) -> None:
        try:
            record = build_record(
                result, "daemon", gpu={k: v for k, v in asdict(gpu).items() if k != "serial"}, host=self.node,
                power_cap_watts=power_cap_watts, original_cap_watts=original_cap_watts, sweep_id=sweep_id,
                sweep_points=sweep_points,
            )
        except (TypeError, ValueError) as exc:  # history is best effort; metrics still publish
            log.error("cannot record a probe result in the history: %s", exc)
            return
        self.append_record(record)

    def append_record(self, record: dict[str, Any]) -> None:
        """Append one JSON record (rotating first when the file would pass ``max_bytes``); best effort."""
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                    self._rotate()
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as exc:  # history is best effort; metrics still publish
                log.error("cannot write probe history %s: %s", self.path, exc)


def read_history(path: Path | str, include_rotated: bool = True) -> Iterator[dict[str, Any]]:
    """Records from a history file (and its rotated backups, oldest first); bad lines skipped."""
    path = Path(path)
    files = []
    if include_rotated:
        backups = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
        files += [p for p in backups if p.suffix[1:].isdigit()]
    files.append(path)
    for file in files:
        if not file.exists():
            continue
        with open(file, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    log.warning("%s:%d: skipped a malformed history line", file, number)

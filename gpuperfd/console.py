"""Tiny, dependency-free console helpers shared by the CLI commands.

* :class:`ProgressBar`: one self-overwriting line on stderr when the stream is a
  terminal. When it is not (a log, a pipe, CI), it draws nothing but prints one plain
  line per finished point (:meth:`ProgressBar.point_done`: what, its result, elapsed
  and time left), so a long matrix is never silent until the end. ``--no-progress``
  turns both off. Redraws are rate-limited so a fast loop costs nothing.
* :func:`format_table`: plain-text, column-aligned tables (numbers right-aligned)
  that read well in a terminal and paste cleanly into Markdown-free places.
* :func:`format_number`, :func:`format_duration`: compact human units for table cells.

Nothing here imports anything outside the standard library, so the daemon and the
lightweight CLI paths can use it freely.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any

__all__ = ["ProgressBar", "format_table", "format_number", "format_duration", "is_tty", "seconds_between"]


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type`` for a number of seconds in [low, high], its error naming the text and the range."""
    import argparse

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} s: give between {low:g} and {high:g} seconds")
        return value

    return parse


def is_tty(stream: IO[str] | None) -> bool:
    """True when ``stream`` is an interactive terminal (never raises)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or odd streams
        return False


def format_duration(seconds: float | None) -> str:
    """``75.2`` -> ``"1m15s"``; short and stable width for progress lines."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_number(value: Any, digits: int = 4) -> str:
    """A table cell for ``value``: ``None`` -> ``"-"``, floats to ``digits`` significant digits.

    Large and small magnitudes use SI-free scientific notation only outside
    [1e-3, 1e7) so ordinary throughputs stay readable (``12345.7``, ``0.0587``).
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1e7 or magnitude < 1e-3:
            return f"{value:.{max(digits - 1, 0)}e}"
        decimals = max(digits - 1 - int(math.floor(math.log10(magnitude))), 0)
        return f"{value:.{decimals}f}"
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    align: Sequence[str] | None = None,
    digits: int = 4,
    drop_empty: bool = False,
) -> str:
    """Format ``rows`` under ``headers`` as aligned plain text.

    ``drop_empty`` leaves out columns with no value in any row (no TTFT or req/s columns in a table of
    vit and attention points).

    ``align`` gives ``"l"`` or ``"r"`` per column; by default a column is
    right-aligned when every non-empty cell in it is a number. Cells go through
    :func:`format_number`.
    """
    raw_rows = [list(row) for row in rows]
    width = len(headers)
    for row in raw_rows:
        if len(row) != width:
            raise ValueError(f"row has {len(row)} cells, expected {width}: {row!r}")
    if drop_empty and raw_rows:
        keep = [c for c in range(width) if any(row[c] not in (None, "") for row in raw_rows)]
        headers = [headers[c] for c in keep]
        raw_rows = [[row[c] for c in keep] for row in raw_rows]
        if align is not None:
            align = [align[c] for c in keep]
        width = len(headers)
    if align is None:
        align = []
        for col in range(width):
            cells = [row[col] for row in raw_rows if row[col] is not None]
            numeric = bool(cells) and all(
                isinstance(c, (int, float)) and not isinstance(c, bool) for c in cells
            )
            align.append("r" if numeric else "l")
    elif len(align) != width:
        raise ValueError(f"align has {len(align)} entries, expected {width}")
    text_rows = [[format_number(cell, digits) for cell in row] for row in raw_rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for col, cell in enumerate(row):
            widths[col] = max(widths[col], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = []
        for col, cell in enumerate(cells):
            parts.append(cell.rjust(widths[col]) if align[col] == "r" else cell.ljust(widths[col]))
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(row) for row in text_rows)
    return "\n".join(out)


class ProgressBar:
    """A single-line progress bar on stderr: ``desc [#####.....] 5/10 12s<12s msg``.

    ``enabled=None`` means "a bar on a terminal, one line per finished point elsewhere"
    (:attr:`mode` is ``"bar"`` or ``"lines"``); ``enabled=True`` forces the bar,
    ``enabled=False`` silences both (``"off"``). Use as a context manager or call
    :meth:`close`; ``update`` and ``set_message`` are cheap when disabled. Not
    thread-safe: drive it from one thread.
    """

    def __init__(
        self,
        total: int,
        desc: str = "",
        enabled: bool | None = None,
        stream: IO[str] | None = None,
        width: int = 24,
        min_interval: float = 0.1,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        tty = is_tty(self.stream)
        self.enabled = tty if enabled is None else bool(enabled)
        #: "bar" (a terminal), "lines" (not a terminal, progress left on), "off" (--no-progress).
        self.mode = "bar" if self.enabled else ("lines" if enabled is None else "off")
        self.total = max(int(total), 0)
        self.desc = desc
        self.width = width
        self.min_interval = min_interval
        self.count = 0
        self.message = ""
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_len = 0
        self._closed = False

    def __enter__(self) -> ProgressBar:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1, message: str | None = None) -> None:
        """Advance by ``n`` steps (clamped to total) and optionally change the message."""
        self.count = min(self.count + n, self.total) if self.total else self.count + n
        if message is not None:
            self.message = message
        self._draw(force=self.count >= self.total)

    def eta(self) -> float | None:
        """Seconds left, from the pace so far (None before the first step)."""
        if not self.count or not self.total:
            return None
        elapsed = time.monotonic() - self._start
        return elapsed / self.count * max(self.total - self.count, 0)

    def point_done(self, what: str, result: str) -> None:
        """A point finished: in ``lines`` mode, one line ``what: result (elapsed 12s, about 30s left)``.

        Call it after :meth:`update` has counted the point's steps, so the time left is current.
        On a terminal the bar already shows it, so nothing extra is printed.
        """
        if self.mode != "lines" or self._closed:
            return
        elapsed = time.monotonic() - self._start
        left = self.eta()
        if self.total and self.count >= self.total:
            timing = f"done in {format_duration(elapsed)}"
        else:
            timing = f"elapsed {format_duration(elapsed)}, about {format_duration(left)} left"
        counts = f" {self.count}/{self.total}" if self.total else ""
        prefix = f"{self.desc}{counts}: " if self.desc or counts else ""
        try:
            self.stream.write(f"{prefix}{what}: {result} ({timing})\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.mode = "off"

    def set_message(self, message: str) -> None:
        self.message = message
        self._draw()

    def render(self) -> str:
        """The current line, without the carriage return (for tests and logs)."""
        elapsed = time.monotonic() - self._start
        if self.total:
            frac = self.count / self.total
            filled = int(round(frac * self.width))
            bar = "#" * filled + "." * (self.width - filled)
            eta = self.eta()
            counts = f"{self.count}/{self.total}"
            timing = f"{format_duration(elapsed)}<{format_duration(eta)}"
            text = f"[{bar}] {counts} {timing}"
        else:
            text = f"{self.count} {format_duration(elapsed)}"
        if self.desc:
            text = f"{self.desc} {text}"
        if self.message:
            text = f"{text} {self.message}"
        return text

    def _draw(self, force: bool = False) -> None:
        if not self.enabled or self._closed:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        text = self.render()
        pad = max(self._last_len - len(text), 0)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False
        self._last_len = len(text)

    def write(self, text: str) -> None:
        """Print a line above the bar without garbling it."""
        if self.enabled and not self._closed and self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
        self.stream.write(text.rstrip("\n") + "\n")
        self._last_len = 0
        self._draw(force=True)

    def close(self) -> None:
        """Draw the final state and end the line (once)."""
        if self._closed:
            return
        if self.enabled:
            self._draw(force=True)
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self._closed = True

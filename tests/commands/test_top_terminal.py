"""``gpuperfd top`` in a real terminal (a pty): redraws in place within the width and height, Ctrl-C exits 0
and gives the terminal back (cursor shown, main screen)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

from gpuperfd.commands.top import ENTER, LEAVE

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_until(fd: int, predicate, timeout: float) -> bytes:  # type: ignore[no-untyped-def]
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate(data):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return data


def test_ctrl_c_in_a_40_by_12_terminal(tmp_path) -> None:
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 12, 40, 0, 0))  # 12 rows, 40 columns
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TERM="xterm", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpuperfd", "top", "--simulate", "2", "--interval", "0.2"],
                            stdin=child_fd, stdout=child_fd, stderr=child_fd, env=env, cwd=tmp_path,
                            start_new_session=True,
                            # as a terminal's foreground job has it: a runner started in the background
                            # (`cmd &`) ignores SIGINT, and an ignored disposition survives exec
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(child_fd)
    try:
        shown = read_until(main_fd, lambda d: d.count(b"\x1b[H") >= 3, 30).decode(errors="replace")
        assert shown.count("\x1b[H") >= 3, shown  # redrawn in place, frame after frame
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C goes to the terminal's foreground group
        rest = read_until(main_fd, lambda d: LEAVE.encode() in d, 15).decode(errors="replace")
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main_fd)
    text = shown + rest
    assert text.startswith(ENTER) and text.rstrip("\r\n").endswith(LEAVE) and "Traceback" not in text
    frame = text.split("\x1b[H")[2].split("\x1b[J")[0]
    lines = [ANSI.sub("", line) for line in frame.replace("\r", "").split("\n")]
    assert all(len(line) <= 40 for line in lines), lines
    assert len(lines) <= 11  # never taller than the terminal: it would scroll and garble the next redraw
    assert lines[-1].startswith("...") and "more line(s)" in lines[-1]
    assert "GPU 0" in frame and "\x1b[32mup\x1b[0m" in frame  # colour on a terminal

"""gpuperfd.console: table formatting and the progress bar."""

from __future__ import annotations

import io

import pytest

from gpuperfd.console import ProgressBar, format_duration, format_number, format_table


def test_format_number() -> None:
    assert format_number(None) == "-"
    assert format_number(True) == "yes"
    assert format_number(12) == "12"
    assert format_number(1234.5678) == "1235"
    assert format_number(0.058712) == "0.05871"
    assert format_number(5.8e14) == "5.800e+14"
    assert format_number(float("nan")) == "nan"
    assert format_number("abc") == "abc"


def test_format_duration() -> None:
    assert format_duration(5.2) == "5s"
    assert format_duration(75) == "1m15s"
    assert format_duration(7322) == "2h02m"
    assert format_duration(None) == "--"


def test_format_table_aligns_numbers_right_and_text_left() -> None:
    text = format_table(["name", "rate"], [["a", 1.5], ["longer", 123.26]])
    lines = text.splitlines()
    assert lines[0].startswith("name  ")
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].startswith("a     ") and lines[2].endswith("1.500")
    assert lines[3].endswith("123.3")
    # every line has the rate column ending at the same place
    assert len({len(line) for line in lines}) == 1


def test_format_table_checks_widths() -> None:
    with pytest.raises(ValueError):
        format_table(["a", "b"], [[1]])
    with pytest.raises(ValueError):
        format_table(["a"], [[1]], align=["l", "r"])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_is_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    with ProgressBar(3, desc="x", stream=stream) as bar:
        bar.update(1, "one")
        bar.write("a line")
    assert stream.getvalue() == "a line\n"


def test_progress_bar_draws_on_a_terminal_and_can_be_disabled() -> None:
    stream = _Tty()
    with ProgressBar(4, desc="probe", stream=stream, min_interval=0) as bar:
        bar.update(2, "half")
        assert "2/4" in bar.render() and "half" in bar.render()
    out = stream.getvalue()
    assert "\r" in out and "4/4" not in out and out.endswith("\n")
    assert "[############............] 2/4" in out
    quiet = _Tty()
    with ProgressBar(4, stream=quiet, enabled=False) as bar:
        bar.update(4)
    assert quiet.getvalue() == ""


def test_progress_bar_clamps_to_total() -> None:
    bar = ProgressBar(2, stream=io.StringIO())
    bar.update(5)
    assert bar.count == 2


def test_progress_lines_when_not_a_terminal_one_per_finished_point() -> None:
    stream = io.StringIO()
    with ProgressBar(4, desc="probe", stream=stream) as bar:
        assert bar.mode == "lines"
        bar.update(2, "measuring")  # steps alone print nothing in a log
        assert stream.getvalue() == ""
        bar.point_done("[1/2] llm tiny b=1", "ok 123.4 tokens/s")
        bar.update(2)
        bar.point_done("[2/2] llm tiny b=4", "failed (oom)")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()
    assert lines[0].startswith("probe 2/4: [1/2] llm tiny b=1: ok 123.4 tokens/s (elapsed ")
    assert "left)" in lines[0]
    assert lines[1].startswith("probe 4/4: [2/2] llm tiny b=4: failed (oom) (done in ")


def test_progress_lines_off_with_no_progress_and_absent_on_a_terminal() -> None:
    quiet = io.StringIO()
    with ProgressBar(2, stream=quiet, enabled=False) as bar:
        bar.update(2)
        bar.point_done("x", "ok")
    assert bar.mode == "off" and quiet.getvalue() == ""
    tty = _Tty()
    with ProgressBar(2, stream=tty, min_interval=0) as bar:
        bar.update(2)
        bar.point_done("x", "ok")
    assert bar.mode == "bar" and "x: ok" not in tty.getvalue()


def test_format_table_can_drop_columns_no_row_fills() -> None:
    text = format_table(["probe", "TTFT ms", "req/s", "latency"], [["vit", None, None, 1.5], ["attention", None, "", 0.2]],
                        drop_empty=True)
    assert "TTFT" not in text and "req/s" not in text and "latency" in text and "attention" in text
    full = format_table(["probe", "TTFT ms"], [["vit", None]])
    assert "TTFT ms" in full  # off by default

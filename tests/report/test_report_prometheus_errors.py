"""``gpuperfd report --prometheus`` at things that are not Prometheus: a clear line and an exit code, never
a traceback, never the peer's bytes."""

from __future__ import annotations

import json

import pytest

from gpuperfd.commands.report import register
from gpuperfd.report.prometheus import load_prometheus
from gpuperfd.report.records import ReportError

pytest.importorskip("matplotlib")

from hostile_servers import deep_json_port, raw_port  # noqa: E402,F401 (fixtures)


def _report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["report", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def test_a_port_that_answers_not_http_is_named(raw_port, tmp_path, capsys) -> None:
    code, err = _report(["--prometheus", f"http://127.0.0.1:{raw_port}", "--start=-1h", "--out", str(tmp_path)], capsys)
    assert code == 1
    assert "did not answer HTTP" in err and "SSH-2.0" not in err and "\x1b" not in err


def test_json_nested_too_deeply_is_refused(deep_json_port, tmp_path, capsys) -> None:
    code, err = _report(["--prometheus", f"http://127.0.0.1:{deep_json_port}", "--start=-1h", "--out", str(tmp_path)],
                        capsys)
    assert code == 1
    assert "nested too deeply" in err


@pytest.mark.parametrize("url", ["garbage", "http://[::1", "ftp://127.0.0.1", "http://"])
def test_a_url_that_is_not_http_is_a_usage_error_naming_the_flag(url: str, tmp_path, capsys) -> None:
    code, err = _report(["--prometheus", url, "--start=-1h", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert f"--prometheus {url!r}" in err


@pytest.mark.parametrize("body", [
    {"status": "success", "data": []},
    {"status": "success", "data": {"resultType": "matrix", "result": [1, 2]}},
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": "x"}]}},
])
def test_an_answer_of_the_wrong_shape_is_a_report_error(body) -> None:
    with pytest.raises(ReportError, match="Prometheus http://prom:9090"):
        load_prometheus("http://prom:9090", 100.0, 200.0, fetch=lambda _url: json.loads(json.dumps(body)))


def test_values_and_gpu_labels_that_are_not_numbers_are_skipped() -> None:
    def fetch(url: str) -> dict:
        metric = {"gpu": "abc", "uuid": "GPU-1", "probe": "llm", "preset": "small", "power_cap": "300"}
        values = [[150, "10"], ["x"], None, [160, "nan"]]
        return {"status": "success", "data": {"resultType": "matrix",
                                              "result": [{"metric": metric, "values": values}]}}

    loaded = load_prometheus("http://prom:9090", 100.0, 200.0, fetch=fetch)
    assert [(run.time, run.rate, run.gpu.index) for run in loaded.runs] == [(150.0, 10.0, -1)]

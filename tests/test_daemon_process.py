"""The real daemon process: HTTP endpoints, formats, promtool, signals, no-driver error."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest
import requests

pytestmark = pytest.mark.prometheus


def test_scrape_is_valid_for_promtool_and_has_every_gpu(start_daemon):
    daemon = start_daemon(["--simulate", "3"])
    response = requests.get(daemon.url + "/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.text
    for gpu in ("0", "1", "2"):
        assert f'gpuperf_gpu_up{{gpu="{gpu}"' in text
    assert "gpuperf_build_info{" in text
    assert "gpuperf_energy_joules_total{" in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus); scripts/test.sh installs it"
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout.strip() == "" and lint.stderr.strip() == "", lint.stdout + lint.stderr


def test_openmetrics_gzip_health_landing_and_404(start_daemon):
    daemon = start_daemon(["--simulate", "2"])
    om = requests.get(daemon.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5)
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    gz = requests.get(daemon.url + "/metrics", headers={"Accept-Encoding": "gzip"}, timeout=5)
    assert gz.headers.get("Content-Encoding") == "gzip" and "gpuperf_gpu_up" in gz.text
    health = requests.get(daemon.url + "/healthz", timeout=5).json()
    assert health == {"status": "ok", "gpus": 2, "gpus_lost": []}
    page = requests.get(daemon.url + "/", timeout=5)
    assert "NVIDIA H100" in page.text and 'href="/metrics"' in page.text
    assert requests.get(daemon.url + "/nope", timeout=5).status_code == 404
    assert requests.post(daemon.url + "/metrics", timeout=5).status_code == 405


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(start_daemon, sig):
    daemon = start_daemon(["--simulate", "1"])
    assert daemon.stop(sig) == 0
    log = daemon.log()
    assert "stopped" in log and "Traceback" not in log


def test_no_driver_is_a_clear_error_not_a_silent_simulation(tmp_path):
    """This machine has no NVIDIA driver: the NVML backend must refuse, naming --simulate."""
    out = subprocess.run(
        [sys.executable, "-m", "gpuperfd", "run", "--web.listen-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )
    assert out.returncode == 3, out.stderr
    assert "--simulate" in out.stderr and "driver" in out.stderr.lower()
    assert "Traceback" not in out.stderr

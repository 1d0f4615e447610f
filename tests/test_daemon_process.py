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


LAZY_PROBE = """
import json, sys
from gpuperfd.config import config_from_mapping
from gpuperfd.daemon import Daemon
data = {"web": {"listen_address": "127.0.0.1:0"}, "device": {"backend": "simulated"}, "simulation": {"gpus": 1}}
if len(sys.argv) > 1:
    data["web"]["config_file"] = sys.argv[1]
daemon = Daemon(config_from_mapping(data, "<test>"))
daemon.sampler.sample_once()
daemon.exporter.render()
daemon.backend.close()
print(json.dumps({m: m in sys.modules for m in ("bcrypt", "gpuperfd.web.auth", "gpuperfd.web.tls", "gpuperfd.web.watcher",
                                               "gpuperfd.health.nfd", "torch", "numpy")}))
"""


def test_tls_and_basic_auth_code_is_imported_only_when_a_web_config_asks_for_it(tmp_path):
    """The idle footprint carries no TLS/auth/NFD code it was not configured for (issue 36)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    plain = subprocess.run([sys.executable, "-c", LAZY_PROBE], capture_output=True, text=True, cwd=root, check=True)
    assert not any(json.loads(plain.stdout.splitlines()[-1]).values()), plain.stdout
    web = tmp_path / "web.yml"
    web.write_text('basic_auth_users: {u: "$2b$04$8Jp1wmy7y3NnSk8zE3Y9xO3.6GU3t2V1kQm/k6yKXbqM4V0Qh8m9a"}\n')
    secured = subprocess.run([sys.executable, "-c", LAZY_PROBE, str(web)], capture_output=True, text=True, cwd=root,
                             check=True)
    loaded = json.loads(secured.stdout.splitlines()[-1])
    assert loaded["gpuperfd.web.auth"] and loaded["gpuperfd.web.tls"] and loaded["gpuperfd.web.watcher"]
    assert not loaded["torch"] and not loaded["numpy"]


RUN_MODULES = """
import json, os, signal, sys, threading
from gpuperfd import cli
threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
code = cli.main(["run", "--simulate", "1", "--web.listen-address", "127.0.0.1:0", "--log-level", "warning"])
print(json.dumps({"code": code, "loaded": sorted(set(cli.COMMAND_MODULES.values()) & set(sys.modules))}))
"""


def test_gpuperfd_run_does_not_carry_the_other_commands_modules():
    """``gpuperfd run`` imports only what the daemon needs: the probe, sweep, check, report,
    dashboard and install commands' modules stay out of its memory (2 MB, issue 36), and a
    SIGTERM still ends it cleanly; ``--help`` still lists every command."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", RUN_MODULES], capture_output=True, text=True, cwd=root, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report == {"code": 0, "loaded": []}, report
    usage = subprocess.run([sys.executable, "-m", "gpuperfd", "--help"], capture_output=True, text=True, cwd=root,
                           timeout=60)
    for command in ("run", "check", "probe", "sweep", "restore-caps", "dashboards", "install", "uninstall", "report"):
        assert command in usage.stdout, command

"""The shipped integrations of ``gpuperfd check``: their formats and how each maps our exit codes.

- deploy/slurm/prolog-gpuperfd.sh, run with a fake ``gpuperfd`` and a fake ``scontrol`` that records
  its arguments (Slurm: a non-zero Prolog drains the node and requeues the job);
- deploy/node-problem-detector/: the custom plugin monitor config (the structure NPD's
  pkg/custompluginmonitor reads) and its wrapper (0 OK, 1 NonOK, 2 Unknown, one line on stdout),
  also run against the real ``gpuperfd check`` on simulated GPUs;
- deploy/kubernetes/preflight-job.yaml against the Kubernetes API schemas (kubernetes-validate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuperfd.commands.check import EXIT_DEGRADED, EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "deploy/slurm/prolog-gpuperfd.sh"
NPD_DIR = ROOT / "deploy/node-problem-detector"


def fake_tools(tmp_path: Path, code: int, line: str) -> dict[str, str]:
    """A fake gpuperfd that prints ``line`` and exits ``code`` (recording its arguments), a fake scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    gpuperfd = bin_dir / "gpuperfd"
    gpuperfd.write_text(f"#!/bin/bash\necho \"$@\" > {tmp_path}/gpuperfd.args\necho '{line}'\nexit {code}\n")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/bash\nfor a in \"$@\"; do echo \"$a\"; done > {tmp_path}/scontrol.args\n")
    for tool in (gpuperfd, scontrol):
        tool.chmod(0o755)
    return {"PATH": os.environ["PATH"], "GPUPERFD": str(gpuperfd), "SCONTROL": str(scontrol),
            "SLURM_JOB_ID": "4242"}


@pytest.mark.parametrize("code, drains, exit_code", [
    (EXIT_HEALTHY, False, 0), (EXIT_DEGRADED, False, 0), (EXIT_UNHEALTHY, True, 1),
    (EXIT_UNKNOWN, False, 0), (EXIT_USAGE, False, 0), (1, False, 0),
])
def test_prolog_drains_only_an_unhealthy_node(tmp_path: Path, code: int, drains: bool, exit_code: int) -> None:
    line = "unhealthy (reset_gpu): gpu 1 ecc_uncorrectable_volatile: 2 uncorrectable ECC error(s)"
    env = fake_tools(tmp_path, code, line)
    proc = subprocess.run(["bash", str(PROLOG)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == exit_code, proc.stderr
    assert (tmp_path / "gpuperfd.args").read_text().split()[:4] == ["check", "--line", "--quick", "--timeout"]
    recorded = tmp_path / "scontrol.args"
    if not drains:
        assert not recorded.exists()
        return
    args = recorded.read_text().splitlines()
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert args == ["update", f"nodename={host}", "state=drain", f"reason=gpuperfd: {line}"]


def test_prolog_drain_on_is_configurable_and_reason_is_bounded(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, EXIT_UNKNOWN, "unknown: " + "x" * 400)
    env["GPUPERFD_DRAIN_ON"] = "unhealthy,unknown"
    proc = subprocess.run(["bash", str(PROLOG)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    reason = (tmp_path / "scontrol.args").read_text().splitlines()[-1]
    assert reason.startswith("reason=gpuperfd: unknown: ") and len(reason) == len("reason=") + 200


def test_npd_plugin_config_has_the_custom_plugin_structure() -> None:
    config = json.loads((NPD_DIR / "gpuperfd-plugin.json").read_text())
    assert config["plugin"] == "custom"
    assert set(config["pluginConfig"]) >= {"invoke_interval", "timeout", "max_output_length", "concurrency"}
    assert [c["type"] for c in config["conditions"]] == ["GpuperfdUnhealthy"]
    (rule,) = config["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == "GpuperfdUnhealthy"
    assert rule["path"].endswith("/gpuperfd-npd.sh") and rule["reason"]
    # The plugin's timeout holds the check's own bound (--timeout 20 in the wrapper) with room to spare.
    assert int(rule["timeout"].rstrip("s")) > 20 and int(config["pluginConfig"]["timeout"].rstrip("s")) >= 25


@pytest.mark.parametrize("code, status", [
    (EXIT_HEALTHY, 0), (EXIT_DEGRADED, 0), (EXIT_UNHEALTHY, 1), (EXIT_UNKNOWN, 2), (EXIT_USAGE, 2), (1, 2),
])
def test_npd_wrapper_maps_exit_codes(tmp_path: Path, code: int, status: int) -> None:
    env = fake_tools(tmp_path, code, "the verdict line")
    proc = subprocess.run(["bash", str(NPD_DIR / "gpuperfd-npd.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == status
    assert proc.stdout == "the verdict line\n"


def test_npd_wrapper_against_the_real_check(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"device: {{backend: simulated}}\nsimulation: {{gpus: 2, seed: 1, ecc_errors: "
                      f"[{{gpu: 1, uncorrected: 1}}]}}\nprobes: {{state_dir: {tmp_path}}}\n")
    wrapper = tmp_path / "gpuperfd"
    wrapper.write_text(f"#!/bin/bash\nPYTHONPATH={ROOT} exec {sys.executable} -m gpuperfd \"$@\"\n")
    wrapper.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "GPUPERFD": str(wrapper),
           "GPUPERFD_CHECK_ARGS": f"--quick --timeout 20 --config {config}"}
    proc = subprocess.run(["bash", str(NPD_DIR / "gpuperfd-npd.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.startswith("unhealthy (reset_gpu): gpu 1 ecc_uncorrectable_volatile: 1 uncorrectable")
    assert proc.stdout.count("\n") == 1


def test_preflight_job_is_a_valid_kubernetes_job() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/preflight-job.yaml").read_text()) if d]
    (job,) = docs
    for version in ("1.29.0", kubernetes_validate.utils.latest_version()):
        kubernetes_validate.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:2] == ["check", "--json"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"] and pod["restartPolicy"] == "Never"
    failing = job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert sorted(failing) == sorted([EXIT_USAGE, EXIT_DEGRADED, EXIT_UNHEALTHY, EXIT_UNKNOWN])
    broken = json.loads(json.dumps(job))
    broken["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.29.0", strict=True)

"""The container images: the Containerfile's promises, and a real build and smoke run with podman.

The build test runs scripts/image.sh in local mode (debootstrap base, wheels from
this host's pip: no registry) and scripts/image-smoke.sh, which starts both images
as uid 65534 on a read-only root file system and checks what they do and write.
It needs root, podman, runc and debootstrap (scripts/test.sh installs them); about
4 to 5 minutes on the dev VM (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
CONSTRAINTS = ROOT / "deploy" / "container" / "constraints.txt"
VERSION = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
OCI_LABELS = {"title", "description", "version", "revision", "created", "licenses", "source", "documentation"}


def _stages(text: str) -> dict[str, str]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", text)
    stages: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if match:
            name = match.group(2) or match.group(1)
            stages[name] = line + "\n"
        elif name is not None and line.strip() and not line.lstrip().startswith("#"):
            stages[name] += line + "\n"
    return stages


def test_containerfile_runs_gpuperfd_as_nobody_with_oci_labels() -> None:
    stages = _stages(CONTAINERFILE.read_text())
    assert list(stages)[-1] == "telemetry"  # a build without --target gives the small image
    for target in ("telemetry", "probes"):
        assert stages[target].startswith("FROM runtime AS")
        labels = set(re.findall(r"org\.opencontainers\.image\.([a-z]+)=", stages["runtime"] + stages[target]))
        assert OCI_LABELS <= labels, f"{target}: missing {OCI_LABELS - labels}"
    runtime = stages["runtime"]
    assert "USER 65534:65534" in runtime
    assert 'ENTRYPOINT ["/opt/gpuperfd/bin/gpuperfd"]' in runtime
    assert "COPY --from=build-telemetry /opt/gpuperfd" in stages["telemetry"]
    assert "COPY --from=build-probes /opt/gpuperfd" in stages["probes"]
    assert "torch" not in stages["build"] + stages["build-telemetry"].replace("build-telemetry", "")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_constraints_pin_every_direct_dependency() -> None:
    """A dependency added to pyproject.toml must get a pin, or local builds resolve it afresh."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    wanted = _requirement_names(project["dependencies"] + project["optional-dependencies"]["probes"]) - {"torch"}
    assert wanted <= set(pins), f"not pinned in {CONSTRAINTS.name}: {sorted(wanted - set(pins))}"
    assert "torch" not in pins  # chosen by the TORCH build argument (CPU or CUDA build)


@pytest.mark.image
@pytest.mark.timeout(1500)
def test_images_build_here_and_pass_the_smoke_test() -> None:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    assert not missing, f"missing {missing}: apt-get install --no-install-recommends podman buildah runc debootstrap"
    build = subprocess.run(["bash", str(ROOT / "scripts" / "image.sh"), "--mode", "local"],
                           capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    assert "image.sh: mode local:" in build.stdout  # the script says which mode it used
    for name in ("gpuperfd", "gpuperfd-probes"):
        inspect = subprocess.run(["podman", "image", "inspect", f"localhost/{name}:{VERSION}"],
                                 capture_output=True, text=True, check=True)
        config = json.loads(inspect.stdout)[0]["Config"]
        assert config["User"] == "65534:65534"
        assert config["Entrypoint"] == ["/opt/gpuperfd/bin/gpuperfd"]
        assert config["Labels"]["org.opencontainers.image.title"] == name
        assert config["Labels"]["org.opencontainers.image.version"] == VERSION
    smoke = subprocess.run(["bash", str(ROOT / "scripts" / "image-smoke.sh"), VERSION],
                           capture_output=True, text=True, timeout=600)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    assert smoke.stdout.strip().splitlines()[-1] == "smoke: 8 passed, 0 failed", smoke.stdout[-2000:]

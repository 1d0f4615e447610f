"""RSS cost of asking the kubelet's PodResources API: our h2 client vs grpcio.

Starts a real gRPC PodResources server (tests/attribution/fake_kubelet.py, from the
vendored proto) with 8 GPU pods, then in fresh child processes measures VmRSS
after importing the daemon (gpuperfd.daemon), and after additionally making one
List call with (a) gpuperfd's h2 client, (b) grpcio with protoc-generated stubs.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/podresources_rss.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CHILD = r"""
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import gpuperfd.daemon  # the daemon's own imports
base = rss()
mode, sock = sys.argv[1], sys.argv[2]
if mode == "h2":
    from gpuperfd.attribution.podresources import list_pod_resources
    pods = list_pod_resources(sock, 5.0)
    n = len(pods)
elif mode == "grpcio":
    sys.path.insert(0, sys.argv[3])
    import grpc, podresources_v1_pb2 as pb2, podresources_v1_pb2_grpc as pb2_grpc
    with grpc.insecure_channel("unix://" + sock) as channel:
        n = len(pb2_grpc.PodResourcesListerStub(channel).List(pb2.ListPodResourcesRequest(), timeout=5).pod_resources)
else:
    n = 0
print(json.dumps({"mode": mode, "base": base, "after": rss(), "pods": n}))
"""


def main() -> int:
    import fake_kubelet

    stubs = fake_kubelet._out  # protoc output of the vendored proto
    with tempfile.TemporaryDirectory(prefix="kl", dir="/tmp") as tmp:
        sock = Path(tmp) / "kubelet.sock"
        pods = [("ns", f"pod-{i}", [("c", [("nvidia.com/gpu", [f"GPU-{i:08x}-0000-0000-0000-000000000000"])])])
                for i in range(8)]
        server = fake_kubelet.FakeKubelet(sock, pods).start()
        try:
            rows = []
            for mode in ("none", "h2", "grpcio"):
                for _ in range(3):
                    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(sock), stubs],
                                         capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT)})
                    rows.append(json.loads(out.stdout))
        finally:
            server.stop()
    print(f"{'client':8} {'daemon imports MB':>18} {'after List MB':>14} {'cost MB':>8}")
    for mode in ("none", "h2", "grpcio"):
        mine = [r for r in rows if r["mode"] == mode]
        base = min(r["base"] for r in mine) / 1e6
        after = min(r["after"] for r in mine) / 1e6
        print(f"{mode:8} {base:18.1f} {after:14.1f} {after - base:8.1f}   pods={mine[0]['pods']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A real gRPC server that speaks the kubelet's PodResources v1 API on a unix socket.

Its stubs are generated at import time with grpc_tools.protoc from the vendored
deploy/kubernetes/proto/podresources_v1.proto, so the daemon's hand-written
client is checked against what protoc makes of the published API, not against
our own idea of it. The attribution tests and the fleet's nodes with pods
(:attr:`gpuperfd.fleet.FleetSpec.pods`) use it. Test tooling only: grpcio and
grpcio-tools come with the ``test`` extra, and nothing the daemon imports
imports this module.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc
from grpc_tools import protoc

PROTO = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "proto" / "podresources_v1.proto"

#: Where protoc wrote the stubs (removed at exit); benchmarks/podresources_rss.py loads them in a child.
STUBS_DIR = tempfile.mkdtemp(prefix="podresources-stubs-")
atexit.register(shutil.rmtree, STUBS_DIR, True)
if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={STUBS_DIR}", f"--grpc_python_out={STUBS_DIR}",
                str(PROTO)]) != 0:
    raise RuntimeError(f"protoc failed on {PROTO}")
sys.path.insert(0, STUBS_DIR)
pb2 = importlib.import_module("podresources_v1_pb2")
pb2_grpc = importlib.import_module("podresources_v1_pb2_grpc")
sys.path.remove(STUBS_DIR)

#: (namespace, pod, [(container, [(resource, [device ids])])])
Pods = list[tuple[str, str, list[tuple[str, list[tuple[str, list[str]]]]]]]


def to_message(pods: Pods):  # type: ignore[no-untyped-def]
    return pb2.ListPodResourcesResponse(pod_resources=[
        pb2.PodResources(
            namespace=namespace,
            name=name,
            containers=[
                pb2.ContainerResources(
                    name=container,
                    devices=[pb2.ContainerDevices(resource_name=r, device_ids=ids, topology=pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=0)]))
                             for r, ids in devices],
                    cpu_ids=[2, 3],  # fields the daemon does not read must be skipped
                )
                for container, devices in containers
            ],
        )
        for namespace, name, containers in pods
    ])


class FakeKubelet(pb2_grpc.PodResourcesListerServicer):
    """Serves ``pods``; ``delay_seconds`` makes List slow, ``fail`` makes it return a gRPC error."""

    def __init__(self, socket_path: Path, pods: Pods | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.pods: Pods = pods or []
        self.delay_seconds = 0.0
        self.fail: grpc.StatusCode | None = None
        self.calls = 0
        self._server: grpc.Server | None = None

    def List(self, request, context):  # the gRPC method's name, capitalized as in the .proto
        self.calls += 1
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        if self.fail is not None:
            context.abort(self.fail, "injected failure")
        return to_message(self.pods)

    def start(self) -> FakeKubelet:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop and remove the socket, as a kubelet restart does."""
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        if self.socket_path.exists():
            os.unlink(self.socket_path)

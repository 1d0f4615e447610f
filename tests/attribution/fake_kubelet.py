"""A real gRPC server that speaks the kubelet's PodResources v1 API on a unix socket.

Its stubs are generated at import time with grpc_tools.protoc from the vendored
deploy/kubernetes/proto/podresources_v1.proto, so the daemon's hand-written
client is checked against what protoc makes of the published API, not against
our own idea of it. Test-only: grpcio never enters the daemon.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from grpc_tools import protoc

PROTO = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "proto" / "podresources_v1.proto"

_out = tempfile.mkdtemp(prefix="podresources-stubs-")
atexit.register(shutil.rmtree, _out, True)
if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={_out}", f"--grpc_python_out={_out}", str(PROTO)]) != 0:
    raise RuntimeError(f"protoc failed on {PROTO}")
sys.path.insert(0, _out)
pb2 = importlib.import_module("podresources_v1_pb2")
pb2_grpc = importlib.import_module("podresources_v1_pb2_grpc")
sys.path.remove(_out)

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

    def List(self, request, context):  # noqa: N802 (gRPC method name)
        self.calls += 1
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        if self.fail is not None:
            context.abort(self.fail, "injected failure")
        return to_message(self.pods)

    def start(self) -> "FakeKubelet":
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


class JunkServer:
    """A unix socket that answers any connection with bytes that are not HTTP/2 (a careless or hostile peer),
    or, with ``payload`` None, accepts and never answers (a hung kubelet)."""

    def __init__(self, socket_path: Path, payload: bytes | None = b"HTTP/1.1 200 OK\r\n\r\nhello") -> None:
        self.socket_path = Path(socket_path)
        self.payload = payload
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.socket_path))
        self._sock.listen(4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(65536)
                    if self.payload is None:
                        self._stop.wait()
                    else:
                        conn.sendall(self.payload)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        if self.socket_path.exists():
            os.unlink(self.socket_path)

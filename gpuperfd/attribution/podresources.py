"""A minimal client of the kubelet's PodResources v1 API (gRPC ``List`` over a unix socket).

Why not grpcio: the daemon's RSS target is 60 MB, and importing grpcio and
protobuf costs several times what this module costs (docs/benchmarks.md,
benchmarks/podresources_rss.py). One unary call needs only HTTP/2 framing and
HPACK, which the pure-Python ``h2`` package provides, plus a hand decoder for
the three small messages we read (the field numbers come from the vendored
deploy/kubernetes/proto/podresources_v1.proto). Unknown fields are skipped, as
any protobuf decoder does, so a newer kubelet stays compatible.

Every failure becomes :class:`PodResourcesError` with a short, bounded reason
(``unavailable``, ``no_permission``, ``timeout``, ``malformed``, ``rpc_error``), the label value the
collector reports. The whole call has one deadline; it runs on a background
thread, never during a scrape.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

LIST_PATH = "/v1.PodResourcesLister/List"
#: A node's List answer is a few KiB; anything past this is refused, not buffered.
MAX_RESPONSE_BYTES = 8 << 20

T = TypeVar("T")


class PodResourcesError(Exception):
    """The List call failed; ``reason`` is a stable metric label value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


# -- protobuf wire format (only what these messages use) ---------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise PodResourcesError("malformed", "truncated or overlong varint in the List response")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) for every field; length-delimited values as bytes, others skipped or ints."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise PodResourcesError("malformed", "field number 0 in the List response")
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise PodResourcesError("malformed", "length-delimited field runs past its message")
            yield number, buf[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > len(buf):
                raise PodResourcesError("malformed", "fixed-width field runs past its message")
        else:
            raise PodResourcesError("malformed", f"unsupported protobuf wire type {wire}")


def _text(value: bytes | int) -> str:
    if not isinstance(value, bytes):
        raise PodResourcesError("malformed", "a string field has a non-string wire type")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PodResourcesError("malformed", "a string field is not UTF-8") from exc


def _message(value: bytes | int) -> bytes:
    if not isinstance(value, bytes):
        raise PodResourcesError("malformed", "a message field has a non-message wire type")
    return value


def _layout(buf: bytes, strings: int, item: Callable[[bytes | int], T]) -> tuple[list[str], tuple[T, ...]]:
    """The layout of all three messages we decode: fields 1 to ``strings`` are strings ("" when absent) and
    field ``strings + 1`` repeats, each value read by ``item``; any other field is skipped."""
    texts, items = [""] * strings, []
    for number, value in _fields(buf):
        if number <= strings:
            texts[number - 1] = _text(value)
        elif number == strings + 1:
            items.append(item(value))
    return texts, tuple(items)


def _devices(value: bytes | int) -> ContainerDevices:
    (resource,), ids = _layout(_message(value), 1, _text)
    return ContainerDevices(resource, ids)


def _container(value: bytes | int) -> ContainerResources:
    (name,), devices = _layout(_message(value), 1, _devices)
    return ContainerResources(name, devices)


def _pod(value: bytes | int) -> PodResources:
    (name, namespace), containers = _layout(_message(value), 2, _container)
    return PodResources(name, namespace, containers)


def decode_list_response(buf: bytes) -> list[PodResources]:
    """ListPodResourcesResponse bytes -> pods (field 1, repeated PodResources)."""
    return [_pod(value) for number, value in _fields(buf) if number == 1]


def grpc_message(body: bytes) -> bytes:
    """The one message of a unary gRPC response body (5-byte prefix: flag, length)."""
    if len(body) < 5:
        raise PodResourcesError("malformed", f"gRPC response body of {len(body)} bytes has no message")
    if body[0] != 0:
        raise PodResourcesError("malformed", "compressed gRPC message (we never asked for compression)")
    length = int.from_bytes(body[1:5], "big")
    if len(body) != 5 + length:
        raise PodResourcesError("malformed", f"gRPC message says {length} bytes, body holds {len(body) - 5}")
    return body[5:]


# -- the call ------------------------------------------------------------------


def list_pod_resources(socket_path: str, timeout_seconds: float) -> list[PodResources]:
    """Call ``List`` on the kubelet socket; raise PodResourcesError. Blocks at most ``timeout_seconds``."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    deadline = time.monotonic() + timeout_seconds
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_seconds)
        try:
            sock.connect(socket_path)
        except PermissionError as exc:
            raise PodResourcesError("no_permission", f"{socket_path}: {exc.strerror} (run as root or grant access)") from exc
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise PodResourcesError("unavailable", f"{socket_path}: {exc.strerror}") from exc
        except socket.timeout as exc:
            raise PodResourcesError("timeout", f"{socket_path}: connect timed out") from exc
        except OSError as exc:
            raise PodResourcesError("unavailable", f"{socket_path}: {exc}") from exc
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", LIST_PATH), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-timeout", f"{max(1, int(timeout_seconds * 1000))}m"),
        ])
        conn.send_data(stream, b"\x00\x00\x00\x00\x00", end_stream=True)  # an empty ListPodResourcesRequest
        body = bytearray()
        status: dict[str, str] = {}
        ended = False
        try:
            sock.sendall(conn.data_to_send())
            while not ended:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout()
                sock.settimeout(remaining)
                data = sock.recv(65536)
                if not data:
                    raise PodResourcesError("unavailable", "the kubelet closed the connection mid-call")
                for event in conn.receive_data(data):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        status.update(event.headers)
                    elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                        body += event.data
                        if len(body) > MAX_RESPONSE_BYTES:
                            raise PodResourcesError("malformed", f"List response over {MAX_RESPONSE_BYTES} bytes")
                        conn.acknowledge_received_data(event.flow_controlled_length, stream)
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                        ended = True
                    elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                        raise PodResourcesError("unavailable", f"the kubelet ended the call ({type(event).__name__})")
                sock.sendall(conn.data_to_send())
        except socket.timeout as exc:
            raise PodResourcesError("timeout", f"List did not answer within {timeout_seconds:g} s") from exc
        except h2.exceptions.ProtocolError as exc:
            raise PodResourcesError("malformed", f"HTTP/2 protocol error: {exc}") from exc
        except OSError as exc:
            raise PodResourcesError("unavailable", f"{socket_path}: {exc}") from exc
    finally:
        sock.close()
    if status.get(":status") != "200":
        raise PodResourcesError("malformed", f"HTTP status {status.get(':status')!r}, not 200")
    if status.get("grpc-status") == "4":  # DEADLINE_EXCEEDED: the kubelet honoured our grpc-timeout
        raise PodResourcesError("timeout", f"List did not answer within {timeout_seconds:g} s (server deadline)")
    if status.get("grpc-status", "") != "0":
        message = status.get("grpc-message", "")
        raise PodResourcesError("rpc_error", f"grpc-status {status.get('grpc-status')!r}: {message}"[:200])
    return decode_list_response(grpc_message(bytes(body)))

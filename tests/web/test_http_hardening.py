"""The HTTP surface under attack: bounded connections, strict framing, auth that never falls open.

Real servers on loopback ports, real sockets, plain and TLS (a self-signed
certificate made here): request bodies are never parsed as requests, chunked
and conflicting framing are refused with the connection closed, HTTP/1.1 needs
Host, absolute-form targets work; hundreds of idle, slowloris and
never-handshaking connections leave the thread count unchanged while a real
scrape still gets through; and a web config rewritten in place, cut at random
points, never lets a request in without credentials.
"""

from __future__ import annotations

import base64
import datetime
import logging
import random
import resource
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuperfd.web.connections import Limits
from gpuperfd.web.security import secure_web_server
from gpuperfd.web.server import Response, WebServer
from gpuperfd.web.watcher import WebConfigWatcher

PASSWORD = "s3cret"
BODY = b"# metrics\nup 1\n"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("cert")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    crt, pem = directory / "server.crt", directory / "server.key"
    crt.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


@pytest.fixture(scope="module")
def password_hash() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@dataclass
class Served:
    web: WebServer
    tls: bool
    cert: Path
    config_file: Path | None
    watcher: WebConfigWatcher | None

    @property
    def port(self) -> int:
        return self.web.port

    def connect(self, timeout: float = 5.0) -> socket.socket:
        """A connected (and, over TLS, handshaken) client socket."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        if not self.tls:
            return raw
        context = ssl.create_default_context(cafile=str(self.cert))
        return context.wrap_socket(raw, server_hostname="localhost")

    def exchange(self, data: bytes, wait: float = 3.0) -> tuple[bytes, bool]:
        """Send ``data``; read until the server closes or ``wait`` passes: (received, closed)."""
        sock = self.connect(timeout=wait)
        received, closed = b"", False
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                received += chunk
            closed = True
        except (socket.timeout, TimeoutError):
            pass
        except (ConnectionResetError, ssl.SSLError):
            closed = True
        finally:
            sock.close()
        return received, closed


@pytest.fixture
def serve(tmp_path: Path, cert: tuple[Path, Path]) -> Iterator:
    servers: list[WebServer] = []

    def start(tls: bool = False, config: dict | None = None, limits: Limits | None = None, routes: dict | None = None,
              check_interval: float = 0.05, inline: bool = False) -> Served:
        web = WebServer("127.0.0.1", 0, routes or {"/metrics": lambda _h: Response(200, BODY)}, limits=limits,
                        inline_paths=frozenset({"/metrics"}) if inline else frozenset())
        config = dict(config or {})
        if tls:
            config["tls_server_config"] = {"cert_file": str(cert[0]), "key_file": str(cert[1])}
        watcher = config_file = None
        if config:
            config_file = tmp_path / "web.yml"
            config_file.write_text(yaml.safe_dump(config))
            watcher = WebConfigWatcher(config_file, check_interval=check_interval)
            secure_web_server(web, watcher)
        web.start()
        servers.append(web)
        return Served(web, tls, cert[0], config_file, watcher)

    yield start
    for web in servers:
        web.stop()


def statuses(received: bytes) -> list[int]:
    """Status codes of every response in a byte stream of HTTP/1.1 responses with Content-Length."""
    codes = []
    while received:
        head, sep, rest = received.partition(b"\r\n\r\n")
        assert sep, received[:200]
        lines = head.split(b"\r\n")
        codes.append(int(lines[0].split()[1]))
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
        received = rest[length:]
    return codes


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
GET_CLOSE = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
SMUGGLED = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED_GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"

# --- strict framing, plain and TLS -------------------------------------------------------------

FRAMING = {
    # a Content-Length body is read and dropped: the smuggled request inside is never answered
    "get_with_body": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(SMUGGLED), SMUGGLED)
                      + GET_CLOSE, [200, 200], True),
    # a chunked body is read (RFC 9112 section 7.1) and dropped: the smuggled request inside is never answered
    "chunked": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                % (len(SMUGGLED), SMUGGLED) + GET_CLOSE, [200, 200], True),
    "chunked_extensions_trailers": (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n%X ; ext\r\n%s\r\n000;last\r\nX-Checksum: 1\r\nX-Other: two\r\n\r\n"
        % (len(SMUGGLED), SMUGGLED) + GET_CLOSE, [200, 200], True),
    "chunked_capitalized": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n" + GET_CLOSE,
                            [200, 200], True),
    "chunked_size_not_hex": (CHUNKED_GET + b"zz\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", [400], True),
    "chunked_size_0x": (CHUNKED_GET + b"0x1f\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", [400], True),
    "chunked_size_negative": (CHUNKED_GET + b"-1f\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", [400], True),
    "chunked_size_leading_space": (CHUNKED_GET + b" 1f\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", [400], True),
    "chunked_size_empty": (CHUNKED_GET + b"\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", [400], True),
    "chunked_size_17_digits": (CHUNKED_GET + b"1" * 17 + b"\r\n" + SMUGGLED, [400], True),
    "chunked_size_line_endless": (CHUNKED_GET + b"1;" + b"x" * 5000, [400], True),
    "chunked_bare_lf": (CHUNKED_GET + b"1f\n" + SMUGGLED + b"\n0\n\n", [400], True),
    "chunked_data_longer_than_size": (CHUNKED_GET + b"5\r\nhello!\r\n0\r\n\r\n" + SMUGGLED, [400], True),
    "chunked_one_huge_chunk": (CHUNKED_GET + b"100000\r\n" + SMUGGLED, [413], True),
    "chunked_many_chunks_too_large": (CHUNKED_GET + b"400\r\n" + b"x" * 1024 + b"\r\n" * 1 + (b"400\r\n" + b"x" * 1024
                                      + b"\r\n") * 64 + b"0\r\n\r\n", [413], True),
    "chunked_bad_trailer": (CHUNKED_GET + b"0\r\nnot a field\r\n\r\n" + SMUGGLED, [400], True),
    "chunked_trailer_space_before_colon": (CHUNKED_GET + b"0\r\nX-A : 1\r\n\r\n" + SMUGGLED, [400], True),
    "chunked_trailer_endless": (CHUNKED_GET + b"0\r\n" + b"X-A: 1\r\n" * 10000, [431], True),
    "chunked_twice": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
                      [501], True),
    "chunked_http_1_0": (b"GET /metrics HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", [400], True),
    "post_chunked": (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (len(SMUGGLED), SMUGGLED), [405], True),
    "chunked_and_length": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"0\r\n\r\n" + SMUGGLED, [400], True),
    "gzip_coding": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + SMUGGLED, [501], True),
    "two_lengths": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 31\r\n\r\n" + SMUGGLED,
                    [400], True),
    "negative_length": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + SMUGGLED, [400], True),
    "space_before_colon": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length : 31\r\n\r\n" + SMUGGLED, [400], True),
    "folded_header": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: 31\r\n\r\n" + SMUGGLED, [400], True),
    "post_with_body": (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(SMUGGLED), SMUGGLED),
                       [405], True),
    "body_too_large": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + SMUGGLED * 100, [413], True),
    "no_host": (b"GET /metrics HTTP/1.1\r\n\r\n" + SMUGGLED, [400], True),
    "http_1_0_without_host": (b"GET /metrics HTTP/1.0\r\n\r\n", [200], True),
    "absolute_form": (b"GET http://example:9/metrics?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", [200], True),
    "put": (b"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", [405], True),
    "options": (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", [405], True),
    "pipelined": (GET + GET + GET_CLOSE, [200, 200, 200], True),
    # header fields are parsed by our strict parser (gpuperfd.web.request), not email.feedparser
    "bare_cr_in_value": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: 1\rContent-Length: 31\r\n\r\n" + SMUGGLED,
                         [400], True),
    "nul_in_value": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n" + SMUGGLED, [400], True),
    "name_not_a_token": (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX(A): 1\r\n\r\n" + SMUGGLED, [400], True),
    "too_many_fields": (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-A: 1\r\n" * 100 + b"\r\n", [431], True),
    "host_with_spaces_around": (b"GET /metrics HTTP/1.1\r\nHost: \t x \r\nConnection: close\r\n\r\n", [200], True),
}


@pytest.mark.parametrize("mode", ["plain", "plain-inline", "tls"])
@pytest.mark.parametrize("name", sorted(FRAMING))
def test_framing(serve, mode: str, name: str) -> None:
    served = serve(tls=mode == "tls", inline=mode == "plain-inline")
    data, expected, closes = FRAMING[name]
    received, closed = served.exchange(data)
    assert statuses(received) == expected, received[:400]
    assert closed == closes, (closed, received[-200:])
    if expected[0] == 405:
        assert b"\r\nAllow: GET, HEAD\r\n" in received
    again, _ = served.exchange(GET_CLOSE)  # and the server goes on serving
    assert statuses(again) == [200]


def close_after(sock: socket.socket, pause: float) -> bytes:
    """After ``pause`` seconds (the request before it handled on its own), a last request that asks the
    server to close; everything the server sent on ``sock`` until it closed. Closes ``sock``."""
    time.sleep(pause)
    sock.sendall(GET_CLOSE)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_small_body_keeps_the_connection_and_nothing_is_smuggled(serve, tls: bool) -> None:
    served = serve(tls=tls)
    sock = served.connect()
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED))
    time.sleep(0.2)  # the body arrives later, in its own packet
    sock.sendall(SMUGGLED)
    assert statuses(close_after(sock, pause=0.3)) == [200, 200]


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_chunked_body_in_pieces_keeps_the_connection_and_nothing_is_smuggled(serve, tls: bool) -> None:
    """A chunked body that arrives a few bytes at a time, split inside sizes, data and CRLFs."""
    served = serve(tls=tls)
    sock = served.connect()
    body = b"%x;e=1\r\n%s\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    sock.sendall(CHUNKED_GET)
    for i in range(0, len(body), 7):
        time.sleep(0.02)
        sock.sendall(body[i:i + 7])
    assert statuses(close_after(sock, pause=0.2)) == [200, 200]


# --- bounded connections ---------------------------------------------------------------------


def scrape(served: Served, auth: tuple[str, str] | None = None) -> tuple[int, float]:
    start = time.monotonic()
    extra = b""
    if auth:
        extra = b"Authorization: Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()) + b"\r\n"
    received, _ = served.exchange(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + b"\r\n", wait=10)
    return statuses(received)[0], time.monotonic() - start


def open_idle(port: int, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first_bytes:
            sock.sendall(first_bytes)
        held.append(sock)
    return held


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


IDLE_COUNT = min(800, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 3)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("kind", ["silent", "slowloris"])
def test_idle_and_slowloris_connections_take_no_threads(serve, tls: bool, kind: str) -> None:
    served = serve(tls=tls, limits=Limits(max_connections=4 * IDLE_COUNT))
    assert scrape(served)[0] == 200
    threads = threading.active_count()
    # silent: connect and say nothing (over TLS: never a ClientHello); slowloris: half a request head
    # (over TLS: half a ClientHello, which leaves the server mid-handshake)
    partial = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" if tls else b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    held = open_idle(served.port, IDLE_COUNT, partial if kind == "slowloris" else b"")
    try:
        assert wait_for(lambda: len(served.web.loop.conns) >= IDLE_COUNT)
        for sock in held[::50]:
            if kind == "slowloris":
                sock.sendall(b"a")  # still trickling
        assert threading.active_count() == threads
        status, _ = scrape(served)
        assert status == 200
        assert threading.active_count() == threads
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: len(served.web.loop.conns) == 0)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_at_the_connection_cap_the_oldest_idle_connection_makes_room(serve, tls: bool) -> None:
    served = serve(tls=tls, limits=Limits(max_connections=50))
    held = open_idle(served.port, 120)
    try:
        assert wait_for(lambda: served.web.loop.evicted >= 70)
        assert len(served.web.loop.conns) <= 50
        assert held[0].recv(1) == b""  # the first ones were closed to make room
        assert scrape(served)[0] == 200  # and a real scrape still gets in
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_deadlines_for_head_handshake_and_idle_keep_alive(serve, tls: bool) -> None:
    served = serve(tls=tls, limits=Limits(header_timeout=0.5, tls_handshake_timeout=0.5, idle_timeout=0.7))
    # a trickling head (or a stalled handshake) is cut at its deadline, not kept alive byte by byte
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=0.1)
    first = b"\x16\x03\x01\x02\x00\x01" if tls else b"GET /metrics HTTP/1.1\r\nX: "
    sock.sendall(first)
    start, cut = time.monotonic(), None
    while time.monotonic() - start < 5:
        try:
            sock.sendall(b"a")
            if sock.recv(1024) == b"":
                cut = time.monotonic() - start
                break
        except (socket.timeout, TimeoutError):
            continue
        except (BrokenPipeError, ConnectionResetError):
            cut = time.monotonic() - start
            break
    sock.close()
    assert cut is not None and 0.3 < cut < 2.0, cut
    # an idle keep-alive connection is closed after idle_timeout
    client = served.connect()
    client.sendall(GET)
    response = b""
    while not response.endswith(BODY):
        response += client.recv(65536)
    assert response.startswith(b"HTTP/1.1 200")
    client.settimeout(5)
    start = time.monotonic()
    assert client.recv(1024) == b""
    assert 0.5 < time.monotonic() - start < 2.5
    client.close()


def test_max_requests_answers_503_beyond_the_limit(serve) -> None:
    release = threading.Event()

    def slow(_handler):
        release.wait(10)
        return Response(200, BODY)

    served = serve(limits=Limits(workers=1, max_requests=2), routes={"/metrics": lambda _h: Response(200, BODY),
                                                                      "/slow": slow})
    threads = threading.active_count()
    waiting = [served.connect() for _ in range(2)]
    for sock in waiting:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert wait_for(lambda: served.web.loop.in_flight == 2)
    received, closed = served.exchange(GET_CLOSE)
    assert statuses(received) == [503] and closed and b"Retry-After: 1" in received
    assert threading.active_count() == threads
    release.set()
    for sock in waiting:
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
        assert statuses(response) == [200]
        sock.close()
    assert scrape(served)[0] == 200


# --- authentication never falls open -----------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_in_place_rewrites_at_random_cut_points_never_let_anyone_in(serve, tls: bool, password_hash: str) -> None:
    config = {"http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
              "basic_auth_users": {"prometheus": password_hash, "grafana": password_hash}}
    served = serve(tls=tls, config=config, check_interval=0.0)
    assert served.config_file is not None and served.watcher is not None
    full = served.config_file.read_bytes()
    assert scrape(served)[0] == 401 and scrape(served, ("prometheus", PASSWORD))[0] == 200
    rng = random.Random(20)
    cuts = sorted({0, 1, len(full) - 1, *(rng.randrange(len(full)) for _ in range(40))})
    seen = set()
    for cut in cuts:
        with served.config_file.open("r+b") as handle:  # truncate, then write: what editors do in place
            handle.truncate(0)
            handle.write(full[:cut])
        served.watcher.reload()
        status, _ = scrape(served)
        seen.add(status)
        assert status == 401, (cut, full[:cut])
        served.config_file.write_bytes(full)
    assert seen == {401}
    # the same while a writer keeps rewriting and clients keep asking, with no forced reload
    stop, statuses_seen = threading.Event(), []

    def writer() -> None:
        while not stop.is_set():
            cut = rng.randrange(len(full))
            with served.config_file.open("r+b") as handle:
                handle.truncate(0)
                handle.flush()
                handle.write(full[:cut])
                handle.flush()
                time.sleep(0.002)
                handle.write(full[cut:])

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            statuses_seen.append(scrape(served)[0])
    finally:
        stop.set()
        thread.join()
    assert statuses_seen and set(statuses_seen) == {401}, sorted(set(statuses_seen))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_auth_is_turned_off_only_by_a_file_that_says_so(serve, tls: bool, password_hash: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    served = serve(tls=tls, config={"basic_auth_users": {"prometheus": password_hash}}, check_interval=0.0)
    assert served.config_file is not None and served.watcher is not None
    tls_part = {"tls_server_config": yaml.safe_load(served.config_file.read_text())["tls_server_config"]} if tls else {}
    caplog.set_level(logging.INFO, logger="gpuperfd.web")
    prefix = yaml.safe_dump(tls_part) if tls_part else ""
    for text in ["", "{}\n", prefix, prefix + "basic_auth_users:\n", prefix + "basic_auth_users: null\n",
                 yaml.safe_dump({**tls_part, "http_server_config": {"headers": {"X-Frame-Options": "deny"}}})]:
        served.config_file.write_text(text)
        assert served.watcher.reload() is False, text
        assert scrape(served)[0] == 401, text
        # over TLS an empty file is refused for turning TLS off; with TLS kept, for turning auth off
        keeps_tls = "tls_server_config" in (yaml.safe_load(text) or {})
        reason = "turns TLS off" if tls and not keeps_tls else "would turn basic auth off"
        assert reason in caplog.text, (text, caplog.text)
        caplog.clear()
    served.config_file.write_text(yaml.safe_dump({**tls_part, "basic_auth_users": {}}))
    assert served.watcher.reload() is True
    assert scrape(served)[0] == 200
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "basic auth OFF" in r.getMessage()]
    assert len(warnings) == 1
    # and once off, an empty file is simply "nothing on" again
    served.config_file.write_text(yaml.safe_dump(tls_part) if tls_part else "")
    served.watcher.reload()
    assert scrape(served)[0] == 200


def test_empty_file_at_start_still_serves_without_auth(serve) -> None:
    served = serve(config={"http_server_config": {}})
    assert scrape(served)[0] == 200


# --- cheap requests answered on the connection loop (no worker hand-off) -----------------------

BIG = b"x" * (8 << 20)  # far more than loopback's socket buffers take at once


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response with Content-Length, read whole from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(1 << 20)
    assert len(body) == length
    return head + b"\r\n\r\n" + body


def test_inline_keep_alive_scrapes_are_served_on_the_loop_with_no_worker(serve) -> None:
    served = serve(inline=True, routes={"/metrics": lambda _h: Response(200, BODY),
                                        "/other": lambda _h: Response(200, b"other\n")})
    sock = served.connect()
    for _ in range(5):
        sock.sendall(GET)
        assert _read_response(sock).endswith(BODY)
    assert served.web.loop.served_inline == 5
    sock.sendall(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")  # not an inline path: a worker serves it
    assert _read_response(sock).endswith(b"other\n")
    assert served.web.loop.served_inline == 5
    sock.close()


def test_inline_response_to_a_slow_reader_blocks_nobody_and_arrives_whole(serve) -> None:
    served = serve(inline=True, limits=Limits(workers=1), routes={"/metrics": lambda _h: Response(200, BIG)})
    slow = served.connect(timeout=10)
    slow.sendall(GET)
    assert wait_for(lambda: served.web.loop.served_inline == 1)
    start = time.monotonic()
    for _ in range(3):  # others are served (on the loop too) while the slow reader's rest waits
        received, _ = served.exchange(GET_CLOSE, wait=10)
        assert statuses(received) == [200] and received.endswith(BIG)
    assert time.monotonic() - start < 8
    time.sleep(0.2)
    assert _read_response(slow).endswith(BIG)  # then it reads everything, in order
    slow.sendall(GET)  # and its connection goes on
    assert _read_response(slow).endswith(BIG)
    slow.close()


def test_inline_response_never_read_is_dropped_after_the_write_timeout(serve) -> None:
    served = serve(inline=True, limits=Limits(write_timeout=0.5), routes={"/metrics": lambda _h: Response(200, BIG)})
    sock = served.connect()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(GET)
    assert wait_for(lambda: served.web.loop.served_inline == 1)
    assert wait_for(lambda: not served.web.loop.conns)  # closed by the write deadline, not left open
    sock.close()
    assert scrape(served)[0] == 200

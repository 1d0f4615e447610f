"""Web config (exporter-toolkit format): TLS, client certificates, basic auth, headers, live reload.

Everything runs against a real :class:`gpuperfd.web.WebServer` on a loopback
port, with a throwaway CA made here, and real clients: requests, raw ssl
sockets, curl and Prometheus itself.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import ipaddress
import json
import logging
import re
import shutil
import socket
import ssl
import threading
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml
from conftest import free_port
from child_processes import end
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuperfd.config import ConfigError
from gpuperfd.web import config as webconfig
from gpuperfd.web import watcher as webwatcher
from gpuperfd.web.auth import BasicAuthGate, parse_basic_auth
from gpuperfd.web.config import WebConfigError, WebSecurity, load_web_config
from gpuperfd.web.security import secure_web_server
from gpuperfd.web.server import Response, WebServer
from gpuperfd.web.watcher import WebConfigWatcher

PASSWORD = "s3cret-scrape"
METRICS = b"# HELP demo_up A demo metric.\n# TYPE demo_up gauge\ndemo_up 1\n"


# --- a throwaway PKI -------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_file: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> "CA":
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert, _write_cert(cert, directory / f"{name}.crt"))

    def issue(self, directory: Path, name: str, *, server: bool, sans: list[x509.GeneralName]) -> tuple[Path, Path, int]:
        """A leaf certificate and key; returns (cert_file, key_file, serial)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        return _write_cert(cert, directory / f"{name}.crt"), _write_key(key, directory / f"{name}.key"), serial


@dataclass
class PKI:
    directory: Path
    ca: CA
    rogue_ca: CA
    server: tuple[Path, Path, int]
    server2: tuple[Path, Path, int]
    client: tuple[Path, Path, int]
    client_other_san: tuple[Path, Path, int]
    rogue_client: tuple[Path, Path, int]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca = CA.create(directory, "test-ca")
    rogue = CA.create(directory, "rogue-ca")
    server_sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return PKI(
        directory=directory,
        ca=ca,
        rogue_ca=rogue,
        server=ca.issue(directory, "server", server=True, sans=server_sans),
        server2=ca.issue(directory, "server2", server=True, sans=server_sans),
        client=ca.issue(directory, "client", server=False, sans=[x509.DNSName("prometheus.example")]),
        client_other_san=ca.issue(directory, "intruder", server=False, sans=[x509.DNSName("intruder.example")]),
        rogue_client=rogue.issue(directory, "rogue-client", server=False, sans=[x509.DNSName("prometheus.example")]),
    )


@pytest.fixture(scope="module")
def password_hash() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=6)).decode()


# --- a real server -----------------------------------------------------------------------------


@dataclass
class Served:
    web: WebServer
    watcher: WebConfigWatcher
    gate: BasicAuthGate
    config_file: Path

    @property
    def port(self) -> int:
        return self.web.port

    def url(self, path: str = "/metrics", scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[WebServer] = []

    def start(config: dict, *, check_interval: float = 0.1, open_paths: frozenset[str] = frozenset()) -> Served:
        config_file = tmp_path / "web.yml"
        write_yaml(config_file, config)
        watcher = WebConfigWatcher(config_file, check_interval=check_interval)
        routes = {
            "/metrics": lambda _h: Response(200, METRICS, "text/plain; version=0.0.4; charset=utf-8"),
            "/healthz": lambda _h: Response(200, b'{"status": "ok"}\n', "application/json"),
        }
        web = WebServer("127.0.0.1", 0, routes)
        gate = secure_web_server(web, watcher, open_paths=open_paths)
        web.start()
        servers.append(web)
        return Served(web, watcher, gate, config_file)

    yield start
    for web in servers:
        web.stop()


def write_yaml(path: Path, data: dict) -> None:
    # Write-then-rename, as config management does: the watcher never sees half a file.
    partial = path.with_suffix(".partial")
    partial.write_text(yaml.safe_dump(data))
    partial.replace(path)


def tls_config(pki: PKI, **extra: object) -> dict:
    return {"cert_file": str(pki.server[0]), "key_file": str(pki.server[1]), **extra}


def client_context(pki: PKI, cert: tuple[Path, Path, int] | None = None, **versions: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    if cert is not None:
        context.load_cert_chain(cert[0], cert[1])
    for name, value in versions.items():
        setattr(context, name, value)
    return context


def raw_get(port: int, context: ssl.SSLContext, path: str = "/metrics", auth: tuple[str, str] | None = None) -> tuple[int, bytes, int]:
    """One HTTPS GET over a raw ssl socket: (status, body, server certificate serial)."""
    import base64

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            serial = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number
            headers = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            if auth:
                headers += "Authorization: Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() + "\r\n"
            tls.sendall((headers + "\r\n").encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body, serial


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# --- loading and validation ----------------------------------------------------------------


def test_empty_file_turns_nothing_on(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    security = load_web_config(path)
    assert security.tls is None and security.ssl_context() is None
    assert not security.auth_required and dict(security.headers) == {}


def test_full_config_relative_paths_and_context(pki: PKI, password_hash: str, tmp_path: Path) -> None:
    for name in ("server.crt", "server.key"):
        shutil.copy(pki.directory / name, tmp_path / name)
    shutil.copy(pki.ca.cert_file, tmp_path / "ca.crt")
    path = tmp_path / "web.yml"
    write_yaml(path, {
        "tls_server_config": {
            "cert_file": "server.crt", "key_file": "server.key", "client_ca_file": "ca.crt",
            "client_auth_type": "RequireAndVerifyClientCert", "min_version": "TLS13",
            "cipher_suites": ["TLS_AES_128_GCM_SHA256"],
        },
        "http_server_config": {"http2": False, "headers": {"X-Content-Type-Options": "nosniff", "X-XSS-Protection": ""}},
        "basic_auth_users": {"prometheus": password_hash},
    })
    security = load_web_config(path)
    assert security.tls is not None
    assert security.tls.cert_file == tmp_path / "server.crt"  # relative to the config file, not the cwd
    assert security.tls.client_ca_file == tmp_path / "ca.crt"
    context = security.ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert dict(security.headers) == {"X-Content-Type-Options": "nosniff"}  # blank means unset
    assert set(security.users) == {"prometheus"}
    assert set(security.files) == {path, tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt"}


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ("foo: 1\n", "(top level)", "unknown field(s) foo"),
        ("- a\n", "(top level)", "must be a mapping"),
        ("basic_auth_users: {alice: notahash}\n", "basic_auth_users.alice", "not a bcrypt hash"),
        ("basic_auth_users: {'a:b': '$2b$04$" + "a" * 53 + "'}\n", "basic_auth_users.a:b", "cannot contain ':'"),
        ("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n", "tls_server_config.cert_file", "does not exist"),
        ("tls_server_config: {key_file: SERVER_KEY}\n", "tls_server_config.cert_file", "missing"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, client_auth_type: Sometimes}\n",
         "tls_server_config.client_auth_type", "unknown value 'Sometimes'"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, min_version: TLS14}\n",
         "tls_server_config.min_version", "unknown TLS version 'TLS14'"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, min_version: TLS13, max_version: TLS12}\n",
         "tls_server_config.min_version", "above max_version"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, client_ca_file: CA_CRT}\n",
         "tls_server_config.client_ca_file", "without a client_auth_type"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, client_auth_type: RequireAndVerifyClientCert}\n",
         "tls_server_config.client_ca_file", "required with client_auth_type RequireAndVerifyClientCert"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: CLIENT_KEY}\n", "tls_server_config.cert_file", "cannot load certificate"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, client_auth_type: VerifyClientCertIfGiven, "
         "client_ca_file: CA_CRT, client_allowed_sans: [x]}\n", "tls_server_config.client_allowed_sans", "needs client_auth_type"),
        ("tls_server_config: {cert: '-----BEGIN', key_file: SERVER_KEY}\n", "tls_server_config.cert", "inline PEM"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "http_server_config.headers.X-Frame-Options", "invalid value 'allow'"),
        ("http_server_config: {headers: {Server: nginx}}\n", "http_server_config.headers.Server", "cannot be configured"),
        ("tls_server_config: {cert_file: SERVER_CRT, key_file: SERVER_KEY, client_auth_type: VerifyClientCertIfGiven, "
         "client_ca_file: SERVER_KEY}\n", "tls_server_config.client_ca_file", "cannot load CA certificates"),
    ],
)
def test_invalid_files_name_file_and_field(pki: PKI, tmp_path: Path, config: str, field: str, message: str) -> None:
    text = (
        config.replace("SERVER_CRT", str(pki.server[0]))
        .replace("SERVER_KEY", str(pki.server[1]))
        .replace("CLIENT_KEY", str(pki.client[1]))
        .replace("CA_CRT", str(pki.ca.cert_file))
    )
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as raised:
        load_web_config(path)
    assert str(raised.value).startswith(f"{path}: {field}: "), str(raised.value)
    assert message in str(raised.value)
    assert isinstance(raised.value, ConfigError)  # so the CLI turns it into exit code 2


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="web config file not found"):
        load_web_config(tmp_path / "nope.yml")
    (tmp_path / "bad.yml").write_text("basic_auth_users: [unclosed\n")
    with pytest.raises(WebConfigError, match="not valid YAML"):
        load_web_config(tmp_path / "bad.yml")


@pytest.mark.prometheus
def test_promtool_agrees_on_valid_and_invalid_files(pki: PKI, password_hash: str, tmp_path: Path) -> None:
    """Files Prometheus' own checker accepts load here, and files it rejects fail here too."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus)"
    cases = {
        "empty": ({}, True),
        "users": ({"basic_auth_users": {"prometheus": password_hash}}, True),
        "tls": ({"tls_server_config": tls_config(pki, min_version="TLS13")}, True),
        "mtls": ({"tls_server_config": tls_config(
            pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca.cert_file))}, True),
        "headers": ({"http_server_config": {"headers": {"X-Frame-Options": "deny"}}}, True),
        "unknown_field": ({"tls_server_config": tls_config(pki, colour="red")}, False),
        "bad_auth_type": ({"tls_server_config": tls_config(pki, client_auth_type="Sometimes")}, False),
        "bad_hash": ({"basic_auth_users": {"prometheus": "plain"}}, False),
        "bad_header": ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, False),
        "bad_version": ({"tls_server_config": tls_config(pki, min_version="TLS99")}, False),
        "missing_key": ({"tls_server_config": {"cert_file": str(pki.server[0])}}, False),
    }
    for name, (config, valid) in cases.items():
        path = tmp_path / f"{name}.yml"
        write_yaml(path, config)
        checked = subprocess.run([promtool, "check", "web-config", str(path)], capture_output=True, text=True)
        assert (checked.returncode == 0) == valid, f"promtool on {name}: {checked.stdout}{checked.stderr}"
        if valid:
            load_web_config(path)
        else:
            with pytest.raises(WebConfigError):
                load_web_config(path)


def test_parse_basic_auth() -> None:
    import base64

    def header(raw: bytes) -> str:
        return "Basic " + base64.b64encode(raw).decode()

    assert parse_basic_auth(header(b"alice:pa:ss")) == ("alice", b"pa:ss")
    assert parse_basic_auth(header(b"alice:")) == ("alice", b"")
    assert parse_basic_auth(header(b"no-colon")) is None
    assert parse_basic_auth("Bearer abc") is None
    assert parse_basic_auth("Basic !!!notbase64") is None
    assert parse_basic_auth(None) is None


# --- basic auth ------------------------------------------------------------------------------


def test_basic_auth_over_tls(serve, pki: PKI, password_hash: str) -> None:
    served = serve({"tls_server_config": tls_config(pki), "basic_auth_users": {"prometheus": password_hash}})
    ca = str(pki.ca.cert_file)
    ok = requests.get(served.url(), auth=("prometheus", PASSWORD), verify=ca, timeout=5)
    assert ok.status_code == 200 and ok.content == METRICS
    for auth in (("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", ""), None):
        denied = requests.get(served.url(), auth=auth, verify=ca, timeout=5)
        assert denied.status_code == 401, auth
        assert denied.headers["WWW-Authenticate"] == 'Basic realm="gpuperfd"'
        assert b"demo_up" not in denied.content
    # a 404 is only given to authenticated clients; paths are not probed without credentials
    assert requests.get(served.url("/nope"), verify=ca, timeout=5).status_code == 401
    assert requests.get(served.url("/nope"), auth=("prometheus", PASSWORD), verify=ca, timeout=5).status_code == 404
    assert requests.head(served.url(), auth=("prometheus", PASSWORD), verify=ca, timeout=5).status_code == 200


def test_open_paths_skip_auth_only_there(serve, password_hash: str) -> None:
    served = serve({"basic_auth_users": {"prometheus": password_hash}}, open_paths=frozenset({"/healthz"}))
    assert requests.get(served.url("/healthz", "http"), timeout=5).status_code == 200
    assert requests.get(served.url("/healthz?x=1", "http"), timeout=5).status_code == 200
    assert requests.get(served.url("/metrics", "http"), timeout=5).status_code == 401


def test_bcrypt_runs_once_for_many_concurrent_scrapers(serve, password_hash: str) -> None:
    served = serve({"basic_auth_users": {"prometheus": password_hash}})

    def scrape(auth: tuple[str, str]) -> int:
        return requests.get(served.url(scheme="http"), auth=auth, timeout=10).status_code

    # Requests that arrive while the one bcrypt check runs are told to retry (429), never queued
    # behind it; once it is cached every request is answered from the cache.
    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(scrape, [("prometheus", PASSWORD)] * 100))
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 1, statuses
    assert [scrape(("prometheus", PASSWORD)) for _ in range(5)] == [200] * 5
    assert served.gate.bcrypt_calls == 1
    assert served.gate.refused == statuses.count(429)
    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(scrape, [("prometheus", "wrong")] * 40))
    assert set(statuses) <= {401, 429} and statuses.count(401) >= 1, statuses
    assert served.gate.bcrypt_calls == 2  # a wrong password is cached as wrong, too


def test_cached_credentials_never_wait_behind_a_running_bcrypt_check(serve, password_hash: str, monkeypatch) -> None:
    """A bcrypt check that never ends (standing in for cost 12 under a flood) holds one worker; every
    other uncached attempt is refused at once with 429 + Retry-After and counted; a scrape whose
    credentials are cached is answered. Before issue 33 the attempts queued on the bcrypt lock,
    held every worker, and the cached scrape waited for all of them."""
    from gpuperfd.web import auth

    served = serve({"basic_auth_users": {"prometheus": password_hash}})
    url = served.url(scheme="http")
    assert requests.get(url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200  # cached now
    entered, release = threading.Event(), threading.Event()
    real_check = auth._bcrypt_check

    def stuck_check(password: bytes, hashed: bytes) -> bool:
        entered.set()
        release.wait(60)
        return real_check(password, hashed)

    monkeypatch.setattr(auth, "_bcrypt_check", stuck_check)
    with concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool:
        first = pool.submit(requests.get, url, auth=("prometheus", "guess-0"), timeout=30)
        assert entered.wait(10)
        # more attempts than the server has workers (4): each must come back at once, not queue
        floods = [pool.submit(requests.get, url, auth=("prometheus", f"guess-{i}"), timeout=30) for i in range(1, 33)]
        refused = [f.result() for f in floods]
        assert [r.status_code for r in refused] == [429] * 32
        assert all(r.headers["Retry-After"] == "1" for r in refused)
        assert "WWW-Authenticate" not in refused[0].headers
        # the legitimate scraper, its credentials cached, is served while the check still runs
        for _ in range(3):
            assert requests.get(url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200
        assert not first.done()
        # unknown users and wrong passwords for them are refused the same way (no user oracle)
        assert requests.get(url, auth=("mallory", "x"), timeout=10).status_code == 429
        assert requests.get(url, timeout=10).status_code == 401  # no credentials: no check needed
        assert served.gate.refused == 33
        release.set()
        assert first.result().status_code == 401
    assert served.gate.bcrypt_calls == 2
    samples = {s.name: s.value for f in served.gate.collect() for s in f.samples}
    assert samples == {"gpuperf_web_auth_refused_total": 33.0}


def test_cache_is_bounded_and_unknown_users_fail(password_hash: str) -> None:
    security = WebSecurity(users={"prometheus": password_hash.encode()})
    gate = BasicAuthGate(security, cache_size=4)
    for i in range(10):
        assert not gate.verify(security, "prometheus", f"guess{i}".encode())
    assert len(gate._cache) == 4
    assert not gate.verify(security, "mallory", PASSWORD.encode())
    assert gate.verify(security, "prometheus", PASSWORD.encode())
    # a password longer than bcrypt's 72 bytes is checked on its first 72, as bcrypt always did
    long_hash = bcrypt.hashpw(b"x" * 72, bcrypt.gensalt(rounds=4))
    long_security = WebSecurity(users={"u": long_hash})
    assert gate.verify(long_security, "u", b"x" * 100)


def test_headers_on_every_response(serve, password_hash: str) -> None:
    served = serve({
        "basic_auth_users": {"prometheus": password_hash},
        "http_server_config": {"headers": {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff"}},
    })
    for path, auth, status in (("/metrics", ("prometheus", PASSWORD), 200), ("/metrics", None, 401),
                               ("/gone", ("prometheus", PASSWORD), 404)):
        response = requests.get(served.url(path, "http"), auth=auth, timeout=5)
        assert response.status_code == status
        assert response.headers["X-Frame-Options"] == "deny"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert requests.post(served.url("/metrics", "http"), timeout=5).headers["X-Frame-Options"] == "deny"


# --- TLS and client certificates ---------------------------------------------------------------


def test_plain_http_to_tls_port_is_refused_and_server_keeps_serving(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(pki)})
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(served.url(scheme="http"), timeout=5)
    assert requests.get(served.url(), verify=str(pki.ca.cert_file), timeout=5).status_code == 200


def test_require_and_verify_client_cert(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca.cert_file))})
    ca = str(pki.ca.cert_file)
    good = requests.get(served.url(), verify=ca, cert=(str(pki.client[0]), str(pki.client[1])), timeout=5)
    assert good.status_code == 200 and good.content == METRICS
    with pytest.raises(requests.exceptions.ConnectionError):  # no client certificate
        requests.get(served.url(), verify=ca, timeout=5)
    with pytest.raises(requests.exceptions.ConnectionError):  # signed by a CA the server does not trust
        requests.get(served.url(), verify=ca, cert=(str(pki.rogue_client[0]), str(pki.rogue_client[1])), timeout=5)
    # and at the TLS layer, on TLS 1.2 where the server's verdict is part of the handshake itself
    with pytest.raises(ssl.SSLError):
        raw_get(served.port, client_context(pki, pki.rogue_client, maximum_version=ssl.TLSVersion.TLSv1_2))
    with pytest.raises(ssl.SSLError):
        raw_get(served.port, client_context(pki, None, maximum_version=ssl.TLSVersion.TLSv1_2))
    status, body, _ = raw_get(served.port, client_context(pki, pki.client, maximum_version=ssl.TLSVersion.TLSv1_2))
    assert status == 200 and body == METRICS


def test_verify_client_cert_if_given(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(
        pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.ca.cert_file))})
    ca = str(pki.ca.cert_file)
    assert requests.get(served.url(), verify=ca, timeout=5).status_code == 200
    assert requests.get(served.url(), verify=ca, cert=(str(pki.client[0]), str(pki.client[1])), timeout=5).status_code == 200
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(served.url(), verify=ca, cert=(str(pki.rogue_client[0]), str(pki.rogue_client[1])), timeout=5)


def test_client_allowed_sans(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca.cert_file),
        client_allowed_sans=["prometheus.example"])})
    ca = str(pki.ca.cert_file)
    assert requests.get(served.url(), verify=ca, cert=(str(pki.client[0]), str(pki.client[1])), timeout=5).status_code == 200
    with pytest.raises(requests.exceptions.ConnectionError):  # right CA, SAN not on the list
        requests.get(served.url(), verify=ca, cert=(str(pki.client_other_san[0]), str(pki.client_other_san[1])), timeout=5)


def test_min_version_tls13_rejects_a_tls12_only_client(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(pki, min_version="TLS13")})
    with pytest.raises(ssl.SSLError):
        raw_get(served.port, client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2))
    status, _, _ = raw_get(served.port, client_context(pki, minimum_version=ssl.TLSVersion.TLSv1_3))
    assert status == 200


def test_max_version_tls12_rejects_a_tls13_only_client(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(pki, max_version="TLS12")})
    with pytest.raises(ssl.SSLError):
        raw_get(served.port, client_context(pki, minimum_version=ssl.TLSVersion.TLSv1_3))
    assert raw_get(served.port, client_context(pki))[0] == 200


def test_slow_handshake_does_not_block_other_clients(serve, pki: PKI) -> None:
    served = serve({"tls_server_config": tls_config(pki)})
    stalled = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(5)]  # connect, never say hello
    try:
        start = time.monotonic()
        response = requests.get(served.url(), verify=str(pki.ca.cert_file), timeout=5)
        assert response.status_code == 200
        assert time.monotonic() - start < 2.0  # the handshake timeout is 10 s: nobody waited for the stalled ones
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl(serve, pki: PKI, password_hash: str) -> None:
    served = serve({"tls_server_config": tls_config(pki, min_version="TLS13"),
                    "basic_auth_users": {"prometheus": password_hash}})

    def curl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(pki.ca.cert_file), *args, served.url()],
            capture_output=True, text=True, timeout=30,
        )

    assert curl("--user", f"prometheus:{PASSWORD}").stdout == "200"
    assert curl("--user", "prometheus:wrong").stdout == "401"
    assert curl().stdout == "401"
    too_old = curl("--tls-max", "1.2", "--user", f"prometheus:{PASSWORD}")
    assert too_old.returncode != 0 and too_old.stdout == "000", too_old


# --- live reload ---------------------------------------------------------------------------------


def test_new_password_applies_without_restart(serve, pki: PKI, tmp_path: Path) -> None:
    old_hash = bcrypt.hashpw(b"old-password", bcrypt.gensalt(rounds=4)).decode()
    new_hash = bcrypt.hashpw(b"new-password", bcrypt.gensalt(rounds=4)).decode()
    config = {"tls_server_config": tls_config(pki), "basic_auth_users": {"prometheus": old_hash}}
    served = serve(config)
    ca = str(pki.ca.cert_file)

    def status(password: str) -> int:
        return requests.get(served.url(), auth=("prometheus", password), verify=ca, timeout=5).status_code

    assert status("old-password") == 200 and status("new-password") == 401
    write_yaml(served.config_file, {**config, "basic_auth_users": {"prometheus": new_hash, "grafana": old_hash}})
    assert wait_for(lambda: status("new-password") == 200)
    assert status("old-password") == 401
    assert requests.get(served.url(), auth=("grafana", "old-password"), verify=ca, timeout=5).status_code == 200


def test_invalid_new_file_keeps_old_settings(serve, pki: PKI, password_hash: str, caplog: pytest.LogCaptureFixture) -> None:
    config = {"tls_server_config": tls_config(pki), "basic_auth_users": {"prometheus": password_hash}}
    served = serve(config)
    ca = str(pki.ca.cert_file)
    caplog.set_level(logging.INFO, logger="gpuperfd.web")
    broken = [
        "basic_auth_users: [unclosed\n",  # not YAML
        yaml.safe_dump({**config, "basic_auth_users": {"prometheus": "plaintext"}}),  # not a bcrypt hash
        yaml.safe_dump({**config, "tls_server_config": tls_config(pki, key_file=str(pki.client[1]))}),  # key mismatch
        yaml.safe_dump({"basic_auth_users": {"prometheus": password_hash}}),  # TLS off needs a restart
    ]

    def rejected() -> bool:  # the file is checked when requests come in
        requests.get(served.url(), verify=ca, timeout=5)
        return "keeping the previous settings" in caplog.text

    for number, text in enumerate(broken):
        caplog.clear()
        served.config_file.write_text(text)
        assert wait_for(rejected), (number, caplog.text)
        response = requests.get(served.url(), auth=("prometheus", PASSWORD), verify=ca, timeout=5)
        assert response.status_code == 200, number
        assert requests.get(served.url(), verify=ca, timeout=5).status_code == 401, number
    # a rejected file is logged once, not once a second
    caplog.clear()
    time.sleep(0.5)
    requests.get(served.url(), verify=ca, timeout=5)
    assert "keeping the previous settings" not in caplog.text
    # and a good file after the bad ones is taken
    write_yaml(served.config_file, {**config, "basic_auth_users": {}})
    assert wait_for(lambda: requests.get(served.url(), verify=ca, timeout=5).status_code == 200)


def test_renewed_certificate_applies_to_new_connections(serve, pki: PKI, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server[0], cert)
    shutil.copy(pki.server[1], key)
    served = serve({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}})
    context = client_context(pki)
    assert raw_get(served.port, context)[2] == pki.server[2]
    # renewal writes the key and certificate (the config file itself does not change)
    shutil.copy(pki.server2[1], key)
    shutil.copy(pki.server2[0], cert)
    assert wait_for(lambda: raw_get(served.port, context)[2] == pki.server2[2])


def test_new_client_ca_applies_without_restart(serve, pki: PKI, tmp_path: Path) -> None:
    ca_file = tmp_path / "clients.crt"
    shutil.copy(pki.ca.cert_file, ca_file)
    served = serve({"tls_server_config": tls_config(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(ca_file))})
    ca = str(pki.ca.cert_file)
    rogue = (str(pki.rogue_client[0]), str(pki.rogue_client[1]))

    def rogue_gets_in() -> bool:
        try:
            return requests.get(served.url(), verify=ca, cert=rogue, timeout=5).status_code == 200
        except requests.exceptions.ConnectionError:
            return False

    assert not rogue_gets_in()
    shutil.copy(pki.rogue_ca.cert_file, ca_file)
    assert wait_for(rogue_gets_in)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(served.url(), verify=ca, cert=(str(pki.client[0]), str(pki.client[1])), timeout=5)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_watcher_checks_at_most_once_per_interval(tmp_path: Path, password_hash: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "web.yml"
    write_yaml(path, {"basic_auth_users": {"a": password_hash}})
    clock = _Clock()
    watcher = WebConfigWatcher(path, check_interval=1.0, clock=clock)
    hashed, loads = [], []
    real_fingerprint, real_load = webconfig.files_fingerprint, webconfig.load_web_config
    counting_fingerprint = lambda files, read=None: hashed.append(1) or real_fingerprint(files, read)  # noqa: E731
    for module in (webconfig, webwatcher):  # load_web_config hashes too; the watcher calls both
        monkeypatch.setattr(module, "files_fingerprint", counting_fingerprint, raising=False)
    monkeypatch.setattr(webwatcher, "load_web_config", lambda p: loads.append(1) or real_load(p))
    write_yaml(path, {"basic_auth_users": {"b": password_hash}})
    for _ in range(100):
        assert set(watcher.current().users) == {"a"}
        clock.now += 0.005
    assert hashed == [] and loads == []  # 0.5 s of requests: the files were not even looked at
    clock.now = 1.0
    assert set(watcher.current().users) == {"b"}
    for _ in range(50):
        watcher.current()
        clock.now += 0.01
    assert len(loads) == 1 and len(hashed) == 2  # one check, one load (which hashes what it read)
    clock.now += 1.0
    watcher.current()
    assert len(loads) == 1 and len(hashed) == 3  # unchanged files: hashed, not loaded
    write_yaml(path, {"basic_auth_users": {"c": password_hash}})
    assert watcher.reload() is True  # SIGHUP does not wait for the interval
    assert set(watcher.current().users) == {"c"}
    assert watcher.reload() is False  # nothing changed


def test_invalid_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {a: b}\n")
    with pytest.raises(WebConfigError, match="basic_auth_users.a"):
        WebConfigWatcher(path)


# --- Prometheus itself ---------------------------------------------------------------------------


@pytest.mark.prometheus
def test_prometheus_scrapes_over_mtls_with_basic_auth(serve, pki: PKI, password_hash: str, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "Prometheus is required (apt-get install prometheus); scripts/test.sh installs it"
    served = serve({
        "tls_server_config": tls_config(
            pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca.cert_file), min_version="TLS13"),
        "basic_auth_users": {"prometheus": password_hash},
    })
    target = f"127.0.0.1:{served.port}"
    tls = {"ca_file": str(pki.ca.cert_file), "cert_file": str(pki.client[0]), "key_file": str(pki.client[1])}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "gpuperfd", "scheme": "https", "tls_config": tls,
             "basic_auth": {"username": "prometheus", "password": PASSWORD},
             "static_configs": [{"targets": [target]}]},
            {"job_name": "wrong-password", "scheme": "https", "tls_config": tls,
             "basic_auth": {"username": "prometheus", "password": "wrong"},
             "static_configs": [{"targets": [target]}]},
            {"job_name": "no-client-cert", "scheme": "https", "tls_config": {"ca_file": str(pki.ca.cert_file)},
             "basic_auth": {"username": "prometheus", "password": PASSWORD},
             "static_configs": [{"targets": [target]}]},
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log_file, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
        try:
            def ups() -> dict[str, float]:
                url = f"http://127.0.0.1:{port}/api/v1/query?query=up"
                try:
                    with urllib.request.urlopen(url, timeout=2) as answer:
                        result = json.load(answer)["data"]["result"]
                except OSError:
                    return {}
                return {r["metric"]["job"]: float(r["value"][1]) for r in result}

            assert wait_for(lambda: len(ups()) == 3 and ups()["gpuperfd"] == 1.0, timeout=60, interval=0.5), (
                ups(), log_path.read_text(errors="replace")[-3000:])
            assert ups() == {"gpuperfd": 1.0, "wrong-password": 0.0, "no-client-cert": 0.0}
            url = f"http://127.0.0.1:{port}/api/v1/query?query=demo_up"
            with urllib.request.urlopen(url, timeout=2) as answer:
                samples = json.load(answer)["data"]["result"]
            assert [s["metric"]["job"] for s in samples] == ["gpuperfd"]
        finally:
            end(proc)


def test_web_config_examples_in_the_docs_load(pki: PKI, tmp_path: Path) -> None:
    """Every web config example in docs/operations.md is valid (with this test's certificates)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "tls_server_config" in b]
    assert len(blocks) >= 2
    files = {"cert_file": pki.server[0], "key_file": pki.server[1], "client_ca_file": pki.ca.cert_file}
    for number, block in enumerate(blocks):
        data = yaml.safe_load(block)
        for key, path in files.items():
            if key in data["tls_server_config"]:
                data["tls_server_config"][key] = str(path)
        write_yaml(tmp_path / f"example{number}.yml", data)
        security = load_web_config(tmp_path / f"example{number}.yml")
        assert security.ssl_context() is not None


def test_daemon_exports_the_auth_refusal_counter_and_promtool_accepts_it(start_daemon, tmp_path: Path,
                                                                          password_hash: str) -> None:
    import shutil
    import subprocess

    web_file = tmp_path / "web.yml"
    write_yaml(web_file, {"basic_auth_users": {"prometheus": password_hash}})
    daemon = start_daemon(config_text=f"""
device: {{backend: simulated}}
simulation: {{gpus: 1, seed: 1}}
web: {{config_file: {web_file}}}
probes: {{enabled: false, state_dir: {tmp_path}/state, history: {{path: null}}}}
""", ready=False)  # /healthz asks for credentials too: wait for the log line instead
    deadline = time.monotonic() + 30
    while "listening on" not in daemon.log():
        assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.log()
        time.sleep(0.05)
    url = daemon.url + "/metrics"
    text = requests.get(url, auth=("prometheus", PASSWORD), timeout=10).text
    assert "\ngpuperf_web_auth_refused_total 0.0\n" in text
    assert "# TYPE gpuperf_web_auth_refused_total counter" in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus)"
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr
    openmetrics = requests.get(url, auth=("prometheus", PASSWORD), timeout=10,
                               headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    assert "\ngpuperf_web_auth_refused_total 0.0\n" in openmetrics and openmetrics.endswith("# EOF\n")
    daemon.stop()

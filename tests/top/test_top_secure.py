"""``gpuperfd top`` finds the daemon the way its config says: address, TLS and basic auth of its web config."""

from __future__ import annotations

import datetime
import ipaddress
import time
from pathlib import Path

import bcrypt
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuperfd.cli import main

PASSWORD = "top-s3cret"


def _cert(subject: str, key, issuer_key, issuer: x509.Name | None, ca: bool, sans=()):  # type: ignore[no-untyped-def]
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def pki(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key)."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("top-test-ca", ca_key, ca_key, None, True)
    server = _cert("server", server_key, ca_key, ca.subject, False, [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


def test_top_reaches_a_tls_and_basic_auth_daemon_from_its_config(start_daemon, tmp_path, capsys, monkeypatch):
    ca, cert, key = pki(tmp_path)
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"tls_server_config: {{cert_file: {cert}, key_file: {key}}}\nbasic_auth_users: {{alice: '{hashed}'}}\n")
    daemon = start_daemon(["--simulate", "1", "--web.config.file", str(web)], ready=False)
    # the node's config as top reads it: the daemon's address and web config
    config = tmp_path / "node.yaml"
    config.write_text(f"web: {{listen_address: '0.0.0.0:{daemon.port}', config_file: {web}}}\n")
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"https://127.0.0.1:{daemon.port}/healthz", verify=str(ca), auth=("alice", PASSWORD), timeout=1)
            break
        except requests.RequestException:
            assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.log()
            time.sleep(0.1)

    monkeypatch.setenv("GPUPERFD_PASSWORD", PASSWORD)
    assert main(["top", "--once", "--config", str(config), "--ca-file", str(ca), "--user", "alice"]) == 0
    out = capsys.readouterr().out
    assert f"from daemon https://127.0.0.1:{daemon.port}" in " ".join(out.split()) and "GPU 0 " in out

    assert main(["top", "--once", "--config", str(config), "--ca-file", str(ca)]) == 1
    assert "wants basic auth: --user NAME with the password in $GPUPERFD_PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("GPUPERFD_PASSWORD", "wrong")
    assert main(["top", "--once", "--config", str(config), "--ca-file", str(ca), "--user", "alice"]) == 1
    assert "(refused)" in capsys.readouterr().err
    assert main(["top", "--once", "--config", str(config), "--user", "alice"]) == 1  # the CA not given
    assert "--ca-file" in capsys.readouterr().err
    monkeypatch.delenv("GPUPERFD_PASSWORD")
    assert main(["top", "--once", "--config", str(config), "--user", "alice"]) == 2
    assert "set the password in $GPUPERFD_PASSWORD" in capsys.readouterr().err

"""Bad input: random configs, malformed HTTP, slow clients, hostile label values.

* The config loader, fed random mappings, mutated valid configs, random YAML
  text and bytes, either returns a Config or raises ConfigError with a message
  (never another exception, so never a traceback at start-up).
* A real daemon answers malformed requests with a 4xx status line (or the
  RFC's 501/505) and closes the connection, cuts off clients that send their
  request head too slowly, shrugs off clients that hang up mid-response, and
  keeps serving normal scrapes throughout.
* Quotes, backslashes, newlines, braces and any Unicode in device-provided
  label values come out escaped, parse back to the same strings, and pass
  ``promtool check metrics``.
"""

from __future__ import annotations

import copy
import dataclasses
import http.client
import shutil
import socket
import struct
import subprocess
import sys
import time

import pytest
from conftest import DaemonProcess
from manual_clock import FakeClock
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuperfd.config import (
    Config,
    ConfigError,
    FaultConfig,
    SimulationConfig,
    config_from_mapping,
    load_config,
)
from gpuperfd.device.simulated import SimulatedBackend
from gpuperfd.telemetry.collectors import COLLECTORS
from gpuperfd.telemetry.exporter import Exporter
from gpuperfd.telemetry.sampler import Sampler
from gpuperfd.web.server import REQUEST_TIMEOUT_SECONDS, Response, WebServer

HYPOTHESIS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

# --- the config loader --------------------------------------------------------------------

SECTION_KEYS = {
    "web": ["listen_address", "telemetry_path", "config_file"],
    "device": ["backend", "gpus", "call_timeout_seconds"],
    "simulation": ["gpus", "model", "seed", "faults", "xid_events", "ecc_errors", "degrade", "initial_power_limits",
                   "state_file"],
    "sampler": ["interval_seconds", "collectors"],
    "probes": ["enabled", "read_only", "state_dir", "idle_seconds", "schedules", "executor", "torch_device",
               "timeout_seconds", "history", "simulated_measure_seconds", "max_slowdown", "queue_seconds"],
}
SCHEDULE_KEYS = ["probe", "preset", "interval_seconds", "cron", "caps", "settle_seconds", "options", "gpus"]
OPTION_KEYS = ["batch_size", "dtype", "model", "variant", "prompt_tokens", "output_tokens", "seq_len", "heads",
               "n_groups", "causal", "inject_fault", "weights_path", "dataset_path", "extra", "seed", "device", "probe",
               "preset", "memory_limit_bytes", "image_size", "iterations", "measure_seconds", "head_dim"]
TRICKY = ["llm", "vit", "attention", "train", "tiny", "gpt2", "default", "* * * * *", "61 * * * *", "*/0 * * * *",
          "0 0 31 2 *", "@daily", "max", "min", "current", "0.5", "bf16", "fp8", "cpu", "cuda:99999999999999999999",
          "simulated", "nvml", "127.0.0.1:0", ":99999", "[::1]:80", "host:", "/metrics", "/", "oom", "hang", "nan",
          "inf", "-1", "1e400", "", "\x00", "/a\x00b", "💥", "H100"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=20), st.sampled_from(TRICKY), st.binary(max_size=6),
)


def values(depth: int):
    if depth == 0:
        return scalars
    keys = st.one_of(st.text(max_size=8), st.integers(), st.sampled_from(OPTION_KEYS + SCHEDULE_KEYS), st.none())
    return st.one_of(scalars, st.lists(values(depth - 1), max_size=4), st.dictionaries(keys, values(depth - 1), max_size=4))


schedules = st.fixed_dictionaries(
    {},
    optional={k: (st.dictionaries(st.sampled_from(OPTION_KEYS), values(1), max_size=4) if k == "options" else values(1))
              for k in SCHEDULE_KEYS},
)


def section(name: str):
    optional = {k: values(2) for k in SECTION_KEYS[name]}
    if name == "probes":
        optional["schedules"] = st.lists(schedules, max_size=3)
    return st.fixed_dictionaries({}, optional=optional)


config_shaped = st.fixed_dictionaries({}, optional={**{n: section(n) for n in SECTION_KEYS}, "log_level": scalars})

VALID = {
    "log_level": "info",
    "web": {"listen_address": "127.0.0.1:0", "telemetry_path": "/metrics"},
    "device": {"backend": "simulated", "gpus": [0], "call_timeout_seconds": 1},
    "simulation": {
        "gpus": 2, "seed": 1,
        "faults": [{"gpu": 0, "call": "info", "kind": "slow", "after_seconds": 1, "duration_seconds": 2, "delay_seconds": 1}],
        "xid_events": [{"gpu": 0, "xid": 79}], "ecc_errors": [{"gpu": 0, "corrected": 1}],
        "degrade": [{"gpu": 1, "sm_clock_factor": 0.9}], "initial_power_limits": {0: 500}, "state_file": "/tmp/x",
    },
    "sampler": {"interval_seconds": 1, "collectors": {"pcie": {"enabled": True, "interval_seconds": 5}}},
    "probes": {"state_dir": "/tmp", "history": {"path": None}, "schedules": [
        {"probe": "llm", "preset": "tiny", "interval_seconds": 60, "caps": ["max", 300, 0.5],
         "options": {"batch_size": 2, "dtype": "bf16"}},
        {"probe": "attention", "cron": "*/5 * * * *", "options": {"heads": 4, "n_groups": 2}},
        {"probe": "vit", "preset": "tiny", "interval_seconds": 60, "options": {"image_size": 32}},
        {"probe": "train", "preset": "tiny", "interval_seconds": 60, "options": {"seq_len": 16}},
    ]},
}


def _paths(node, prefix=()):
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, prefix + (index,))
    return found


VALID_PATHS = _paths(VALID)[1:]


def check_loads_or_config_error(load) -> None:
    """``load()`` returns a Config or raises ConfigError with a message; anything else fails the test."""
    try:
        result = load()
    except ConfigError as error:
        message = str(error)
        assert message.strip() and "Traceback" not in message
        return
    assert isinstance(result, Config)


def test_the_valid_base_config_is_valid():
    assert isinstance(config_from_mapping(VALID), Config)


@HYPOTHESIS
@given(st.one_of(config_shaped, values(3)))
def test_random_mappings_give_a_config_or_a_config_error(data):
    check_loads_or_config_error(lambda: config_from_mapping(data))


@HYPOTHESIS
@given(st.lists(st.tuples(st.sampled_from(VALID_PATHS), values(1), st.booleans(), st.text(max_size=6)), min_size=1, max_size=3))
def test_mutated_valid_configs_give_a_config_or_a_config_error(mutations):
    data = copy.deepcopy(VALID)
    for path, value, add_key, key in mutations:
        node = data
        try:
            for part in path[:-1]:
                node = node[part]
            if add_key and isinstance(node[path[-1]], dict):
                node[path[-1]][key] = value
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass
    check_loads_or_config_error(lambda: config_from_mapping(data))


YAML_SAMPLES = [
    b"&a [*a]", b"!!python/object/apply:os.system [ls]", b"a: !!binary AAAA", b"\xff\xfe\x00", b"---\n...\n---\n",
    b"web: {listen_address: '127.0.0.1:1'}\nweb: 2", b"%YAML 9.9\n---\n", b"? [a, b]\n: c", b"{[1,2]: 3}",
    b"probes: {schedules: [{probe: llm, interval_seconds: 60, options: {? [a]: 1}}]}", b"\x00", "\ufeffa: 1".encode(),
    b"a: *unknown", b"- !!set {a, b}", b"probes:\n  schedules:\n    - probe: llm\n      cron: '@reboot'",
    b"simulation: {gpus: 1e999}", b"web:\n\tlisten_address: x", b"device: {backend: simulated, gpus: [-1]}",
]


@HYPOTHESIS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode), st.sampled_from(YAML_SAMPLES)))
@example(b"")
@example(b"log_level: debug\n")
def test_random_yaml_files_give_a_config_or_a_config_error(tmp_path_factory, raw):
    path = tmp_path_factory.getbasetemp() / "fuzz.yaml"
    path.write_bytes(raw)
    check_loads_or_config_error(lambda: load_config(path, required=True))


def test_unreadable_config_paths_are_config_errors(tmp_path):
    check_loads_or_config_error(lambda: load_config(tmp_path, required=True))  # a directory
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", required=True)


def _nested(depth: int) -> dict:
    top = node = {}
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return top


def test_deeply_nested_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 1000 + "]" * 1000)
    with pytest.raises(ConfigError):
        load_config(path, required=True)


def test_deeply_nested_rejected_mapping_is_a_config_error():
    with pytest.raises(ConfigError):
        config_from_mapping({"web": _nested(1000)})


@pytest.mark.parametrize("text", [
    "web: [",  # YAML syntax
    "unknown_section: {}",
    "probes: {schedules: [{probe: llm, interval_seconds: 60, options: {inject_fault: nope}}]}",
    "simulation: {gpus: 0}",
    "\xff",
])
def test_cli_rejects_bad_configs_with_exit_2_and_no_traceback(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text.encode("latin-1"))
    for args in (["check-config", str(path)], ["run", "--config", str(path), "--web.listen-address", "127.0.0.1:0"]):
        out = subprocess.run([sys.executable, "-m", "gpuperfd", *args], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("gpuperfd: ") and str(path) in out.stderr
        assert "Traceback" not in out.stderr


# --- malformed HTTP against a real daemon ---------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http")
    proc = DaemonProcess(["--simulate", "2"], f"probes: {{state_dir: {tmp}/state, history: {{path: null}}}}\n", tmp)
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0
    log = proc.log()
    assert "Traceback" not in log and "Exception occurred" not in log, log[-3000:]


def exchange(port: int, data: bytes, wait: float = 3.0) -> tuple[bytes, bool, float]:
    """Send ``data``; read until the server closes or ``wait`` passes: (received, closed, seconds)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=wait)
    start = time.monotonic()
    received = b""
    closed = False
    try:
        sock.sendall(data)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            received += chunk
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    finally:
        sock.close()
    return received, closed, time.monotonic() - start


def scrape_ok(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    start = time.monotonic()
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read()
    conn.close()
    assert response.status == 200 and b"gpuperf_gpu_up{" in body
    return time.monotonic() - start


MALFORMED = {
    "garbage": (b"\x00\x01\x02garbage\r\n\r\n", 400),
    "one_word": (b"GET\r\n\r\n", 400),
    "four_words": (b"GET /metrics HTTP/1.1 extra\r\n\r\n", 400),
    "http_0_9": (b"GET /metrics\r\n", 400),
    "bad_version": (b"GET /metrics HTTP/1.x\r\n\r\n", 400),
    "http_2_preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    "unknown_method": (b"FOO /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 501),  # RFC 9110: unrecognized method
    "trace_method": (b"TRACE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 405),  # defined by HTTP, not allowed here
    "post": (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 405),
    "header_line_over_64k": (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
    "headers_over_64k_in_total": (
        b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 4000) for i in range(20)) + b"\r\n", 431),
    "too_many_headers": (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n", 431),
    "url_over_64k": (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    "url_60k": (b"GET /" + b"a" * 60000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    "non_utf8_path": (b"GET /\xff\xfe\xc3(%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    "control_chars_in_path": (b"GET /metrics\x1b[31m\x7f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    "absolute_uri": (b"GET http://evil/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
    "no_host_on_http_1_1": (b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
    "two_hosts": (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    "relative_target": (b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "ftp_absolute_target": (b"GET ftp://x/metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_request_gets_an_error_status_and_the_daemon_keeps_serving(daemon, name):
    data, status = MALFORMED[name]
    received, closed, seconds = exchange(daemon.port, data)
    assert received.startswith("HTTP/1.".encode()), received[:200]  # a real status line, even for garbage
    assert int(received.split(b" ", 2)[1]) == status, received[:200]
    assert closed and seconds < 2.0, (closed, seconds)
    scrape_ok(daemon.port)


def test_lf_only_and_pipelined_requests_are_served(daemon):
    received, closed, _ = exchange(daemon.port, b"GET /healthz HTTP/1.1\nHost: x\nConnection: close\n\n")
    assert received.startswith(b"HTTP/1.1 200") and closed
    two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    received, closed, _ = exchange(daemon.port, two)
    assert received.count(b"HTTP/1.1 200") == 2 and closed


def test_empty_and_reset_connections_are_harmless(daemon):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", daemon.port)):
            pass  # connect and close without a byte
    received, closed, _ = exchange(daemon.port, b"\r\n")
    assert received == b"" and closed
    scrape_ok(daemon.port)


def test_clients_hanging_up_mid_response_leave_no_traceback(daemon):
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", daemon.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        sock.close()
    time.sleep(0.5)
    scrape_ok(daemon.port)
    log = daemon.log()
    assert "Traceback" not in log and "Exception occurred" not in log, log[-2000:]


def test_hundreds_of_half_open_connections_do_not_slow_scrapes(daemon):
    held = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", daemon.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + str(i).encode())  # never finished
            held.append(sock)
        latencies = sorted(scrape_ok(daemon.port) for _ in range(30))
        print(f"\nwith 300 half-open connections: scrape median {1000 * latencies[15]:.1f} ms, "
              f"max {1000 * latencies[-1]:.1f} ms")
        assert latencies[len(latencies) // 2] < 0.1 and latencies[-1] < 1.0, latencies
    finally:
        for sock in held:
            sock.close()


def seconds_until_cut_off(sock: socket.socket, within: float, recv_timeout: float | None = None) -> float | None:
    """Trickle a request head's header value into ``sock`` a byte per read (each read waits the socket's
    timeout, or ``recv_timeout`` once set) until the server closes: the seconds that took, None if it
    had not closed within ``within`` seconds. Closes ``sock``."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Trickle: ")
    start = time.monotonic()
    cut = None
    while time.monotonic() - start < within:
        try:
            sock.sendall(b"a")
            if recv_timeout is not None:
                sock.settimeout(recv_timeout)
            if sock.recv(1024) == b"":
                cut = time.monotonic() - start
                break
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            cut = time.monotonic() - start
            break
    sock.close()
    return cut


@pytest.mark.slow
def test_real_daemon_cuts_off_a_trickling_client_within_its_request_timeout(daemon):
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=REQUEST_TIMEOUT_SECONDS + 10)
    # one byte a second keeps a per-read timeout happy forever
    cut = seconds_until_cut_off(sock, REQUEST_TIMEOUT_SECONDS + 10, recv_timeout=1.0)
    print(f"\ntrickling client cut off after {cut} s (request timeout {REQUEST_TIMEOUT_SECONDS} s)")
    assert cut is not None and cut <= REQUEST_TIMEOUT_SECONDS + 2, cut


# --- slow clients against the web server itself (short timeout) ---------------------------


@pytest.fixture
def small_server():
    server = WebServer("127.0.0.1", 0, {"/metrics": lambda _h: Response(200, b"ok\n")}, request_timeout_seconds=1.0)
    server.start()
    yield server
    server.stop()


def test_half_request_is_closed_after_the_request_timeout(small_server):
    received, closed, seconds = exchange(small_server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n", wait=5)
    assert closed and 0.9 <= seconds < 2.0, (received, seconds)


def test_trickling_request_head_is_cut_off_at_the_deadline_not_per_read(small_server):
    sock = socket.create_connection(("127.0.0.1", small_server.port), timeout=0.2)
    # a byte every 0.2 s: a 1 s per-read timeout would never fire
    cut = seconds_until_cut_off(sock, 6)
    assert cut is not None and cut < 2.0, cut


def test_keep_alive_requests_each_get_their_own_deadline(small_server):
    conn = http.client.HTTPConnection("127.0.0.1", small_server.port, timeout=5)
    for _ in range(4):  # 4 x 0.6 s: longer than one deadline in all, each request well within its own
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b"ok\n"
        time.sleep(0.6)
    conn.close()


# --- hostile label values -----------------------------------------------------------------

HOSTILE = [
    'q"uote', "back\\slash\\", "new\nline", '{brace}="x",y="z"} 1\nfake_metric 2', "ü日本🚀\u202e",
    "cr\rtab\t", "nul\x00", "\\n literal", '"', "\\", "\n", " ", "# HELP x y", 'a\\"b', "\u2028\u2029", "\x7f\x1b[31m",
]


def hostile_exporter(value: str) -> Exporter:
    clock = FakeClock()
    backend = SimulatedBackend(
        SimulationConfig(gpus=2, seed=1, faults=[FaultConfig(gpu=1, call="ecc_errors", kind="unknown")]),
        clock=clock, sleep=clock.sleep,
    )
    for gpu in backend.devices():
        gpu._info = dataclasses.replace(
            gpu._info, name=value, uuid=f"GPU-{gpu.index}-{value}", pci_bus_id=value, driver_version=value,
            compute_capability=value,
        )
    sampler = Sampler(backend, backend.devices(), [c() for n, c in sorted(COLLECTORS.items()) if n != "xid"], clock=clock)
    sampler.sample_once()
    return Exporter(sampler, "simulated")


@pytest.mark.parametrize("value", HOSTILE, ids=[f"h{i}" for i in range(len(HOSTILE))])
def test_hostile_label_values_are_escaped_and_parse_back(value):
    exporter = hostile_exporter(value)
    text = exporter.render().decode()
    om = exporter.render(openmetrics=True).decode()
    for parsed in (list(text_string_to_metric_families(text)), list(parse_openmetrics(om))):
        samples = [s for family in parsed for s in family.samples]
        names = {f.name for f in parsed}
        assert "fake_metric" not in names  # nothing injected a series of its own
        info = [s for s in samples if s.name == "gpuperf_gpu_info"]
        assert len(info) == 2
        for s in info:
            assert s.labels["name"] == value and s.labels["pci_bus_id"] == value
            assert s.labels["uuid"] == f"GPU-{s.labels['gpu']}-{value}"
        uuids = {s.labels["uuid"] for s in samples if "uuid" in s.labels}
        assert uuids == {f"GPU-0-{value}", f"GPU-1-{value}"}  # every per-GPU series, errors included
        errors = [s for s in samples if s.name.startswith("gpuperf_device_errors")]
        assert errors and errors[0].labels["uuid"] == f"GPU-1-{value}"


@pytest.mark.prometheus
def test_promtool_accepts_every_hostile_output():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus)"
    for value in HOSTILE:
        text = hostile_exporter(value).render().decode()
        lint = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (value, lint)
